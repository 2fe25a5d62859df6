"""Counters that tests and logs read: how many graphs were compiled, loaded from disk, run."""
compiles = 0        # graphs compiled by LLVM in this process
disk_hits = 0       # graphs whose object code came from the disk cache
memory_hits = 0     # graphs found in the in-memory cache


def reset() -> None:
    global compiles, disk_hits, memory_hits
    compiles = disk_hits = memory_hits = 0

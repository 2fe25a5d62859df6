"""How one rank's failure or exit reaches the others, so that no rank waits forever for a
rank that is gone: an uncaught exception aborts every rank (MPI_Abort), and a rank that exits
(`sys.exit`, or the end of its script) tells the others, so a rank waiting for it in a
tracegrad collective raises `RankExited` instead of hanging.

Why exits need a notice: mpi4py finalizes MPI at exit, and MPI_Finalize waits for every
rank to finalize, while a rank still waiting for the exited one in a collective never will;
both would wait forever. Why notices are compared by count: a rank may exit just after a
collective it took part in, before a slower rank saw that collective finish; that
collective still completes, only one the exited rank never entered cannot."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

ABORT_GRACE_S = 0.5     # how long a failing rank waits for its traceback to be forwarded
EXIT_TAG = 31           # the tag of exit notices, on the watch's own communicator
UNKNOWN = -1            # the code in a notice of a rank that did not exit through sys.exit


class RankExited(RuntimeError):
    """Rank `rank` exited (with `code`, None when it did not call `sys.exit`) while this
    rank waited for it in a collective that it never entered."""

    def __init__(self, rank: int, code: int | None, message: str):
        super().__init__(message)
        self.rank = rank
        self.code = code


class _ExitWatch:
    """This rank's side of the notices: the exited ranks it has heard of, how many
    collectives it has completed, and the receive that is always posted for the next
    notice."""

    def __init__(self, world: Any):
        self.world = world
        self.control = world.comm.Dup()    # notices never match the program's own messages
        self.completed = 0
        self.exited: dict[int, tuple[int | None, int]] = {}   # rank -> (code, completed)
        self.exit_status: Any = None
        self.exit_called = False
        self._buf = np.zeros(2, np.int64)
        self._status = world.MPI.Status()
        self.notice = self.control.Irecv(self._buf, source=world.MPI.ANY_SOURCE, tag=EXIT_TAG)

    def wait(self, request: Any, what: str) -> None:
        """Wait for `request` (collective number `self.completed`), raising RankExited once
        a rank that never entered it has exited."""
        MPI = self.world.MPI
        while True:
            if self.exited:
                self._check(what)
            if MPI.Request.Waitany([request, self.notice], self._status) == 0:
                self.completed += 1
                return
            self._record(self._status, repost=True)

    def _check(self, what: str) -> None:
        for rank, (code, completed) in sorted(self.exited.items()):
            if completed <= self.completed:
                me, size = self.world.rank, self.world.size
                how = (f"with code {code} (sys.exit)" if code is not None else
                       "without calling sys.exit (its script ended, or raised)")
                raise RankExited(rank, code, (
                    f"rank {rank} of {size} exited {how} while rank {me} waited for it in "
                    f"{what} (collective #{self.completed + 1}; rank {rank} took part in "
                    f"{completed}); every rank must run the same collectives"))

    def _record(self, status: Any, repost: bool) -> None:
        code, completed = (int(v) for v in self._buf)
        self.exited[status.Get_source()] = (None if code == UNKNOWN else code, completed)
        if repost:
            self.notice = self.control.Irecv(self._buf, source=self.world.MPI.ANY_SOURCE,
                                             tag=EXIT_TAG)

    def at_exit(self) -> None:
        """Tell every other rank this one is leaving, then wait until all of them leave
        too (MPI_Finalize, which comes next, would wait anyway), hearing their notices."""
        MPI, me, size = self.world.MPI, self.world.rank, self.world.size
        if MPI.Is_finalized():
            return
        code = UNKNOWN if not self.exit_called else _exit_code(self.exit_status)
        message = np.array([code, self.completed], np.int64)
        sends = [self.control.Isend(message, dest=r, tag=EXIT_TAG)
                 for r in range(size) if r != me]
        everyone = self.control.Ibarrier()
        status = MPI.Status()
        while MPI.Request.Waitany([everyone, self.notice], status) != 0:
            self._record(status, repost=True)
        # every rank sent its notice before entering the barrier: receive those not yet heard
        self.notice.Cancel()
        self.notice.Wait(status)
        if not status.Is_cancelled():
            self._record(status, repost=False)
        for rank in range(size):
            if rank != me and rank not in self.exited:
                self.control.Recv(self._buf, source=rank, tag=EXIT_TAG, status=status)
                self._record(status, repost=False)
        MPI.Request.Waitall(sends)
        self.control.Free()


def _exit_code(status: Any) -> int:
    """The exit status `sys.exit(status)` gives the process."""
    if status is None:
        return 0
    return status if isinstance(status, int) else 1


_watch: _ExitWatch | None = None


def wait(request: Any, what: str) -> None:
    """Wait for a collective's request; in a multi-rank world, raise RankExited if a rank
    that never entered it has exited."""
    if _watch is None:
        request.Wait()
    else:
        _watch.wait(request, what)


def watch_exits(world: Any) -> None:
    """Send this rank's exit notice at exit, and record the status `sys.exit` is called
    with (the main thread's only: a thread's sys.exit ends that thread alone)."""
    global _watch
    _watch = watch = _ExitWatch(world)
    real_exit = sys.exit

    def recording_exit(status: Any = None, /) -> None:
        if threading.current_thread() is threading.main_thread():
            watch.exit_status, watch.exit_called = status, True
        real_exit(status)

    # a SystemExit's status never reaches Python code at exit, so it is noted on the way out
    sys.exit = recording_exit
    atexit.register(watch.at_exit)   # Python's atexit runs before mpi4py's MPI_Finalize


def abort_on_uncaught(world: Any) -> None:
    """Make an uncaught exception print its traceback and abort every rank, with the exit
    code of the exited rank when the exception is RankExited."""
    def abort_all(kind: type, value: BaseException, tb: Any) -> None:
        code = 1
        try:
            if isinstance(value, RankExited) and value.code:
                code = value.code
            text = "".join(traceback.format_exception(kind, value, tb)) + (
                f"tracegrad.distributed: rank {world.rank} of {world.size} failed with "
                f"{kind.__name__}: {value}\ntracegrad.distributed: aborting all "
                f"{world.size} ranks (MPI_Abort)\n")
            sys.stderr.flush()
            os.write(2, text.encode(errors="replace"))   # one write: ranks do not interleave
            # the launcher drops output still in its pipes once it sees the abort
            time.sleep(ABORT_GRACE_S)
        finally:
            world.comm.Abort(code)

    sys.excepthook = abort_all

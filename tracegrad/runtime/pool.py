"""The thread pool native code calls back into to run a kernel's tasks on several cores.

The entry function calls `parallel_for(kernel, table, n_tasks)` through a pointer in its
table. That callback takes the GIL only to hand out work: each thread (the caller included)
claims task numbers from a shared counter and runs them through ctypes, which releases the
GIL for the native call. Tasks are fixed at compile time, so results do not depend on how
many threads run them. Thread count: `TRACEGRAD_NUM_THREADS`, default os.cpu_count()."""
from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading

KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
PARALLEL_FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

_kernels: dict[int, ctypes._CFuncPtr] = {}


def _kernel(addr: int):
    fn = _kernels.get(addr)
    if fn is None:
        if len(_kernels) > 4096:   # addresses of unloaded code may be reused: start afresh
            _kernels.clear()
        fn = _kernels[addr] = KERNEL(addr)
    return fn


class _Job:
    __slots__ = ("fn", "table", "n", "counter", "left", "lock", "done")

    def __init__(self, fn, table: int, n: int, participants: int):
        self.fn, self.table, self.n = fn, table, n
        self.counter = itertools.count()
        self.left = participants
        self.lock = threading.Lock()
        self.done = threading.Event()

    def work(self) -> None:
        try:
            while True:
                t = next(self.counter)   # atomic under the GIL
                if t >= self.n:
                    break
                self.fn(self.table, t)
        finally:
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


class Pool:
    def __init__(self, n_threads: int):
        self.n_threads = max(1, int(n_threads))
        self.queues: list[queue.SimpleQueue] = []
        for i in range(self.n_threads - 1):
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=self._worker, args=(q,), daemon=True,
                             name=f"tracegrad-{i}").start()
            self.queues.append(q)

    @staticmethod
    def _worker(q: queue.SimpleQueue) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            job.work()

    def run(self, fn_addr: int, table: int, n: int) -> None:
        fn = _kernel(fn_addr)
        helpers = min(len(self.queues), n - 1)
        if helpers <= 0:
            for t in range(n):
                fn(table, t)
            return
        job = _Job(fn, table, n, helpers + 1)
        for q in self.queues[:helpers]:
            q.put(job)
        job.work()
        job.done.wait()

    def close(self) -> None:
        for q in self.queues:
            q.put(None)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def _forget_pool_in_child() -> None:
    # a forked child has none of the parent's worker threads: start afresh on first use
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool_in_child)


def default_threads() -> int:
    env = os.environ.get("TRACEGRAD_NUM_THREADS")
    return max(1, int(env)) if env else (os.cpu_count() or 1)


def get_pool() -> Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = Pool(default_threads())
    return _pool


def set_num_threads(n: int) -> None:
    """Use `n` threads for parallel kernels from now on (results do not change)."""
    global _pool
    with _pool_lock:
        old, _pool = _pool, Pool(n)
    if old is not None:
        old.close()


def num_threads() -> int:
    return get_pool().n_threads


def _parallel_for(fn_addr, table, n) -> None:
    get_pool().run(fn_addr, table, n)


PARALLEL_FOR_PTR = PARALLEL_FOR(_parallel_for)
PARALLEL_FOR_ADDR = ctypes.cast(PARALLEL_FOR_PTR, ctypes.c_void_p).value

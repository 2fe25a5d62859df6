"""A thread pool in native code: kernels' tasks run on pthreads that never touch Python.

`tg_parallel_for(kernel, table, n)` publishes a job, runs tasks itself and returns when all
`n` are done. Workers claim task numbers with a compare-and-swap on one 64-bit word holding
(job generation << 32 | next task), so a worker that wakes late can never claim a task of a
job it did not read, and nobody waits for a worker that is not running. Idle workers spin for
a while (jobs of one step come back to back) and then sleep on a futex; a worker that keeps
arriving after its job's tasks are taken (another process has its core) spins less and less.
Tasks are fixed at compile time, so results do not depend on which thread runs them.

Only one job runs at a time; a caller that finds the pool busy (another Python thread's
graph) runs its tasks inline. Linux on x86-64 or AArch64 only: elsewhere `pool.py` keeps the
Python-thread pool."""
from __future__ import annotations

import ctypes
import os
import platform
import sys

import llvmlite.binding as llvm

from .target import emit_object, optimise

SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
CLOSED = 0xFFFFFFFF
# Idle spin before sleeping, in pause instructions (~25 ns each on Zen 3): ~100 us covers the
# gaps between one step's parallel kernels. Longer spins cost more than they save when another
# process wants the cores: mlp_step vs jax.jit under load 2.5 on 2 cores, 20000 pauses 1.28x,
# 4000 1.03x, 1000 0.99x; on the quiet machine 0.895x, 0.905x, 0.93x (wake-up latency).
DEFAULT_SPIN = 4000

_IR = r"""
@state = internal global i64 0, align 64
@job_fn = internal global ptr null, align 64
@job_table = internal global ptr null, align 8
@job_n = internal global i64 0, align 8
@done = internal global i64 0, align 64
@busy = internal global i32 0, align 64
@workers = internal global i64 0, align 64
@sleepers = internal global i32 0, align 64
@futex = internal global i32 0, align 64
@quit = internal global i32 0, align 64
@spin = internal global i64 SPIN, align 64

declare i64 @syscall(i64, ...)
declare i32 @sched_yield()
PAUSE_DECL

define internal void @relax() {
  PAUSE_CALL
  ret void
}

; claim and run tasks of job `gen` until none is left or another job replaced it; returns
; how many this thread ran
define internal i64 @work(ptr %fn, ptr %table, i64 %n, i64 %gen) {
entry:
  br label %loop
loop:
  %ran = phi i64 [ 0, %entry ], [ %ran, %claim ], [ %ran1, %run ]
  %s = load atomic i64, ptr @state seq_cst, align 8
  %g = lshr i64 %s, 32
  %idx = and i64 %s, 4294967295
  %same = icmp eq i64 %g, %gen
  %more = icmp ult i64 %idx, %n
  %ok = and i1 %same, %more
  br i1 %ok, label %claim, label %out
claim:
  %s1 = add i64 %s, 1
  %r = cmpxchg ptr @state, i64 %s, i64 %s1 seq_cst seq_cst
  %won = extractvalue { i64, i1 } %r, 1
  br i1 %won, label %run, label %loop
run:
  call void %fn(ptr %table, i64 %idx)
  %d = atomicrmw add ptr @done, i64 1 seq_cst
  %ran1 = add i64 %ran, 1
  br label %loop
out:
  ret i64 %ran
}

define void @tg_parallel_for(ptr %fn, ptr %table, i64 %n) {
entry:
  %w = load atomic i64, ptr @workers monotonic, align 8
  %solo = icmp eq i64 %w, 0
  %one = icmp sle i64 %n, 1
  %inl = or i1 %solo, %one
  br i1 %inl, label %inline, label %lock
lock:
  %l = cmpxchg ptr @busy, i32 0, i32 1 seq_cst seq_cst
  %got = extractvalue { i32, i1 } %l, 1
  br i1 %got, label %publish, label %inline
inline:
  %i = phi i64 [ 0, %entry ], [ 0, %lock ], [ %i1, %iloop ]
  %imore = icmp slt i64 %i, %n
  br i1 %imore, label %iloop, label %iend
iloop:
  call void %fn(ptr %table, i64 %i)
  %i1 = add i64 %i, 1
  br label %inline
iend:
  ret void
publish:
  %s = load atomic i64, ptr @state seq_cst, align 8
  %g0 = lshr i64 %s, 32
  %g1 = add i64 %g0, 1
  %gen = and i64 %g1, 4294967295
  %hi = shl i64 %gen, 32
  %closed = or i64 %hi, CLOSED
  store atomic i64 %closed, ptr @state seq_cst, align 8
  store atomic ptr %fn, ptr @job_fn seq_cst, align 8
  store atomic ptr %table, ptr @job_table seq_cst, align 8
  store atomic i64 %n, ptr @job_n seq_cst, align 8
  store atomic i64 0, ptr @done seq_cst, align 8
  store atomic i64 %hi, ptr @state seq_cst, align 8
  %sl = load atomic i32, ptr @sleepers seq_cst, align 4
  %anyone = icmp ne i32 %sl, 0
  br i1 %anyone, label %wake, label %run
wake:
  %f = atomicrmw add ptr @futex, i32 1 seq_cst
  %wr = call i64 (i64, ...) @syscall(i64 SYS_FUTEX, ptr @futex, i64 FUTEX_WAKE, i64 2147483647)
  br label %run
run:
  %mine = call i64 @work(ptr %fn, ptr %table, i64 %n, i64 %gen)
  br label %wait
wait:
  %k = phi i64 [ 0, %run ], [ %k1, %again ]
  %dn = load atomic i64, ptr @done seq_cst, align 8
  %fin = icmp eq i64 %dn, %n
  br i1 %fin, label %unlock, label %again
again:
  %k1 = add i64 %k, 1
  %patient = icmp ult i64 %k, 2000
  br i1 %patient, label %pause, label %yield
pause:
  call void @relax()
  br label %wait
yield:
  %y = call i32 @sched_yield()
  br label %wait
unlock:
  store atomic i32 0, ptr @busy seq_cst, align 4
  ret void
}

; A worker that finds a job's tasks all taken when it gets there (its core is busy with other
; processes, or it slept) halves its idle spin, down to sleeping at once: spinning then only
; takes a core the caller could use. Running a task restores the full spin.
define ptr @tg_pool_worker(ptr %arg) {
entry:
  %full0 = load atomic i64, ptr @spin monotonic, align 8
  br label %top
top:
  %seen = phi i64 [ 4294967296, %entry ], [ %seen, %idle ], [ %g, %job ], [ %seen, %back ]
  %budget = phi i64 [ %full0, %entry ], [ %budget, %idle ], [ %nb, %job ], [ %budget, %back ]
  %q = load atomic i32, ptr @quit seq_cst, align 4
  %stop = icmp ne i32 %q, 0
  br i1 %stop, label %exit, label %look
look:
  %s = load atomic i64, ptr @state seq_cst, align 8
  %g = lshr i64 %s, 32
  %idx = and i64 %s, 4294967295
  %new = icmp ne i64 %g, %seen
  %open = icmp ne i64 %idx, CLOSED
  %go = and i1 %new, %open
  br i1 %go, label %job, label %spin
job:
  %fn = load atomic ptr, ptr @job_fn seq_cst, align 8
  %table = load atomic ptr, ptr @job_table seq_cst, align 8
  %n = load atomic i64, ptr @job_n seq_cst, align 8
  %ran = call i64 @work(ptr %fn, ptr %table, i64 %n, i64 %g)
  %hit = icmp ne i64 %ran, 0
  %full = load atomic i64, ptr @spin monotonic, align 8
  %half = lshr i64 %budget, 1
  %nb = select i1 %hit, i64 %full, i64 %half
  br label %top
spin:
  %k = phi i64 [ 0, %look ], [ %k1, %still ]
  %patient = icmp ult i64 %k, %budget
  br i1 %patient, label %pause, label %sleep
pause:
  call void @relax()
  %k1 = add i64 %k, 1
  %s2 = load atomic i64, ptr @state seq_cst, align 8
  %changed = icmp ne i64 %s2, %s
  %q2 = load atomic i32, ptr @quit monotonic, align 4
  %qq = icmp ne i32 %q2, 0
  %wake = or i1 %changed, %qq
  br i1 %wake, label %idle, label %still
still:
  br label %spin
idle:
  br label %top
sleep:
  %v = load atomic i32, ptr @futex seq_cst, align 4
  %a = atomicrmw add ptr @sleepers, i32 1 seq_cst
  %s3 = load atomic i64, ptr @state seq_cst, align 8
  %q3 = load atomic i32, ptr @quit seq_cst, align 4
  %moved = icmp ne i64 %s3, %s
  %qs = icmp ne i32 %q3, 0
  %skip = or i1 %moved, %qs
  br i1 %skip, label %back, label %block
block:
  %v64 = zext i32 %v to i64
  %r = call i64 (i64, ...) @syscall(i64 SYS_FUTEX, ptr @futex, i64 FUTEX_WAIT, i64 %v64, ptr null)
  br label %back
back:
  %b = atomicrmw sub ptr @sleepers, i32 1 seq_cst
  br label %top
exit:
  ret ptr null
}

; stop: wait for the running job, make callers run inline, tell workers to exit
define void @tg_pool_stop() {
entry:
  br label %lock
lock:
  %l = cmpxchg ptr @busy, i32 0, i32 1 seq_cst seq_cst
  %got = extractvalue { i32, i1 } %l, 1
  br i1 %got, label %stop, label %yield
yield:
  %y = call i32 @sched_yield()
  br label %lock
stop:
  store atomic i64 0, ptr @workers seq_cst, align 8
  store atomic i32 1, ptr @quit seq_cst, align 4
  %f = atomicrmw add ptr @futex, i32 1 seq_cst
  %r = call i64 (i64, ...) @syscall(i64 SYS_FUTEX, ptr @futex, i64 FUTEX_WAKE, i64 2147483647)
  store atomic i32 0, ptr @busy seq_cst, align 4
  ret void
}

; before starting workers (also in a forked child, whose copy of the state may be mid-job)
define void @tg_pool_reset(i64 %spin) {
  store atomic i32 0, ptr @quit seq_cst, align 4
  store atomic i32 0, ptr @sleepers seq_cst, align 4
  store atomic i64 0, ptr @workers seq_cst, align 8
  store atomic i64 CLOSED, ptr @state seq_cst, align 8
  store atomic i64 %spin, ptr @spin seq_cst, align 8
  store atomic i32 0, ptr @busy seq_cst, align 4
  ret void
}

define void @tg_pool_set_workers(i64 %n) {
  store atomic i64 %n, ptr @workers seq_cst, align 8
  ret void
}
"""

_SYMBOLS = ("tg_parallel_for", "tg_pool_worker", "tg_pool_stop", "tg_pool_reset",
            "tg_pool_set_workers")


def supported() -> bool:
    return (sys.platform.startswith("linux") and platform.machine().lower() in SYS_FUTEX
            and os.environ.get("TRACEGRAD_NATIVE_POOL", "1") not in ("0", ""))


def _ir_text() -> str:
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    text = (_IR.replace("SYS_FUTEX", str(SYS_FUTEX[platform.machine().lower()]))
            .replace("FUTEX_WAKE", str(FUTEX_WAKE_PRIVATE))
            .replace("FUTEX_WAIT", str(FUTEX_WAIT_PRIVATE))
            .replace("CLOSED", str(CLOSED))
            .replace("SPIN", str(DEFAULT_SPIN)))
    if x86:
        return (text.replace("PAUSE_DECL", "declare void @llvm.x86.sse2.pause()")
                .replace("PAUSE_CALL", "call void @llvm.x86.sse2.pause()"))
    return (text.replace("PAUSE_DECL", "declare void @llvm.aarch64.hint(i32)")
            .replace("PAUSE_CALL", "call void @llvm.aarch64.hint(i32 1)"))


class NativePool:
    """`n_threads - 1` pthreads running `tg_pool_worker`, plus whichever thread calls."""

    def __init__(self) -> None:
        from .jit import _lljit, _lock
        obj = emit_object(optimise(_ir_text()))
        with _lock:
            lib = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
            for s in _SYMBOLS:
                lib = lib.export_symbol(s)
            self._tracker = lib.link(_lljit(), "tg_native_pool")
        addr = {s: self._tracker[s] for s in _SYMBOLS}
        self.parallel_for_address = addr["tg_parallel_for"]
        self._worker = ctypes.c_void_p(addr["tg_pool_worker"])
        self._stop = ctypes.CFUNCTYPE(None)(addr["tg_pool_stop"])
        self._reset = ctypes.CFUNCTYPE(None, ctypes.c_int64)(addr["tg_pool_reset"])
        self._set_workers = ctypes.CFUNCTYPE(None, ctypes.c_int64)(addr["tg_pool_set_workers"])
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p,
                                              ctypes.c_void_p, ctypes.c_void_p]
        self._libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
        self._threads: list[int] = []
        self.n_threads = 1

    def start(self, n_threads: int) -> None:
        """Stop the current workers and start `n_threads - 1` new ones."""
        self.stop()
        spin = int(os.environ.get("TRACEGRAD_SPIN", DEFAULT_SPIN))
        self._reset(spin)
        self.forget_and_start(max(1, int(n_threads)))

    def forget_and_start(self, n_threads: int) -> None:
        """Start workers without joining any (a forked child has none of its parent's)."""
        self._threads = []
        self._reset(int(os.environ.get("TRACEGRAD_SPIN", DEFAULT_SPIN)))
        for _ in range(n_threads - 1):
            tid = ctypes.c_ulong()
            rc = self._libc.pthread_create(ctypes.byref(tid), None, self._worker, None)
            if rc != 0:
                break
            self._threads.append(tid.value)
        self.n_threads = len(self._threads) + 1
        self._set_workers(len(self._threads))

    def stop(self) -> None:
        if not self._threads:
            return
        self._stop()
        for tid in self._threads:
            self._libc.pthread_join(tid, None)
        self._threads = []
        self.n_threads = 1

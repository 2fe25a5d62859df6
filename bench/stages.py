"""Where a compiled mlp_step spends its time, step by step of its native entry: each call the
entry makes (a kernel, run by the pool when it has several tasks, or a region of kernels
sharing the pool) is timed with the CPU's cycle counter, read before and after it inside the
compiled code, so Python and the call's own overhead stay out. The mlp_step breakdown in
RESULTS.md is this script's output.

How: the entry's lowering (`codegen.module._Lowering.emit_steps`, a private method) is
wrapped for this process only, storing `llvm.readcyclecounter` after every step into a numpy
buffer whose address is compiled in. So that such code never reaches another process, this
script compiles into a fresh, temporary compile cache (set before tracegrad is imported).
x86-64 only (the cycle counter is the TSC, which runs at a constant rate); the counter is
calibrated against time.perf_counter.

Run: python bench/stages.py [batch] [steps]
"""
from __future__ import annotations

import atexit
import os
import platform
import shutil
import sys
import tempfile
import time

# before numpy and tracegrad load: threads pinned and OPENBLAS_CORETYPE dropped (common), and
# a compile cache of this process's own
_CACHE = os.environ["TRACEGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracegrad-stages-")
atexit.register(shutil.rmtree, _CACHE, True)
from common import pin_threads  # noqa: E402

pin_threads()

import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402

import tracegrad.codegen.module as module  # noqa: E402
from tracegrad.codegen.linalg import gemm_dims  # noqa: E402
from wl_mlp import data, init, tracegrad_step  # noqa: E402

TICKS = np.zeros(1024, np.int64)    # the counter after each step (0: before the first)
STEPS: list[str] = []               # what each step of the last entry lowered runs


def _describe(lowering, name: str, tasks: int) -> str:
    """A step's kernel (k<group ids>) or region (r<stage>: labelled with its stage's groups),
    its tasks and what its groups compute."""
    groups = lowering.plan.groups
    if name.startswith("r") and name[1:].isdigit():
        ids = [gi for gi, si in lowering.stage_of.items() if si == int(name[1:])]
    elif name.startswith("k"):
        ids = [int(part) for part in name[1:].split("_") if part.isdigit()]
    else:
        ids = []
    parts = []
    for gi in ids:
        g = groups[gi]
        if g.kind == "matmul":
            batch, m, kk, n = gemm_dims(g)
            parts.append(f"matmul {m}x{kk}x{n}" + (" (update)" if g.acc is not None else ""))
        else:
            ops = sorted({e.op for e in g.eqns})
            parts.append(f"{g.kind} {'x'.join(map(str, g.domain)) or 'scalar'} "
                         f"({','.join(ops[:4])}{',...' if len(ops) > 4 else ''})")
    return f"{name:7s} {tasks} task{'s' if tasks > 1 else ' '}  " + "; ".join(parts)


def _instrument() -> None:
    emit = module._Lowering.emit_steps

    def timed(self, b: ir.IRBuilder, table: ir.Value, steps: list) -> None:
        if self.prefix or len(steps) + 1 > len(TICKS):    # (a scan body's lowering)
            return emit(self, b, table, steps)
        i64 = ir.IntType(64)
        try:
            counter = self.module.get_global("llvm.readcyclecounter")
        except KeyError:
            counter = ir.Function(self.module, ir.FunctionType(i64, []),
                                  "llvm.readcyclecounter")

        def tick(i: int) -> None:
            at = ir.Constant(i64, TICKS.ctypes.data + 8 * i)
            b.store(b.call(counter, []), b.inttoptr(at, i64.as_pointer()))
        STEPS.clear()
        tick(0)
        for i, (k, tasks) in enumerate(steps):
            emit(self, b, table, [(k, tasks)])
            STEPS.append(_describe(self, k.name if isinstance(k, ir.Function)
                                   else k.fn.name, tasks))
            tick(i + 1)
    module._Lowering.emit_steps = timed


def main() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        sys.exit("bench/stages.py reads the x86-64 time-stamp counter")
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    _instrument()
    step = tracegrad_step()
    params = init()
    x, y = data(batch)
    for _ in range(30):
        step(params, x, y)
    n = len(STEPS)
    # ticks per second: the first ticks of two steps 0.3 s apart, against perf_counter from
    # the end of the first to the end of the second (off by a step's length in 0.3 s: <1%)
    step(params, x, y)
    c0, t0 = int(TICKS[0]), time.perf_counter()
    time.sleep(0.3)
    step(params, x, y)
    rate = (int(TICKS[0]) - c0) / (time.perf_counter() - t0)
    per = np.zeros((reps, n))
    walls = np.zeros(reps)
    for r in range(reps):
        t = time.perf_counter()
        step(params, x, y)
        walls[r] = time.perf_counter() - t
        per[r] = np.diff(TICKS[:n + 1])
    us = np.median(per, axis=0) / rate * 1e6
    print(f"mlp_step, batch {batch}: {reps} steps, median wall {np.median(walls) * 1e6:.0f} us, "
          f"entry steps' medians add to {us.sum():.0f} us")
    small = 0.0
    for what, t in zip(STEPS, us, strict=True):
        if t >= 1.0:
            print(f"  {t:8.1f} us  {what}")
        else:
            small += t
    print(f"  {small:8.1f} us  the other {sum(t < 1.0 for t in us)} steps (under 1 us each)")


if __name__ == "__main__":
    main()

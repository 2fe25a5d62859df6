"""Where a cold pass of the `dynamic` workload spends its time, call by call and phase by
phase: what to read before working on that target (BENCH.md's `dynamic`; wl_dynamic.py runs
the verdict). Each pass runs in a fresh process with an empty compile cache, as the benchmark
does, so first-call costs (Python's own warm-up included) show as they count there.

Per pass: the first calls one by one (every length is new until the 12th call), then the
repeats of lengths seen before; the phases are the pipeline's stages, timed by wrapping them
(a stage that no longer exists under its name is left out, and the calls' totals still hold).

With --warm, each process first runs the same workload at another size (H=48: every graph,
template and shape-keyed rule new again for H=64) before the pass it times, so Python's and
numpy's first-execution costs are paid beforehand: the pass then shows the work a new shape
costs, and its difference from the cold pass is what a fresh process pays on top.

Run: python bench/dynamic_breakdown.py [jit|tensor] [passes] [--warm]
"""
from __future__ import annotations

import collections
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
FIRST = 11      # calls whose lengths are all new (wl_dynamic.lengths: 11 distinct)

# (module, attribute path, label) of the stages timed in each kind of pass
STAGES = {
    "jit": [
        ("tracegrad.tracer.transforms", "trace", "trace_f"),
        ("tracegrad.tracer.transforms", "ir.roll_loops", "roll"),
        ("tracegrad.tracer.jit", "compile_graph", "cgraph"),
        ("tracegrad.tracer.transforms", "ir.backward_pass", "backward"),
        ("tracegrad.tracer.jit", "loop_form", "loop_form"),
        ("tracegrad.ir.template", "Template.derive", "derive"),
        ("tracegrad.ir.template", "Template.matches", "check"),
        ("tracegrad.ir.template", "Template.instantiate", "instantiate"),
        ("tracegrad.tracer.executor", "Tiered.__call__", "run"),
    ],
    "tensor": [
        ("tracegrad.tracer.autograd_exec", "tape_walk", "tape_walk"),
        ("tracegrad.tracer.autograd_exec", "_backward_graph", "compose"),
        ("tracegrad.tracer.autograd_exec", "autograd_template.learn", "derive"),
        ("tracegrad.tracer.autograd_exec", "_from_template", "write"),
        ("tracegrad.tracer.autograd_compose", "Plan.__call__", "run plan"),
    ],
}


def _wrap(stages: list, spent: dict) -> None:
    """Time each stage into spent[label] (outermost calls only: a stage calling itself
    counts once)."""
    for mod, path, label in stages:
        owner = importlib.import_module(mod)
        *parents, name = path.split(".")
        try:
            for p in parents:
                owner = getattr(owner, p)
            fn = getattr(owner, name)
        except AttributeError:
            continue
        depth = [0]

        def timed(*a, _fn=fn, _label=label, _depth=depth, **k):
            _depth[0] += 1
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                _depth[0] -= 1
                if not _depth[0]:
                    spent[_label] += time.perf_counter() - t0
        setattr(owner, name, timed)


def _workload(kind: str, spent: dict, H: int) -> Callable:
    """One iteration of the workload at hidden size H, as a function of the length T."""
    import numpy as np
    import tracegrad as tg
    rng = np.random.default_rng(0)
    w0, u0 = ((rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32) for _ in "wu")
    xs0 = rng.standard_normal((16, 1, H)).astype(np.float32)
    if kind == "jit":
        def loss(W, U, xs, T):
            h = tg.zeros((1, H))
            for t in range(T):
                h = tg.tanh(h @ W + xs[t] @ U)
            return tg.sum(h * h)
        step = tg.jit(tg.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
        return lambda T: step(w0, u0, xs0, T)
    Wt = tg.tensor(w0, requires_grad=True)
    Ut = tg.tensor(u0, requires_grad=True)
    xt = [tg.tensor(x) for x in xs0]

    def run(T: int) -> None:
        h = tg.zeros(1, H)
        for t in range(T):
            h = tg.tanh(h @ Wt + xt[t] @ Ut)
        loss = (h * h).sum()
        t0 = time.perf_counter()
        loss.backward()
        spent["backward()"] += time.perf_counter() - t0
        Wt.grad = None
        Ut.grad = None
    return run


def _pass(kind: str, warm: bool) -> dict:
    """One pass in this process: per call, its seconds and its stages' seconds. `warm`: run
    the workload at H=48 first (see the module docstring)."""
    import wl_dynamic as D
    spent: dict = collections.defaultdict(float)
    _wrap(STAGES[kind], spent)
    if warm:
        before = _workload(kind, spent, 48)
        for T in D.lengths():
            before(T)
    run = _workload(kind, spent, D.H)
    calls = []
    for T in D.lengths():
        spent.clear()
        t0 = time.perf_counter()
        run(T)
        total = time.perf_counter() - t0
        calls.append({"T": T, "total": total, **spent})
    return {"calls": calls}


def _fresh(kind: str, warm: bool) -> dict:
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=tempfile.mkdtemp(prefix="tracegrad-bench-"))
    done = subprocess.run([sys.executable, __file__, "--pass", kind] + ["--warm"] * warm,
                          capture_output=True, text=True, env=env, cwd=HERE)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} pass failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(kind: str, passes: int, warm: bool = False) -> None:
    runs = [_fresh(kind, warm)["calls"] for _ in range(passes)]
    n = len(runs[0])

    def med(i: int, key: str) -> float:
        return statistics.median(r[i].get(key, 0.0) for r in runs) * 1e6

    labels = [label for _, _, label in STAGES[kind]] + \
        (["backward()"] if kind == "tensor" else [])
    groups = [(f"call {i} (T={runs[0][i]['T']})", [i]) for i in range(3)] + \
        [(f"calls 3-{FIRST - 1}, mean", list(range(3, FIRST))),
         (f"calls {FIRST}-{n - 1} (repeats), mean", list(range(FIRST, n)))]
    what = " (code warmed on H=48 first)" if warm else ""
    print(f"dynamic, {kind}: median of {passes} fresh processes{what}, microseconds")
    head = f"{'':32s}{'total':>8s}" + "".join(f"{lab:>12s}" for lab in labels)
    print(head)
    for name, idx in groups:
        row = [statistics.mean(med(i, "total") for i in idx)] + \
            [statistics.mean(med(i, lab) for i in idx) for lab in labels]
        print(f"{name:32s}{row[0]:8.0f}" + "".join(f"{v:12.0f}" for v in row[1:]))
    totals = [sum(c["total"] for c in r) for r in runs]
    firsts = [sum(c["total"] for c in r[:FIRST]) for r in runs]
    whole, first = statistics.median(totals), statistics.median(firsts)
    rest = statistics.median(t - f for t, f in zip(totals, firsts))
    print(f"pass: {whole * 1e3:.2f} ms ({whole / n * 1e3:.3f} ms/iter); first {FIRST} calls "
          f"{first * 1e3:.2f} ms, the {n - FIRST} repeats {rest * 1e3:.2f} ms")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--warm"]
    warm = "--warm" in sys.argv
    if args[:1] == ["--pass"]:
        from common import pin_threads
        pin_threads()
        print(json.dumps(_pass(args[1], warm)))
    else:
        kinds = args[:1] or ["jit", "tensor"]
        count = int(args[1]) if len(args) > 1 else 7
        for k in kinds:
            report(k, count, warm)
            print()

"""Shared benchmark plumbing: thread pinning, optional anchors, timing by medians."""
from __future__ import annotations

import importlib
import os
import statistics
import time
from typing import Callable

THREADS = int(os.environ.get("BENCH_THREADS", "2"))


def pin_threads() -> None:
    """Pin every framework to the same thread count; call before importing any of them."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "TRACEGRAD_NUM_THREADS"):
        os.environ.setdefault(var, str(THREADS))
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true "
                          f"intra_op_parallelism_threads={THREADS}")
    # OPENBLAS_CORETYPE mis-tunes BLAS on this machine class; benchmarks only (never tests).
    os.environ.pop("OPENBLAS_CORETYPE", None)
    os.environ.pop("OPENBLAS_L2_SIZE", None)
    # "Compiles included" means cold: native code cached on disk by an earlier run must not
    # count, so every run starts from an empty compile cache of its own.
    if "TRACEGRAD_CACHE_DIR" not in os.environ:
        import tempfile
        os.environ["TRACEGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracegrad-bench-cache-")


def optional(name: str):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def torch_mod():
    torch = optional("torch")
    if torch is not None:
        torch.set_num_threads(THREADS)
    return torch


def median_time(fn: Callable[[], object], reps: int, warmup: int = 2,
                min_time: float = 0.0) -> float:
    """Median seconds of `fn()` over `reps` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start) < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) > 100 * reps:
            break
    return statistics.median(times)


def interleaved(fns: dict, reps: int, rounds: int = 10, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each function, timed in alternating blocks of about reps/rounds
    calls (after `warmup` calls per block), so that all of them see the same machine load:
    on a shared 2-core VM, load that comes and goes between two back-to-back medians moved
    the tracegrad/jax ratio between 0.7x and 1.6x from run to run."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    per = max(2, -(-reps // rounds))
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(warmup):
                fn()
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def block(x):
    """Wait for asynchronous results (jax) before stopping the clock."""
    ready = getattr(x, "block_until_ready", None)
    if ready is not None:
        ready()
    elif isinstance(x, (tuple, list)):
        for y in x:
            block(y)
    elif isinstance(x, dict):
        for y in x.values():
            block(y)
    return x

"""BENCH.md's `dynamic` workload with Tensors: an RNN h = tanh(h@W + x_t@U), H=64, whose
sequence length changes every iteration (T = 5 + (7i mod 11)), loss sum(h*h), gradients of W
and U, re-recorded every iteration; 60 iterations averaged, compiles included. Prints ms/iter
for tracegrad (its first pass in this process, then the best of a few more, split into the
forward recording and `backward()`) and, when installed, torch eager (the median of a few
passes: this machine is shared, so one pass of the reference can be far off).

Run: python bench/dynamic_tensor.py [iterations]
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

H = 64
REPEATS = 5


def lengths(n: int) -> list[int]:
    return [5 + (7 * i) % 11 for i in range(n)]


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    u = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    xs = rng.standard_normal((16, 1, H)).astype(np.float32)
    return w, u, xs


def _run(lib, n: int, split: dict | None = None) -> tuple[float, float]:
    """ms/iter and the last loss of the workload in `lib` (tracegrad or torch: the same code).
    `split`, if given, gets the ms/iter spent recording the forward and in backward()."""
    w0, u0, xs0 = data()
    W = lib.tensor(w0, requires_grad=True)
    U = lib.tensor(u0, requires_grad=True)
    xs = [lib.tensor(x) for x in xs0]
    forward = 0.0
    clock = time.perf_counter
    t0 = clock()
    for T in lengths(n):
        f0 = clock()
        h = lib.zeros(1, H)
        for t in range(T):
            h = lib.tanh(h @ W + xs[t] @ U)
        loss = (h * h).sum()
        forward += clock() - f0
        loss.backward()
        W.grad = None
        U.grad = None
    elapsed = clock() - t0
    if split is not None:
        split["forward"] = forward / n * 1e3
        split["backward"] = (elapsed - forward) / n * 1e3
    return elapsed / n * 1e3, float(loss.item())


def run_tracegrad(n: int, split: dict | None = None) -> tuple[float, float]:
    import tracegrad as tg
    return _run(tg, n, split)


def run_torch(n: int) -> tuple[float, float] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)
    runs = [_run(torch, n) for _ in range(REPEATS)]
    return statistics.median(ms for ms, _ in runs), runs[-1][1]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    tg_ms, tg_loss = run_tracegrad(n)
    print(f"tracegrad  {tg_ms:8.3f} ms/iter  (loss {tg_loss:.5f}; first pass, compiles incl.)")
    best, split = None, {}
    for _ in range(REPEATS):
        parts: dict = {}
        ms, _ = run_tracegrad(n, parts)
        if best is None or ms < best:
            best, split = ms, parts
    print(f"tracegrad  {best:8.3f} ms/iter  (every graph seen before, best of {REPEATS}: "
          f"forward {split['forward']:.3f}, backward {split['backward']:.3f})")
    ref = run_torch(n)
    if ref is not None:
        th_ms, th_loss = ref
        print(f"torch eager {th_ms:7.3f} ms/iter  (loss {th_loss:.5f}; median of {REPEATS})")
        print(f"ratio       {tg_ms / th_ms:7.2f}x torch eager (target <= 0.5x); every graph "
              f"seen before {best / th_ms:.2f}x")


if __name__ == "__main__":
    main()

"""dynamic: an RNN whose sequence length changes every iteration, compiles included.

"Compiles included" is measured cold: each number is the first ITERS iterations of a fresh
process (tracegrad with an empty compile cache), so every trace, differentiation, template
and first call is counted. One such pass is a single sample on a shared machine, so each
framework runs in PROCESSES fresh processes, interleaved, and the median counts.

Run alone: python bench/wl_dynamic.py [jit|tensor|torch] prints one pass (ms/iter)."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from common import optional, pin_threads, torch_mod

H = 64
ITERS = 60
# 11: on the shared 2-vCPU machines a process runs in a fast or a slow stretch (a pure-Python
# loop timed in six fresh processes in a row took 219-375 ms, two clusters), so with 5 the
# median of each framework is decided by how many of its processes drew a slow stretch
PROCESSES = int(os.environ.get("BENCH_DYNAMIC_PROCESSES", "11"))
HERE = os.path.dirname(os.path.abspath(__file__))


def lengths(iters: int = ITERS) -> list[int]:
    return [5 + (7 * i) % 11 for i in range(iters)]


def _data():
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((H, H)) / 8).astype(np.float32)
    U = (rng.standard_normal((H, H)) / 8).astype(np.float32)
    xs = rng.standard_normal((16, 1, H)).astype(np.float32)
    return W, U, xs


def _per_iter(fn) -> float:
    t0 = time.perf_counter()
    for T in lengths():
        fn(T)
    return (time.perf_counter() - t0) / ITERS


def _jit_pass() -> float:
    import tracegrad as tg
    W, U, xs = _data()

    def loss(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)
    step = tg.jit(tg.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
    return _per_iter(lambda T: step(W, U, xs, T))


def _tensor_pass() -> float:
    import dynamic_tensor   # the Tensor-API version, re-recorded every iteration
    return dynamic_tensor.run_tracegrad(ITERS)[0] / 1e3


def _torch_pass() -> float | None:
    torch = torch_mod()
    if torch is None:
        return None
    W, U, xs = _data()
    Wt = torch.from_numpy(W).requires_grad_(True)
    Ut = torch.from_numpy(U).requires_grad_(True)
    xt = torch.from_numpy(xs)

    def tstep(T):
        h = torch.zeros(1, H)
        for t in range(T):
            h = torch.tanh(h @ Wt + xt[t] @ Ut)
        loss = (h * h).sum()
        return torch.autograd.grad(loss, (Wt, Ut))
    return _per_iter(tstep)


PASSES = {"jit": _jit_pass, "tensor": _tensor_pass, "torch": _torch_pass}


def _fresh_pass(kind: str) -> float | None:
    """Seconds per iteration of one pass of `kind` in a fresh process."""
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=tempfile.mkdtemp(prefix="tracegrad-bench-"))
    done = subprocess.run([sys.executable, os.path.join(HERE, "wl_dynamic.py"), kind],
                          capture_output=True, text=True, env=env, cwd=HERE)
    if done.returncode != 0:
        raise RuntimeError(f"dynamic {kind} pass failed:\n{done.stderr[-2000:]}")
    value = done.stdout.strip().splitlines()[-1]
    return None if value == "None" else float(value)


def run() -> dict[str, float]:
    samples: dict[str, list[float]] = {"jit": [], "tensor": [], "torch": []}
    for _ in range(PROCESSES):
        for kind in samples:
            t = _fresh_pass(kind)
            if t is not None:
                samples[kind].append(t)
    names = {"jit": "tracegrad jit(T static)", "tensor": "tracegrad Tensor", "torch": "torch"}
    out = {names[k]: statistics.median(v) for k, v in samples.items() if v}
    spread = ", ".join(f"{k} {min(v) * 1e3:.3f}-{max(v) * 1e3:.3f}" for k, v in samples.items()
                       if v)
    print(f"  (median of {PROCESSES} fresh processes each; ms/iter range: {spread})")
    if len(samples["torch"]) == PROCESSES:
        # the same passes as ratios to the torch pass of their round (not the verdict: it
        # takes the medians above); on a machine alternating between fast and slow stretches
        # the ratio of two medians jumps with how many slow passes each side drew
        paired = []
        for k in ("jit", "tensor"):
            r = [a / b for a, b in zip(samples[k], samples["torch"], strict=True)]
            paired.append(f"{k} {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
        print(f"  (per-round ratios to torch, median (range): {', '.join(paired)})")

    jax = optional("jax")
    if jax is not None:     # not the target's anchor, and slow (a compile per length): once
        jnp = jax.numpy
        W, U, xs = _data()

        def jloss(W, U, xs, T):
            h = jnp.zeros((1, H))
            for t in range(T):
                h = jnp.tanh(h @ W + xs[t] @ U)
            return jnp.sum(h * h)
        jstep = jax.jit(jax.value_and_grad(jloss, argnums=(0, 1)), static_argnums=(3,))
        out["jax.jit"] = _per_iter(lambda T: jax.block_until_ready(jstep(W, U, xs, T)))
    return out


if __name__ == "__main__":
    pin_threads()
    print(PASSES[sys.argv[1] if len(sys.argv) > 1 else "jit"]())

"""dynamic: an RNN whose sequence length changes every iteration, compiles included."""
from __future__ import annotations

import time

import numpy as np

from common import optional, torch_mod

H = 64
ITERS = 60


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


def run() -> dict[str, float]:
    W, U, xs = _data()
    out: dict[str, float] = {}
    import tracegrad as tg

    def loss(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)
    step = tg.jit(tg.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
    out["tracegrad jit(T static)"] = _per_iter(lambda T: step(W, U, xs, T))

    try:
        import dynamic_tensor   # the Tensor-API version, re-recorded every iteration
    except ImportError:
        dynamic_tensor = None
    if dynamic_tensor is not None:
        out["tracegrad Tensor"] = dynamic_tensor.run_tracegrad(ITERS)[0] / 1e3

    torch = torch_mod()
    if torch is not None:
        Wt = torch.from_numpy(W).requires_grad_(True)
        Ut = torch.from_numpy(U).requires_grad_(True)
        xt = torch.from_numpy(xs)

        def tstep(T):
            h = torch.zeros(1, H)
            for t in range(T):
                h = torch.tanh(h @ Wt + xt[t] @ Ut)
            loss = (h * h).sum()
            return torch.autograd.grad(loss, (Wt, Ut))
        out["torch"] = _per_iter(tstep)

    jax = optional("jax")
    if jax is not None:
        jnp = jax.numpy

        def jloss(W, U, xs, T):
            h = jnp.zeros((1, H))
            for t in range(T):
                h = jnp.tanh(h @ W + xs[t] @ U)
            return jnp.sum(h * h)
        jstep = jax.jit(jax.value_and_grad(jloss, argnums=(0, 1)), static_argnums=(3,))
        out["jax.jit"] = _per_iter(lambda T: jax.block_until_ready(jstep(W, U, xs, T)))
    return out

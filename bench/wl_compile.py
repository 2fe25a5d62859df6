"""compile: first call (trace + differentiate + compile) of a 100-step elementwise loop."""
from __future__ import annotations

import time

import numpy as np

from common import block, optional

STEPS = 100


def run(reps: int = 3) -> dict[str, float]:
    x = np.linspace(-1, 1, 1000).astype(np.float32)
    out: dict[str, float] = {}

    import tracegrad as tg
    times = []
    for r in range(reps):
        c = 1.01 + 1e-6 * (r + 1 + time.time_ns() % 997)   # a new graph: no cache hit

        def f(x, c=c):
            for _ in range(STEPS):
                x = tg.sin(x) * c + 0.1 * tg.tanh(x)
            return tg.sum(x)
        t0 = time.perf_counter()
        tg.jit(tg.value_and_grad(f))(x)
        times.append(time.perf_counter() - t0)
    out["tracegrad"] = float(np.median(times))

    jax = optional("jax")
    if jax is not None:
        jnp = jax.numpy
        times = []
        for r in range(reps):
            c = 1.01 + 1e-6 * (r + 1 + time.time_ns() % 997)

            def fj(x, c=c):
                for _ in range(STEPS):
                    x = jnp.sin(x) * c + 0.1 * jnp.tanh(x)
                return jnp.sum(x)
            t0 = time.perf_counter()
            block(jax.jit(jax.value_and_grad(fj))(x))
            times.append(time.perf_counter() - t0)
        out["jax.jit"] = float(np.median(times))
    return out

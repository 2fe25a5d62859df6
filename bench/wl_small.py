"""small: per-call overhead of a cached value_and_grad on two 8-element vectors. tracegrad and
jax.jit (the target's anchor) are timed in alternating blocks: back to back, the machine's
slow stretches moved single runs between 0.29x and 0.68x."""
from __future__ import annotations

import numpy as np

from common import block, interleaved, median_time, optional, torch_mod


def run(reps: int = 2000) -> dict[str, float]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    out: dict[str, float] = {}

    import tracegrad as tg

    def f_tg(a, b):
        y = a
        for i in range(10):
            y = tg.sin(y * b + 0.1 * i)
        return tg.sum(y * y)
    step = tg.jit(tg.value_and_grad(f_tg, argnums=(0, 1)))
    timed = {"tracegrad": lambda: step(a, b)}

    jax = optional("jax")
    if jax is not None:
        jnp = jax.numpy

        def f_jax(a, b):
            y = a
            for i in range(10):
                y = jnp.sin(y * b + 0.1 * i)
            return jnp.sum(y * y)
        jstep = jax.jit(jax.value_and_grad(f_jax, argnums=(0, 1)))
        aj, bj = jnp.asarray(a), jnp.asarray(b)
        timed["jax.jit"] = lambda: block(jstep(aj, bj))
    for fn in timed.values():       # the first calls compile
        for _ in range(20):
            fn()
    out.update(interleaved(timed, reps, rounds=20))

    torch = torch_mod()
    if torch is not None:
        at, bt = torch.from_numpy(a), torch.from_numpy(b)

        def f_torch():
            x = at.detach().requires_grad_(True)
            z = bt.detach().requires_grad_(True)
            y = x
            for i in range(10):
                y = torch.sin(y * z + 0.1 * i)
            s = (y * y).sum()
            return s, torch.autograd.grad(s, (x, z))
        out["torch"] = median_time(f_torch, reps // 4, warmup=20)

    ag = optional("autograd")
    if ag is not None:
        anp = ag.numpy

        def f_ag(a, b):
            y = a
            for i in range(10):
                y = anp.sin(y * b + 0.1 * i)
            return anp.sum(y * y)
        vg = ag.value_and_grad(lambda ab: f_ag(ab[0], ab[1]))
        out["autograd"] = median_time(lambda: vg((a, b)), reps // 10, warmup=5)
    return out

"""ew_chain: value_and_grad of an elementwise chain over 2^22 elements."""
from __future__ import annotations

import numpy as np

from common import block, median_time, optional, torch_mod

N = 1 << 22


def _x(n: int = N) -> np.ndarray:
    return np.random.default_rng(0).uniform(-2, 2, n).astype(np.float32)


def run(n: int = N, reps: int = 10) -> dict[str, float]:
    x = _x(n)
    out: dict[str, float] = {}

    import tracegrad as tg

    def f_tg(x):
        return tg.sum(tg.tanh(x) * tg.sigmoid(x) + tg.exp(-x * x) * tg.log1p(x * x)
                      + tg.sin(x) * tg.cos(x))
    step = tg.jit(tg.value_and_grad(f_tg))
    out["tracegrad"] = median_time(lambda: step(x), reps)

    def by_hand():
        t, s, e, l1, sn, c = (np.tanh(x), 1 / (1 + np.exp(-x)), np.exp(-x * x),
                              np.log1p(x * x), np.sin(x), np.cos(x))
        val = np.sum(t * s + e * l1 + sn * c)
        g = ((1 - t * t) * s + t * s * (1 - s) + (-2 * x) * e * l1 + e * (2 * x) / (1 + x * x)
             + c * c - sn * sn)
        return val, g
    out["numpy"] = median_time(by_hand, reps)

    jax = optional("jax")
    if jax is not None:
        jnp = jax.numpy

        def f_jax(x):
            return jnp.sum(jnp.tanh(x) * jax.nn.sigmoid(x) + jnp.exp(-x * x) * jnp.log1p(x * x)
                           + jnp.sin(x) * jnp.cos(x))
        jstep = jax.jit(jax.value_and_grad(f_jax))
        xj = jnp.asarray(x)
        out["jax.jit"] = median_time(lambda: block(jstep(xj)), reps)

    torch = torch_mod()
    if torch is not None:
        def f_torch(xt):
            xt = xt.detach().requires_grad_(True)
            y = (torch.tanh(xt) * torch.sigmoid(xt) + torch.exp(-xt * xt) * torch.log1p(xt * xt)
                 + torch.sin(xt) * torch.cos(xt)).sum()
            (g,) = torch.autograd.grad(y, xt)
            return y, g
        xt = torch.from_numpy(x)
        out["torch"] = median_time(lambda: f_torch(xt), reps)
        try:
            compiled = torch.compile(f_torch)
            out["torch.compile"] = median_time(lambda: compiled(xt), reps, warmup=3)
        except Exception as e:  # inductor needs a C compiler; report rather than fail
            print(f"  torch.compile unavailable: {type(e).__name__}: {e}"[:200])

    ag = optional("autograd")
    if ag is not None:
        anp = ag.numpy

        def f_ag(x):
            return anp.sum(anp.tanh(x) / (1 + anp.exp(-x)) + anp.exp(-x * x) * anp.log1p(x * x)
                           + anp.sin(x) * anp.cos(x))
        vg = ag.value_and_grad(f_ag)
        out["autograd"] = median_time(lambda: vg(x.astype(np.float32)), max(3, reps // 3))
    return out

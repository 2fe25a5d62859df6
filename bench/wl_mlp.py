"""mlp_step: one SGD step of a 784-512-512-10 tanh MLP with softmax cross-entropy."""
from __future__ import annotations

import numpy as np

from common import block, interleaved, median_time, optional, torch_mod

SIZES = (784, 512, 512, 10)
LR = 0.01


def init(sizes=SIZES, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32))
        params.append(np.zeros(n, np.float32))
    return params


def data(batch: int, sizes=SIZES, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return x, y


def tracegrad_step():
    import tracegrad as tg

    def loss(params, x, y):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = tg.tanh(h @ params[i] + params[i + 1])
        logits = h @ params[-2] + params[-1]
        return tg.nn.functional.cross_entropy(logits, y)

    @tg.jit
    def step(params, x, y):
        value, grads = tg.value_and_grad(loss)(params, x, y)
        return value, [p - LR * g for p, g in zip(params, grads)]
    return step


def jax_step(jax):
    """The same step in JAX, jitted (the anchor)."""
    jnp = jax.numpy

    def jloss(params, x, y):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = jnp.tanh(h @ params[i] + params[i + 1])
        logp = jax.nn.log_softmax(h @ params[-2] + params[-1])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], 1))

    @jax.jit
    def jstep(params, x, y):
        value, grads = jax.value_and_grad(jloss)(params, x, y)
        return value, [p - LR * g for p, g in zip(params, grads)]
    return jstep


def torch_step(torch, params, x, y):
    """The same step in PyTorch eager (the anchor for memory, and compiled by torch.compile)."""
    tp = [torch.from_numpy(p.copy()).requires_grad_(True) for p in params]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def tstep():
        h = xt
        for i in range(0, len(tp) - 2, 2):
            h = torch.tanh(h @ tp[i] + tp[i + 1])
        loss = torch.nn.functional.cross_entropy(h @ tp[-2] + tp[-1], yt)
        grads = torch.autograd.grad(loss, tp)
        with torch.no_grad():
            return loss, [p - LR * g for p, g in zip(tp, grads)]
    return tstep


def numpy_step(params, x, y):
    acts = [x]
    h = x
    for i in range(0, len(params) - 2, 2):
        h = np.tanh(h @ params[i] + params[i + 1])
        acts.append(h)
    logits = h @ params[-2] + params[-1]
    m = logits.max(1, keepdims=True)
    e = np.exp(logits - m)
    p = e / e.sum(1, keepdims=True)
    n = x.shape[0]
    loss = -np.log(p[np.arange(n), y]).mean()
    d = p
    d[np.arange(n), y] -= 1
    d /= n
    grads = [None] * len(params)
    for i in range(len(params) - 2, -1, -2):
        grads[i] = acts[i // 2].T @ d
        grads[i + 1] = d.sum(0)
        if i:
            d = (d @ params[i].T) * (1 - acts[i // 2] ** 2)
    return loss, [p - LR * g for p, g in zip(params, grads)]


def run(batch: int = 128, reps: int = 100, anchors: bool = True) -> dict[str, float]:
    params = init()
    x, y = data(batch)
    out: dict[str, float] = {}
    step = tracegrad_step()
    ours = {"tracegrad": lambda: step(params, x, y)}
    jax = optional("jax") if anchors else None
    if jax is not None:   # the target anchor: timed in turns with tracegrad
        jnp = jax.numpy
        jstep = jax_step(jax)
        jp = [jnp.asarray(p) for p in params]
        xj, yj = jnp.asarray(x), jnp.asarray(y.astype(np.int32))
        ours["jax.jit"] = lambda: block(jstep(jp, xj, yj))
    out.update(interleaved(ours, 2 * reps))
    if not anchors:
        return out
    out["numpy"] = median_time(lambda: numpy_step(params, x, y), reps)

    torch = torch_mod()
    if torch is not None:
        tstep = torch_step(torch, params, x, y)
        out["torch"] = median_time(tstep, reps, warmup=3)
        try:
            ctstep = torch.compile(tstep)
            out["torch.compile"] = median_time(ctstep, reps, warmup=3)
        except Exception as e:
            print(f"  torch.compile unavailable: {type(e).__name__}: {e}"[:200])

    ag = optional("autograd")
    if ag is not None:
        anp = ag.numpy

        def agloss(params):
            h = x
            for i in range(0, len(params) - 2, 2):
                h = anp.tanh(anp.dot(h, params[i]) + params[i + 1])
            logits = anp.dot(h, params[-2]) + params[-1]
            m = anp.max(logits, axis=1, keepdims=True)
            logp = logits - m - anp.log(anp.sum(anp.exp(logits - m), axis=1, keepdims=True))
            return -anp.mean(logp[np.arange(batch), y])
        vg = ag.value_and_grad(agloss)

        def agstep():
            value, grads = vg(params)
            return value, [p - LR * g for p, g in zip(params, grads)]
        out["autograd"] = median_time(agstep, max(3, reps // 2))
    return out

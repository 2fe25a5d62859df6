"""Pure optimizer updates on pytrees of parameters (JAX-style), usable inside `tg.jit`:

    state = tg.optim.adam_init(params)
    params, state = tg.optim.adam_update(params, grads, state, lr=1e-3)

Every function returns new values and mutates nothing, so a whole training step (forward,
backward, update) traces into one graph. Hyperparameters may be Python floats or traced
scalars (a learning-rate schedule then never retraces). The formulas are PyTorch's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..tracer import numpy_api as tnp
from ..tracer.pytree import tree_flatten, tree_map, tree_unflatten


def _zeros_like(x: Any) -> np.ndarray:
    return np.zeros(tuple(x.shape), np.dtype(x.dtype))


def _scalar(h: Any, like: Any) -> Any:
    """A hyperparameter in the dtype of the value it scales (Python numbers stay weak)."""
    if isinstance(h, (int, float)):
        return h
    return tnp.astype(h, like.dtype)


def _one_minus(h: Any) -> Any:
    return 1.0 - h if isinstance(h, (int, float)) else tnp.sub(1.0, h)


def _times(a: Any, b: Any) -> Any:
    both = isinstance(a, (int, float)) and isinstance(b, (int, float))
    return a * b if both else tnp.mul(a, b)


def _map(fn: Any, *trees: Any) -> list[Any]:
    """`fn` over matching leaves; returns the flat list of results (pairs are split later)."""
    flat = [tree_flatten(t)[0] for t in trees]
    return [fn(*leaves) for leaves in zip(*flat, strict=True)]


def _unzip(results: list[tuple], tree: Any) -> tuple:
    td = tree_flatten(tree)[1]
    return tuple(tree_unflatten(td, list(col)) for col in zip(*results, strict=True))


def _step(state: dict) -> Any:
    return tnp.add(state["step"], 1)


# ---- SGD ---------------------------------------------------------------------------------------

def sgd_init(params: Any) -> dict:
    """State for `sgd_update`: the step count and one momentum buffer per parameter."""
    return {"step": np.zeros((), np.int64), "momentum_buffer": tree_map(_zeros_like, params)}


def sgd_update(params: Any, grads: Any, state: dict, lr: Any = 1e-3, momentum: Any = 0.0,
               dampening: Any = 0.0, weight_decay: Any = 0.0, nesterov: bool = False,
               maximize: bool = False) -> tuple[Any, dict]:
    """One step of SGD with optional momentum, dampening, Nesterov and weight decay."""
    damped = not isinstance(dampening, (int, float)) or dampening != 0
    if nesterov and (_is_zero(momentum) or damped):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    first = tnp.equal(state["step"], 0)

    def one(p: Any, g: Any, buf: Any) -> tuple:
        if maximize:
            g = tnp.neg(g)
        if not _is_zero(weight_decay):
            g = tnp.add(g, tnp.mul(p, _scalar(weight_decay, p)))
        if not _is_zero(momentum):
            m = _scalar(momentum, p)
            blend = tnp.add(tnp.mul(buf, m), tnp.mul(g, _one_minus(_scalar(dampening, p))))
            buf = blend if _is_zero(dampening) else tnp.where(first, g, blend)
            g = tnp.add(g, tnp.mul(buf, m)) if nesterov else buf
        return tnp.sub(p, tnp.mul(g, _scalar(lr, p))), buf

    res = _map(one, params, grads, state["momentum_buffer"])
    new_params, bufs = _unzip(res, params) if res else (params, state["momentum_buffer"])
    return new_params, {"step": _step(state), "momentum_buffer": bufs}


# ---- Adam / AdamW ------------------------------------------------------------------------------

def adam_init(params: Any) -> dict:
    """State for `adam_update`/`adamw_update`: step count, first and second moments."""
    return {"step": np.zeros((), np.int64), "exp_avg": tree_map(_zeros_like, params),
            "exp_avg_sq": tree_map(_zeros_like, params)}


def adam_update(params: Any, grads: Any, state: dict, lr: Any = 1e-3,
                betas: tuple[Any, Any] = (0.9, 0.999), eps: Any = 1e-8,
                weight_decay: Any = 0.0, decoupled_weight_decay: bool = False,
                maximize: bool = False) -> tuple[Any, dict]:
    """One Adam step (PyTorch's bias-corrected form). With `decoupled_weight_decay` the
    decay multiplies the parameters by (1 - lr * weight_decay) first: AdamW."""
    step = _step(state)
    b1, b2 = betas

    def one(p: Any, g: Any, m: Any, v: Any) -> tuple:
        if maximize:
            g = tnp.neg(g)
        if not _is_zero(weight_decay):
            wd = _scalar(weight_decay, p)
            if decoupled_weight_decay:
                p = tnp.mul(p, _one_minus(_times(_scalar(lr, p), wd)))
            else:
                g = tnp.add(g, tnp.mul(p, wd))
        b1_, b2_ = _scalar(b1, p), _scalar(b2, p)
        m = tnp.add(tnp.mul(m, b1_), tnp.mul(g, _one_minus(b1_)))
        v = tnp.add(tnp.mul(v, b2_), tnp.mul(tnp.square(g), _one_minus(b2_)))
        t = tnp.astype(step, p.dtype)
        bc1 = tnp.sub(1.0, tnp.pow(b1_, t))
        bc2 = tnp.sub(1.0, tnp.pow(b2_, t))
        denom = tnp.add(tnp.div(tnp.sqrt(v), tnp.sqrt(bc2)), _scalar(eps, p))
        p = tnp.sub(p, tnp.mul(tnp.div(_scalar(lr, p), bc1), tnp.div(m, denom)))
        return p, m, v

    res = _map(one, params, grads, state["exp_avg"], state["exp_avg_sq"])
    if not res:
        return params, {**state, "step": step}
    new_params, ms, vs = _unzip(res, params)
    return new_params, {"step": step, "exp_avg": ms, "exp_avg_sq": vs}


def adamw_update(params: Any, grads: Any, state: dict, lr: Any = 1e-3,
                 betas: tuple[Any, Any] = (0.9, 0.999), eps: Any = 1e-8,
                 weight_decay: Any = 1e-2, maximize: bool = False) -> tuple[Any, dict]:
    """One AdamW step: Adam with decoupled weight decay (default 1e-2, as PyTorch)."""
    return adam_update(params, grads, state, lr, betas, eps, weight_decay,
                       decoupled_weight_decay=True, maximize=maximize)


adamw_init = adam_init


def _is_zero(h: Any) -> bool:
    return isinstance(h, (int, float)) and h == 0

"""Derivative rules, one table per interpretation: VJP[op] and JVP[op] emit IR.

VJP rules take the output cotangent `g`, the inputs and `out=`, and return one gradient per
input (None for no gradient). JVP rules take the input tangents (None for zero), the inputs
and `out=`, and return the output tangent. Unary ops share one derivative table.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from . import emit as E
from .builder import Traced
from .core import is_float
from .scan import scan_jvp
from .scan_vjp import scan_vjp

Rule = Callable[..., Any]
VJP: dict[str, Rule] = {}
# VJP rules that take `need=` (one bool per input) and skip the gradients nobody reads
PARTIAL_VJP = {"matmul", "mul"}
JVP: dict[str, Rule] = {}
NO_GRAD = {"sign", "not", "stop_gradient", "lt", "le", "gt", "ge", "eq", "ne", "and", "or",
           "argmax", "argmin", "iota", "full", "random"}

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# d out / d x for the smooth unary ops, in terms of the input and the output
DERIV: dict[str, Callable[[Any, Any], Any]] = {
    "exp": lambda x, out: out,
    "log": lambda x, out: 1.0 / x,
    "log1p": lambda x, out: 1.0 / (1.0 + x),
    "expm1": lambda x, out: out + 1.0,
    "sin": lambda x, out: E.cos(x),
    "cos": lambda x, out: -E.sin(x),
    "tan": lambda x, out: 1.0 + out * out,
    "tanh": lambda x, out: 1.0 - out * out,
    "logistic": lambda x, out: out * (1.0 - out),
    "sqrt": lambda x, out: 0.5 / out,
    "erf": lambda x, out: _TWO_OVER_SQRT_PI * E.exp(-(x * x)),
    "abs": lambda x, out: E.sign(x),
}
for _op, _d in DERIV.items():
    VJP[_op] = lambda g, x, out, _d=_d: (g * _d(x, out),)
    JVP[_op] = lambda t, x, out, _d=_d: t * _d(x, out)

for _op in NO_GRAD:
    VJP[_op] = lambda g, *xs, out, **p: (None,) * len(xs)
    JVP[_op] = lambda *a, **p: None


# ---- helpers -----------------------------------------------------------------------------------

def _ub(g: Any, x: Any) -> Any:
    return None if g is None else E.unbroadcast(g, x.shape)


def _update_slice_vjp(g, x, v, out, index):
    gv = E.slice_(g, index)     # read before g's slice is zeroed: in place, where it may be
    return E.update_slice(g, E.zeros_like(v), index), gv


def _zeros(t: Any, like: Any) -> Any:
    return t if t is not None else E.zeros_like(like)


def _tangent(t: Any, shape: tuple) -> Any:
    return None if t is None else E.broadcast_to(t, shape)


def _max_mask(g: Any, x: Any, y: Any) -> tuple[Any, Any]:
    """Split `g` between maximum's operands: all to the larger one, half each on a tie."""
    half = g * 0.5
    return E.where(E.greater(x, y), g, E.where(E.equal(x, y), half, 0.0)), \
        E.where(E.less(x, y), g, E.where(E.equal(x, y), half, 0.0))


def _min_mask(g: Any, x: Any, y: Any) -> tuple[Any, Any]:
    # min(x, y) = max(y, x) with the roles swapped: x gets g where y > x
    return _max_mask(g, y, x)


def _pow_dx(x: Any, y: Any) -> Any:
    """y * x**(y-1), and 0 where y == 0 (as PyTorch: x**0 is constant, even at x = 0)."""
    return E.where(E.equal(y, 0.0), 0.0, y * E.pow(x, y - 1.0))


def _pow_dy(x: Any, out: Any) -> Any:
    positive = E.greater(x, 0.0)
    return out * E.where(positive, E.log(E.where(positive, x, 1.0)), 0.0)


def _kept(g: Any, x: Any, axes: tuple[int, ...]) -> Any:
    """Broadcast a reduction's cotangent back over the reduced axes."""
    if tuple(axes) == tuple(range(len(axes))):   # leading axes: numpy broadcasting adds them
        return E.broadcast_to(g, x.shape)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return E.broadcast_to(E.reshape(g, shape), x.shape)


def _extreme_weights(x: Any, out: Any, axes: tuple[int, ...]) -> Any:
    """1/count on the elements equal to the max (or min), 0 elsewhere: ties split evenly."""
    hit = E.convert(E.equal(x, _kept(out, x, axes)), x.dtype)
    return hit / _kept(E.reduce_sum(hit, axes), x, axes)


def _prod_partials(x: Any, out: Any, axes: tuple[int, ...]) -> Any:
    """d prod / d x_i: the product of the other elements, exact when some x are zero."""
    is_zero = E.equal(x, 0.0)
    nonzero_prod = _kept(E.reduce_prod(E.where(is_zero, 1.0, x), axes), x, axes)
    zeros = _kept(E.reduce_sum(E.convert(is_zero, x.dtype), axes), x, axes)
    at_zero = E.where(E.equal(zeros, 1.0), nonzero_prod, 0.0)
    return E.where(is_zero, at_zero, _kept(out, x, axes) / E.where(is_zero, 1.0, x))


def _scatter_winners(x: Any, idx: Any, axis: int) -> Any:
    """Which entries of `idx` a scatter "set" writes (each index's last entry), shaped to
    broadcast against the updates."""
    shape = tuple(E.shape_of(idx))
    ids = E.reshape(E.iota((math.prod(shape),), 0, "int64"), shape)
    last = E.scatter(E.full((x.shape[axis],), -1, "int64"), ids, idx, 0, "set")
    won = E.equal(E.take(last, idx, 0), ids)
    return E.reshape(won, (1,) * axis + shape + (1,) * (len(x.shape) - axis - 1))


def _scatter_mul_partials(x: Any, v: Any, idx: Any, axis: int) -> tuple[Any, Any]:
    """(d out / d x: the product of each entry's updates, 1 where none lands; d out / d v
    over x: per update the product of the other updates to its entry), exact when some
    updates are zero (as `_prod_partials`)."""
    n = x.shape[axis]
    ones = E.full(x.shape, 1, x.dtype)
    is_zero = E.equal(v, 0.0)
    prod = E.scatter(ones, v, idx, axis, "mul")
    nonzero = E.take(E.scatter(ones, E.where(is_zero, 1.0, v), idx, axis, "mul"), idx, axis)
    zeros = E.take(E.scatter_add(E.convert(is_zero, x.dtype), idx, axis, n), idx, axis)
    others = E.where(is_zero, E.where(E.equal(zeros, 1.0), nonzero, 0.0),
                     E.where(E.equal(zeros, 0.0), nonzero / E.where(is_zero, 1.0, v), 0.0))
    return prod, others


def _scatter_extreme_weights(x: Any, v: Any, idx: Any, out: Any, axis: int
                             ) -> tuple[Any, Any, Any]:
    """(x's weights, v's weights, count) of a scatter "min"/"max", as JAX's: an entry's
    derivative goes evenly to those of x and its updates equal to the result (ties split);
    an entry no update reaches is x's alone; a NaN result equals none (a derivative of 0)."""
    n = x.shape[axis]
    touched = E.greater(E.scatter_add(E.full(E.shape_of(v), 1, x.dtype), idx, axis, n), 0.0)
    hx = E.convert(E.logical_or(E.logical_not(touched), E.equal(x, out)), x.dtype)
    hv = E.convert(E.equal(v, E.take(out, idx, axis)), x.dtype)
    count = hx + E.scatter_add(hv, idx, axis, n)
    return hx, hv, E.where(E.equal(count, 0.0), 1.0, count)


def _scatter_vjp(g: Any, x: Any, v: Any, idx: Any, out: Any, axis: int, mode: str) -> tuple:
    if mode == "set":
        return (E.scatter(g, E.zeros_like(v), idx, axis, "set"),
                E.where(_scatter_winners(x, idx, axis), E.take(g, idx, axis), 0.0), None)
    if mode == "mul":
        prod, others = _scatter_mul_partials(x, v, idx, axis)
        return g * prod, E.take(g * x, idx, axis) * others, None
    hx, hv, count = _scatter_extreme_weights(x, v, idx, out, axis)
    share = g / count
    return share * hx, E.take(share, idx, axis) * hv, None


def _scatter_jvp(tx: Any, tv: Any, ti: Any, x: Any, v: Any, idx: Any, out: Any, axis: int,
                 mode: str) -> Any:
    if tx is None and tv is None:
        return None
    if mode == "set":
        return E.scatter(_zeros(tx, x), _zeros(tv, v), idx, axis, "set")
    n = x.shape[axis]
    if mode == "mul":
        prod, others = _scatter_mul_partials(x, v, idx, axis)
        return _sum_tangents(_mul_t(tx, prod), None if tv is None else
                             x * E.scatter_add(tv * others, idx, axis, n), shape=out.shape)
    hx, hv, count = _scatter_extreme_weights(x, v, idx, out, axis)
    return _sum_tangents(_mul_t(tx, hx), None if tv is None else
                         E.scatter_add(tv * hv, idx, axis, n), shape=out.shape) / count


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _concat_vjp(g: Any, *xs: Any, out: Any, axis: int) -> tuple:
    grads, start = [], 0
    for x in xs:
        index = [(0, d, 1) for d in g.shape]
        index[axis] = (start, start + x.shape[axis], 1)
        grads.append(E.slice_(g, index))
        start += x.shape[axis]
    return tuple(grads)


def _as_matrix(a: Any, b: Any, g: Any) -> tuple[Any, Any, Any]:
    """Promote matmul's 1-d operands to matrices, as numpy does."""
    a2 = E.reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = E.reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    g_shape = a2.shape[:-1] + b2.shape[-1:]
    if b2.ndim > 2 and a2.ndim == 2:
        g_shape = b2.shape[:-2] + g_shape
    return a2, b2, E.reshape(g, g_shape)


def _mT(x: Any) -> Any:
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return E.transpose(x, perm)


def _matmul_vjp(g: Any, a: Any, b: Any, out: Any, need: tuple = (True, True)) -> tuple:
    a2, b2, g2 = _as_matrix(a, b, g)
    ga = gb = None
    if need[0]:
        ga = E.matmul(g2, _mT(b2))
        if ga.ndim > a.ndim + (a.ndim == 1):
            ga = E.reduce_sum(ga, tuple(range(ga.ndim - 2)))
        ga = E.reshape(ga, a.shape)
    if need[1]:
        gb = E.reshape(E.matmul(_mT(a2), g2), b.shape)
    return ga, gb


def _mul_vjp(g: Any, x: Any, y: Any, out: Any, need: tuple = (True, True)) -> tuple:
    if need[0] and need[1] and (x is y or type(x) is Traced and type(y) is Traced and
                                x.atom is y.atom):
        # `x * x`: both terms are g * x (the same bits), made once; the sum adds it to itself
        gx = _ub(g * x, x)
        return gx, gx
    return (_ub(g * y, x) if need[0] else None), (_ub(g * x, y) if need[1] else None)


def _custom_vjp(gs: list, *xs: Any, out: Any, n_args: int, n_res: int, bwd: Any) -> tuple:
    res = xs[n_args:n_args + n_res]
    outs = xs[n_args + n_res:]
    gs = [E.zeros_like(o) if g is None else g for g, o in zip(gs, outs)]
    grads = bwd(tuple(res), gs[0] if len(gs) == 1 else tuple(gs))
    if not isinstance(grads, (tuple, list)) or len(grads) != n_args:
        raise TypeError(f"custom_vjp backward must return a tuple of {n_args} gradients, "
                        f"got {grads!r}")
    fixed = []
    for gr, x in zip(grads, xs[:n_args]):
        if gr is None or not is_float(x.dtype):
            fixed.append(None)
            continue
        if tuple(E.shape_of(gr)) != x.shape:
            raise ValueError(f"custom_vjp backward returned a gradient of shape "
                             f"{tuple(E.shape_of(gr))} for an argument of shape {x.shape}")
        fixed.append(E.convert(gr, x.dtype))
    return tuple(fixed) + (None,) * (n_res + len(outs))


# ---- VJP ---------------------------------------------------------------------------------------

VJP.update({
    "neg": lambda g, x, out: (-g,),
    "add": lambda g, x, y, out: (_ub(g, x), _ub(g, y)),
    "sub": lambda g, x, y, out: (_ub(g, x), _ub(-g, y)),
    "mul": _mul_vjp,
    "div": lambda g, x, y, out: (_ub(g / y, x), _ub(-g * out / y, y)),
    "pow": lambda g, x, y, out: (_ub(g * _pow_dx(x, y), x), _ub(g * _pow_dy(x, out), y)),
    "max": lambda g, x, y, out: tuple(map(_ub, _max_mask(g, x, y), (x, y))),
    "min": lambda g, x, y, out: tuple(map(_ub, _min_mask(g, x, y), (x, y))),
    "select": lambda g, c, x, y, out: (None, _ub(E.where(c, g, 0.0), x),
                                       _ub(E.where(c, 0.0, g), y)),
    "convert": lambda g, x, out, dtype: (E.convert(g, x.dtype) if is_float(x.dtype) else None,),
    "reduce_sum": lambda g, x, out, axes: (_kept(g, x, axes),),
    "reduce_max": lambda g, x, out, axes: (_kept(g, x, axes) * _extreme_weights(x, out, axes),),
    "reduce_min": lambda g, x, out, axes: (_kept(g, x, axes) * _extreme_weights(x, out, axes),),
    "reduce_prod": lambda g, x, out, axes: (_kept(g, x, axes) * _prod_partials(x, out, axes),),
    "reshape": lambda g, x, out, shape: (E.reshape(g, x.shape),),
    "broadcast": lambda g, x, out, shape: (E.unbroadcast(g, x.shape),),
    "transpose": lambda g, x, out, perm: (E.transpose(g, _inverse(perm)),),
    "slice": lambda g, x, out, index: (E.pad_slice(g, x.shape, index),),
    "pad_slice": lambda g, x, out, shape, index: (E.slice_(g, index),),
    "update_slice": _update_slice_vjp,
    "concatenate": _concat_vjp,
    "take": lambda g, x, idx, out, axis: (E.scatter_add(g, idx, axis, x.shape[axis]), None),
    "scatter_add": lambda g, x, idx, out, axis, size: (E.take(g, idx, axis), None),
    "scatter": _scatter_vjp,
    "matmul": _matmul_vjp,
    "custom_vjp_call": _custom_vjp,
    "scan": scan_vjp,
})


# ---- JVP ---------------------------------------------------------------------------------------

def _linear(fn: Callable) -> Rule:
    """JVP of an op linear in all its (float) inputs: the op applied to the tangents."""
    def rule(*args, out, **params):
        n = len(args) // 2
        ts, xs = args[:n], args[n:]
        if all(t is None for t in ts):
            return None
        return fn(*[_zeros(t, x) for t, x in zip(ts, xs)], **params)
    return rule


def _sum_tangents(*ts: Any, shape: tuple) -> Any:
    live = [t for t in ts if t is not None]
    if not live:
        return None
    total = live[0]
    for t in live[1:]:
        total = total + t
    return E.broadcast_to(total, shape)


def _mul_t(t: Any, factor: Any) -> Any:
    return None if t is None else t * factor


def _extreme_jvp(tx, x, out, axes):
    return None if tx is None else E.reduce_sum(tx * _extreme_weights(x, out, axes), axes)


def _custom_jvp(*args, out, n_args, n_res, bwd):
    # Forward mode differentiates the recorded forward computation of the custom function.
    n = len(args) // 2
    return list(args[n_args + n_res:n])


def _select_jvp(tc, tx, ty, c, x, y, out):
    if tx is None and ty is None:
        return None
    return E.where(c, _tangent(_zeros(tx, x), out.shape), _tangent(_zeros(ty, y), out.shape))


JVP.update({
    "neg": lambda t, x, out: -t,
    "add": lambda tx, ty, x, y, out: _sum_tangents(tx, ty, shape=out.shape),
    "sub": lambda tx, ty, x, y, out: _sum_tangents(tx, None if ty is None else -ty,
                                                   shape=out.shape),
    "mul": lambda tx, ty, x, y, out: _sum_tangents(_mul_t(tx, y), _mul_t(ty, x),
                                                   shape=out.shape),
    "div": lambda tx, ty, x, y, out: _sum_tangents(
        None if tx is None else tx / y, None if ty is None else -ty * out / y, shape=out.shape),
    "pow": lambda tx, ty, x, y, out: _sum_tangents(
        _mul_t(tx, _pow_dx(x, y)), _mul_t(ty, _pow_dy(x, out)), shape=out.shape),
    "max": lambda tx, ty, x, y, out: _minmax_jvp(_max_mask, tx, ty, x, y, out),
    "min": lambda tx, ty, x, y, out: _minmax_jvp(_min_mask, tx, ty, x, y, out),
    "select": _select_jvp,
    "convert": lambda t, x, out, dtype: E.convert(t, dtype) if is_float(out.dtype) else None,
    "reduce_sum": _linear(E.reduce_sum),
    "reduce_max": _extreme_jvp,
    "reduce_min": _extreme_jvp,
    "reduce_prod": lambda t, x, out, axes: None if t is None else E.reduce_sum(
        t * _prod_partials(x, out, axes), axes),
    "reshape": _linear(E.reshape),
    "broadcast": _linear(E.broadcast_to),
    "transpose": _linear(E.transpose),
    "slice": _linear(E.slice_),
    "pad_slice": _linear(E.pad_slice),
    "update_slice": _linear(E.update_slice),
    "concatenate": lambda *a, out, axis: _linear(
        lambda *xs, axis: E.concatenate(xs, axis))(*a, out=out, axis=axis),
    "take": lambda tx, ti, x, idx, out, axis: None if tx is None else E.take(tx, idx, axis),
    "scatter_add": lambda tg, ti, g, idx, out, axis, size: None if tg is None else
    E.scatter_add(tg, idx, axis, size),
    "scatter": _scatter_jvp,
    "matmul": lambda ta, tb, a, b, out: _sum_tangents(
        None if ta is None else E.matmul(ta, b), None if tb is None else E.matmul(a, tb),
        shape=out.shape),
    "custom_vjp_call": _custom_jvp,
    "scan": scan_jvp,
})


def _minmax_jvp(mask_fn, tx, ty, x, y, out):
    if tx is None and ty is None:
        return None
    one = E.full(out.shape, 1.0, out.dtype)
    wx, wy = mask_fn(one, x, y)
    return _sum_tangents(_mul_t(tx, wx), _mul_t(ty, wy), shape=out.shape)

"""The primitive table: for every op, its kind, its shape/dtype rule and its numpy reference."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .core import Aval, is_float


class ShapeError(ValueError):
    """An op was given operands whose shapes do not fit together."""


class AxisError(ShapeError, IndexError):
    """An axis out of range for the array's dimensions (as numpy's AxisError: a ValueError
    and an IndexError, the class torch raises for a dim out of range)."""


class DTypeError(TypeError):
    """An op was given operands of a dtype it does not accept."""


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str                  # unary binary select compare reduce index shape matmul create misc
    rule: Callable[..., Any]   # (*avals, **params) -> Aval | list[Aval]
    ref: Callable[..., Any]    # (*arrays, **params) -> array | tuple of arrays
    multi_out: bool = False


OPS: dict[str, OpDef] = {}


def _def(name: str, kind: str, rule: Callable, ref: Callable, multi_out: bool = False) -> None:
    OPS[name] = OpDef(name, kind, rule, ref, multi_out)


# ---- shape rules -----------------------------------------------------------------------------

def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    # in Python rather than np.broadcast_shapes, which stops at 32 dimensions
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != out[i] and out[i] != 1 and d != 1:
                raise ShapeError("operands could not be broadcast together with shapes "
                                 + " ".join(str(tuple(s)) for s in shapes))
            if d != 1:
                out[i] = d
    return tuple(out)


def _same_dtype(*avals: Aval) -> np.dtype:
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1:
        raise DTypeError("operands have different dtypes " + ", ".join(
            str(a.dtype) for a in avals) + " (cast one with tg.astype)")
    return avals[0].dtype


def _float_unary(x: Aval) -> Aval:
    if not is_float(x.dtype):
        raise DTypeError(f"needs a floating point operand, got {x.dtype}")
    return x


def _unary(x: Aval) -> Aval:
    return x


def _numeric_unary(x: Aval) -> Aval:
    if x.dtype == np.bool_:
        raise DTypeError("does not accept bool operands")
    return x


def _binary(x: Aval, y: Aval) -> Aval:
    return Aval(broadcast_shapes(x.shape, y.shape), _same_dtype(x, y))


def _numeric_binary(x: Aval, y: Aval) -> Aval:
    out = _binary(x, y)
    if out.dtype == np.bool_:
        raise DTypeError("does not accept bool operands")
    return out


def _compare(x: Aval, y: Aval) -> Aval:
    return Aval(broadcast_shapes(x.shape, y.shape), np.dtype(np.bool_))


def _logical(x: Aval, y: Aval) -> Aval:
    if x.dtype != np.bool_ or y.dtype != np.bool_:
        raise DTypeError(f"needs bool operands, got {x.dtype} and {y.dtype}")
    return _compare(x, y)


def _select(c: Aval, x: Aval, y: Aval) -> Aval:
    if c.dtype != np.bool_:
        raise DTypeError(f"condition must be bool, got {c.dtype}")
    return Aval(broadcast_shapes(c.shape, x.shape, y.shape), _same_dtype(x, y))


def _check_axes(x: Aval, axes: tuple[int, ...]) -> None:
    if len(set(axes)) != len(axes) or any(not 0 <= a < x.ndim for a in axes):
        raise ShapeError(f"axes {axes} out of range for shape {x.shape}")


def _reduce(x: Aval, *, axes: tuple[int, ...]) -> Aval:
    _check_axes(x, axes)
    for a in axes:
        if x.shape[a] == 0:
            raise ShapeError(f"zero-size axis {a} of shape {x.shape} has no identity")
    return Aval(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _reduce_sum(x: Aval, *, axes: tuple[int, ...]) -> Aval:
    _check_axes(x, axes)
    return Aval(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _argreduce(x: Aval, *, axis: int) -> Aval:
    _reduce(x, axes=(axis,))
    return Aval(tuple(d for i, d in enumerate(x.shape) if i != axis), np.dtype(np.int64))


def _reshape(x: Aval, *, shape: tuple[int, ...]) -> Aval:
    if math.prod(shape) != x.size or any(d < 0 for d in shape):
        raise ShapeError(f"cannot reshape array of shape {x.shape} into shape {shape}")
    return Aval(tuple(shape), x.dtype)


def _broadcast(x: Aval, *, shape: tuple[int, ...]) -> Aval:
    if broadcast_shapes(x.shape, shape) != tuple(shape):
        raise ShapeError(f"cannot broadcast shape {x.shape} to {tuple(shape)}")
    return Aval(tuple(shape), x.dtype)


def _transpose(x: Aval, *, perm: tuple[int, ...]) -> Aval:
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"perm {perm} is not a permutation of the axes of shape {x.shape}")
    return Aval(tuple(x.shape[p] for p in perm), x.dtype)


def slice_shape(shape: tuple[int, ...], index: tuple[tuple[int, int, int], ...]) -> tuple:
    if len(index) != len(shape):
        raise ShapeError(f"slice index {index} does not match shape {shape}")
    return tuple(len(range(*s)) for s in index)


def _slice(x: Aval, *, index: tuple) -> Aval:
    return Aval(slice_shape(x.shape, index), x.dtype)


def _pad_slice(g: Aval, *, shape: tuple[int, ...], index: tuple) -> Aval:
    if slice_shape(shape, index) != g.shape:
        raise ShapeError(f"operand {g.shape} does not fill slice {index} of shape {shape}")
    return Aval(tuple(shape), g.dtype)


def _update_slice(x: Aval, v: Aval, *, index: tuple) -> Aval:
    if slice_shape(x.shape, index) != v.shape:
        raise ShapeError(f"update {v.shape} does not fill slice {index} of shape {x.shape}")
    return Aval(x.shape, _same_dtype(x, v))


def _concatenate(*xs: Aval, axis: int) -> Aval:
    if not xs:
        raise ShapeError("needs at least one operand")
    dtype = _same_dtype(*xs)
    first = xs[0].shape
    if not 0 <= axis < len(first):
        raise ShapeError(f"axis {axis} out of range for shape {first}")
    for x in xs:
        if len(x.shape) != len(first) or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, first)) if i != axis):
            raise ShapeError("shapes " + " ".join(str(x.shape) for x in xs)
                             + f" differ outside axis {axis}")
    size = sum(x.shape[axis] for x in xs)
    return Aval(first[:axis] + (size,) + first[axis + 1:], dtype)


def _take(x: Aval, idx: Aval, *, axis: int) -> Aval:
    if not np.issubdtype(idx.dtype, np.integer):
        raise DTypeError(f"indices must be integers, got {idx.dtype}")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for shape {x.shape}")
    if x.shape[axis] == 0 and idx.size:   # no element to take, nor one to clamp to
        raise IndexError(f"cannot take indices of shape {idx.shape} from the empty axis "
                         f"{axis} of shape {x.shape}")
    return Aval(x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype)


SCATTER_MODES = ("set", "mul", "min", "max")


def _scatter(x: Aval, v: Aval, idx: Aval, *, axis: int, mode: str) -> Aval:
    if mode not in SCATTER_MODES:
        raise ValueError(f"scatter mode must be one of {SCATTER_MODES}, got {mode!r}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise DTypeError(f"indices must be integers, got {idx.dtype}")
    if not 0 <= axis < x.ndim:
        raise ShapeError(f"axis {axis} out of range for shape {x.shape}")
    if x.dtype != v.dtype:
        raise DTypeError(f"updates of dtype {v.dtype} for an operand of dtype {x.dtype}")
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if v.shape != want:
        raise ShapeError(f"updates {v.shape} do not match indices {idx.shape} at axis {axis} "
                         f"of an operand {x.shape} (expected {want})")
    if x.shape[axis] == 0 and idx.size:     # no element to write, nor one to clamp to
        raise IndexError(f"cannot scatter indices of shape {idx.shape} into the empty axis "
                         f"{axis} of shape {x.shape}")
    return x


def _scatter_add(g: Aval, idx: Aval, *, axis: int, size: int) -> Aval:
    if not np.issubdtype(idx.dtype, np.integer):
        raise DTypeError(f"indices must be integers, got {idx.dtype}")
    k = idx.ndim
    if g.shape[axis:axis + k] != idx.shape:
        raise ShapeError(f"updates {g.shape} do not match indices {idx.shape} at axis {axis}")
    return Aval(g.shape[:axis] + (size,) + g.shape[axis + k:], g.dtype)


def _matmul(a: Aval, b: Aval) -> Aval:
    dtype = _same_dtype(a, b)
    if dtype == np.bool_:
        raise DTypeError("does not accept bool operands")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"operands must be at least 1-d, got shapes {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise ShapeError(f"contracting dimensions differ: {a.shape} @ {b.shape} ({ka} != {kb})")
    if a.ndim > 2 or b.ndim > 2:
        if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ShapeError(f"batch dimensions differ: {a.shape} @ {b.shape}")
    shape = a.shape[:-1] + (b.shape[-1:] if b.ndim >= 2 else ())
    if a.ndim == 1 and b.ndim >= 2:
        shape = b.shape[:-2] + b.shape[-1:]
    return Aval(tuple(shape), dtype)


def _convert(x: Aval, *, dtype: np.dtype) -> Aval:
    return Aval(x.shape, np.dtype(dtype))


def convert_value(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`x.astype(dtype)`, but a float converted to an integer saturates: NaN -> 0, values
    beyond the integer's range -> its min or max (as JAX does, and as the native code's
    saturating conversion does; numpy's own result there is whatever the CPU gives, INT_MIN
    on x86, so the two backends would disagree)."""
    dtype = np.dtype(dtype)
    if x.dtype.kind != "f" or dtype.kind not in "iu":
        return x.astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = float(info.min), float(info.max) + 1.0     # (both exact powers of two, or 0)
    with np.errstate(invalid="ignore"):
        out = x.astype(dtype)
        inside = (x >= lo) & (x < hi)     # (False for NaN)
    if inside.all():
        return out
    return np.where(inside, out, np.where(x < lo, info.min, np.where(x >= hi, info.max, 0))
                    ).astype(dtype)


def _iota(*, shape: tuple[int, ...], dimension: int, dtype: np.dtype) -> Aval:
    if not 0 <= dimension < len(shape):
        raise ShapeError(f"dimension {dimension} out of range for shape {shape}")
    return Aval(tuple(shape), np.dtype(dtype))


def _full(*, shape: tuple[int, ...], value: Any, dtype: np.dtype) -> Aval:
    return Aval(tuple(shape), np.dtype(dtype))


def _custom_vjp_call(*avals: Aval, n_args: int, n_res: int, bwd: Any) -> list[Aval]:
    return list(avals[n_args + n_res:])


def _scan(*avals: Aval, body: Any, length: int, n_consts: int, n_carry: int,
          reverse: bool = False) -> list[Aval]:
    """`scan[body, length, n_consts, n_carry, reverse](consts, carry, xs) -> (carry, ys)`:
    `length` applications of `body: (consts, carry, x_t) -> (carry, y_t)`, as JAX's
    `lax.scan`. Each x and each y is stacked along a new leading axis of size `length`: the
    body reads `xs[q][t]` and writes `ys[j][t]`. `reverse`: t runs from `length - 1` down."""
    n_x = len(body.invars) - n_consts - n_carry
    n_y = len(body.outvars) - n_carry
    if length < 1 or n_x < 0 or n_y < 0 or len(avals) != n_consts + n_carry + n_x:
        raise ShapeError(f"scan of length {length} over a body taking {len(body.invars)} "
                         f"values got {len(avals)} inputs")
    head = n_consts + n_carry
    want = body.in_avals[:head] + [Aval((length,) + a.shape, a.dtype)
                                   for a in body.in_avals[head:]]
    for i, (a, w) in enumerate(zip(avals, want)):
        if a != w:
            raise ShapeError(f"scan input {i} is {a}, its body takes {w}")
    carry_in = body.in_avals[n_consts:head]
    carry_out = body.out_avals[:n_carry]
    if carry_in != carry_out:
        raise ShapeError("scan body's carry types change: " + ", ".join(map(str, carry_in))
                         + " -> " + ", ".join(map(str, carry_out)))
    return carry_out + [Aval((length,) + a.shape, a.dtype) for a in body.out_avals[n_carry:]]


def _random(seed: Aval, *, shape: tuple[int, ...], dist: str, dtype: np.dtype) -> Aval:
    if seed.shape != () or seed.dtype != np.int64:
        raise DTypeError(f"seed must be an int64 scalar, got {seed}")
    if dist not in ("uniform", "normal") or not is_float(np.dtype(dtype)):
        raise DTypeError(f"unknown distribution {dist!r} or non-float dtype {dtype}")
    return Aval(tuple(shape), np.dtype(dtype))


# ---- numpy references ------------------------------------------------------------------------

def _np_unary(fn: Callable) -> Callable:
    def ref(x):
        with np.errstate(all="ignore"):
            return np.asarray(fn(x)).astype(x.dtype, copy=False)
    return ref


def _np_binary(fn: Callable) -> Callable:
    def ref(x, y):
        with np.errstate(all="ignore"):
            return np.asarray(fn(x, y)).astype(np.result_type(x, y), copy=False)
    return ref


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a non-positive number never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _maximum(x, y):
    return np.maximum(x, y)


def _div(x, y):
    if np.issubdtype(np.result_type(x, y), np.integer):     # x // 0 is 0, as numpy's
        return np.where(y == 0, 0, np.floor_divide(x, np.where(y == 0, 1, y)))
    return np.divide(x, y)


def _pow(x, y):
    if np.issubdtype(np.result_type(x, y), np.integer):
        return np.power(x, np.maximum(y, 0))
    return np.power(x, y)


def _ref_reduce(fn: Callable) -> Callable:
    def ref(x, *, axes):
        with np.errstate(all="ignore"):
            return np.asarray(fn(x, axis=tuple(axes))).astype(x.dtype, copy=False)
    return ref


def np_index(index: tuple) -> tuple[slice, ...]:
    """A slice index `((start, stop, step), ...)` selects `range(start, stop, step)` on each
    axis, like Python's range: a negative stop only ever means 'past the front'."""
    # an empty range can start at -1 (x[-5::-1] on 3 elements), which numpy reads as the end
    return tuple(slice(0, 0, 1) if not len(range(a, b, c)) else
                 slice(a, None if b < 0 else b, c) for a, b, c in index)


def _ref_slice(x, *, index):
    return x[np_index(index)]


def _ref_pad_slice(g, *, shape, index):
    out = np.zeros(shape, g.dtype)
    out[np_index(index)] = g
    return out


def _ref_update_slice(x, v, *, index):
    out = x.copy()
    out[np_index(index)] = v
    return out


def clip_index(idx: np.ndarray, n: int) -> np.ndarray:
    """take/scatter_add index semantics: negatives wrap once, then clamp into [0, n-1] (JAX's
    "clip" mode). Values cannot raise inside compiled code, so both passes and both backends
    agree on this; the `tg` front end raises IndexError for out-of-range concrete indices."""
    if idx.dtype.kind == "u" or idx.dtype.itemsize < 4:     # (idx + n must not overflow)
        idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    return np.clip(idx, 0, max(n - 1, 0))


def _ref_take(x, idx, *, axis):
    return np.take(x, clip_index(idx, x.shape[axis]), axis=axis)


def _ref_scatter_add(g, idx, *, axis, size):
    shape = g.shape[:axis] + (size,) + g.shape[axis + idx.ndim:]
    out = np.zeros(shape, g.dtype)
    moved = np.moveaxis(out, axis, 0)
    gm = np.moveaxis(g.reshape(g.shape[:axis] + (idx.size,) + g.shape[axis + idx.ndim:]),
                     axis, 0)
    if size:
        np.add.at(moved, clip_index(idx.reshape(-1), size), gm)
    return out


_SCATTER_UFUNCS = {"mul": np.multiply, "min": np.minimum, "max": np.maximum}


def _ref_scatter(x, v, idx, *, axis, mode):
    """x with its entries idx (along axis, clipped as take reads them) combined with v's in
    order: set (the last of a repeated index wins), mul, min or max (numpy's ufunc.at)."""
    out = x.copy()
    n = x.shape[axis]
    if not idx.size:
        return out
    moved = np.moveaxis(out, axis, 0)
    vm = np.moveaxis(v.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1:]), axis, 0)
    flat = clip_index(idx.reshape(-1), n)
    if mode == "set":
        _, last = np.unique(flat[::-1], return_index=True)   # each index's last entry
        keep = flat.size - 1 - last
        moved[flat[keep]] = vm[keep]
    else:
        _SCATTER_UFUNCS[mode].at(moved, flat, vm)
    return out


def _ref_matmul(a, b):
    return np.matmul(a, b)


def _ref_iota(*, shape, dimension, dtype):
    r = np.arange(shape[dimension], dtype=dtype)
    r = r.reshape((-1,) + (1,) * (len(shape) - dimension - 1))
    return np.ascontiguousarray(np.broadcast_to(r, shape))


def _ref_custom_vjp_call(*xs, n_args, n_res, bwd):
    return tuple(xs[n_args + n_res:])


def _ref_scan(*xs, body, length, n_consts, n_carry, reverse=False):
    from .interpret import interpret
    head = n_consts + n_carry
    consts, carry, stacked = list(xs[:n_consts]), list(xs[n_consts:head]), xs[head:]
    ys: list[list] = [[] for _ in body.outvars[n_carry:]]
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for t in steps:
        outs = interpret(body, consts + carry + [x[t] for x in stacked])
        carry = outs[:n_carry]
        for y, o in zip(ys, outs[n_carry:]):
            y.append(o)
    if reverse:
        for y in ys:
            y.reverse()
    return tuple(carry + [np.stack(y) for y in ys])


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The counter-based hash behind `random`: element i of a draw is a pure function of
    (seed, i), so the compiled kernels reproduce the reference bit for bit."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def uniform_bits(seed: np.ndarray, n: int, stream: int) -> np.ndarray:
    """Uniform floats in [0, 1) with 24 random bits: exact in float32 and float64."""
    with np.errstate(over="ignore"):
        base = np.uint64(np.int64(seed)) * np.uint64(0xD1B54A32D192ED03)
        ctr = np.arange(n, dtype=np.uint64) * np.uint64(2) + np.uint64(stream)
        h = splitmix64(ctr + base)
    return (h >> np.uint64(40)).astype(np.float64) * 2.0 ** -24


def _ref_random(seed, *, shape, dist, dtype):
    n = math.prod(shape)
    u = uniform_bits(seed, n, 0)
    if dist == "normal":   # Box-Muller on two independent streams
        u2 = uniform_bits(seed, n, 1)
        u = np.sqrt(-2.0 * np.log1p(-u)) * np.cos(2 * np.pi * u2)
    return u.reshape(shape).astype(dtype)


UNARY_FLOAT = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "logistic": _sigmoid, "sqrt": np.sqrt,
    "erf": _erf,
}
for _name, _fn in UNARY_FLOAT.items():
    _def(_name, "unary", _float_unary, _np_unary(_fn))
_def("neg", "unary", _numeric_unary, _np_unary(np.negative))
_def("abs", "unary", _numeric_unary, _np_unary(np.abs))
_def("sign", "unary", _numeric_unary, _np_unary(np.sign))
_def("not", "unary", _unary, _np_unary(np.logical_not))
_def("stop_gradient", "unary", _unary, lambda x: x)

BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "pow": _pow,
          "max": _maximum, "min": np.minimum}
for _name, _fn in BINARY.items():
    _def(_name, "binary", _binary if _name in ("max", "min", "add", "mul")
         else _numeric_binary, _np_binary(_fn))

COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}
for _name, _fn in COMPARE.items():
    _def(_name, "compare", _compare, _fn)
_def("and", "compare", _logical, np.logical_and)
_def("or", "compare", _logical, np.logical_or)

_def("select", "select", _select, lambda c, x, y: np.where(c, x, y))
_def("convert", "unary", _convert, lambda x, *, dtype: convert_value(x, dtype))

_def("reduce_sum", "reduce", _reduce_sum, _ref_reduce(np.sum))
_def("reduce_max", "reduce", _reduce, _ref_reduce(np.max))
_def("reduce_min", "reduce", _reduce, _ref_reduce(np.min))
_def("reduce_prod", "reduce", _reduce_sum, _ref_reduce(np.prod))
_def("argmax", "reduce", _argreduce, lambda x, *, axis: np.argmax(x, axis=axis))
_def("argmin", "reduce", _argreduce, lambda x, *, axis: np.argmin(x, axis=axis))

_def("reshape", "shape", _reshape, lambda x, *, shape: np.reshape(x, shape))
_def("broadcast", "shape", _broadcast,
     lambda x, *, shape: np.ascontiguousarray(np.broadcast_to(x, shape)))
_def("transpose", "shape", _transpose, lambda x, *, perm: np.transpose(x, perm))
_def("slice", "shape", _slice, _ref_slice)
_def("pad_slice", "shape", _pad_slice, _ref_pad_slice)
_def("update_slice", "shape", _update_slice, _ref_update_slice)
_def("concatenate", "shape", _concatenate, lambda *xs, axis: np.concatenate(xs, axis))
_def("take", "index", _take, _ref_take)
_def("scatter_add", "index", _scatter_add, _ref_scatter_add)
_def("scatter", "index", _scatter, _ref_scatter)
_def("matmul", "matmul", _matmul, _ref_matmul)
_def("iota", "create", _iota, _ref_iota)
_def("full", "create", _full, lambda *, shape, value, dtype: np.full(shape, value, dtype))
_def("random", "create", _random, _ref_random)
_def("custom_vjp_call", "misc", _custom_vjp_call, _ref_custom_vjp_call, multi_out=True)
_def("scan", "misc", _scan, _ref_scan, multi_out=True)

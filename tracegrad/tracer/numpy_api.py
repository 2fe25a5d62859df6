"""The numpy-like ops of the `tg` namespace. They work on numpy arrays (eagerly), Python
scalars, traced values (recording IR) and Tensors (through `dispatch`)."""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Sequence

import numpy as np

from ..ir import emit as E
from ..ir.builder import Traced
from ..ir.ops import AxisError, ShapeError, broadcast_shapes
from .dispatch import op
from .indexing import _at_user
from .pytree import NODE_TYPES, tree_map

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)


def _holds_traced(xs: Sequence[Any]) -> bool:
    return builtins.any(isinstance(v, Traced) or (isinstance(v, (list, tuple))
                                                  and _holds_traced(v)) for v in xs)


def _arr(x: Any) -> Any:
    """Traced values stay; lists and scalars become arrays (Python floats as float32)."""
    if isinstance(x, Traced):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        arr = x
    elif isinstance(x, (bool, int, float)):
        return np.asarray(x, E.dtype_of(x))
    elif isinstance(x, (list, tuple)) and _holds_traced(x):
        # numpy stacks a list of arrays; so do we when some are traced (a list passed to jit)
        return stack([_arr(v) for v in x])
    else:
        arr = np.asarray(x)
        if arr.dtype == float64:
            arr = arr.astype(float32)
    if arr.dtype.kind in "OcSUVMm":   # object, complex, strings, records, datetimes
        raise TypeError(f"cannot convert {type(x).__name__} of dtype {arr.dtype} to an array "
                        "(tracegrad supports bool, integer and float dtypes)")
    return arr


def _axes(x: Any, axis: Any) -> tuple[int, ...]:
    """The axes `axis` names of `x`, sorted; a 0-d `x` takes axis 0 or -1, as torch's (and
    reduces over none of its axes)."""
    ndim = len(E.shape_of(x))
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int:
        axes: tuple = (axis,)
    elif type(axis) is tuple and builtins.all(type(a) is int for a in axis):
        axes = axis
    else:
        try:
            axes = (operator.index(axis),)
        except TypeError:
            try:
                axes = tuple(operator.index(a) for a in axis)
            except TypeError:
                raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}" +
                                _at_user()) from None
    out = tuple(sorted(_axis(a, builtins.max(ndim, 1), ndim) for a in axes))
    if len(set(out)) != len(out):
        raise AxisError(f"duplicate value in axis {axis!r} (of an array of dimension "
                        f"{ndim})" + _at_user())
    return out if ndim else ()


def _axis(a: int, n: int, ndim: int | None = None, what: str = "") -> int:
    """Axis `a` of `n` axes, from 0 (AxisError if out of range; `ndim`: the dimension to
    name, when it is not `n`: a 0-d array's reductions take axis 0)."""
    if not -n <= a < n:
        raise AxisError(f"{what + ': ' if what else ''}axis {a} is out of bounds for an "
                        f"array of dimension {n if ndim is None else ndim}" + _at_user())
    return a % n


def _axis_kw(axis: Any, kwargs: dict) -> Any:
    """PyTorch spells axis `dim` and keepdims `keepdim`; accept both."""
    if "dim" in kwargs:
        axis = kwargs.pop("dim")
    return axis


def _keep(x: Any, out: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    if not keepdims:
        return out
    shape = tuple(1 if i in axes else d for i, d in enumerate(E.shape_of(x)))
    return E.reshape(out, shape)


# ---- elementwise -------------------------------------------------------------------------------

def _unary(fn, name):
    @op(name, traced=fn, unary=True)
    def f(x: Any) -> Any:
        return fn(_arr(x))
    f.__name__ = fn.__name__
    return f


def _binary(fn, name):
    @op(name, traced=fn)
    def f(x: Any, y: Any) -> Any:
        return fn(x if isinstance(x, (bool, int, float)) else _arr(x),
                  y if isinstance(y, (bool, int, float)) else _arr(y))
    return f


exp = _unary(E.exp, "Exp")
log = _unary(E.log, "Log")
log1p = _unary(E.log1p, "Log1P")
expm1 = _unary(E.expm1, "Expm1")
sin = _unary(E.sin, "Sin")
cos = _unary(E.cos, "Cos")
tan = _unary(E.tan, "Tan")
tanh = _unary(E.tanh, "Tanh")
sigmoid = _unary(E.sigmoid, "Sigmoid")
sqrt = _unary(E.sqrt, "Sqrt")
erf = _unary(E.erf, "Erf")
neg = _unary(E.neg, "Neg")
abs = _unary(E.abs, "Abs")  # noqa: A001
sign = _unary(E.sign, "Sign")
logical_not = _unary(E.logical_not, "LogicalNot")
add = _binary(E.add, "Add")
sub = _binary(E.sub, "Sub")
subtract = sub
mul = _binary(E.mul, "Mul")
multiply = mul
div = _binary(E.div, "Div")
divide = div
true_divide = div
floor_divide = _binary(E.floor_divide, "FloorDiv")
pow = _binary(E.pow, "Pow")  # noqa: A001
power = pow
maximum = _binary(E.maximum, "Maximum")
minimum = _binary(E.minimum, "Minimum")
less = _binary(E.less, "Lt")
less_equal = _binary(E.less_equal, "Le")
greater = _binary(E.greater, "Gt")
greater_equal = _binary(E.greater_equal, "Ge")
equal = _binary(E.equal, "Eq")
not_equal = _binary(E.not_equal, "Ne")
logical_and = _binary(E.logical_and, "LogicalAnd")
logical_or = _binary(E.logical_or, "LogicalOr")


@op("Relu")
def relu(x: Any) -> Any:
    x = _arr(x)
    # relu'(0) = 0 as in PyTorch, and NaN stays NaN (the comparison is false for it)
    return E.where(E.less_equal(x, 0), 0, x)


@op("Square")
def square(x: Any) -> Any:
    x = _arr(x)
    return E.mul(x, x)


@op("Reciprocal")
def reciprocal(x: Any) -> Any:
    return E.div(1.0, _arr(x))


@op("Where")
def where(cond: Any, x: Any, y: Any) -> Any:
    return E.where(_arr(cond), x if isinstance(x, (int, float)) else _arr(x),
                   y if isinstance(y, (int, float)) else _arr(y))


@op("Clamp")
def clip(x: Any, a_min: Any = None, a_max: Any = None, **bounds: Any) -> Any:
    """Clamp to [a_min, a_max]; the gradient passes where a_min <= x <= a_max (as PyTorch).
    The bounds may be given as torch's `min=` and `max=`."""
    for key in bounds:
        if key not in ("min", "max"):
            raise TypeError(f"clip() got an unexpected keyword argument {key!r}")
    a_min = bounds.get("min", a_min)
    a_max = bounds.get("max", a_max)
    x = _arr(x)
    if a_min is not None:
        x = E.where(E.less(x, a_min), E.convert(a_min, E.dtype_of(x)) if not isinstance(
            a_min, (int, float)) else a_min, x)
    if a_max is not None:
        x = E.where(E.greater(x, a_max), E.convert(a_max, E.dtype_of(x)) if not isinstance(
            a_max, (int, float)) else a_max, x)
    return x


clamp = clip


@op("StopGradient")
def _stop_gradient(x: Any) -> Any:
    return E.stop_gradient(_arr(x))


def stop_gradient(x: Any) -> Any:
    """`x` as a constant to differentiation (its gradient is zero). A pytree — a tuple, list
    or dict of arrays, a namedtuple, a registered type — is mapped leaf by leaf, as
    jax.lax.stop_gradient does (an array-like list is not stacked into one array)."""
    if x is None or type(x) in (tuple, list, dict) or type(x) in NODE_TYPES or \
            (isinstance(x, tuple) and hasattr(x, "_fields")):
        return tree_map(_stop_gradient, x)
    return _stop_gradient(x)


@op("ToCopy")
def astype(x: Any, dtype: Any) -> Any:
    return E.convert(_arr(x), np.dtype(dtype))


cast = astype


# ---- reductions --------------------------------------------------------------------------------

def _sum_all(x: Traced) -> Any:
    """`sum(x)` of a traced `x`: over every axis (the commonest call), without the keyword
    and conversion handling."""
    if x.atom.aval.dtype.kind == "b":
        return sum.raw(x)
    return E.reduce_sum(x, range(len(x.atom.aval.shape)))


@op("Sum", traced=_sum_all)
def sum(x: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Any:  # noqa: A001
    axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
    x = _arr(x)
    if E.dtype_of(x).kind == "b":
        x = E.convert(x, int64)
    axes = _axes(x, axis)
    return _keep(x, E.reduce_sum(x, axes), axes, keepdims)


@op("Mean")
def mean(x: Any, axis: Any = None, keepdims: bool = False, dtype: Any = None,
         **kw: Any) -> Any:
    axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
    x = _arr(x) if dtype is None else E.convert(_arr(x), np.dtype(dtype))
    x = E.to_float(x)
    axes = _axes(x, axis)
    n = math.prod(E.shape_of(x)[a] for a in axes)
    return _keep(x, E.div(E.reduce_sum(x, axes), float(n) if n else math.nan), axes, keepdims)


def _variance(x: Any, axis: Any, keepdims: bool, ddof: Any, kw: dict) -> Any:
    """var's sum of squared deviations from the mean over `axis`, divided by n - ddof (n
    the number of elements summed; numpy's `ddof`, also spelt `correction` as the array API
    and torch do). As numpy: a divisor of zero or less gives inf, or NaN where the sum is 0."""
    axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
    if "correction" in kw:
        ddof = kw.pop("correction")
    if kw:
        raise TypeError(f"var/std: unexpected keyword argument {next(iter(kw))!r}")
    if isinstance(ddof, bool) or not isinstance(ddof, (int, float, np.integer, np.floating)):
        raise TypeError(f"var/std: ddof must be a number, got {type(ddof).__name__}")
    x = E.to_float(_arr(x))
    axes = _axes(x, axis)
    shape = E.shape_of(x)
    n = math.prod(shape[a] for a in axes)
    centred = E.sub(x, E.reshape(E.div(E.reduce_sum(x, axes), float(n) if n else math.nan),
                                 tuple(1 if i in axes else d for i, d in enumerate(shape))))
    out = E.div(E.reduce_sum(E.mul(centred, centred), axes), float(max(n - ddof, 0)))
    return _keep(x, out, axes, keepdims)


@op("Var")
def var(x: Any, axis: Any = None, keepdims: bool = False, ddof: Any = 0, **kw: Any) -> Any:
    """The variance over `axis` (numpy's and JAX's: ddof 0 unless given)."""
    return _variance(x, axis, keepdims, ddof, kw)


@op("Std")
def std(x: Any, axis: Any = None, keepdims: bool = False, ddof: Any = 0, **kw: Any) -> Any:
    """The standard deviation over `axis`: sqrt(var(x, axis, ddof=ddof))."""
    return E.sqrt(_variance(x, axis, keepdims, ddof, kw))


def _extreme(reduce, name):
    @op(name)
    def f(x: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
        x = _arr(x)
        axes = _axes(x, axis)
        return _keep(x, reduce(x, axes), axes, keepdims)
    return f


max = _extreme(E.reduce_max, "Max")  # noqa: A001
min = _extreme(E.reduce_min, "Min")  # noqa: A001
amax, amin = max, min
prod = _extreme(E.reduce_prod, "Prod")


def _arg(reduce, name):
    @op(name)
    def f(x: Any, axis: int | None = None, keepdims: bool = False, **kw: Any) -> Any:
        axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
        x = _arr(x)
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{name.lower()}: axis must be an int or None, got {axis!r}" +
                            _at_user())
        if axis is None or not E.shape_of(x):
            if axis is not None:
                _axes(x, axis)      # (a 0-d x's axis: 0 or -1, else AxisError)
            flat = E.reshape(x, (E.size_of(E.shape_of(x)),))
            out = reduce(flat, 0)
            return E.reshape(out, (1,) * len(E.shape_of(x))) if keepdims else out
        (a,) = _axes(x, axis)
        return _keep(x, reduce(x, a), (a,), keepdims)
    return f


def _truth(name):
    @op(name)
    def f(x: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        """numpy's all / any: whether every (some) element along `axis` is nonzero (NaN
        counts as nonzero); a bool array. Over no elements all is True and any False."""
        axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
        x = _arr(x)
        axes = _axes(x, axis)
        nonzero = x if E.dtype_of(x).kind == "b" else E.not_equal(x, E.zeros_like(x))
        count = E.reduce_sum(E.convert(nonzero, int64), axes)
        if name == "All":
            out = E.equal(count, math.prod(E.shape_of(x)[a] for a in axes))
        else:
            out = E.greater(count, 0)
        return _keep(x, out, axes, keepdims)
    f.__name__ = name.lower()
    return f


all = _truth("All")  # noqa: A001
any = _truth("Any")  # noqa: A001
argmax = _arg(E.argmax, "Argmax")
argmin = _arg(E.argmin, "Argmin")


@op("Logsumexp")
def logsumexp(x: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Any:
    """log(sum(exp(x))), shifted by the max so it neither overflows nor underflows."""
    axis, keepdims = _axis_kw(axis, kw), kw.pop("keepdim", keepdims)
    x = E.to_float(_arr(x))
    axes = _axes(x, axis)
    shape = E.shape_of(x)
    if builtins.any(shape[a] == 0 for a in axes):    # the log of an empty sum: -inf, as torch's
        out = E.full([d for i, d in enumerate(shape) if i not in axes], -math.inf,
                     E.dtype_of(x))
        return _keep(x, out, axes, keepdims)
    m = E.stop_gradient(E.reduce_max(x, axes))
    m = E.where(E.less(E.abs(m), math.inf), m, 0.0)    # an all -inf row stays -inf, not nan
    m_kept = E.reshape(m, tuple(1 if i in axes else d for i, d in enumerate(E.shape_of(x))))
    out = E.add(E.log(E.reduce_sum(E.exp(E.sub(x, m_kept)), axes)), m)
    return _keep(x, out, axes, keepdims)


# ---- shapes ------------------------------------------------------------------------------------

def _shape_arg(shape: Sequence[Any]) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


@op("View")
def reshape(x: Any, *shape: Any) -> Any:
    x = _arr(x)
    shape = list(_shape_arg(shape))
    size = E.size_of(E.shape_of(x))
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: can only specify one unknown dimension, got {tuple(shape)}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"reshape: cannot reshape array of shape {E.shape_of(x)} into "
                             f"shape {tuple(shape)}")
        shape[shape.index(-1)] = size // known
    return E.reshape(x, shape)


@op("Permute")
def transpose(x: Any, axes: Any = None, *more: Any) -> Any:
    x = _arr(x)
    ndim = len(E.shape_of(x))
    if axes is None:
        perm = tuple(reversed(range(ndim)))
    elif more:   # torch style transpose(x, dim0, dim1)
        perm = list(range(ndim))
        a, b = _axes(x, axes), _axes(x, more[0])    # (() of a 0-d x: nothing to swap)
        if ndim:
            perm[a[0]], perm[b[0]] = perm[b[0]], perm[a[0]]
    else:
        axes = tuple(axes)
        if len(axes) != ndim or not builtins.all(-ndim <= a < ndim for a in axes):
            raise ShapeError(f"transpose: axes {axes} don't match an array of shape "
                             f"{tuple(E.shape_of(x))}")
        perm = tuple(a % ndim for a in axes)
    return E.transpose(x, perm)


def swapaxes(x: Any, a: int, b: int) -> Any:
    return transpose(x, a, b)


@op("Expand")
def broadcast_to(x: Any, shape: int | Sequence[int]) -> Any:
    return E.broadcast_to(_arr(x), (shape,) if isinstance(shape, (int, np.integer))
                          else tuple(shape))


@op("Unsqueeze")
def expand_dims(x: Any, axis: int | Sequence[int]) -> Any:
    x = _arr(x)
    shape = list(E.shape_of(x))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    n = len(shape) + len(axes)      # (as numpy: axes of the output)
    for a in sorted(_axis(a, n, what="expand_dims") for a in axes):
        shape.insert(a, 1)
    return E.reshape(x, shape)


@op("Squeeze")
def squeeze(x: Any, axis: Any = None) -> Any:
    x = _arr(x)
    shape = E.shape_of(x)
    if axis is None:
        return E.reshape(x, [d for d in shape if d != 1])
    axes = _axes(x, axis)
    for a in axes:
        if shape[a] != 1:
            raise ShapeError(f"squeeze: cannot select an axis to squeeze out which has size "
                             f"not equal to one (axis {a} of shape {shape})")
    return E.reshape(x, [d for i, d in enumerate(shape) if i not in axes])


@op("Cat")
def concatenate(xs: Sequence[Any], axis: int = 0, dim: int | None = None) -> Any:
    axis = axis if dim is None else dim     # (torch's name)
    xs = [_arr(x) for x in xs]
    if not xs:
        raise ShapeError("concatenate: needs at least one array")
    if axis is None:    # numpy's: the arrays flattened, end to end
        xs = [E.reshape(x, (E.size_of(E.shape_of(x)),)) for x in xs]
        axis = 0
    ndim = len(E.shape_of(xs[0]))
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated")
    return E.concatenate(xs, _axis(axis, ndim, what="concatenate"))


cat = concatenate


@op("Stack")
def stack(xs: Sequence[Any], axis: int = 0, dim: int | None = None) -> Any:
    axis = axis if dim is None else dim     # (torch's name)
    xs = [_arr(x) for x in xs]
    if not xs:
        raise ShapeError("stack: needs at least one array")
    shapes = {tuple(E.shape_of(x)) for x in xs}
    if len(shapes) != 1:
        raise ShapeError(f"stack: all input arrays must have the same shape, got "
                         f"{[tuple(E.shape_of(x)) for x in xs]}")
    axis = _axis(axis, len(E.shape_of(xs[0])) + 1, what="stack")
    return E.concatenate([expand_dims.raw(x, axis) for x in xs], axis)


@op("Take")
def take(x: Any, indices: Any, axis: int | None = None) -> Any:
    x = _arr(x)
    idx = _arr(indices)
    if axis is None:
        x = E.reshape(x, (E.size_of(E.shape_of(x)),))
        axis = 0
    axis = _axis(axis, builtins.max(len(E.shape_of(x)), 1), len(E.shape_of(x)), "take")
    if isinstance(idx, (np.ndarray, np.generic)) and np.size(idx):
        n = E.shape_of(x)[axis]
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size and n:   # (an empty axis gets the shape rule's own error)
            raise IndexError(f"take: index {bad.flat[0]} is out of bounds for axis {axis} with "
                             f"size {n}")
    return E.take(x, idx, axis)


# ---- linear algebra ----------------------------------------------------------------------------

@op("Mm")
def matmul(a: Any, b: Any) -> Any:
    if (type(a) is Traced and type(b) is Traced and 0 < len(a.atom.aval.shape) <= 2
            and 0 < len(b.atom.aval.shape) <= 2):
        return E.matmul(a, b)       # the common case: no batch dimensions to broadcast
    a, b = _arr(a), _arr(b)
    sa, sb = E.shape_of(a), E.shape_of(b)
    if len(sa) == 0 or len(sb) == 0:
        raise ShapeError(f"matmul: operands must be at least 1-d, got shapes {sa} and {sb}")
    if len(sa) > 2 or len(sb) > 2:
        batch = broadcast_shapes(sa[:-2] if len(sa) > 1 else (),
                                 sb[:-2] if len(sb) > 1 else ())
        if len(sa) >= 2:
            a = E.broadcast_to(a, batch + tuple(sa[-2:]))
        else:
            a = E.broadcast_to(E.reshape(a, (1,) + tuple(sa)), batch + (1,) + tuple(sa))
        if len(sb) >= 2:
            b = E.broadcast_to(b, batch + tuple(sb[-2:]))
        else:
            b = E.broadcast_to(E.reshape(b, tuple(sb) + (1,)), batch + tuple(sb) + (1,))
        out = E.matmul(a, b)
        if len(sa) == 1:
            out = E.reshape(out, batch + (E.shape_of(out)[-1],))
        elif len(sb) == 1:
            out = E.reshape(out, batch + (E.shape_of(out)[-2],))
        return out
    return E.matmul(a, b)


@op("Dot")
def dot(a: Any, b: Any) -> Any:
    """numpy's dot: a product with a scalar, else the sum over a's last axis and b's second
    to last (its only one if 1-d). Up to 2-d, and a 1-d operand, that is matmul; two of
    which one has more axes take every pairing, not matmul's batches (shape
    a.shape[:-1] + b.shape[:-2] + b.shape[-1:])."""
    a, b = _arr(a), _arr(b)
    sa, sb = tuple(E.shape_of(a)), tuple(E.shape_of(b))
    if not sa or not sb:
        return E.mul(a, b)
    if len(sa) <= 2 and len(sb) <= 2 or len(sa) == 1 or len(sb) == 1:
        return matmul.raw(a, b)
    if sa[-1] != sb[-2]:
        raise ShapeError(f"dot: shapes {sa} and {sb} not aligned: {sa[-1]} (dim {len(sa) - 1}) "
                         f"!= {sb[-2]} (dim {len(sb) - 2})")
    rest = sb[:-2] + sb[-1:]
    bt = E.transpose(b, [len(sb) - 2] + [i for i in range(len(sb)) if i != len(sb) - 2])
    out = matmul.raw(E.reshape(a, (math.prod(sa[:-1]), sa[-1])),
                     E.reshape(bt, (sb[-2], math.prod(rest))))
    return E.reshape(out, sa[:-1] + rest)


# ---- creation (inside a trace; the Tensor module wraps these outside) ---------------------------

def _dtype(dtype: Any, default: np.dtype = float32) -> np.dtype:
    return default if dtype is None else np.dtype(dtype)


def full_traced(shape: Sequence[int], value: Any, dtype: Any = None) -> Any:
    if dtype is None:
        dtype = E.dtype_of(value) if isinstance(value, (bool, int, float)) else float32
    return E.full(tuple(int(d) for d in shape), value, np.dtype(dtype))


def arange_traced(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> Any:
    if stop is None:
        start, stop = 0, start
    n = builtins.max(0, math.ceil((stop - start) / step))
    if dtype is None:
        dtype = float32 if builtins.any(isinstance(v, float) for v in (start, stop, step)) \
            else int64
    r = E.iota((n,), 0, np.dtype(dtype))
    if step != 1:
        r = E.mul(r, step)
    if start != 0:
        r = E.add(r, start)
    return r


def linspace_traced(start: float, stop: float, num: int = 50, dtype: Any = None) -> Any:
    dtype = _dtype(dtype)
    step = (stop - start) / builtins.max(num - 1, 1)
    return E.add(E.mul(E.iota((num,), 0, dtype), step), start)


def eye_traced(n: int, m: int | None = None, dtype: Any = None) -> Any:
    m = n if m is None else m
    hit = E.equal(E.iota((n, m), 0, int64), E.iota((n, m), 1, int64))
    return E.convert(hit, _dtype(dtype))

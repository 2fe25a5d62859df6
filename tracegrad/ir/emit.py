"""The op layer shared by user code and autodiff rules: numpy-style promotion of operands
(Python scalars are weakly typed), then one `bind` per primitive. Works on Traced values
(recording IR) and on plain arrays (evaluating the reference)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .builder import Traced, bind, bind_traced, scalar_literal
from .core import is_float
from .ops import convert_value

float32 = np.dtype(np.float32)
_WEAK = (bool, int, float)


def dtype_of(x: Any) -> np.dtype:
    if isinstance(x, Traced):
        return x.dtype
    if isinstance(x, np.generic):   # numpy scalars are strongly typed (np.float64 is a float)
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, int):
        return np.dtype(np.int64)
    if isinstance(x, float):
        return float32
    return np.asarray(x).dtype


def shape_of(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, Traced) else np.shape(x)


def _weak(x: Any) -> Any:
    """`x` if it is a Python scalar, a stand-in scalar if it is a traced input that was passed
    as one (weakly typed, as in JAX), else None."""
    if isinstance(x, _WEAK) and not isinstance(x, np.generic):
        return x
    if isinstance(x, np.generic) and x.dtype.kind == "f":
        # numpy scalars as operands (`x / np.sqrt(d)`) are weak too, as PyTorch treats them:
        # they never promote a float32 array to float64
        return x.item()
    if isinstance(x, Traced) and getattr(x.atom, "id", None) in x.builder.weak_inputs:
        return {"f": 0.0, "i": 0, "b": False}.get(x.dtype.kind)
    return None


def result_dtype(*xs: Any) -> np.dtype:
    weak_of = [_weak(x) for x in xs]
    weak = [w for w in weak_of if w is not None]
    strong = [dtype_of(x) for x, w in zip(xs, weak_of) if w is None]
    if not strong:   # numpy scalars among themselves keep numpy's rules
        strong = [x.dtype for x in xs if isinstance(x, np.generic) and x.dtype.kind == "f"]
    if not strong:
        if any(isinstance(w, float) for w in weak):
            return float32
        if any(not isinstance(w, bool) for w in weak):
            return np.dtype(np.int64)
        return np.dtype(np.bool_)
    d = np.result_type(*strong)
    if any(isinstance(w, float) for w in weak) and not is_float(d):
        return float32
    if any(isinstance(w, int) and not isinstance(w, bool) for w in weak) and d == np.bool_:
        return np.dtype(np.int64)
    return d


def asdtype(x: Any, dtype: np.dtype) -> Any:
    """`x` with dtype `dtype`: scalars become literals, others are converted if needed."""
    if type(x) is Traced and x.atom.aval.dtype is dtype:
        return x
    dtype = np.dtype(dtype)
    if isinstance(x, _WEAK):
        return np.asarray(x, dtype)
    if isinstance(x, Traced):
        return x if x.dtype == dtype else bind("convert", x, dtype=dtype)
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError(f"cannot use a value of type {type(x).__name__} as an array")
    return arr if arr.dtype == dtype else convert_value(arr, dtype)


def promote(*xs: Any) -> Sequence[Any]:
    first = xs[0]
    if type(first) is Traced and not first.builder.weak_inputs:   # the common case, quickly
        d = first.atom.aval.dtype
        for x in xs:
            if type(x) is not Traced or x.atom.aval.dtype is not d or x.builder.weak_inputs:
                break
        else:
            return xs
    xs = [_traced_value(x) for x in xs]
    d = result_dtype(*xs)
    return [asdtype(x, d) for x in xs]


def _traced_value(x: Any) -> Any:
    """`x`, or the array an object offers for tracing (`__tg_array__`): a Tensor operand of a
    traced value (`a * W` in a jitted function) is a constant of the trace, as in `W * a`,
    where the Tensor's own operator hands over its value."""
    get = getattr(x, "__tg_array__", None)
    return x if get is None else get()


def to_float(x: Any) -> Any:
    d = dtype_of(x)
    return x if is_float(d) and not isinstance(x, _WEAK) else asdtype(x, float32 if not
                                                                     is_float(d) else d)


# ---- elementwise -------------------------------------------------------------------------------

def _unary_float(op: str):
    def f(x: Any) -> Any:
        if type(x) is Traced and x.atom.aval.dtype.kind == "f":
            return bind_traced(op, x)
        return bind(op, to_float(x))
    f.__name__ = op
    return f


exp = _unary_float("exp")
log = _unary_float("log")
log1p = _unary_float("log1p")
expm1 = _unary_float("expm1")
sin = _unary_float("sin")
cos = _unary_float("cos")
tan = _unary_float("tan")
tanh = _unary_float("tanh")
sigmoid = _unary_float("logistic")
sqrt = _unary_float("sqrt")
erf = _unary_float("erf")


def neg(x: Any) -> Any:
    return bind("neg", asdtype(x, dtype_of(x)))


def abs(x: Any) -> Any:  # noqa: A001 - numpy's name
    return bind("abs", asdtype(x, dtype_of(x)))


def sign(x: Any) -> Any:
    return bind("sign", asdtype(x, dtype_of(x)))


def logical_not(x: Any) -> Any:
    return bind("not", asdtype(x, np.bool_))


def stop_gradient(x: Any) -> Any:
    return bind("stop_gradient", asdtype(x, dtype_of(x))) if isinstance(x, Traced) else x


def _binary(op: str):
    def f(x: Any, y: Any) -> Any:
        # The common cases need no promotion: two traced values of one dtype, and a float
        # traced value with a Python number (which never changes its dtype); no weak inputs.
        tx, ty = type(x), type(y)
        if tx is Traced:
            if ty is Traced:
                if (x.atom.aval.dtype is y.atom.aval.dtype and not x.builder.weak_inputs
                        and not y.builder.weak_inputs):
                    return bind_traced(op, x, y)
            elif (ty is float or ty is int) and not x.builder.weak_inputs:
                d = x.atom.aval.dtype
                if d.kind == "f":
                    return bind_traced(op, x, scalar_literal(y, d))
        elif ty is Traced and (tx is float or tx is int) and not y.builder.weak_inputs:
            d = y.atom.aval.dtype
            if d.kind == "f":
                return bind_traced(op, scalar_literal(x, d), y)
        return bind(op, *promote(x, y))
    f.__name__ = op
    return f


add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
maximum = _binary("max")
minimum = _binary("min")
less = _binary("lt")
less_equal = _binary("le")
greater = _binary("gt")
greater_equal = _binary("ge")
equal = _binary("eq")
not_equal = _binary("ne")
_div = _binary("div")


def floor_divide(x: Any, y: Any) -> Any:
    """numpy's `x // y`: `div` of integers floors; of floats, floor(x / y), the floor taken
    as the quotient truncated (through int64) less one where that exceeds it (a quotient of
    2**52 or more is integral already), with numpy's infinities: inf // 2 is NaN, -1 // inf
    is -1. (numpy corrects by the remainder, so where x / y rounds up to an integer it gives
    one less: 1.0 // 0.1 is 9.0 there, 10.0 here.)"""
    q = _div(x, y)
    d = dtype_of(q)
    if d.kind != "f":
        return q
    t = convert(convert(q, np.int64), d)
    out = where(less(abs(q), 2.0 ** 52), sub(t, convert(less(q, t), d)), q)
    # a finite x (not 0) by an infinite y: 0 of one sign, -1 of two; an infinite x: NaN
    signs = where(not_equal(less(x, 0.0), less(y, 0.0)), -1.0, 0.0)
    finite_x = logical_and(not_equal(x, 0.0), less(abs(x), np.inf))
    out = where(logical_and(equal(abs(y), np.inf), finite_x), signs, out)
    return where(logical_and(equal(abs(x), np.inf), not_equal(y, 0.0)), np.nan, out)


def logical_and(x: Any, y: Any) -> Any:
    return bind("and", asdtype(x, np.bool_), asdtype(y, np.bool_))


def logical_or(x: Any, y: Any) -> Any:
    return bind("or", asdtype(x, np.bool_), asdtype(y, np.bool_))


_float_div = _binary("div")


def div(x: Any, y: Any) -> Any:
    """True division: integer operands divide as float32 (as Python's `/` on ints)."""
    if ((type(x) is Traced and x.atom.aval.dtype.kind == "f")
            or (type(y) is Traced and y.atom.aval.dtype.kind == "f")):
        return _float_div(x, y)    # a float operand: promotion gives a float dtype
    d = result_dtype(x, y)
    if not is_float(d):
        d = float32
    return bind("div", asdtype(x, d), asdtype(y, d))


pow = _binary("pow")  # noqa: A001 - numpy's name


def where(c: Any, x: Any, y: Any) -> Any:
    x, y = promote(x, y)
    return bind("select", asdtype(c, np.bool_), x, y)


def convert(x: Any, dtype: Any) -> Any:
    return asdtype(x, np.dtype(dtype))


# ---- reductions --------------------------------------------------------------------------------

def _reduce(op: str):
    def f(x: Any, axes: Sequence[int]) -> Any:
        axes = tuple(sorted(axes))
        if type(x) is Traced:
            return bind_traced(op, x, params={"axes": axes}) if axes else x
        x = asdtype(x, dtype_of(x))
        if not axes:
            return x
        return bind(op, x, axes=axes)
    f.__name__ = op
    return f


reduce_sum = _reduce("reduce_sum")
reduce_max = _reduce("reduce_max")
reduce_min = _reduce("reduce_min")
reduce_prod = _reduce("reduce_prod")


def argmax(x: Any, axis: int) -> Any:
    return bind("argmax", asdtype(x, dtype_of(x)), axis=axis)


def argmin(x: Any, axis: int) -> Any:
    return bind("argmin", asdtype(x, dtype_of(x)), axis=axis)


# ---- shapes ------------------------------------------------------------------------------------

def reshape(x: Any, shape: Sequence[int]) -> Any:
    x = asdtype(x, dtype_of(x))
    shape = tuple(int(d) for d in shape)
    if tuple(shape_of(x)) == shape:
        return x
    return bind("reshape", x, shape=shape)


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    x = asdtype(x, dtype_of(x))
    shape = tuple(int(d) for d in shape)
    if tuple(shape_of(x)) == shape:
        return x
    return bind("broadcast", x, shape=shape)


def transpose(x: Any, perm: Sequence[int]) -> Any:
    x = asdtype(x, dtype_of(x))
    perm = tuple(int(p) for p in perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind("transpose", x, perm=perm)


def slice_(x: Any, index: Sequence[tuple[int, int, int]]) -> Any:
    return bind("slice", asdtype(x, dtype_of(x)), index=tuple(tuple(s) for s in index))


def pad_slice(g: Any, shape: Sequence[int], index: Sequence[tuple[int, int, int]]) -> Any:
    return bind("pad_slice", asdtype(g, dtype_of(g)), shape=tuple(shape),
                index=tuple(tuple(s) for s in index))


def update_slice(x: Any, v: Any, index: Sequence[tuple[int, int, int]]) -> Any:
    """`x` with its slice `index` (as `slice_`'s) replaced by `v`, broadcast to that slice's
    shape and cast to x's dtype (as numpy's slice assignment does)."""
    d = dtype_of(x)
    index = tuple(tuple(s) for s in index)
    v = broadcast_to(asdtype(v, d), [len(range(*s)) for s in index])
    return bind("update_slice", asdtype(x, d), v, index=index)


def concatenate(xs: Sequence[Any], axis: int) -> Any:
    xs = promote(*xs)
    if len(xs) == 1:
        return xs[0]
    return bind("concatenate", *xs, axis=axis)


def take(x: Any, idx: Any, axis: int) -> Any:
    idx = asdtype(idx, dtype_of(idx)) if not isinstance(idx, (int, list)) else np.asarray(idx)
    return bind("take", asdtype(x, dtype_of(x)), idx, axis=axis)


def scatter_add(g: Any, idx: Any, axis: int, size: int) -> Any:
    return bind("scatter_add", g, idx, axis=axis, size=size)


def scatter(x: Any, v: Any, idx: Any, axis: int, mode: str) -> Any:
    """x with x[..., idx, ...] (idx along `axis`) combined with v in order: mode "set"
    (the last of a repeated index wins), "mul", "min" or "max"."""
    return bind("scatter", x, v, idx, axis=axis, mode=mode)


matmul = _binary("matmul")


def iota(shape: Sequence[int], dimension: int, dtype: Any) -> Any:
    return bind("iota", shape=tuple(shape), dimension=dimension, dtype=np.dtype(dtype))


def full(shape: Sequence[int], value: Any, dtype: Any) -> Any:
    return bind("full", shape=tuple(int(d) for d in shape), value=value, dtype=np.dtype(dtype))


def random(shape: Sequence[int], seed: Any, dist: str, dtype: Any) -> Any:
    """Uniform [0,1) or standard normal draws; a pure function of (seed, shape)."""
    return bind("random", asdtype(seed, np.int64), shape=tuple(int(d) for d in shape),
                dist=dist, dtype=np.dtype(dtype))


def zeros_like(x: Any) -> Any:
    return full(shape_of(x), 0, dtype_of(x))


def unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    """Sum `g` down to `shape`, undoing numpy broadcasting (the gradient of a broadcast)."""
    shape = tuple(shape)
    gshape = shape_of(g)
    if tuple(gshape) == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and gshape[i + lead] != 1)
    return reshape(reduce_sum(g, axes), shape)


def size_of(shape: Sequence[int]) -> int:
    return math.prod(shape)


# ---- operators on Traced values ----------------------------------------------------------------

def _swap(fn):
    return lambda self, other: fn(other, self)


for _name, _fn in {"add": add, "sub": sub, "mul": mul, "truediv": div, "pow": pow,
                   "matmul": matmul, "floordiv": floor_divide}.items():
    setattr(Traced, f"__{_name}__", _fn)
    setattr(Traced, f"__r{_name}__", _swap(_fn))
for _name, _fn in {"lt": less, "le": less_equal, "gt": greater, "ge": greater_equal,
                   "eq": equal, "ne": not_equal, "and": logical_and,
                   "or": logical_or}.items():
    setattr(Traced, f"__{_name}__", _fn)
Traced.__rand__ = _swap(logical_and)
Traced.__ror__ = _swap(logical_or)
Traced.__neg__ = neg
Traced.__pos__ = lambda self: self
Traced.__abs__ = abs
Traced.__invert__ = logical_not
Traced.__hash__ = lambda self: id(self)

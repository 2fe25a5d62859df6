"""Tensor methods and operators (PyTorch spellings, `dim=`/`keepdim=` aliases), in-place
ops with version counters, and slice assignment. Each records through `tensor_record.record`."""
from __future__ import annotations

from collections import namedtuple
from typing import Any, Callable

import numpy as np

from ..ir import emit as E
from . import numpy_api as tnp
from .numpy_api import _axis
from .autograd_exec import realize
from .autograd_graph import MAX_LEAF_CHAIN, Inplace, Node
from .grad_mode import mode
from .indexing import _expand as expand_index
from .autograd_graph import _TYPE_NAMES
from .indexing import _index_array, _is_array_index, ellipsis_gap, getitem, update_at
from .tensor import Tensor, record, refresh_views, register_view, write_aliases
from .tensor_record import binary_methods, record_binary, record_unary

_DTYPES = {"float": np.float32, "double": np.float64, "half": np.float16, "int": np.int32,
           "long": np.int64, "bool": np.bool_}

ReturnTypes = namedtuple("ReturnTypes", ["values", "indices"])


def _r(fn: Any) -> Any:
    return getattr(fn, "raw", fn)


# ---- operators -----------------------------------------------------------------------------------

def _binary(fn: Any, name: str) -> tuple:
    raw = _r(fn)

    def op(self: Tensor, other: Any) -> Any:
        return record_binary(raw, name, self, other)

    def rop(self: Tensor, other: Any) -> Any:
        return record_binary(raw, name, other, self)
    return op, rop


for _n, (_f, _stem) in {"add": (tnp.add, "Add"), "sub": (tnp.sub, "Sub"),
                        "mul": (tnp.mul, "Mul"), "truediv": (tnp.div, "Div"),
                        "pow": (tnp.pow, "Pow"), "matmul": (tnp.matmul, "Mm"),
                        "floordiv": (tnp.floor_divide, "FloorDiv")}.items():
    _op, _rop = binary_methods(_r(_f), _stem)
    setattr(Tensor, f"__{_n}__", _op)
    setattr(Tensor, f"__r{_n}__", _rop)

for _n, (_f, _stem) in {"lt": (tnp.less, "Lt"), "le": (tnp.less_equal, "Le"),
                        "gt": (tnp.greater, "Gt"), "ge": (tnp.greater_equal, "Ge"),
                        "and": (tnp.logical_and, "LogicalAnd"),
                        "or": (tnp.logical_or, "LogicalOr")}.items():
    _op, _rop = _binary(_f, _stem)
    setattr(Tensor, f"__{_n}__", _op)
    if _n in ("and", "or"):
        setattr(Tensor, f"__r{_n}__", _rop)


def _eq(self: Tensor, other: Any) -> Any:
    if other is None:
        return False
    return record(_r(tnp.equal), "Eq", (self, other), {})


def _ne(self: Tensor, other: Any) -> Any:
    if other is None:
        return True
    return record(_r(tnp.not_equal), "Ne", (self, other), {})


Tensor.__eq__ = _eq
Tensor.__ne__ = _ne
Tensor.__hash__ = lambda self: id(self)
Tensor.__neg__ = lambda self: record(_r(tnp.neg), "Neg", (self,), {})
Tensor.__pos__ = lambda self: self
Tensor.__abs__ = lambda self: record(_r(tnp.abs), "Abs", (self,), {})
Tensor.__invert__ = lambda self: record(_r(tnp.logical_not), "LogicalNot", (self,), {})


# ---- methods -------------------------------------------------------------------------------------

def _method(fn: Any, name: str) -> Any:
    raw = _r(fn)

    def m(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            return record_unary(raw, name, self)
        return record(raw, name, (self,) + args, kwargs)
    m.__name__ = getattr(fn, "__name__", name.lower())
    return m


_METHODS = {
    "sum": (tnp.sum, "Sum"), "mean": (tnp.mean, "Mean"), "prod": (tnp.prod, "Prod"),
    "all": (tnp.all, "All"), "any": (tnp.any, "Any"),
    "argmax": (tnp.argmax, "Argmax"), "argmin": (tnp.argmin, "Argmin"),
    "exp": (tnp.exp, "Exp"), "log": (tnp.log, "Log"), "log1p": (tnp.log1p, "Log1P"),
    "expm1": (tnp.expm1, "Expm1"), "tanh": (tnp.tanh, "Tanh"),
    "sigmoid": (tnp.sigmoid, "Sigmoid"), "relu": (tnp.relu, "Relu"),
    "sqrt": (tnp.sqrt, "Sqrt"), "abs": (tnp.abs, "Abs"), "sin": (tnp.sin, "Sin"),
    "cos": (tnp.cos, "Cos"), "tan": (tnp.tan, "Tan"), "erf": (tnp.erf, "Erf"),
    "neg": (tnp.neg, "Neg"), "sign": (tnp.sign, "Sign"), "square": (tnp.square, "Square"),
    "reciprocal": (tnp.reciprocal, "Reciprocal"), "pow": (tnp.pow, "Pow"),
    "matmul": (tnp.matmul, "Mm"), "mm": (tnp.matmul, "Mm"), "dot": (tnp.dot, "Dot"),
    "add": (tnp.add, "Add"), "sub": (tnp.sub, "Sub"), "mul": (tnp.mul, "Mul"),
    "div": (tnp.div, "Div"), "maximum": (tnp.maximum, "Maximum"),
    "minimum": (tnp.minimum, "Minimum"), "logsumexp": (tnp.logsumexp, "Logsumexp"),
    "clamp": (tnp.clip, "Clamp"), "clip": (tnp.clip, "Clamp"),
    "unsqueeze": (tnp.expand_dims, "Unsqueeze"), "squeeze": (tnp.squeeze, "Squeeze"),
    "take": (tnp.take, "Take"), "astype": (tnp.astype, "ToCopy"),
    "eq": (tnp.equal, "Eq"), "ne": (tnp.not_equal, "Ne"), "lt": (tnp.less, "Lt"),
    "le": (tnp.less_equal, "Le"), "gt": (tnp.greater, "Gt"), "ge": (tnp.greater_equal, "Ge"),
}
for _n, (_f, _stem) in _METHODS.items():
    setattr(Tensor, _n, _method(_f, _stem))


def _variance_method(fn: Any, stem: str) -> Any:
    """torch's var/std: over `dim`, with Bessel's correction unless `unbiased=False` or
    another `correction` is given (the numpy functions' default is none)."""
    raw = _r(fn)

    def m(self: Tensor, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
          correction: Any = None, **kw: Any) -> Any:
        if isinstance(dim, bool):       # x.var(False): the old (unbiased) form
            dim, unbiased = None, dim
        dim = kw.pop("axis", dim)
        keepdim = kw.pop("keepdims", keepdim)
        if unbiased is not None and correction is not None:
            raise TypeError(f"{fn.__name__}(): give unbiased or correction, not both")
        if self.dtype.kind not in "fc":
            raise RuntimeError("std and var only support floating point and complex dtypes")
        ddof = correction if correction is not None else 0 if unbiased is False else 1
        return record(raw, stem, (self,), {"axis": dim, "keepdims": keepdim, "ddof": ddof,
                                           **kw})
    m.__name__ = fn.__name__
    return m


def _mean(self: Tensor, *args: Any, **kwargs: Any) -> Any:
    """torch's mean: of floats (an integer tensor raises unless `dtype=` is given)."""
    d = self._var.aval.dtype
    if d.kind != "f" and d.kind != "c" and kwargs.get("dtype") is None:
        raise RuntimeError("mean(): could not infer output dtype. Input dtype must be either "
                           "a floating point or complex dtype. Got: "
                           + _TYPE_NAMES.get(d.name, d.name))
    if not args and not kwargs:
        return record_unary(_MEAN, "Mean", self)
    return record(_MEAN, "Mean", (self,) + args, kwargs)


_MEAN = _r(tnp.mean)
Tensor.mean = _mean
Tensor.var = _variance_method(tnp.var, "Var")
Tensor.std = _variance_method(tnp.std, "Std")


def _with_alpha(fn: Any, name: str) -> Any:
    raw = _r(fn)

    def m(self: Tensor, other: Any, alpha: Any = 1) -> Any:
        if alpha != 1:
            other = other * alpha
        return record(raw, name, (self, other), {})
    return m


def _functional(name: str, stem: str) -> Any:
    def m(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        fn = _nn_fns.get(name)
        if fn is None:      # nn sits above the tracer: imported when first used (an import
            from ..nn import functional as F    # statement costs ~3 us a call)
            fn = _nn_fns[name] = _r(getattr(F, name))
        return record(fn, stem, (self,) + args, kwargs)
    m.__name__ = name
    return m


_nn_fns: dict[str, Any] = {}      # name -> tg.nn.functional's function, undispatched
Tensor.softmax = _functional("softmax", "Softmax")
Tensor.log_softmax = _functional("log_softmax", "LogSoftmax")
Tensor.add = _with_alpha(tnp.add, "Add")
Tensor.sub = _with_alpha(tnp.sub, "Sub")


def _extreme(fn: Any, arg: Any, name: str, pair: str) -> Any:
    def m(self: Tensor, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
        dim = kw.pop("axis", dim)
        keepdim = kw.pop("keepdims", keepdim)
        if isinstance(dim, Tensor):        # x.max(other): elementwise
            return record(_r(pair), name + "imum", (self, dim), {})
        if dim is None:
            return record(_r(fn), name, (self,), {})
        values = record(_r(fn), name, (self, dim), {"keepdims": keepdim})
        indices = record(_r(arg), "Arg" + name.lower(), (self, dim), {"keepdims": keepdim})
        return ReturnTypes(values, indices)
    return m


Tensor.max = _extreme(tnp.max, tnp.argmax, "Max", tnp.maximum)
Tensor.min = _extreme(tnp.min, tnp.argmin, "Min", tnp.minimum)


def _reshape(self: Tensor, *shape: Any) -> Tensor:
    return record(_r(tnp.reshape), "View", (self,) + shape, {})


def _transpose(self: Tensor, dim0: int = 0, dim1: int = 1) -> Tensor:
    return record(_r(tnp.transpose), "Transpose", (self, dim0, dim1), {})


def _permute(self: Tensor, *dims: Any) -> Tensor:
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    return record(_r(tnp.transpose), "Permute", (self, dims), {})


def _t(self: Tensor) -> Tensor:
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{self.ndim}D")
    return record(_r(tnp.transpose), "T", (self,), {})


def _flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    shape = self.shape
    if not shape:
        return _reshape(self, 1)
    s, e = (_axis(d, len(shape), what="flatten") for d in (start_dim, end_dim))
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    new = shape[:s] + (int(np.prod(shape[s:e + 1])),) + shape[e + 1:]
    return _reshape(self, new)


def _expand(self: Tensor, *sizes: Any) -> Tensor:
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) \
        else sizes
    lead = len(sizes) - self.ndim
    shape = tuple(self.shape[i - lead] if d == -1 else d for i, d in enumerate(sizes))
    return record(_r(tnp.broadcast_to), "Expand", (self, shape), {})


def _contiguous_of(self: Tensor) -> Tensor:
    """`self`, or a copy of a view not laid out row-major (as torch's contiguous())."""
    of = self._x.get("view") if self._x is not None else None
    if of is None or of[2] is True or _contiguous(self.shape, _strides(of[2], self.shape)):
        return self
    return _clone(self)


def identity(x: Any) -> Any:
    return x


def _clone(self: Tensor) -> Tensor:
    return record(identity, "Clone", (self,), {})


def _to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif not isinstance(a, str):
            dtype = a
    if dtype is None or np.dtype(dtype) == self.dtype:
        return self
    return record(_r(tnp.astype), "ToCopy", (self, np.dtype(dtype)), {})


def _cast(dtype: Any) -> Any:
    return lambda self: _to(self, dtype)


def _marks_view(method: Any, kind: str, strides: Callable | None = None) -> Any:
    """Results of view ops are marked with their base and how they were made from it
    (holding the base, as torch's `._base`), and share its version counter: tracegrad's
    views are values, not windows on the base's storage, so an in-place op on one could not
    reach the base (see _check_inplace), and the base remakes them when it changes
    (tensor.register_view). Which results are views is torch's: each view knows its layout
    in the base's memory, True for contiguous or else how to work out its strides (lazily:
    `strides(in_strides, args, kwargs, in_shape, out_shape)` of this op; see _strides), and
    a reshape is a view only where torch's would be (_view_strides), a copy elsewhere.
    `kind`: "layout" (transpose, permute, expand), "shape" (squeeze, unsqueeze), "reshape",
    "index" (a view for basic indexing only: an index array or mask copies)."""
    def m(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        if out.__class__ is not Tensor or out is self:
            return out
        x = self._x
        of = x.get("view") if x is not None else None
        layout = True if of is None else of[2]
        if kind == "index":
            if layout is True:
                c = _basic_contiguous(args[0], self.shape)
                if c is None:          # advanced indexing: a copy
                    return out
                if not c:
                    layout = (_index_strides, args, kwargs, self.shape, out.shape, True)
            elif _basic(args[0]):
                layout = (_index_strides, args, kwargs, self.shape, out.shape, layout)
            else:
                return out
        elif kind == "reshape":
            if layout is not True:
                st = _view_strides(self.shape, _strides(layout, self.shape), out.shape)
                if st is None:         # not expressible as a view of that memory: a copy
                    return out
                layout = True if _contiguous(out.shape, st) else st
        elif kind == "layout" or layout is not True:
            layout = (strides, args, kwargs, self.shape, out.shape, layout)
        if of is None:
            row = args[0] % self.shape[0] if kind == "index" and type(args[0]) is int else None
            of = (self, ((method, args, kwargs),), layout, row)
        else:       # a view of a view: of the first base, made by both steps
            of = (of[0], of[1] + ((method, args, kwargs),), layout, None)
        register_view(out, of)
        return out
    return m


def _c_strides(shape: tuple) -> tuple:
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return tuple(reversed(out))


def _strides(layout: Any, shape: tuple) -> tuple:
    """A view's strides (in elements of its base) from its layout (see _marks_view)."""
    chain = []
    while layout is not True and layout and callable(layout[0]):
        chain.append(layout)
        layout = layout[5]
    st = _c_strides(chain[-1][3] if chain else shape) if layout is True else layout
    for fn, args, kwargs, in_shape, out_shape, _ in reversed(chain):
        st = fn(st, args, kwargs, in_shape, out_shape)
    return st


def _contiguous(shape: tuple, strides: tuple) -> bool:
    """Whether `strides` lay `shape` out row-major with no gaps (size-1 axes aside)."""
    if 0 in shape:
        return True
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def _view_strides(old: tuple, strides: tuple, new: tuple) -> tuple | None:
    """The strides of a view of shape `new` on memory laid out as `old` with `strides`, or
    None where there is none (torch's computeStride: reshape copies, view raises)."""
    if not old or 0 in old:
        return _c_strides(new)
    out = [0] * len(new)
    view_d = len(new) - 1
    chunk = strides[-1]
    tensor_n = view_n = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_n *= old[d]
        if d == 0 or (old[d - 1] != 1 and strides[d - 1] != tensor_n * chunk):
            while view_d >= 0 and (view_n < tensor_n or new[view_d] == 1):
                out[view_d] = view_n * chunk
                view_n *= new[view_d]
                view_d -= 1
            if view_n != tensor_n:
                return None
            if d > 0:
                chunk = strides[d - 1]
                tensor_n = view_n = 1
    return tuple(out) if view_d == -1 else None


def _reshape_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    return _view_strides(old, st, new) or _c_strides(new)   # (squeeze, unsqueeze: a view)


def _transpose_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    dims = list(args) + [kwargs[k] for k in ("dim0", "dim1") if k in kwargs]
    d0, d1 = (list(dims) + [0, 1][len(dims):])[:2]
    out = list(st)
    out[d0 % len(st)], out[d1 % len(st)] = st[d1 % len(st)], st[d0 % len(st)]
    return tuple(out)


def _permute_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    dims = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    return tuple(st[d % len(st)] for d in dims)


def _reversed_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    return st[::-1]


def _expand_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    lead = len(new) - len(old)
    return (0,) * lead + tuple(0 if n == 1 and new[i + lead] != 1 else s
                               for i, (n, s) in enumerate(zip(old, st, strict=True)))


def _index_strides(st: tuple, args: tuple, kwargs: dict, old: tuple, new: tuple) -> tuple:
    out, d = [], 0
    for it in expand_index(args[0], tuple(old)):
        if it is None:
            out.append(0)
        elif type(it) is slice:
            out.append(st[d] * it.indices(old[d])[2])
            d += 1
        else:
            d += 1
    return tuple(out)


def _basic(index: Any) -> bool:
    """Whether `x[index]` is basic indexing (ints, slices, None, `...`): a view in torch;
    index arrays, tensors and masks copy."""
    for it in (index if type(index) is tuple else (index,)):
        if not (it is None or it is Ellipsis or type(it) is slice or isinstance(
                it, (int, np.integer)) and not isinstance(it, (bool, np.bool_))):
            return False
    return True


def _basic_contiguous(index: Any, shape: tuple) -> bool | None:
    """For `x[index]` of a contiguous `x`: None if `index` is not basic (see _basic), else
    whether the result is contiguous (leading ints, at most one slice of step 1, whole axes
    after it)."""
    t = type(index)
    if t is int or t is slice and index.step is None:     # (the common cases)
        return True
    if not _basic(index):
        return None
    sliced = False
    for it, n in zip((i for i in expand_index(index, tuple(shape)) if i is not None), shape,
                     strict=False):
        if type(it) is slice:
            start, stop, step = it.indices(n)
            if sliced and (start, stop, step) != (0, n, 1) or step != 1:
                return False
            sliced = True
        elif sliced:
            return False
    return True


def _bounds(index: Any, shape: tuple) -> list | None:
    """[(start, stop)] per axis bounding what basic `x[index]` reads, or None."""
    if not _basic(index):
        return None
    out = []
    for it, n in zip((i for i in expand_index(index, tuple(shape)) if i is not None), shape,
                     strict=False):
        if type(it) is slice:
            r = range(*it.indices(n))
            out.append((min(r), max(r) + 1) if r else (0, 0))
        else:
            i = int(it) % n
            out.append((i, i + 1))
    return out


def _reads_none_of(index: Any, shape: tuple) -> Callable | None:
    """refresh_views' `unchanged` after `x[index] = ...` of an `x` of `shape`: a view
    x[other] whose bounds miss the written ones on some axis reads none of it. (Writing an
    int row, refresh_views looks at that row's x[i] views only, not at the other rows'.)"""
    written = _bounds(index, shape)
    if written is None:
        return None

    def unchanged(steps: tuple) -> bool:
        if len(steps) != 1 or steps[0][0] is not _getitem_raw:
            return False
        b = _bounds(steps[0][1][0], shape)
        return b is not None and any(e1 <= s2 or e2 <= s1 for (s1, e1), (s2, e2)
                                     in zip(b, written, strict=False))
    return unchanged


_reshape_view = _marks_view(_reshape, "reshape")
_transpose = _marks_view(_transpose, "layout", _transpose_strides)
_permute = _marks_view(_permute, "layout", _permute_strides)
_t = _marks_view(_t, "layout", _reversed_strides)
_expand = _marks_view(_expand, "layout", _expand_strides)
_flatten = _marks_view(_flatten, "reshape")     # (its own reshape: no view of its own)
_squeeze_all = Tensor.squeeze


def _squeeze(self: Tensor, dim: Any = None, **kw: Any) -> Tensor:
    """torch's squeeze: the given dims of size 1 go, the others stay (numpy's raises)."""
    dim = kw.pop("axis", dim)
    if kw:
        raise TypeError(f"squeeze() got unexpected keyword arguments {sorted(kw)}")
    if dim is None:
        return _squeeze_all(self)
    shape = self.shape
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    n = max(len(shape), 1)      # (a 0-d tensor's dim is 0 or -1, as torch's)
    axes = [_axis(d, n, len(shape), what="squeeze") for d in dims]
    if len(set(axes)) != len(axes):
        raise IndexError(f"squeeze: dim {dim!r} repeats a dim (of a tensor of dimension "
                         f"{len(shape)})")
    keep = tuple(a for a in axes if a < len(shape) and shape[a] == 1)
    return record(_r(tnp.squeeze), "Squeeze", (self, keep), {})


Tensor.squeeze = _squeeze
for _n in ("unsqueeze", "squeeze"):
    setattr(Tensor, _n, _marks_view(getattr(Tensor, _n), "shape", _reshape_strides))

Tensor.reshape = _reshape_view
Tensor.view = _reshape_view
Tensor.transpose = _transpose
Tensor.swapaxes = _transpose
Tensor.permute = _permute
Tensor.t = _t
Tensor.T = property(_marks_view(lambda self: record(_r(tnp.transpose), "Permute", (self,), {}),
                                 "layout", _reversed_strides))
Tensor.mT = property(lambda self: _transpose(self, -2, -1))
Tensor.flatten = _flatten
Tensor.expand = _expand
Tensor.expand_as = lambda self, other: _expand(self, other.shape)
Tensor.broadcast_to = _expand
Tensor.view_as = lambda self, other: _reshape_view(self, other.shape)
Tensor.reshape_as = lambda self, other: _reshape_view(self, other.shape)
Tensor.clone = _clone
Tensor.contiguous = _contiguous_of
Tensor.cpu = lambda self: self
Tensor.to = _to
Tensor.type_as = lambda self, other: _to(self, other.dtype)
for _n, _d in _DTYPES.items():
    setattr(Tensor, _n, _cast(_d))
Tensor.where = lambda self, cond, other: record(_r(tnp.where), "Where", (cond, self, other), {})
Tensor.masked_fill = lambda self, mask, value: record(
    _r(tnp.where), "MaskedFill", (mask, value, self), {})
Tensor.__getitem__ = lambda self, index: _getitem(self, index)
Tensor.__iter__ = lambda self: (self[i] for i in range(len(self)))
Tensor.equal = lambda self, other: bool(self.shape == other.shape and np.array_equal(
    self._val(), other._val()))
Tensor.allclose = lambda self, other, rtol=1e-5, atol=1e-8: bool(np.allclose(
    self._val(), other._val() if isinstance(other, Tensor) else other, rtol, atol))


def _concrete_masks(index: Any) -> Any:
    """A tuple index with its boolean Tensors as their values (masks: no gradient flows
    through them, and their True entries fix the result's shape, as torch reads them)."""
    if type(index) is tuple:
        for i in index:     # (every tuple index passes here: a loop, no generator)
            if isinstance(i, Tensor) and i.dtype == np.bool_:
                return tuple(j._val() if isinstance(j, Tensor) and j.dtype == np.bool_ else j
                             for j in index)
    return index


def _torch_layout(index: Any, shape: tuple) -> Any:
    """`index` without a '...' that stands for no axes between two index arrays: torch
    takes them as adjacent, numpy (whose layout `getitem` follows) as apart."""
    if type(index) is not tuple or len(index) < 3 or not ellipsis_gap(index, shape):
        return index    # (a gap needs an array, '...' and an array: three items)
    return tuple(i for i in index if i is not Ellipsis)


def _getitem(self: Tensor, index: Any) -> Tensor:
    index = _torch_layout(_concrete_masks(index), self.shape)
    mask = index if isinstance(index, (Tensor, np.ndarray)) else None
    if mask is not None and mask.dtype == np.bool_:
        m = mask._val() if isinstance(mask, Tensor) else mask
        if m.shape != self.shape[:m.ndim]:
            raise IndexError(f"The shape of the mask {list(m.shape)} does not match the shape "
                             f"of the indexed tensor {list(self.shape)}")
        flat = _reshape(self, (-1,) + self.shape[m.ndim:])
        return record(_r(tnp.take), "Index", (flat, np.flatnonzero(m), 0), {},
                      keep_arrays=True)
    if isinstance(index, Tensor) or type(index) is tuple and any(
            isinstance(i, Tensor) for i in index):
        _check_index_arrays(index, self.shape, "indexing")
    split = _ints_first(index, self.shape)
    if split is not None:
        return _getitem(_getitem(self, split[0]), split[1])
    return record(_r(getitem), "Index", (self, index), {}, keep_arrays=True)


def _is_int(i: Any) -> bool:
    return isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))


def _ints_first(index: Any, shape: tuple) -> tuple[tuple, tuple] | None:
    """For an index mixing ints and index arrays: (its ints, the rest), as torch applies them
    one after the other (the ints as selects: `t[1, :, idx]` is `t[1][:, idx]`, of shape
    (n, len(idx)); numpy, taking the int for an index array, lays idx's axis first). None
    for any other index."""
    if type(index) is not tuple or not any(map(_is_array_index, index)) or \
            not any(map(_is_int, index)):
        return None
    items = expand_index(index, shape)
    return (tuple(i if _is_int(i) else slice(None) for i in items if i is not None),
            tuple(i for i in items if not _is_int(i)))


_getitem_raw = _getitem
_getitem = _marks_view(_getitem, "index")


# ---- in-place ------------------------------------------------------------------------------------

def _check_inplace(self: Tensor) -> None:
    of = self._get("view")
    if of:
        if _written_through(of) is None:
            raise RuntimeError(
                "in-place operation on a view (the result of view/reshape/transpose/"
                "expand, or of indexing a view): tracegrad's views do not share storage "
                "with their base tensor, so the change would not reach it. Assign through "
                "the base instead (base[index] = value) or .clone() the view first.")
        _check_inplace(of[0])
        return
    if mode.grad and self._fn is None and self._rg:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")
    if self._get("inference") and not mode.inference:
        raise RuntimeError(
            "Inplace update to inference tensor outside InferenceMode is not allowed.You can "
            "make a clone to get a normal tensor before doing inplace update.See "
            "https://github.com/pytorch/rfcs/pull/17 for more details.")


def assign(self: Tensor, new: Tensor, unchanged: Callable | None = None,
           row: int | None = None) -> Tensor:
    """Make `self` hold `new`'s value (and, if recorded with grad, its history); bump the
    version counter. Writes through to the tensors sharing its storage, and remakes its
    views (but those `unchanged`: see refresh_views). A view `base[index]` (basic indexing)
    is written through: `base[index] = new`, which remakes it (see _written_through)."""
    if new.shape != self.shape:
        raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast "
                           f"shape {list(new.shape)}")
    x = self._x
    if x is not None and "view" in x:
        through = _written_through(x["view"])
        if through is not None:
            _setitem(through[0], through[1], new)   # (the base remakes self, its view)
            return self
    # the op's node (before a cast to self's dtype): what it saved of self is the value replaced
    own = new._fn if new._fn is not None and new._fn.saved else None
    if new.dtype != self.dtype:
        if np.can_cast(new.dtype, self.dtype, "same_kind"):
            new = record(_r(tnp.astype), "ToCopy", (new, self.dtype), {})
        else:
            raise RuntimeError(f"result type {new.dtype} can't be cast to the desired output "
                               f"type {self.dtype}")
    prev = self._node if self._value is None else None
    old = (self._var, self._value, self._node)
    self._var, self._value, self._node = new._var, new._value, new._node
    if new._fn is not None:
        self._fn = new._fn
        self._rg = True
    elif self._fn is None and self._value is None:
        _chain(self, prev)
    Inplace.bump(self._vc)
    if own is not None:     # the op read the value it replaced: that is not a later change
        for s in own.saved:
            if s.vc is self._vc:
                if s.slot == 0:
                    # the value replaced, as torch keeps it (a copy: original_self): later
                    # in-place changes of this tensor leave it valid (C.mul_(A); C.add_(1)),
                    # also what a saved_tensors_hooks pack returned as it was (t.cpu(), t)
                    s.vc, s.version = [0], 0
                    if s.tensor is self or s.packed is self:
                        snap = _snapshot(*old)
                        if s.tensor is self:
                            s.tensor = snap
                        if s.packed is self:
                            s.packed = snap
                else:
                    s.version = self._vc[0]
    if self._x is not None:
        if "aliases" in self._x:
            for t, prev in write_aliases(self):
                _chain(t, prev)
        if "views" in self._x:
            refresh_views(self, unchanged, row)
    return self


def _written_through(of: tuple) -> tuple[Tensor, Any] | None:
    """(base, index) of a view `base[index]` made by basic indexing (ints, slices, None,
    `...`) of a tensor that is no view itself: an in-place op on it writes `base[index]`, as
    torch's `x[0] += 1` or `x[0].zero_()` do (tracegrad's views are values: the base, once
    assigned, remakes the view). None for the other views, which refuse in-place ops."""
    base, steps = of[0], of[1]
    if len(steps) != 1 or steps[0][0] is not _getitem_raw or steps[0][2] or \
            not _basic(steps[0][1][0]) or base._get("view") is not None:
        return None
    return base, steps[0][1][0]


def _snapshot(var: Any, value: Any, node: Any) -> Tensor:
    """A tensor of a value an in-place op replaced (its variable, known value or node)."""
    if value is not None:
        return Tensor._leaf(value)
    return Tensor._from_var(var, node, None)


def _chain(leaf: Tensor, prev: Node | None) -> None:
    """A leaf's value is now pending: mark the node, and compute it once chains get long."""
    node = leaf._node
    node.leaf_chain = 1 + (prev.leaf_chain if prev is not None else 0)
    if node.leaf_chain > MAX_LEAF_CHAIN:
        realize([leaf])


def _inplace(fn: Any, name: str) -> Any:
    raw = _r(fn)

    def m(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        _check_inplace(self)
        return assign(self, record(raw, name, (self,) + args, kwargs))
    return m


def _inplace_alpha(fn: Any, name: str) -> Any:
    raw = _r(fn)

    def m(self: Tensor, other: Any, alpha: Any = 1) -> Tensor:
        _check_inplace(self)
        if alpha != 1:
            other = other * alpha
        return assign(self, record(raw, name, (self, other), {}))
    return m


for _n, (_f, _stem) in {"mul_": (tnp.mul, "Mul"), "div_": (tnp.div, "Div"),
                        "pow_": (tnp.pow, "Pow"), "clamp_": (tnp.clip, "Clamp"),
                        "exp_": (tnp.exp, "Exp"), "tanh_": (tnp.tanh, "Tanh"),
                        "relu_": (tnp.relu, "Relu"), "sigmoid_": (tnp.sigmoid, "Sigmoid"),
                        "neg_": (tnp.neg, "Neg"), "sqrt_": (tnp.sqrt, "Sqrt"),
                        "abs_": (tnp.abs, "Abs"), "log_": (tnp.log, "Log")}.items():
    setattr(Tensor, _n, _inplace(_f, _stem))
Tensor.add_ = _inplace_alpha(tnp.add, "Add")
Tensor.sub_ = _inplace_alpha(tnp.sub, "Sub")
Tensor.__iadd__ = lambda self, other: Tensor.add_(self, other)
Tensor.__isub__ = lambda self, other: Tensor.sub_(self, other)
Tensor.__imul__ = lambda self, other: Tensor.mul_(self, other)
Tensor.__itruediv__ = lambda self, other: Tensor.div_(self, other)


def _fill(x: Any, v: Any) -> Any:
    return E.add(E.mul(x, 0), v)


def _copy(x: Any, s: Any) -> Any:
    return E.broadcast_to(E.convert(s, x.dtype), x.shape)


def _masked_set(x: Any, m: Any, v: Any) -> Any:
    return E.where(m, E.convert(v, x.dtype) if not isinstance(v, (int, float)) else v, x)


def _set_value(self: Tensor, value: np.ndarray) -> Tensor:
    """Overwrite with a concrete value (the tensor leaves the graph, as a filled leaf)."""
    _check_inplace(self)
    if self._fn is not None and mode.grad:
        return assign(self, record(_fill, "Fill", (self, value), {}))
    new = Tensor._leaf(np.asarray(value, self.dtype))
    return assign(self, new)


Tensor.zero_ = lambda self: _set_value(self, np.zeros(self.shape, self.dtype))
Tensor.fill_ = lambda self, v: _set_value(self, np.full(self.shape, v._val() if isinstance(
    v, Tensor) else v, self.dtype))


def _copy_(self: Tensor, src: Any) -> Tensor:
    _check_inplace(self)
    src = src if isinstance(src, Tensor) else Tensor._leaf(np.asarray(src))
    return assign(self, record(_copy, "Copy", (self, src), {}))


def _uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    from .random import numpy_rng
    return _set_value(self, numpy_rng().uniform(a, b, self.shape))


def _normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    from .random import numpy_rng
    return _set_value(self, numpy_rng().normal(mean, std, self.shape))


Tensor.copy_ = _copy_
Tensor.uniform_ = _uniform_
Tensor.normal_ = _normal_


def _check_index_arrays(index: Any, shape: tuple, what: str = "slice assignment") -> None:
    """IndexError for an index array (or tensor) out of bounds, as torch raises (recorded
    as an input, a tensor index is a traced one: reading would clamp it, an update drop its
    entry, as JAX's do)."""
    dim = 0
    for item in expand_index(index, tuple(shape)):
        if item is None:
            continue
        if _is_array_index(item):
            _index_array(np.asarray(item._val() if isinstance(item, Tensor) else item),
                         shape[dim], dim, what)
        dim += 1


def _setitem(self: Tensor, index: Any, value: Any) -> None:
    _check_inplace(self)
    unchanged = row = None
    index = _torch_layout(_concrete_masks(index), self.shape)
    if isinstance(index, (Tensor, np.ndarray)) and index.dtype == np.bool_:
        m = index._val() if isinstance(index, Tensor) else index
        if m.shape != self.shape[:m.ndim]:
            raise IndexError(f"The shape of the mask {list(m.shape)} does not match the shape "
                             f"of the indexed tensor {list(self.shape)}")
        if (value.ndim if isinstance(value, Tensor) else np.ndim(value)) == 0:
            # a scalar: one select, its mask an input (the graph the same for every mask);
            # a mask of the leading axes covers the rest whole
            if m.ndim < self.ndim:
                index = m.reshape(m.shape + (1,) * (self.ndim - m.ndim))
            new = record(_masked_set, "MaskedFill", (self, index, value), {})
        else:   # values, one per masked entry (torch's x[mask] = v): by the entries' indices
            new = record(_scatter, "IndexPut", (self, value, np.nonzero(m)), {})
    else:
        if type(index) is not int:
            _check_index_arrays(index, self.shape)
        new = record(_scatter, "CopySlices", (self, value, index), {})
        if self._x is not None and "views" in self._x:
            unchanged = _reads_none_of(index, self.shape)
            if type(index) is int:
                row = index % self.shape[0]
    if new._fn is not None:
        new._fn.name_ = "CopySlices"
    assign(self, new, unchanged, row)


Tensor.__setitem__ = _setitem


def _scatter(x: Any, v: Any, index: Any) -> Any:
    """`x` with `x[index]` replaced by `v`: basic indexing (ints, slices, `...`, None), or
    integer arrays (torch's index_put_; of a repeated index, the last value is written);
    ints beside index arrays select first, as torch's (see `_ints_first`)."""
    split = _ints_first(index, tuple(E.shape_of(x)))
    if split is not None:
        part = update_at(getitem(x, split[0]), split[1], v, None, "slice assignment")
        return update_at(x, split[0], part, None, "slice assignment")
    return update_at(x, index, v, None, "slice assignment")

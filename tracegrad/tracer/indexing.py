"""Basic and integer-array indexing (`x[1:, ::2, None]`, `x[idx]`) as slice, reshape, take;
updates of an indexed part (`x.at[1:, 0].set(v)`, a Tensor's `x[1:, 0] = v`) as update_slice
and scatter_add."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import emit as E
from ..ir.builder import Traced, bind_traced, params_token, user_source
from ..ir.core import remember
from .dispatch import op


def _is_array_index(i: Any) -> bool:
    return isinstance(i, (Traced, np.ndarray, list)) or (
        hasattr(i, "__tg_function__") and not isinstance(i, (int, slice)))


def _at_user() -> str:
    src = user_source()
    return f" (at {src})" if src else ""


def _int_item(i: int, n: int, axis: int, what: str) -> int:
    """An int index `i` into an axis of size `n`, from 0 (IndexError if out of range)."""
    if not -n <= i < n:
        raise IndexError(f"{what}: index {i} is out of bounds for axis {axis} with size {n}"
                         + _at_user())
    return i % n


def _index_array(idx: Any, n: int, axis: int, what: str) -> Any:
    """An index array into an axis of size `n`: a traced one as it is, a concrete one checked
    (integers, each in range: IndexError naming the first that is not) and counted from 0."""
    if not isinstance(idx, Traced):
        listed = not isinstance(idx, np.ndarray)
        idx = np.asarray(idx)
        if listed and not idx.size:     # x[[]]: numpy takes an empty list as integers
            idx = idx.astype(np.intp)
    if E.dtype_of(idx) == np.bool_:
        raise IndexError(f"{what}: boolean mask indexing has a data-dependent shape; use "
                         "tg.where(mask, x, 0) instead" + _at_user())
    if not np.issubdtype(E.dtype_of(idx), np.integer):
        raise IndexError(f"{what}: index arrays must be integers, got {E.dtype_of(idx)}"
                         + _at_user())
    if isinstance(idx, Traced):
        return idx
    bad = idx[(idx < -n) | (idx >= n)]
    if bad.size:
        raise IndexError(f"{what}: index {int(bad[0])} is out of bounds for axis {axis} "
                         f"with size {n}" + _at_user())
    # (widened first: a small integer type overflows adding n)
    return np.where(idx < 0, idx.astype(np.int64) + n, idx) if idx.size and idx.min() < 0 \
        else idx


def _mask(i: Any) -> np.ndarray | None:
    """`i` as a concrete boolean mask of one or more axes (a numpy array or a list of
    bools), else None."""
    if isinstance(i, np.ndarray) or (type(i) is list and i):
        m = np.asarray(i)
        if m.dtype == np.bool_ and m.ndim:
            return m
    return None


def _expand(index: Any, shape: tuple) -> list[Any]:
    """`index` as one item per axis of an array of `shape` (Nones kept): '...' written out
    as full slices, and a concrete boolean mask of k axes as the k integer arrays of its
    True entries (numpy's: a mask's shape must match the axes it indexes; its result's
    length is known here, so jit takes it as numpy does)."""
    ndim = len(shape)
    if not isinstance(index, tuple):
        index = (index,)
    n_ellipsis = sum(i is Ellipsis for i in index)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    masks = None
    for i in index:
        if type(i) is list or type(i) is np.ndarray:
            masks = {k: m for k, j in enumerate(index) if (m := _mask(j)) is not None}
            break
    if masks:
        return _with_masks(index, shape, masks)
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices: array is {ndim}-dimensional, but {used} were indexed")
    out: list[Any] = []
    for i in index:
        if i is Ellipsis:
            out.extend([slice(None)] * (ndim - used))
        else:
            out.append(i)
    out.extend([slice(None)] * (ndim - sum(1 for i in out if i is not None)))
    return out


def ellipsis_gap(index: Any, shape: tuple) -> bool:
    """Whether `index` has a '...' standing for no axes between two of its advanced items
    (index arrays, masks, and ints, which count as advanced beside an array). numpy takes
    them as apart there, as if a slice were between them, and lays the result's indexed axes
    first: on shape (5, 3, 4), x[:2, [0, 1, 2], ..., [1, 2, 3]] is (3, 2). (torch takes them
    as adjacent: (2, 3).)"""
    if type(index) is not tuple:
        return False
    at = -1
    for k, i in enumerate(index):
        if i is Ellipsis:
            at = k
            break
    if at < 0:
        return False

    def advanced(i: Any) -> bool:
        return _is_array_index(i) or isinstance(i, (int, np.integer)) and \
            not isinstance(i, (bool, np.bool_))
    if not (any(map(advanced, index[:at])) and any(map(advanced, index[at + 1:]))):
        return False
    used = 0
    for i in index:
        if i is not None and i is not Ellipsis:
            m = _mask(i)
            used += 1 if m is None else m.ndim
    return used == len(shape)


def _with_masks(index: tuple, shape: tuple, masks: dict) -> list[Any]:
    """_expand of an index holding boolean masks (`masks`: position -> mask)."""
    ndim = len(shape)
    used = sum(masks[k].ndim if k in masks else 1 for k, i in enumerate(index)
               if i is not None and i is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices: array is {ndim}-dimensional, but {used} were indexed")
    out: list[Any] = []
    dim = 0
    for k, i in enumerate(index):
        if i is Ellipsis:
            out.extend([slice(None)] * (ndim - used))
            dim += ndim - used
        elif k in masks:
            m = masks[k]
            for a, (got, want) in enumerate(zip(m.shape, shape[dim:dim + m.ndim])):
                if got != want:
                    raise IndexError(f"boolean index did not match indexed array along axis "
                                     f"{dim + a}; size of axis is {want} but size of "
                                     f"corresponding boolean axis is {got}" + _at_user())
            out.extend(np.nonzero(m))
            dim += m.ndim
        else:
            out.append(i)
            dim += i is not None
    out.extend([slice(None)] * (ndim - sum(1 for i in out if i is not None)))
    return out

# (shape, int index) -> the params of x[index]'s slice (None if there is nothing to cut) and
# reshape, each with its bind_traced token; equations share them, as they share a rule's
# params when autodiff replays it
_INT_INDEX: dict[tuple, tuple[dict | None, int, dict, int]] = {}


def int_index(x: Traced, index: int) -> Any:
    """`x[index]` for a traced `x` and an int `index`: the common case (`xs[t]`), as a slice
    and a reshape (`Traced.__getitem__` calls it directly; the user's line is looked for
    from the frame above its caller)."""
    shape = x.atom.aval.shape
    if not shape:
        return getitem(x, index)    # (a 0-d value: getitem's error)
    params = _INT_INDEX.get((shape, index))
    if params is None:
        n = shape[0]
        i = _int_item(index, n, 0, "indexing")
        cut = ({"index": ((i, i + 1, 1),) + tuple((0, d, 1) for d in shape[1:])}
               if n != 1 else None)
        params = remember(_INT_INDEX, (shape, index),
                          (cut, params_token(), {"shape": shape[1:]}, params_token()))
    if params[0] is not None:
        x = bind_traced("slice", x, params=params[0], token=params[1])
    return bind_traced("reshape", x, params=params[2], token=params[3])


class _Merged:
    """An index of integer arrays (and ints) on some axes and slices on the others, as one
    index array along one axis (numpy's advanced indexing): `x` is sliced by the slices
    (`slices`, None if all are full), its indexed axes are moved together (to the front when
    a slice separates them, where numpy puts their result) and merged into axis `axis`
    (`xm`), and `flat` indexes it (shape: the arrays' broadcast shape). `x[index]` is
    take(xm, flat, axis); `back(ym)` lays out an updated xm as x[slices] again.

    Out of bounds, as JAX: a traced index is clamped (`drop` False: reading, or an update's
    mode "clip"), or its entry dropped (`drop`: an update's default, JAX's for scatters; xm
    then has one more entry along `axis`, where such entries write, and `back` cuts it
    off). A concrete one raises IndexError, or is clamped with `clip` (mode "clip")."""
    __slots__ = ("slices", "xm", "flat", "axis", "perm", "shape", "padded")

    def __init__(self, x: Any, items: list, what: str, drop: bool = False,
                 clip: bool = False, apart: bool = False):
        shape = tuple(E.shape_of(x))
        slices, idx = [], []
        for k, (item, n) in enumerate(zip(items, shape)):
            if isinstance(item, slice):
                slices.append(item.indices(n))
                continue
            slices.append((0, n, 1))
            if clip and not isinstance(item, Traced) and n:
                item = np.asarray(item)
                if np.issubdtype(item.dtype, np.integer):
                    item = np.clip(np.where(item < 0, item.astype(np.int64) + n, item), 0, n - 1)
            if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
                item = np.asarray(_int_item(int(item), n, k, what))
            idx.append((k, _index_array(item, n, k, what)))
        self.slices = None if all(s == (0, n, 1) for s, n in zip(slices, shape)) else slices
        if self.slices is not None:
            x = E.slice_(x, slices)
            shape = tuple(E.shape_of(x))
        axes = [k for k, _ in idx]
        together = not apart and axes == list(range(axes[0], axes[-1] + 1))
        self.perm = None if together else axes + [k for k in range(len(shape)) if k not in axes]
        if self.perm is not None:
            x = E.transpose(x, self.perm)
            shape = tuple(shape[k] for k in self.perm)
        self.axis = axis = axes[0] if together else 0
        self.shape = shape
        sizes = shape[axis:axis + len(axes)]
        total = math.prod(sizes)
        self.xm = E.reshape(x, shape[:axis] + (total,) + shape[axis + len(axes):])
        self.padded = drop and any(isinstance(i, Traced) for _, i in idx)
        if len(idx) == 1 and not self.padded:  # (take and scatter clamp a traced index)
            self.flat = idx[0][1]
            return
        shapes = [tuple(E.shape_of(i)) for _, i in idx]
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise IndexError(f"{what}: shape mismatch: indexing arrays could not be broadcast "
                             f"together with shapes {' '.join(map(str, shapes))}"
                             + _at_user()) from None
        flat: Any = 0
        valid: Any = True
        stride = 1
        for (_, i), n in reversed(list(zip(idx, sizes))):
            if isinstance(i, Traced):       # from 0, then clamped or checked
                i = E.asdtype(i, np.int64)
                if self.padded:
                    valid = E.logical_and(valid, E.logical_and(E.greater_equal(i, -n),
                                                               E.less(i, n)))
                i = E.where(E.less(i, 0), i + n, i)
                if not self.padded:
                    i = E.minimum(E.maximum(i, 0), max(n - 1, 0))
            else:
                i = i.astype(np.int64)
            flat = i * stride + flat
            stride *= n
        self.flat = flat
        if self.padded:     # an entry out of bounds writes into one more, cut off after
            self.flat = E.where(valid, flat, total)
            pad = shape[:axis] + (1,) + shape[axis + len(axes):]
            self.xm = E.concatenate([self.xm, E.full(pad, 0, E.dtype_of(x))], axis)

    def back(self, ym: Any) -> Any:
        if self.padded:
            ym = E.slice_(ym, [(0, d - (k == self.axis), 1)
                               for k, d in enumerate(E.shape_of(ym))])
        y = E.reshape(ym, self.shape)
        if self.perm is not None:
            inverse = [0] * len(self.perm)
            for k, p in enumerate(self.perm):
                inverse[p] = k
            y = E.transpose(y, inverse)
        return y


@op("Index")
def getitem(x: Any, index: Any) -> Any:
    if type(index) is int and type(x) is Traced and x.atom.aval.shape:   # x[t]: the common case
        return int_index(x, index)
    shape = tuple(E.shape_of(x))
    items = _expand(index, shape)
    slices: list[tuple[int, int, int]] = []
    out_shape: list[int] = []
    advanced: tuple[int, Any] | None = None   # (axis in the output, indices)
    dim = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        n = shape[dim]
        if isinstance(item, (bool, np.bool_)):
            raise IndexError("boolean scalar indices are not supported")
        if isinstance(item, (int, np.integer)):
            i = _int_item(int(item), n, dim, "indexing")
            slices.append((i, i + 1, 1))
        elif isinstance(item, slice):
            start, stop, step = item.indices(n)
            slices.append((start, stop, step))
            out_shape.append(len(range(start, stop, step)))
        elif _is_array_index(item):
            if advanced is not None:
                return _merged_getitem(x, items, ellipsis_gap(index, shape))
            slices.append((0, n, 1))
            advanced = (len(out_shape), _index_array(item, n, dim, "indexing"))
            out_shape.append(n)
        else:
            raise IndexError(f"unsupported index {item!r} of type {type(item).__name__}")
        dim += 1
    if advanced is not None:    # (a slice or a None between an int and the array: merged)
        spots = [k for k, i in enumerate(items)
                 if isinstance(i, (int, np.integer)) or _is_array_index(i)]
        if spots != list(range(spots[0], spots[-1] + 1)) or ellipsis_gap(index, shape):
            return _merged_getitem(x, items, True)
    y = x
    if any(s != (0, n, 1) for s, n in zip(slices, shape)):
        y = E.slice_(y, slices)
    y = E.reshape(y, out_shape)
    if advanced is not None:
        y = E.take(y, advanced[1], advanced[0])
    return y


def _merged_getitem(x: Any, items: list, apart: bool = False) -> Any:
    """x[index] for several index arrays, or an int and an array a slice apart (`apart`:
    the index arrays are apart though their axes are not: see `ellipsis_gap`)."""
    x, items = _new_axes(x, items)
    m = _Merged(x, items, "indexing", apart=apart)
    return E.take(m.xm, m.flat, m.axis)


def _new_axes(x: Any, items: list) -> tuple[Any, list]:
    """(x', items') with x'[items'] == x[items] and no None in items': x with an axis of size 1
    where each None is, taken whole (numpy's advanced indexing places its result the same
    way: None is not an index array, so it separates two as a slice does)."""
    if not any(i is None for i in items):
        return x, items
    shape = iter(E.shape_of(x))
    return (E.reshape(x, tuple(1 if i is None else next(shape) for i in items)),
            [slice(None) if i is None else i for i in items])


def _basic_slices(shape: tuple, index: Any, what: str, clip: bool = False
                  ) -> tuple[list, list, list]:
    """For a basic index (ints, slices, None, '...') of an array of `shape`: the slice per
    axis, the slice's shape, and x[index]'s shape (what a value written there broadcasts
    to). Raises IndexError for an int out of range (`clip`: clamps it, as JAX's mode "clip"),
    NotImplementedError for array indices."""
    slices, sub, target = [], [], []
    dim = 0
    for item in _expand(index, tuple(shape)):
        if item is None:
            target.append(1)
            continue
        n = shape[dim]
        if isinstance(item, slice):
            s = item.indices(n)
            slices.append(s)
            sub.append(len(range(*s)))
            target.append(len(range(*s)))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            i = min(max(int(item), -n), n - 1) if clip and n else int(item)
            i = _int_item(i, n, dim, what)
            slices.append((i, i + 1, 1))
            sub.append(1)
        else:
            raise NotImplementedError(
                f"{what}: only ints, slices, None, '...' and integer arrays index an update "
                f"(got {type(item).__name__}); use tg.where for a mask")
        dim += 1
    return slices, sub, target


def update(x: Any, index: Any, v: Any, combine: Any = None, what: str = "update",
           clip: bool = False) -> Any:
    """`x` with `x[index]` (a basic index) replaced by `v`, or by `combine(x[index], v)`;
    `v` broadcasts to x[index]'s shape as numpy's slice assignment does (leading 1s beyond
    its rank dropped) and takes x's dtype. `clip`: an int out of range is clamped."""
    shape = tuple(E.shape_of(x))
    slices, sub, target = _basic_slices(shape, index, what, clip)
    v = E.asdtype(v, E.dtype_of(x))
    vshape = tuple(E.shape_of(v))
    extra = len(vshape) - len(target)
    if extra > 0 and all(d == 1 for d in vshape[:extra]):
        v = E.reshape(v, vshape[extra:])
    v = E.reshape(E.broadcast_to(v, target), sub)
    if combine is not None:
        v = combine(E.slice_(x, slices), v)
    return E.update_slice(x, v, slices)


_MODES = (None, "drop", "fill", "clip", "promise_in_bounds")


def _hints(hints: dict, what: str) -> str | None:
    """JAX's keyword arguments of the updates: `indices_are_sorted` and `unique_indices` are
    hints (results are right either way); `mode` is returned: a traced index out of bounds
    is dropped (None, "drop", "fill": JAX's default for updates) or clamped ("clip",
    "promise_in_bounds"); a concrete one raises IndexError, or is clamped with "clip"."""
    for key in hints:
        if key not in ("indices_are_sorted", "unique_indices", "mode"):
            raise TypeError(f"{what} got an unexpected keyword argument {key!r}")
    mode = hints.get("mode")
    if mode not in _MODES:
        raise ValueError(f"{what}: mode must be one of {_MODES}, got {mode!r}" + _at_user())
    return mode


# the updates by an index array that are one scatter op (by what `update_at` combines with)
_SCATTER_MODES = {None: "set", E.mul: "mul", E.minimum: "min", E.maximum: "max"}


class _At:
    """`x.at[index]`: JAX's functional updates of an indexed part of a traced value, each a
    new value (`set`, `add`, `subtract`, `multiply`, `divide`, `power`, `min`, `max`), and
    `get()` (see `update_at`). The updates take JAX's hints `indices_are_sorted`,
    `unique_indices` and `mode` (see `_hints`)."""
    __slots__ = ("x", "index")

    def __init__(self, x: Any, index: Any = None):
        self.x, self.index = x, index

    def __getitem__(self, index: Any) -> _At:
        return _At(self.x, index)

    def get(self) -> Any:
        return getitem(self.x, self.index)


def _update_method(name: str, combine: Any) -> Any:
    """`_At.<name>(v, **hints)`: x with x[index] replaced by v (combine None), or by
    combine(x[index], v)."""
    what = f"at[].{name}"

    def method(self: _At, v: Any, **hints: Any) -> Any:
        return update_at(self.x, self.index, v, combine, what, _hints(hints, what))
    method.__name__ = method.__qualname__ = name
    return method


for _name, _combine in (("set", None), ("add", E.add), ("subtract", E.sub),
                        ("multiply", E.mul), ("divide", E.div), ("power", E.pow),
                        ("min", E.minimum), ("max", E.maximum)):
    setattr(_At, _name, _update_method(_name, _combine))


def update_at(x: Any, index: Any, v: Any, combine: Any, what: str, mode: str | None = None
              ) -> Any:
    """`x` with `x[index]` replaced by `v` (combine None) or by `combine(x[index], v)`: a basic
    index is one update_slice; integer arrays (ints among them) one scatter or scatter_add
    on the indexed axes merged into one (see `_Merged` for `mode` and `_by_array`)."""
    shape = tuple(E.shape_of(x))
    items = _expand(index, shape)
    if not any(_is_array_index(i) for i in items):
        return update(x, index, v, combine, what, mode == "clip")
    x0, (x, items) = x, _new_axes(x, items)
    m = _Merged(x, items, what, drop=mode in (None, "drop", "fill"), clip=mode == "clip",
                apart=ellipsis_gap(index, shape))
    xm, flat, axis = m.xm, m.flat, m.axis
    shape = tuple(E.shape_of(xm))
    target = shape[:axis] + tuple(E.shape_of(flat)) + shape[axis + 1:]
    v = E.asdtype(v, E.dtype_of(x))
    vshape = tuple(E.shape_of(v))
    extra = len(vshape) - len(target)   # (leading 1s beyond x[index]'s rank: dropped)
    if extra > 0 and all(d == 1 for d in vshape[:extra]):
        v = E.reshape(v, vshape[extra:])
    v = E.broadcast_to(v, target)
    if not math.prod(E.shape_of(flat)):
        return x0
    y = m.back(_by_array(xm, v, flat, axis, combine))
    y = y if m.slices is None else E.update_slice(x, y, m.slices)
    return y if x is x0 else E.reshape(y, E.shape_of(x0))


def _by_array(x: Any, v: Any, idx: Any, axis: int, combine: Any) -> Any:
    """x updated by one index array `idx` along `axis` (v: x[idx]'s shape, x's dtype).
    add/subtract are a scatter_add; set, multiply, min and max one scatter (repeated indices
    apply in order, as numpy's ufunc.at); divide and power divide by, or raise to, the product
    of each entry's updates (as JAX)."""
    shape = tuple(E.shape_of(x))
    if combine is E.add or combine is E.sub:
        return x + E.scatter_add(v if combine is E.add else -v, idx, axis, shape[axis])
    mode = _SCATTER_MODES.get(combine)
    if mode is not None:
        return E.scatter(x, v, idx, axis, mode)
    prod = E.scatter(E.full(shape, 1, E.dtype_of(x)), v, idx, axis, "mul")
    # (only where an update lands: x / 1 of an int x goes through float32)
    hit = E.scatter(E.full(shape, False, np.bool_), E.full(E.shape_of(v), True, np.bool_), idx,
                    axis, "set")
    return E.where(hit, E.asdtype(combine(x, prod), E.dtype_of(x)), x)

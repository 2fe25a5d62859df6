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
    if isinstance(idx, Traced):
        return idx
    if not np.issubdtype(idx.dtype, np.integer):
        raise IndexError(f"{what}: index arrays must be integers, got {idx.dtype}"
                         + _at_user())
    bad = idx[(idx < -n) | (idx >= n)]
    if bad.size:
        raise IndexError(f"{what}: index {int(bad[0])} is out of bounds for axis {axis} "
                         f"with size {n}" + _at_user())
    # (widened first: a small integer type overflows adding n)
    return np.where(idx < 0, idx.astype(np.int64) + n, idx) if idx.size and idx.min() < 0 \
        else idx


def _expand(index: Any, ndim: int) -> list[Any]:
    if not isinstance(index, tuple):
        index = (index,)
    n_ellipsis = sum(i is Ellipsis for i in index)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
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


@op("Index")
def getitem(x: Any, index: Any) -> Any:
    if type(index) is int and type(x) is Traced and x.atom.aval.shape:   # x[t]: the common case
        return int_index(x, index)
    shape = tuple(E.shape_of(x))
    items = _expand(index, len(shape))
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
                raise NotImplementedError("indexing with more than one integer array is not "
                                          "supported; use tg.take along one axis at a time")
            slices.append((0, n, 1))
            advanced = (len(out_shape), _index_array(item, n, dim, "indexing"))
            out_shape.append(n)
        else:
            raise IndexError(f"unsupported index {item!r} of type {type(item).__name__}")
        dim += 1
    if advanced is not None:
        real = [i for i in items if i is not None]
        spots = [k for k, i in enumerate(real)
                 if isinstance(i, (int, np.integer)) or _is_array_index(i)]
        if spots != list(range(spots[0], spots[-1] + 1)):
            raise NotImplementedError("mixing integer and array indices on non-adjacent axes "
                                      "is not supported")
    y = x
    if any(s != (0, n, 1) for s, n in zip(slices, shape)):
        y = E.slice_(y, slices)
    y = E.reshape(y, out_shape)
    if advanced is not None:
        y = E.take(y, advanced[1], advanced[0])
    return y


def _basic_slices(shape: tuple, index: Any, what: str) -> tuple[list, list, list]:
    """For a basic index (ints, slices, None, '...') of an array of `shape`: the slice per
    axis, the slice's shape, and x[index]'s shape (what a value written there broadcasts
    to). Raises IndexError for an int out of range, NotImplementedError for array indices."""
    slices, sub, target = [], [], []
    dim = 0
    for item in _expand(index, len(shape)):
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
            i = _int_item(int(item), n, dim, what)
            slices.append((i, i + 1, 1))
            sub.append(1)
        else:
            raise NotImplementedError(
                f"{what}: only ints, slices, None and '...' index an update (got "
                f"{type(item).__name__}), or one integer array with full ':' slices on the "
                "other axes; use tg.where for a mask")
        dim += 1
    return slices, sub, target


def update(x: Any, index: Any, v: Any, combine: Any = None, what: str = "update") -> Any:
    """`x` with `x[index]` (a basic index) replaced by `v`, or by `combine(x[index], v)`;
    `v` broadcasts to x[index]'s shape as numpy's slice assignment does (leading 1s beyond
    its rank dropped) and takes x's dtype."""
    shape = tuple(E.shape_of(x))
    slices, sub, target = _basic_slices(shape, index, what)
    v = E.asdtype(v, E.dtype_of(x))
    vshape = tuple(E.shape_of(v))
    extra = len(vshape) - len(target)
    if extra > 0 and all(d == 1 for d in vshape[:extra]):
        v = E.reshape(v, vshape[extra:])
    v = E.reshape(E.broadcast_to(v, target), sub)
    if combine is not None:
        v = combine(E.slice_(x, slices), v)
    return E.update_slice(x, v, slices)


def _hints(hints: dict, what: str) -> None:
    """JAX's keyword arguments of the updates: `indices_are_sorted` and `unique_indices` are
    hints (results are right either way); `mode` may be "clip" (what a traced index does)
    or "promise_in_bounds" (a concrete index out of bounds raises IndexError either way)."""
    for key, value in hints.items():
        if key not in ("indices_are_sorted", "unique_indices", "mode"):
            raise TypeError(f"{what} got an unexpected keyword argument {key!r}")
        if key == "mode" and value not in (None, "clip", "promise_in_bounds"):
            raise NotImplementedError(
                f"{what}: mode={value!r} is not supported: a traced index out of bounds is "
                "clamped (mode='clip'), a concrete one raises IndexError" + _at_user())


# the updates by an index array that are one scatter op (by what `_At._apply` combines with)
_SCATTER_MODES = {None: "set", E.mul: "mul", E.minimum: "min", E.maximum: "max"}


class _At:
    """`x.at[index]`: JAX's functional updates of an indexed part of a traced value, each a
    new value (`set`, `add`, `subtract`, `multiply`, `divide`, `power`, `min`, `max`), and
    `get()`. A basic index is one update_slice. Every update also takes one integer array
    along an axis (with full slices on the others), concrete or traced: `add`/`subtract` as a
    scatter-add, `set`/`multiply`/`min`/`max` as a scatter, whose repeated indices apply in
    order as numpy's `ufunc.at` does (`set`: the last one wins); see `_by_array` for
    `divide` and `power`."""
    __slots__ = ("x", "index")

    def __init__(self, x: Any, index: Any = None):
        self.x, self.index = x, index

    def __getitem__(self, index: Any) -> _At:
        return _At(self.x, index)

    def get(self) -> Any:
        return getitem(self.x, self.index)

    def set(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].set")
        return self._apply(v, None, "at[].set")

    def add(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].add")
        axis = self._array_axis()
        if axis is not None:
            return self._scatter(v, axis, "at[].add")
        return update(self.x, self.index, v, E.add, "at[].add")

    def subtract(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].subtract")
        axis = self._array_axis()
        if axis is not None:
            return self._scatter(-E.asdtype(v, E.dtype_of(self.x)), axis, "at[].subtract")
        return update(self.x, self.index, v, E.sub, "at[].subtract")

    def multiply(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].multiply")
        return self._apply(v, E.mul, "at[].multiply")

    def divide(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].divide")
        return self._apply(v, E.div, "at[].divide")

    def power(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].power")
        return self._apply(v, E.pow, "at[].power")

    def min(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].min")
        return self._apply(v, E.minimum, "at[].min")

    def max(self, v: Any, **hints: Any) -> Any:
        _hints(hints, "at[].max")
        return self._apply(v, E.maximum, "at[].max")

    def _apply(self, v: Any, combine: Any, what: str) -> Any:
        """The update by a basic index (one update_slice) or by one index array."""
        axis = self._array_axis()
        if axis is not None:
            return self._by_array(v, axis, combine, what)
        return update(self.x, self.index, v, combine, what)

    def _array_axis(self) -> int | None:
        """The axis of an index that is one integer array and full slices, else None."""
        items = _expand(self.index, len(E.shape_of(self.x)))
        arrays = [k for k, i in enumerate(items) if _is_array_index(i)]
        if len(arrays) != 1 or any(i != slice(None) for k, i in enumerate(items)
                                   if k != arrays[0]):
            return None
        return arrays[0]

    def _indices(self, axis: int, what: str) -> tuple[tuple, int, Any]:
        """(x's shape, the axis's length, the index array along it, checked)."""
        shape = tuple(E.shape_of(self.x))
        n = shape[axis]
        return shape, n, _index_array(_expand(self.index, len(shape))[axis], n, axis, what)

    def _scatter(self, v: Any, axis: int, what: str) -> Any:
        x = self.x
        shape, n, idx = self._indices(axis, what)
        target = shape[:axis] + tuple(E.shape_of(idx)) + shape[axis + 1:]
        v = E.broadcast_to(E.asdtype(v, E.dtype_of(x)), target)
        return x + E.scatter_add(v, idx, axis, n)

    def _by_array(self, v: Any, axis: int, combine: Any, what: str) -> Any:
        """The update by an index array along `axis`. set, multiply, min and max are one
        scatter (repeated indices apply in order, as numpy's ufunc.at). divide and power by a
        traced array divide by, or raise to, the product of each entry's updates (as JAX);
        by a concrete array they run in rounds: round r applies the r-th occurrence of
        every index (unique within the round), read with take and written back with a take
        from the round's values and a where."""
        x = self.x
        shape, n, idx = self._indices(axis, what)
        v = E.broadcast_to(E.asdtype(v, E.dtype_of(x)), shape[:axis] + tuple(E.shape_of(idx))
                           + shape[axis + 1:])
        if not math.prod(E.shape_of(idx)):
            return x
        mode = _SCATTER_MODES.get(combine)
        if mode is not None:
            return E.scatter(x, v, idx, axis, mode)
        if isinstance(idx, Traced):
            prod = E.scatter(E.full(shape, 1, E.dtype_of(x)), v, idx, axis, "mul")
            return E.asdtype(combine(x, prod), E.dtype_of(x))
        flat = idx.reshape(-1).astype(np.int64)
        v = E.reshape(v, shape[:axis] + (flat.size,) + shape[axis + 1:])
        # each entry's rank among the entries of its index, in order
        order = np.argsort(flat, kind="stable")
        ranked = flat[order]
        first = np.r_[True, ranked[1:] != ranked[:-1]]
        at_first = np.maximum.accumulate(np.where(first, np.arange(flat.size), 0))
        rank = np.empty(flat.size, np.int64)
        rank[order] = np.arange(flat.size) - at_first
        bcast = [1] * len(shape)
        bcast[axis] = n
        for r in range(int(rank.max()) + 1):
            ks = np.flatnonzero(rank == r)
            at = flat[ks]
            vr = v if ks.size == flat.size else E.take(v, ks, axis)
            new = E.asdtype(combine(E.take(x, at, axis), vr), E.dtype_of(x))    # (int / int)
            src = np.zeros(n, np.int64)
            src[at] = np.arange(at.size)
            hit = np.zeros(n, np.bool_)
            hit[at] = True
            x = E.where(hit.reshape(bcast), E.take(new, src, axis), x)
        return x

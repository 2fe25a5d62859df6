"""The lazy `tg.Tensor`: PyTorch autograd semantics on the trace-and-compile core.

A Tensor is a variable of the IR. Leaves hold a numpy value; an op on Tensors runs the
un-dispatched `tg` function on `Traced` values in a thread-local recording Builder, and the
equations it emitted become a `Node` (its `grad_fn` when it requires grad; see tensor_record).
Values are computed when asked for (`numpy()`, `item()`, `print`, `bool()`, `backward()`) by
collecting the IR they need into one graph (`autograd_exec.realize`)."""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable

import numpy as np

from ..ir.core import Aval, Var, is_float, remember
from . import dispatch
from .autograd_exec import realize
from .autograd_graph import AccumulateGrad, Inplace, Node, add_hook, hook_name
from .grad_mode import mode, prune_tape

_new = object.__new__
_AVALS: dict = {}    # (shape, dtype) -> Aval, for leaves (making an Aval hashes it)

NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead. See github.com/pytorch/pytorch/pull/30531 for more information.")


class Tensor:
    """An n-d array that records the operations made with it (see the module docstring)."""
    __slots__ = ("_var", "_value", "_node", "_fn", "_rg", "_vc", "_x", "__weakref__")
    __array_priority__ = 1000
    __array_ufunc__ = None     # `ndarray op tensor` defers to our reflected operators

    def __new__(cls, *data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
        from .tensor_factories import tensor
        if len(data) == 1 and not isinstance(data[0], int):
            return tensor(data[0], dtype=dtype or np.float32, requires_grad=requires_grad)
        from .tensor_factories import zeros
        return zeros(*data, dtype=dtype, requires_grad=requires_grad)

    # -- construction
    @staticmethod
    def _leaf(value: np.ndarray, requires_grad: bool = False) -> Tensor:
        t = _new(Tensor)
        key = (value.shape, value.dtype)
        aval = _AVALS.get(key)
        if aval is None:
            aval = remember(_AVALS, key, Aval(*key))
        t._var = Var(aval)
        t._value = value
        t._node = None
        t._fn = None
        t._rg = requires_grad
        t._vc = [0]
        t._x = {"inference": True} if mode.state.inference else None
        return t

    @staticmethod
    def _from_var(var: Var, node: Node, fn: Node | None) -> Tensor:
        t = _new(Tensor)
        t._var = var
        t._value = None
        t._node = node
        t._fn = fn
        t._rg = fn is not None
        t._vc = [0]
        t._x = None
        return t

    def _extra(self) -> dict:
        if self._x is None:
            self._x = {}
        return self._x

    def _get(self, key: str, default: Any = None) -> Any:
        x = self._x
        return default if x is None else x.get(key, default)

    # -- sources for the graph
    def _gsrc(self) -> Any:
        if self._fn is not None:
            return self._fn
        if not self._rg:
            return None
        x = self._x
        if x is not None:
            ref = x.get("acc")
            if ref is not None:
                acc = ref()
                if acc is not None and acc.hooked:
                    # In torch it goes, with its hooks, once the user and the graphs using it
                    # drop it; here the tape also holds the graphs dropped since the last
                    # backward: prune those first (perhaps freeing it), then look again. Once
                    # per tape: a leaf read at every step of a long loop would prune the whole
                    # tape each time. (So one dropped later on this tape is kept till the
                    # next backward.)
                    st = mode.state
                    if acc.checked != st.tape_gen:
                        acc = None
                        prune_tape(st)
                        acc = ref()
                        if acc is not None:
                            acc.checked = st.tape_gen
                if acc is not None:
                    return acc
        acc = AccumulateGrad(self)
        self._extra()["acc"] = weakref.ref(acc)
        return acc

    def _vsrc(self) -> Any:
        return self._value if self._value is not None else self._node

    def _plain(self) -> Tensor:
        """A new no-grad tensor with this value (no aliasing of later in-place changes)."""
        t = Tensor._from_var(self._var, self._node, None)
        t._value = self._value
        return t

    def _val(self) -> np.ndarray:
        """The value, computing it if it is pending."""
        v = self._value
        if v is None:
            realize([self])
            v = self._value
        return v

    def __tg_array__(self) -> np.ndarray:
        return self._val()

    @classmethod
    def __tg_function__(cls, fn: Callable, name: str, args: tuple, kwargs: dict) -> Any:
        if not kwargs:     # (dispatch hands over the undecorated function)
            if len(args) == 1 and type(args[0]) is Tensor:
                return record_unary(fn, name, args[0], 3)
            if len(args) == 2:
                return record_binary(fn, name, args[0], args[1], 3)
        return record(fn, name, args, kwargs)

    # -- autograd attributes
    @property
    def requires_grad(self) -> bool:
        return self._rg

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._fn is not None and not requires_grad:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use "
                "a computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach().")
        if requires_grad and not is_float(self._var.aval.dtype):
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        if self._fn is None:
            self._rg = bool(requires_grad)
        return self

    @property
    def is_leaf(self) -> bool:
        return self._fn is None

    @property
    def grad_fn(self) -> Node | None:
        return self._fn

    @property
    def grad(self) -> Tensor | None:
        if self._fn is not None and not self._get("retain"):
            warnings.warn(NON_LEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return self._get("grad")

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad "
                                f"of type {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has data of a different size: "
                                   f"{value.shape} vs {self.shape}")
        self._extra()["grad"] = value

    def retain_grad(self) -> None:
        if not self._rg:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._fn is None:
            return
        self._extra()["retain"] = True
        node = self._fn
        if node.retains is None:
            node.retains = {}
        node.retains[self._var.id] = weakref.ref(self)

    @property
    def retains_grad(self) -> bool:
        return bool(self._get("retain")) and self._fn is not None

    def register_hook(self, hook: Callable) -> Any:
        """`hook(grad)` runs when this tensor's gradient is computed; it may return a
        replacement gradient."""
        from .autograd_graph import add_hook
        if not self._rg:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require "
                               "gradient")
        if self._fn is None:
            return add_hook(self._extra().setdefault("hooks", {}), hook)
        node = self._fn
        if node.tensor_hooks is None:
            node.tensor_hooks = {}
        return add_hook(node.tensor_hooks.setdefault(self._var.id, {}), hook)

    def register_post_accumulate_grad_hook(self, hook: Callable) -> Any:
        """`hook(self)` runs after a backward accumulated into this leaf's `.grad` (not for
        `autograd.grad`, which accumulates nothing); it returns None."""
        if self._fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf "
                               "tensors")
        if not self._rg:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require "
                               "gradient")
        return add_hook(self._extra().setdefault("post_accumulate", {}), hook)

    def _post_accumulate(self) -> None:
        """Run the hooks of register_post_accumulate_grad_hook (its `.grad` is written)."""
        for fn in list(self._x["post_accumulate"].values()):
            r = fn(self)
            if r is not None:   # (torch: a RuntimeError for a Tensor, else a TypeError)
                error = RuntimeError if isinstance(r, Tensor) else TypeError
                raise error(f"Tensor post accumulate grad hooks should return None (hook "
                            f"'{hook_name(fn)}' returned '{type(r).__name__}')")

    def backward(self, gradient: Any = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        """Accumulate d(self)/d(leaf) (times `gradient` for non-scalars) into leaves' .grad."""
        engine = _engine or _bind_engine()
        engine.backward(self if gradient is None else [self],
                        None if gradient is None else [gradient], retain_graph, create_graph,
                        inputs=inputs)

    def detach(self) -> Tensor:
        """A tensor with the same value, cut from the graph (sharing the version counter;
        in-place changes through it reach this tensor)."""
        if self._value is not None:
            t = Tensor._leaf(self._value)
        else:
            from ..ir import emit as E
            t = record(E.stop_gradient, "Detach", (self,), {}, grad=False)
        t._vc = self._vc
        _share_storage(self, t)
        of = self._x.get("view")
        if of is not None:      # an alias of a view is one too (writes through it raise)
            register_view(t, of)
        return t

    def detach_(self) -> Tensor:
        if self._fn is not None:
            d = self.detach()
            self._var, self._value, self._node = d._var, d._value, d._node
        self._fn = None
        self._rg = False
        return self

    @property
    def data(self) -> Tensor:
        """detach()'s tensor with a version counter of its own, as torch's `.data`: in-place
        changes through it (an old-style `W.data.add_(-lr * g)`) write through but are not
        seen by autograd's checks (the recorded graph keeps the values it read)."""
        t = self.detach()
        t._vc = [0]
        return t

    @data.setter
    def data(self, value: Tensor) -> None:
        value = value if isinstance(value, Tensor) else Tensor._leaf(np.asarray(value))
        if self._x is not None:      # new storage: old aliases and views no longer see it
            self._x.pop("aliases", None)
            self._x.pop("view", None)       # (nor does it see its own base, if a view)
            views = self._x.pop("views", None)
            for v in all_views(views) if views is not None else ():
                if v._x.get("view", (None,))[0] is self:
                    del v._x["view"]        # (they hold the old storage: the base of their views)
        if value._fn is not None:
            # a result in a graph: its data, not its variable (this tensor is no output of that
            # graph's node; sharing the variable sent this one's gradient into the graph)
            self._var, self._value, self._node = Var(value._var.aval), value._val(), None
            return
        self._var, self._value, self._node = value._var, value._value, value._node
        _share_storage(value, self)

    def is_inference(self) -> bool:
        return bool(self._get("inference"))

    # -- shape and dtype
    @property
    def shape(self) -> tuple[int, ...]:
        return self._var.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self._var.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self._var.aval.shape)

    def dim(self) -> int:
        return len(self._var.aval.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self._var.aval.size

    nelement = numel

    @property
    def device(self) -> str:
        return "cpu"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __hash__(self) -> int:
        return id(self)

    # -- values
    def numpy(self, force: bool = False) -> np.ndarray:
        if self._rg and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        return self._val()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self.numpy()
        return v if dtype is None else v.astype(dtype)

    def item(self) -> Any:
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to "
                               "Scalar")
        return self._val().reshape(()).item()

    def tolist(self) -> Any:
        return self._val().tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is "
                               "ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if is_float(self.dtype) or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an "
                            "index")
        return int(self.item())

    def __format__(self, spec: str) -> str:
        if self.ndim == 0 and spec:
            return format(self.item(), spec)
        return format(repr(self), spec)

    def __repr__(self) -> str:
        from .tensor_format import tensor_repr
        return tensor_repr(self)

    def __reduce__(self) -> Any:
        from .tensor_factories import tensor
        return (tensor, (self._val(), None, self._rg))


from .tensor_record import record, record_binary, record_unary  # noqa: E402, I001

_engine: Any = None     # autograd_engine, which imports this module: bound at the first backward


def _bind_engine() -> Any:
    """autograd_engine, imported once (an import statement costs ~10K instructions a call)."""
    global _engine
    from . import autograd_engine as _engine
    return _engine

dispatch.register_tensor_type(Tensor, record_unary)


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """`tg.tensor` (defined in tensor_factories; here for modules that import this one)."""
    from .tensor_factories import tensor as make
    return make(data, dtype=dtype, requires_grad=requires_grad)


def assign_(t: Tensor, value: Any) -> Tensor:
    """Overwrite `t`'s value in place, outside autograd (as `t.copy_(value)` under no_grad)."""
    arr = np.asarray(value._val() if isinstance(value, Tensor) else value, t.dtype)
    if arr.shape != t.shape:
        raise ValueError(f"cannot assign a value of shape {arr.shape} to a tensor of shape "
                         f"{t.shape}")
    t._var = Var(Aval(arr.shape, arr.dtype))
    t._value, t._node = arr, None
    Inplace.bump(t._vc)
    if t._x is not None:
        if "aliases" in t._x:
            write_aliases(t)
        if "views" in t._x:
            refresh_views(t)
    return t


def _share_storage(t: Tensor, alias: Tensor) -> None:
    """`alias` (t.detach(), t.data) shares t's storage: an in-place change of any tensor of
    the group reaches all the others (tensor_ops.assign), as in torch. The group is a list
    of weak references all its tensors hold."""
    group = t._get("aliases")
    if group is None:
        group = t._extra()["aliases"] = [weakref.ref(t)]
    elif len(group) > 8:
        group[:] = [r for r in group if r() is not None]
    group.append(weakref.ref(alias))
    alias._extra()["aliases"] = group


def write_aliases(t: Tensor) -> list[tuple[Tensor, Node | None]]:
    """After an in-place change of `t`: the tensors sharing its storage hold its new value
    too (each keeps its own autograd history, or none, as a snapshot does). Returns those
    now pending with the node each held before (tensor_ops._chain)."""
    group = t._x["aliases"]
    pending = []
    for ref in group:
        a = ref()
        if a is None or a is t or a._x is None or a._x.get("aliases") is not group:
            continue
        prev = a._node if a._value is None else None
        a._var, a._value, a._node = t._var, t._value, t._node
        if a._fn is None and a._value is None:
            pending.append((a, prev))
        if "views" in a._x:
            refresh_views(a)
    return pending


class _Views(list):
    """Weak references to a tensor's live views (and some dead ones: see _prune); each
    view's `_x["view"]` says how it was made from the tensor (tensor_ops._marks_view).
    Rows (x[i] for an int i) are kept apart by row, in `rows`: writing x[i] remakes those
    of row i only, whatever the number of other rows kept (x[t + 1] = f(x[t]))."""
    __slots__ = ("prune_at", "rows")


def register_view(view: Tensor, of: tuple) -> None:
    """Mark `view` as made from of[0] by the steps of[1], each (method, args, kwargs)
    (its layout: of[2]; of[3], the row when it is x[row]), sharing its version counter (as
    torch's views), and register it there. tracegrad's views are values, not windows on
    their base's storage, so the base remembers them to make them again: an in-place change
    of it remakes its live views (refresh_views), which then read its new value, as torch's
    views do."""
    root = of[0]
    x = view._x
    if x is None:
        view._x = {"view": of}
    else:
        x["view"] = of
    view._vc = root._vc
    x = root._x
    views = x.get("views") if x is not None else None
    if views is None:
        views = root._extra()["views"] = _Views()
        views.prune_at = 32
        views.rows = {}
    row = of[3]
    if row is not None:
        refs = views.rows.get(row)
        if refs is None:
            views.rows[row] = [weakref.ref(view)]
            return
        if len(refs) >= 8:
            refs[:] = [r for r in refs if r() is not None]
        refs.append(weakref.ref(view))
        return
    if len(views) >= views.prune_at:
        _prune(views)
    views.append(weakref.ref(view))


def _prune(views: _Views) -> list:
    """The live views, the dead references dropped when they are many. References other
    threads append meanwhile go after the prefix replaced (one list operation): kept."""
    n = len(views)
    live = [v for ref in views[:n] if (v := ref()) is not None]
    if not live:
        del views[:n]
        views.prune_at = 32
    elif 2 * len(live) < n or n >= views.prune_at:
        views[:n] = [weakref.ref(v) for v in live]
        views.prune_at = max(32, 2 * len(live))
    return live


def _rows(views: _Views, row: int | None) -> list:
    """The live views of `row` (of every row: None), dead references dropped."""
    keys = list(views.rows) if row is None else [row] if row in views.rows else []
    live = []
    for r in keys:
        refs = views.rows.get(r)
        if refs is None:
            continue
        n = len(refs)
        now = [v for ref in refs[:n] if (v := ref()) is not None]
        if now:
            refs[:n] = [weakref.ref(v) for v in now]
            live += now
        elif n == len(refs):
            views.rows.pop(r, None)
    return live


def all_views(views: _Views) -> list:
    """The live views of a registry, rows and all."""
    return _prune(views) + _rows(views, None)


def refresh_views(base: Tensor, unchanged: Callable | None = None,
                  row: int | None = None) -> None:
    """Make `base`'s live views again from its new value; one that had a gradient history
    gets a new one, into base's. `unchanged(steps)`: whether a view made by `steps` reads
    none of what changed (an assignment to other elements: x[t + 1] = f(x[t])); `row`: the
    one row written (x[row] = ...), so the other rows' views are not even looked at."""
    views = base._x["views"]
    live = _prune(views) + _rows(views, row)
    saved = mode.grad
    try:
        for v in live:
            of = v._x.get("view")
            if of is None or of[0] is not base:     # (its base's storage was replaced)
                continue
            steps = of[1]
            if unchanged is not None and unchanged(steps):
                continue
            mode.grad = v._fn is not None
            new = base
            for method, args, kwargs in steps:
                new = method(new, *args, **kwargs)
            # (a view made a leaf with requires_grad_() stays one; the rest take new's)
            v._var, v._value, v._node, v._fn, v._rg = (
                new._var, new._value, new._node, new._fn,
                new._rg or v._fn is None and v._rg)
    finally:
        mode.grad = saved

"""`tg.autograd.Function`: ops with a user-written backward, as in PyTorch. `forward` runs on
Tensors under no_grad; the outputs get a Node whose backward calls the user's `backward`."""
from __future__ import annotations

from typing import Any

import numpy as np

from .autograd_graph import FREED_MSG, Node, SavedTensor
from .grad_mode import mode, no_grad
from .tensor import Tensor, record


def _identity(x: Any) -> Any:
    return x


class FunctionCtx:
    """The `ctx` passed to `forward` and `backward`; any attribute may be set on it."""

    def __init__(self) -> None:
        self.to_save: tuple = ()
        self.non_differentiable: set[int] = set()
        self.materialize_grads = True
        self.needs_input_grad: tuple[bool, ...] = ()
        self._node: Node | None = None
        self._cls: Any = None
        self._n_args = 0
        self._tensor_pos: list[int] = []

    def save_for_backward(self, *tensors: Any) -> None:
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    @property
    def saved_tensors(self) -> tuple:
        node = self._node
        if node is None:
            return tuple(self.to_save)
        if node.freed and node.saved:
            raise RuntimeError(FREED_MSG)
        out, k = [], 0
        for t in self.to_save:
            if isinstance(t, Tensor):
                out.append(node.saved[k].unpacked(node))
                k += 1
            else:
                out.append(t)
        return tuple(out)

    def _apply_backward(self, gouts: list) -> list:
        node = self._node
        name = node.name_
        gs = []
        for g, v in zip(gouts, node.out_vars, strict=False):
            if g is None and self.materialize_grads:
                g = Tensor._leaf(np.zeros(v.aval.shape, v.aval.dtype))
            gs.append(g)
        res = self._cls.backward(self, *gs)
        res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        if len(res) != self._n_args:
            if len(res) > self._n_args and all(r is None for r in res[self._n_args:]):
                res = res[:self._n_args]
            else:
                raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                                   f"(expected {self._n_args}, got {len(res)})")
        grads = []
        for pos, (var, _, _) in zip(self._tensor_pos, node.args, strict=False):
            g = res[pos]
            if g is not None and not isinstance(g, Tensor):
                from .tensor_factories import tensor
                g = tensor(g, dtype=var.aval.dtype)
            if g is not None and g.shape != var.aval.shape:
                try:
                    g = g.expand(var.aval.shape) if np.broadcast_shapes(
                        g.shape, var.aval.shape) == var.aval.shape and g.ndim <= len(
                        var.aval.shape) else None
                except ValueError:
                    g = None
                if g is None:
                    raise RuntimeError(
                        f"Function {name} returned an invalid gradient at index {pos} - got "
                        f"{list(res[pos].shape)} but expected shape compatible with "
                        f"{list(var.aval.shape)}")
            grads.append(g)
        return grads


class Function:
    """Subclass with static `forward(ctx, *args)` and `backward(ctx, *grads)`; call with
    `.apply(*args)`. (Or `forward(*args)` plus `setup_context(ctx, inputs, output)`.)"""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward "
                                  "mode AD.")

    vjp = backward

    @staticmethod
    def setup_context(ctx: FunctionCtx, inputs: tuple, output: Any) -> None:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        ctx = FunctionCtx()
        ctx._cls = cls
        ctx._n_args = len(args)
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a._rg for a in args)
        grad_on = mode.grad
        new_style = cls.setup_context is not Function.setup_context
        with no_grad():
            out = cls.forward(*args, **kwargs) if new_style else \
                cls.forward(ctx, *args, **kwargs)
        if new_style:
            cls.setup_context(ctx, args, out)
        multi = isinstance(out, tuple)
        outs = list(out) if multi else [out]
        ctx._tensor_pos = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        entries = [(a._var, a._gsrc(), a._vsrc()) for a in args if isinstance(a, Tensor)]
        requires = grad_on and any(e[1] is not None for e in entries)
        with no_grad():   # every output gets its own variable, as the node's outputs
            fresh = [record(_identity, "", (o,), {}) if isinstance(o, Tensor) else o
                     for o in outs]
        out_vars = [f._var for f in fresh if isinstance(f, Tensor)]
        node = Node.make([], entries, out_vars, requires, f"{cls.__name__}Backward")
        node.fn_ctx = ctx
        ctx._node = node
        results = []
        for o, f in zip(outs, fresh, strict=False):
            if not isinstance(f, Tensor):
                results.append(f)
                continue
            diff = requires and id(o) not in ctx.non_differentiable and \
                np.issubdtype(f.dtype, np.floating)
            f._fn = node if diff else None
            f._rg = diff
            results.append(f)
        if requires:
            hooks = mode.saved_hooks[-1] if mode.saved_hooks else None
            node.saved = [SavedTensor(t, t._var, t._vc, i, node, hooks)
                          for i, t in enumerate(ctx.to_save) if isinstance(t, Tensor)]
        else:
            node.saved = [SavedTensor(t, t._var, t._vc, i, node, None)
                          for i, t in enumerate(ctx.to_save) if isinstance(t, Tensor)]
        return tuple(results) if multi else results[0]


class once_differentiable:  # noqa: N801 - PyTorch's name
    """Accepted for compatibility: the wrapped backward runs as written."""

    def __new__(cls, fn: Any) -> Any:
        return fn

"""`tg.custom_vjp`: a function with a user-written backward, as in JAX."""
from __future__ import annotations

import functools
from typing import Any, Callable

from ..ir.builder import bind, current_builder
from .pytree import flatten_up_to, tree_flatten, tree_unflatten
from .trace import flatten_args, tracing


class custom_vjp:  # noqa: N801 - JAX's name
    """`f = custom_vjp(f); f.defvjp(fwd, bwd)` with `fwd(*args) -> (out, residuals)` and
    `bwd(residuals, g) -> tuple` of one gradient per positional argument."""

    def __init__(self, fun: Callable):
        self.fun = fun
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None
        self._in_fwd = 0   # fwd usually calls f itself (as in JAX): that call is the plain f
        functools.update_wrapper(self, fun)

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any) -> Any:
        arg_leaves, _ = flatten_args(args)
        if self.fwd is None or self._in_fwd or not tracing(arg_leaves):
            return self.fun(*args)
        if current_builder() is None:
            builder = next(a.builder for a in arg_leaves if hasattr(a, "builder"))
            with builder.active():
                return self._record(args, arg_leaves)
        return self._record(args, arg_leaves)

    def _record(self, args: tuple, arg_leaves: list) -> Any:
        self._in_fwd += 1
        try:
            out, res = self.fwd(*args)
        finally:
            self._in_fwd -= 1
        out_leaves, out_tree = tree_flatten(out)
        res_leaves, res_tree = tree_flatten(res)
        arg_trees = [tree_flatten(a)[1] for a in args]
        bwd = self.bwd

        def flat_bwd(res_flat: tuple, g: Any) -> tuple:
            gs = g if isinstance(g, tuple) else (g,)
            grads = bwd(tree_unflatten(res_tree, list(res_flat)),
                        tree_unflatten(out_tree, list(gs)))
            if not isinstance(grads, (tuple, list)) or len(grads) != len(args):
                raise TypeError(f"custom_vjp backward of {self.__name__} must return a tuple "
                                f"with one gradient per argument ({len(args)}), got {grads!r}")
            flat = []
            for i, (gr, td) in enumerate(zip(grads, arg_trees)):
                try:    # (a None anywhere is a zero gradient for the leaves under it)
                    flat.extend(flatten_up_to(td, gr))
                except ValueError as e:
                    raise TypeError(f"custom_vjp backward of {self.__name__}: the gradient "
                                    f"of argument {i} must have the argument's structure "
                                    f"({e})") from None
            return tuple(flat)
        flat_bwd.__name__ = f"{getattr(bwd, '__name__', 'bwd')}"
        flat_bwd.__qualname__ = getattr(bwd, "__qualname__", "bwd")
        flat_bwd.__module__ = getattr(bwd, "__module__", "")

        outs = bind("custom_vjp_call", *arg_leaves, *res_leaves, *out_leaves,
                    n_args=len(arg_leaves), n_res=len(res_leaves), bwd=flat_bwd)
        return tree_unflatten(out_tree, outs)

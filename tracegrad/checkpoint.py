"""`tg.checkpoint(f)`: gradient checkpointing (rematerialisation).

The backward pass keeps only `f`'s inputs and recomputes `f`'s intermediate activations
when it needs them, trading one extra forward of `f` for not holding its activations
between the forward and backward passes. Built on `tg.custom_vjp`: the forward saves the
inputs as residuals, the backward re-runs `tg.vjp(f, *inputs)`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .ir import is_float
from .ir import emit as E
from .tracer.custom import custom_vjp
from .tracer.pytree import tree_flatten, tree_unflatten
from .tracer.transforms import vjp


def _barrier(leaves: list[Any]) -> list[Any]:
    """Fresh names for the recomputation's inputs, so CSE cannot merge the recomputed
    activations back into the forward ones (which would keep them alive after all).
    An identity custom_vjp: gradients flow through it, and the backend aliases it away."""
    ident = custom_vjp(lambda *xs: xs)
    ident.defvjp(lambda *xs: (xs, None), lambda _, gs: tuple(gs))
    return list(ident(*leaves))


def checkpoint(f: Callable) -> Callable:
    """`f` with the same values and gradients, whose activations are recomputed in the
    backward pass instead of being stored. Use it on blocks of a deep network:
    `h = tg.checkpoint(block)(h, params)`."""

    @custom_vjp
    def run(*args: Any) -> Any:
        return f(*args)

    def fwd(*args: Any) -> tuple[Any, Any]:
        return f(*args), args

    def bwd(args: tuple, g: Any) -> tuple:
        leaves, tree = tree_flatten(args)
        diff = [i for i, x in enumerate(leaves) if is_float(E.dtype_of(x))]
        fresh = _barrier([leaves[i] for i in diff])

        def of_float_leaves(*xs: Any) -> Any:
            full = list(leaves)
            for i, x in zip(diff, xs, strict=True):
                full[i] = x
            return f(*tree_unflatten(tree, full))

        grads = vjp(of_float_leaves, *fresh)[1](g) if diff else ()
        # integer leaves get a placeholder: custom_vjp drops gradients of non-float inputs
        flat: list[Any] = [0.0] * len(leaves)
        for i, gr in zip(diff, grads, strict=True):
            flat[i] = gr
        out, start = [], 0
        for a in args:
            n = len(tree_flatten(a)[0])
            out.append(tree_unflatten(tree_flatten(a)[1], flat[start:start + n]))
            start += n
        return tuple(out)

    run.defvjp(fwd, bwd)
    return functools.wraps(f)(lambda *args: run(*args))

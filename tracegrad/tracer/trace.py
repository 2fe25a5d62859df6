"""Tracing a Python function with pytree arguments into a Graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import ir
from ..ir.builder import Builder, Traced, current_builder
from ..ir.core import remember
from .pytree import LEAF, TreeDef, tree_flatten, tree_unflatten

_LEAF_TYPES = (np.ndarray, np.generic, bool, int, float, Traced)
_WEAK_TYPES = (bool, int, float)


def leaf_value(x: Any, where: str) -> Any:
    """A pytree leaf as something traceable: arrays, scalars, traced values, Tensors. An
    array in the other byte order is converted to this machine's (as numpy's arithmetic
    returns it)."""
    if isinstance(x, _LEAF_TYPES):
        if isinstance(x, (bool, int, float)):
            return np.asarray(x, ir.emit.dtype_of(x))
        if isinstance(x, (np.ndarray, np.generic)):
            dt = x.dtype
            if dt.kind == "O":
                raise TypeError(f"{where} is an object array; only numeric arrays can be "
                                "traced")
            if dt.kind not in "biuf":
                raise TypeError(f"{where} has dtype {dt}; tracegrad supports bool, integer "
                                "and float dtypes")
            if not dt.isnative:
                return np.asarray(x, dt.newbyteorder("="))
        return x
    as_array = getattr(x, "__tg_array__", None)   # Tensors
    if as_array is not None:
        return as_array()
    raise TypeError(f"{where} has type {type(x).__name__}, which is not an array, a Python "
                    "scalar, or a tuple/list/dict/None of them")


def leaf_values(xs: Sequence[Any], what: str) -> list[Any]:
    """`leaf_value` of each of `xs`, the i-th named "`what` leaf i" in errors."""
    out = []
    for i, x in enumerate(xs):
        t = type(x)
        if t is Traced or (t is np.ndarray and x.dtype.kind in "biuf" and
                           x.dtype.isnative):   # (quickly)
            out.append(x)
        else:
            out.append(leaf_value(x, f"{what} leaf {i}"))
    return out


_AVAL_OF: dict[tuple, ir.Aval] = {}   # (shape, dtype) -> its Aval, made once


def aval_of_leaf(x: Any) -> ir.Aval:
    if isinstance(x, Traced):
        return x.aval
    arr = x if type(x) is np.ndarray else np.asarray(x)
    key = (arr.shape, arr.dtype)
    aval = _AVAL_OF.get(key)
    if aval is None:
        aval = remember(_AVAL_OF, key, ir.Aval(tuple(arr.shape), arr.dtype))
    return aval


@dataclass
class Traced_fn:
    """A traced function: its graph, the outer values it captured, and its output tree."""
    graph: ir.Graph
    captured: list[Traced]
    out_tree: TreeDef


def flatten_args(args: Sequence[Any], what: str = "argument") -> tuple[list[Any], TreeDef]:
    leaves, tree = tree_flatten(tuple(args))
    return leaf_values(leaves, what), tree


def trace(fn: Callable, args: Sequence[Any], static_argnums: Sequence[int] = (),
          optimized_later: bool = False) -> tuple[Traced_fn, list[Any]]:
    """Trace `fn(*args)` with fresh inputs for every non-static array leaf.
    Returns the traced function and the flat leaf values of the dynamic arguments.
    `optimized_later`: the caller optimises the graph, so transforms inside need not."""
    if static_argnums:
        static = set(static_argnums)
        dyn = [a for i, a in enumerate(args) if i not in static]
    else:
        static, dyn = (), args
    for a in dyn:
        if type(a) is not np.ndarray and type(a) is not Traced:
            raw, in_tree = tree_flatten(tuple(dyn))
            break
    else:           # arrays only (the common call): each argument is its own leaf
        raw, in_tree = list(dyn), None
    leaves = leaf_values(raw, "argument")
    b = Builder(getattr(fn, "__name__", "fn"))
    b.optimized_later = optimized_later
    inputs = [b.new_input(aval_of_leaf(x)) for x in leaves]
    # Python scalar arguments stay weakly typed: `x * n` keeps x's dtype for an int n
    for t, r in zip(inputs, raw):
        if isinstance(r, _WEAK_TYPES) and not isinstance(r, np.generic):
            b.weak_inputs.add(t.atom.id)
    dyn_args = inputs if in_tree is None else tree_unflatten(in_tree, inputs)
    if static:
        it = iter(dyn_args)
        call_args = [a if i in static else next(it) for i, a in enumerate(args)]
    else:
        call_args = dyn_args
    with b.active():
        out = fn(*call_args)
        out_leaves, out_tree = ([out], LEAF) if type(out) is Traced else tree_flatten(out)
        out_leaves = leaf_values(out_leaves, "output")
    graph = b.build(out_leaves)
    return Traced_fn(graph, list(b.captured), out_tree), leaves


def tracing(values: Sequence[Any]) -> bool:
    """Whether a call with these leaves happens inside an outer trace."""
    return current_builder() is not None or any(isinstance(v, Traced) for v in values)


def call_graph(graph: ir.Graph, args: Sequence[Any]) -> list[Any]:
    """Run `graph` on `args`: inline it when tracing, else execute it."""
    if tracing(args):
        b = current_builder()
        if b is None:
            b = next(v.builder for v in args if isinstance(v, Traced))
        with b.active():
            return b.inline(graph, args)
    from .executor import execute
    return execute(graph, args)

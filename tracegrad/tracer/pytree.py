"""Pytrees: nested tuples, lists, dicts and None around array leaves."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

# Extra node types (e.g. Tensor containers) can register (flatten, unflatten) here.
NODE_TYPES: dict[type, tuple[Callable, Callable]] = {}


class TreeDef(NamedTuple):
    """A pytree's structure. A tuple underneath: jit keys its caches by TreeDefs, and a tuple
    is made, hashed and compared in C (a frozen dataclass does each in Python, per node)."""
    kind: str                      # "leaf", "none", "tuple", "list", "dict", or a registered name
    meta: Any = None               # dict keys, or the registered type
    children: tuple["TreeDef", ...] = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __repr__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(map(repr, self.children))
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.meta, self.children))
            return "{" + inner + "}"
        return {"tuple": f"({inner})", "list": f"[{inner}]"}.get(self.kind, f"{self.kind}({inner})")


LEAF = TreeDef("leaf")
NONE = TreeDef("none")


def tree_flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(x: Any, leaves: list[Any]) -> TreeDef:
    if x is None:
        return NONE
    t = type(x)
    if t is tuple or t is list:
        return TreeDef(t.__name__, None, tuple([_flatten(c, leaves) for c in x]))
    if t is dict:
        keys = tuple(sorted(x, key=repr))
        return TreeDef("dict", keys, tuple([_flatten(x[k], leaves) for k in keys]))
    if isinstance(x, tuple) and hasattr(x, "_fields"):   # namedtuple
        return TreeDef("namedtuple", t, tuple([_flatten(c, leaves) for c in x]))
    if t in NODE_TYPES:
        children, meta = NODE_TYPES[t][0](x)
        return TreeDef(t.__name__, (t, meta), tuple([_flatten(c, leaves) for c in children]))
    leaves.append(x)
    return LEAF


def tree_unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    it = iter(leaves)
    out = _unflatten(treedef, it)
    return out


def _unflatten(td: TreeDef, it) -> Any:
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    children = [_unflatten(c, it) for c in td.children]
    if td.kind == "tuple":
        return tuple(children)
    if td.kind == "list":
        return children
    if td.kind == "dict":
        return dict(zip(td.meta, children))
    if td.kind == "namedtuple":
        return td.meta(*children)
    t, meta = td.meta
    return NODE_TYPES[t][1](children, meta)


def flatten_up_to(td: TreeDef, x: Any) -> list[Any]:
    """The leaves of `x`, a tree of structure `td` in which any subtree may be None (as a
    custom VJP's zero gradient is): a None stands for that subtree's leaves, each None.
    Raises ValueError where `x` has another structure (a tuple and a list are alike)."""
    out: list[Any] = []
    _up_to(td, x, out)
    return out


def _up_to(td: TreeDef, x: Any, out: list) -> None:
    if x is None:
        out.extend([None] * td.num_leaves)
        return
    if td.kind == "leaf":
        out.append(x)
        return
    if td.kind == "none":
        raise ValueError(f"expected None, got {type(x).__name__}")
    if td.kind == "dict":
        if type(x) is not dict or set(x) != set(td.meta):
            raise ValueError(f"expected a dict with keys {list(td.meta)}, got {_what(x)}")
        children = [x[k] for k in td.meta]
    else:
        got = tree_flatten(x)[1]
        if (got.kind != td.kind and {got.kind, td.kind} != {"tuple", "list"}) or \
                len(got.children) != len(td.children):
            raise ValueError(f"expected {td!r}, got {_what(x)}")
        children = list(x) if got.kind in ("tuple", "list", "namedtuple") else None
        if children is None:        # a registered node type: its children as it gives them
            children = NODE_TYPES[type(x)][0](x)[0]
    for c, child in zip(td.children, children):
        _up_to(c, child, out)


def _what(x: Any) -> str:
    try:
        return repr(tree_flatten(x)[1])
    except Exception:   # noqa: BLE001 - only for the message
        return type(x).__name__


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    leaves, td = tree_flatten(tree)
    others = [tree_flatten(r)[0] for r in rest]
    return tree_unflatten(td, [fn(x, *xs) for x, *xs in zip(leaves, *others)])


def tree_leaves(tree: Any) -> list[Any]:
    return tree_flatten(tree)[0]


def register_pytree_node(t: type, flatten: Callable, unflatten: Callable) -> None:
    """flatten(x) -> (children, meta); unflatten(children, meta) -> x."""
    NODE_TYPES[t] = (flatten, unflatten)


def _expr(td: TreeDef, counter: list[int]) -> str | None:
    if td.kind == "leaf":
        counter[0] += 1
        return f"o[{counter[0] - 1}]"
    if td.kind == "none":
        return "None"
    parts = [_expr(c, counter) for c in td.children]
    if any(p is None for p in parts):
        return None
    if td.kind == "tuple":
        return "(" + "".join(p + ", " for p in parts) + ")"
    if td.kind == "list":
        return "[" + ", ".join(parts) + "]"
    if td.kind == "dict" and all(type(k) in (str, int) for k in td.meta):
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(td.meta, parts)) + "}"
    return None


def unflattener(treedef: TreeDef) -> Callable[[list[Any]], Any]:
    """A function rebuilding the tree from its leaves, specialised to `treedef`: the hot path
    of a cached jit call rebuilds its outputs without walking the TreeDef."""
    expr = _expr(treedef, [0])
    if expr is None:
        return lambda leaves: tree_unflatten(treedef, leaves)
    return eval(f"lambda o: {expr}")  # noqa: S307 - built from the TreeDef only

"""A structural hash of a graph: equal for graphs equal up to renaming of variables."""
from __future__ import annotations

import hashlib

import numpy as np

from .core import Graph, Lit


def _param(value) -> str:
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, Graph):
        return structural_hash(value)
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    if isinstance(value, tuple):
        return "(" + ",".join(_param(v) for v in value) + ")"
    return repr(value)


def structural_hash(graph: Graph) -> str:
    index: dict[int, int] = {}
    parts: list[str] = []

    def name(v) -> int:
        index[v.id] = len(index)
        return index[v.id]

    for v, c in zip(graph.constvars, graph.consts):
        digest = hashlib.sha1(np.ascontiguousarray(c).tobytes()).hexdigest()
        parts.append(f"c{name(v)}:{v.aval}:{digest}")
    for v in graph.invars:
        parts.append(f"i{name(v)}:{v.aval}")

    def use(a) -> str:
        if isinstance(a, Lit):
            return f"{a.value.item()!r}:{a.aval}"
        return f"%{index[a.id]}"

    for e in graph.eqns:
        params = ";".join(f"{k}={_param(v)}" for k, v in e.params.items())
        ins = ",".join(use(a) for a in e.inputs)
        outs = ",".join(f"{name(v)}:{v.aval}" for v in e.outvars)
        parts.append(f"{outs}={e.op}[{params}]({ins})")
    parts.append("out:" + ",".join(use(a) for a in graph.outvars))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()

"""A structural hash of a graph: equal for graphs equal up to renaming of variables."""
from __future__ import annotations

import hashlib

import numpy as np

from .core import Graph, Lit, remember


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


_PARAMS_TEXT: dict[int, tuple[dict, str]] = {}   # id(params) -> (params, text)


def _params_text(params: dict) -> str:
    """`k=v;...` for an equation's params, remembered per params dict (equations copied by the
    passes and the tracer share theirs)."""
    if not params:
        return ""
    hit = _PARAMS_TEXT.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    text = ";".join(f"{k}={_param(v)}" for k, v in params.items())
    return remember(_PARAMS_TEXT, id(params), (params, text))[1]


def structural_hash(graph: Graph) -> str:
    index: dict[int, str] = {}
    parts: list[str] = []

    for v, c in zip(graph.constvars, graph.consts):
        digest = hashlib.sha1(np.ascontiguousarray(c).tobytes()).hexdigest()
        index[v.id] = name = f"%{len(index)}"
        parts.append(f"c{name}:{v.aval}:{digest}")
    for v in graph.invars:
        index[v.id] = name = f"%{len(index)}"
        parts.append(f"i{name}:{v.aval}")

    def use(a) -> str:
        if type(a) is Lit:
            return f"{a.value.item()!r}:{a.aval}"
        return index[a.id]

    for e in graph.eqns:
        outs = []
        for v in e.outvars:
            index[v.id] = name = f"%{len(index)}"
            outs.append(f"{name}:{v.aval}")
        parts.append(f"{','.join(outs)}={e.op}[{_params_text(e.params)}]"
                     f"({','.join([use(a) for a in e.inputs])})")
    parts.append("out:" + ",".join(use(a) for a in graph.outvars))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()

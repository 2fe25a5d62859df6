"""The reference interpreter: runs a graph with each op's numpy reference. The oracle."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .core import Graph, Lit
from .ops import OPS

# Called after every equation with (eqn, inputs, outputs); set by tracegrad.config.debug_nans.
eqn_hook: Callable | None = None


def interpret(graph: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    if len(args) != len(graph.invars):
        raise TypeError(f"graph takes {len(graph.invars)} inputs, got {len(args)}")
    env: dict[int, np.ndarray] = {}
    for v, a in zip(graph.invars, args):
        arr = np.asarray(a)
        if arr.shape != v.aval.shape or arr.dtype != v.aval.dtype:
            raise TypeError(f"input expects {v.aval}, got {arr.dtype}{list(arr.shape)}")
        env[v.id] = arr
    for v, c in zip(graph.constvars, graph.consts):
        env[v.id] = c

    def read(a):
        return a.value if isinstance(a, Lit) else env[a.id]

    hook = eqn_hook
    for e in graph.eqns:
        ins = [read(a) for a in e.inputs]
        out = OPS[e.op].ref(*ins, **e.params)
        outs = out if OPS[e.op].multi_out else (out,)
        for v, o in zip(e.outvars, outs):
            env[v.id] = np.asarray(o, dtype=v.aval.dtype).reshape(v.aval.shape)
        if hook is not None:
            hook(e, ins, [env[v.id] for v in e.outvars])
    return [np.array(read(a)) for a in graph.outvars]

"""`tg.viz`: draw a graph (ops, shapes, the forward/backward split) with graphviz.

`render` uses the optional `graphviz` package (`pip install tracegrad[viz]`, plus the `dot`
program) and falls back to writing the Graphviz source when either is missing."""
from __future__ import annotations

import os
from typing import Any

from .ir import Graph


def _graph_of(obj: Any) -> Graph:
    if isinstance(obj, Graph):
        return obj
    g = getattr(obj, "ir", None)     # what jit(f).lower(...) returns
    if isinstance(g, Graph):
        return g
    raise TypeError(f"tg.viz expects a tg.ir.Graph (from tg.make_ir) or a lowered jit "
                    f"function, got {type(obj).__name__}")


def to_dot(graph: Any) -> str:
    """Graphviz source for `graph`: one node per input and op, edges labelled with types,
    equations of the backward pass shaded."""
    return _graph_of(graph).to_dot()


def render(graph: Any, path: str | os.PathLike, format: str | None = None) -> str:
    """Draw `graph` to `path` (format from its suffix: .svg, .png, .pdf; `.dot`/`.gv`
    writes the source). Returns the path written, which is `path` with a `.dot` suffix
    when graphviz (the package or the `dot` program) is not installed."""
    path = os.fspath(path)
    root, ext = os.path.splitext(path)
    fmt = format or ext.lstrip(".") or "svg"
    dot = to_dot(graph)
    if fmt not in ("dot", "gv"):
        try:
            import graphviz
            graphviz.Source(dot).render(outfile=path, format=fmt, cleanup=True)
            return path
        except ImportError:
            pass
        except Exception as e:   # noqa: BLE001 - graphviz.ExecutableNotFound and friends
            if type(e).__name__ != "ExecutableNotFound":
                raise
        path = root + ".dot"
    with open(path, "w") as fh:
        fh.write(dot + "\n")
    return path

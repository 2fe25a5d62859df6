"""The IR dump (readable like a jaxpr) and a graphviz rendering of a graph."""
from __future__ import annotations

from typing import Any

import numpy as np

from .core import Graph, Lit, Var, short_dtype


def _names():
    letters = "abcdefghijklmnopqrstuvwxyz"
    n = 0
    while True:
        s, k = "", n
        while True:
            s = letters[k % 26] + s
            k = k // 26 - 1
            if k < 0:
                break
        yield s
        n += 1


def format_param(value: Any) -> str:
    if isinstance(value, np.dtype) or isinstance(value, type):
        return short_dtype(np.dtype(value))
    if isinstance(value, Graph):
        return "{...}"
    if callable(value):
        return getattr(value, "__name__", "fn")
    if isinstance(value, tuple):
        inner = ",".join(format_param(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


class _Namer:
    def __init__(self):
        self.names: dict[int, str] = {}
        self.gen = _names()

    def bind(self, v: Var) -> str:
        name = self.names[v.id] = next(self.gen)
        return name

    def use(self, a: Any) -> str:
        if isinstance(a, Lit):
            return repr(a)
        return self.names.get(a.id, f"?{a.id}")


def format_graph(graph: Graph, source: bool = False, indent: int = 0) -> str:
    n = _Namer()
    pad = " " * indent
    consts = " ".join(f"{n.bind(v)}:{v.aval}" for v in graph.constvars)
    ins = " ".join(f"{n.bind(v)}:{v.aval}" for v in graph.invars)
    head = f"{{ lambda {consts} ; {ins} ." if consts else f"{{ lambda {ins} ."
    lines = [pad + head.replace("lambda  .", "lambda .")]
    for e in graph.eqns:
        outs = " ".join(f"{n.bind(v)}:{v.aval}" for v in e.outvars)
        params = ",".join(f"{k}={format_param(v)}" for k, v in e.params.items()
                          if not isinstance(v, Graph))
        op = f"{e.op}[{params}]" if params else e.op
        args = " ".join(n.use(a) for a in e.inputs)
        line = f"{pad}    {outs} = {op} {args}".rstrip()
        if source and e.source:
            line += f"    # {e.source}"
        lines.append(line)
        for k, v in e.params.items():   # a scan's body: a block of its own, named afresh
            if isinstance(v, Graph):
                block = format_graph(v, source, indent + 6)
                lines.append(f"{pad}      {k}={block[indent + 6:]}")
    outs = " ".join(n.use(a) for a in graph.outvars)
    lines.append(f"{pad}  in ({outs}) }}")
    return "\n".join(lines)


def graph_to_dot(graph: Graph) -> str:
    """Graphviz source: one node per input/equation, edges labelled with types;
    equations the reverse pass emitted (their source says "backward") are shaded."""
    n = _Namer()
    lines = ["digraph G {", "  rankdir=TB;", "  node [shape=box, fontname=monospace];"]
    producer: dict[int, str] = {}
    for i, v in enumerate(graph.constvars + graph.invars):
        name = n.bind(v)
        producer[v.id] = f"in{i}"
        lines.append(f'  in{i} [label="{name}: {v.aval}", shape=ellipse];')
    for i, e in enumerate(graph.eqns):
        back = e.source is not None and "(backward" in e.source
        style = ', style=filled, fillcolor="#dde8ff"' if back else ""
        outs = ", ".join(f"{n.bind(v)}: {v.aval}" for v in e.outvars)
        op = e.op
        if op == "scan":
            op += f" x{e.params['length']} ({len(e.params['body'].eqns)} eqns)"
        lines.append(f'  e{i} [label="{op}\\n{outs}"{style}];')
        for a in e.inputs:
            if isinstance(a, Var) and a.id in producer:
                lines.append(f'  {producer[a.id]} -> e{i} [label="{a.aval}"];')
        for v in e.outvars:
            producer[v.id] = f"e{i}"
    for j, a in enumerate(graph.outvars):
        lines.append(f'  out{j} [label="out {j}: {a.aval}", shape=ellipse];')
        if isinstance(a, Var) and a.id in producer:
            lines.append(f"  {producer[a.id]} -> out{j};")
    lines.append("}")
    return "\n".join(lines)

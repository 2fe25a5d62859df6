"""The verifier: checks that a graph is well formed and every equation type-checks."""
from __future__ import annotations

from .core import Graph, Lit, Var
from .ops import OPS, DTypeError, ShapeError


class IRError(ValueError):
    """A malformed graph."""


def verify(graph: Graph) -> None:
    """Raise IRError naming the first bad equation; return None for a well-formed graph.
    Graphs in an equation's params (a scan's body) are verified too, each once."""
    _verify(graph, set())


def _verify(graph: Graph, checked: set[int]) -> None:
    """`checked`: ids of the nested graphs already verified in this call."""
    from .printer import _Namer
    names = _Namer()
    defined: set[int] = set()

    def define(v: Var, where: str) -> None:
        if not isinstance(v, Var):
            raise IRError(f"{where}: binder {v!r} is not a Var")
        if v.id in defined:
            raise IRError(f"{where}: variable {names.use(v)} is defined twice")
        defined.add(v.id)
        names.bind(v)

    if len(graph.constvars) != len(graph.consts):
        raise IRError("graph has a different number of constvars and consts")
    for v, c in zip(graph.constvars, graph.consts):
        define(v, "constant")
        if tuple(c.shape) != v.aval.shape or c.dtype != v.aval.dtype:
            raise IRError(f"constant {names.use(v)}:{v.aval} holds {c.dtype}{list(c.shape)}")
    for v in graph.invars:
        define(v, "input")
    for i, e in enumerate(graph.eqns):
        where = f"equation {i} ({e.op})"
        if e.op not in OPS:
            raise IRError(f"{where}: unknown op {e.op!r}")
        for a in e.inputs:
            if isinstance(a, Var) and a.id not in defined:
                raise IRError(f"{where}: reads {names.use(a)}, which is not defined before it")
            if not isinstance(a, (Var, Lit)):
                raise IRError(f"{where}: input {a!r} is neither a Var nor a Lit")
        if e.op == "scan" and not isinstance(e.params.get("body"), Graph):
            raise IRError(f"{where}: its body {e.params.get('body')!r} is not a Graph")
        for k, sub in e.params.items():
            if isinstance(sub, Graph) and id(sub) not in checked:
                try:
                    _verify(sub, checked)
                except IRError as err:
                    raise IRError(f"{where}, in its {k}: {err}") from None
                checked.add(id(sub))
        try:
            avals = OPS[e.op].rule(*[a.aval for a in e.inputs], **e.params)
        except (ShapeError, DTypeError, TypeError) as err:
            raise IRError(f"{where}: {err}") from None
        avals = avals if OPS[e.op].multi_out else [avals]
        if len(avals) != len(e.outvars):
            raise IRError(f"{where}: has {len(e.outvars)} outputs, expected {len(avals)}")
        for v, want in zip(e.outvars, avals):
            if v.aval != want:
                raise IRError(f"{where}: output declared {v.aval} but the op gives {want}")
            define(v, where)
    for a in graph.outvars:
        if isinstance(a, Var) and a.id not in defined:
            raise IRError(f"output {names.use(a)} is not defined")

"""Graph-to-graph optimisations: trivial algebra, constant folding, CSE and DCE.

Each pass is linear in the number of equations and returns a new Graph (sharing Vars)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .core import Atom, Eqn, Graph, Lit, Var, remember
from .ops import OPS
from .scan import optimize_bodies

# scan: evaluating a whole loop at compile time could take as long as running it
_NO_FOLD = {"random", "custom_vjp_call", "stop_gradient", "scan"}


def _substituted(graph: Graph, eqns: list[Eqn], subst: dict[int, Atom]) -> Graph:
    """The passes rewrite each equation's inputs as they go (a replacement is always an
    atom already final), so only the outputs are left to read."""
    def read(a: Atom) -> Atom:
        while isinstance(a, Var) and a.id in subst:
            a = subst[a.id]
        return a

    return Graph(graph.invars, eqns, [read(a) for a in graph.outvars],
                 graph.constvars, graph.consts)


def _copy(e: Eqn) -> Eqn:
    return Eqn(e.op, list(e.inputs), e.outvars, e.params, e.source)


def dce(graph: Graph) -> Graph:
    """Drop equations (and constants) whose results no output needs."""
    used = {a.id for a in graph.outvars if isinstance(a, Var)}
    kept = []
    for e in reversed(graph.eqns):
        if any(v.id in used for v in e.outvars):
            kept.append(e)
            used.update(a.id for a in e.inputs if isinstance(a, Var))
    kept.reverse()
    pairs = [(v, c) for v, c in zip(graph.constvars, graph.consts) if v.id in used]
    return Graph(graph.invars, kept, list(graph.outvars),
                 [v for v, _ in pairs], [c for _, c in pairs])


def _freeze(x: Any) -> Any:
    if not x and isinstance(x, dict):
        return ()
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, np.dtype):
        return str(x)
    if isinstance(x, (float, np.floating)) and x == 0 and np.signbit(x):
        return ("-0.0",)    # -0.0 == 0.0 and hashes alike: a full of either is its own value
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


def _is_lit(a: Atom, value: float) -> bool:
    return isinstance(a, Lit) and a.value.item() == value


# stop_gradient is never an identity here: graphs are optimised before an outer transform may
# differentiate them, and removing it would let gradients through.
_MAYBE_IDENTITY = {"reshape", "broadcast", "convert", "transpose", "mul",
                   "add", "div", "pow", "sub", "neg", "select"}


def _is_unit(a: Atom, value: float, producers: dict[int, Eqn]) -> bool:
    """`a` is the literal `value`, or a broadcast of it (as gradient seeds are)."""
    if isinstance(a, Var):
        p = producers.get(a.id)
        if p is None or p.op != "broadcast":
            return False
        a = p.inputs[0]
    return _is_lit(a, value)


def _identity_input(e: Eqn, producers: dict[int, Eqn]) -> Atom | None:
    """The atom equal to `e`'s output when `e` is a no-op (x*1, x+0, same-shape reshape...)."""
    op = e.op
    if op not in _MAYBE_IDENTITY:
        return None
    out = e.out
    ins = e.inputs
    if op in ("reshape", "broadcast", "convert") and ins[0].aval == out.aval:
        return ins[0]
    if e.op == "transpose" and e.params["perm"] == tuple(range(len(out.aval.shape))):
        return ins[0]
    if e.op in ("mul", "add"):
        unit = 1 if e.op == "mul" else 0
        for a, b in ((ins[0], ins[1]), (ins[1], ins[0])):
            if a.aval == out.aval and _is_unit(b, unit, producers):
                return a
    if e.op == "select" and isinstance(ins[0], Lit):
        chosen = ins[1] if ins[0].value.item() else ins[2]
        return chosen if chosen.aval == out.aval else None
    if e.op in ("div", "pow") and _is_lit(ins[1], 1) and ins[0].aval == out.aval:
        return ins[0]
    if e.op == "sub" and _is_lit(ins[1], 0) and ins[0].aval == out.aval:
        return ins[0]
    if e.op == "neg" and isinstance(ins[0], Var):
        inner = producers.get(ins[0].id)
        if inner is not None and inner.op == "neg":
            return inner.inputs[0]
    return None


_FROZEN: dict[int, tuple[dict, Any]] = {}   # id(params) -> (params, frozen params)


def _frozen_params(params: dict) -> Any:
    """`_freeze(params)`, remembered per params dict (copied equations share theirs)."""
    if not params:
        return ()
    hit = _FROZEN.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    return remember(_FROZEN, id(params), (params, _freeze(params)))[1]


def rewrite(graph: Graph, simplify: bool = True, fold: bool = True, cse: bool = True
            ) -> Graph:
    """simplify, fold_constants and cse in one walk: each equation, its inputs already
    rewritten, is dropped as a no-op, folded to a literal, merged with an equal one, or kept."""
    subst: dict[int, Atom] = {}
    producers: dict[int, Eqn] = {}
    seen: dict[Any, list[Var]] = {}
    eqns = []
    for e in graph.eqns:
        e = _copy(e)
        e.inputs = ins = [subst.get(a.id, a) if type(a) is Var else a for a in e.inputs]
        outs = e.outvars
        if len(outs) == 1:
            out = outs[0]
            if simplify:
                if e.op == "reshape" and type(ins[0]) is Var:
                    inner = producers.get(ins[0].id)
                    if inner is not None and inner.op == "reshape":
                        e.inputs = ins = [inner.inputs[0]]
                same = _identity_input(e, producers)
                if same is not None:
                    subst[out.id] = same
                    continue
            if (fold and out.aval.shape == () and e.op not in _NO_FOLD
                    and all(type(a) is Lit for a in ins)):
                value = OPS[e.op].ref(*[a.value for a in ins], **e.params)
                subst[out.id] = Lit(np.asarray(value, out.aval.dtype), out.aval.dtype)
                continue
        if cse:
            key = (e.op, tuple([a.id if type(a) is Var else a.key() for a in ins]),
                   _frozen_params(e.params))
            hit = seen.get(key)
            if hit is not None:
                for v, w in zip(outs, hit):
                    subst[v.id] = w
                continue
            seen[key] = outs
        for v in outs:
            producers[v.id] = e
        eqns.append(e)
    return _substituted(graph, eqns, subst)


def simplify(graph: Graph) -> Graph:
    """Trivial algebra: x*1, x+0, x-0, x/1, x**1, --x, reshape/broadcast/convert to the same
    type and identity transposes become x; reshape of reshape reads the original."""
    return rewrite(graph, fold=False, cse=False)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate equations on literal inputs whose result is a scalar, writing a literal."""
    return rewrite(graph, simplify=False, cse=False)


def cse(graph: Graph) -> Graph:
    """Merge equations that apply the same op with the same params to the same inputs."""
    return rewrite(graph, simplify=False, fold=False)


def optimize(graph: Graph) -> Graph:
    """The standard pipeline: simplify, fold and CSE in one forward walk, then DCE. Every
    rewrite reads inputs that are already final, so one round reaches the fixed point.
    Scan bodies are optimised too (once per body), their constants moved out to the graph's."""
    if any(e.op == "scan" for e in graph.eqns):
        graph = optimize_bodies(graph, optimize)
    return dce(rewrite(graph))

"""Reverse and forward mode as graph-to-graph walks over the rule tables in `rules`.

The walks only emit IR, so differentiating a differentiated graph works like any other."""
from __future__ import annotations

from typing import Any, Sequence

from . import emit as E
from .builder import Builder, Traced
from .core import Eqn, Graph, Lit, Var, is_float, remember
from .ops import OPS
from .passes import _frozen_params
from .rules import JVP, PARTIAL_VJP, VJP


def _differentiable(aval) -> bool:
    return is_float(aval.dtype)


def _input_env(b: Builder, graph: Graph, args: Sequence[Any]) -> dict[int, Traced]:
    """The environment var id -> value holding `graph`'s inputs and constants, in `b`."""
    env: dict[int, Traced] = {}
    for v, a in zip(graph.invars, args):
        env[v.id] = a if isinstance(a, Traced) else Traced(b, b.atom(a))
    for v, c in zip(graph.constvars, graph.consts):
        env[v.id] = Traced(b, b.const(c))
    return env


def forward_values(b: Builder, graph: Graph, args: Sequence[Any]) -> dict[int, Traced]:
    """Inline `graph` into `b`, returning the environment var id -> value (incl. inputs)."""
    env = _input_env(b, graph, args)
    if any(env[v.id].aval != v.aval for v in graph.invars):
        for e in graph.eqns:    # inputs of other types: every equation is checked again
            ins = [_read(b, env, a) for a in e.inputs]
            outs = b.emit(e.op, [t.atom for t in ins], e.params, e.source)
            for v, o in zip(e.outvars, outs):
                env[v.id] = Traced(b, o)
        return env
    # the same types: copy the equations as they are (their rules held when recorded)
    atoms = {k: b.lift(t) for k, t in env.items()}
    emitted = b.eqns
    for e in graph.eqns:
        outs = [Var(v.aval) for v in e.outvars]
        emitted.append(Eqn(e.op, [a if type(a) is Lit else atoms[a.id] for a in e.inputs],
                           outs, e.params, e.source))
        for v, o in zip(e.outvars, outs):
            atoms[v.id] = o
            env[v.id] = Traced(b, o)
    return env


def _read(b: Builder, env: dict[int, Traced], a: Any) -> Traced:
    return Traced(b, a) if isinstance(a, Lit) else env[a.id]


def _reaching(graph: Graph, wrt: Sequence[int]) -> set[int]:
    """Ids of the vars whose value depends differentiably on the inputs in `wrt`."""
    live = {graph.invars[i].id for i in wrt if _differentiable(graph.invars[i].aval)}
    for e in graph.eqns:
        if e.op == "stop_gradient":
            continue
        if any(not isinstance(a, Lit) and a.id in live for a in e.inputs):
            live.update(v.id for v in e.outvars if _differentiable(v.aval))
    return live


def _rule(e: Any, gs: list, ins: list, outs: list, need: tuple | None) -> Any:
    if OPS[e.op].multi_out:
        if need is not None:
            return VJP[e.op](gs, *ins, out=outs, need=need, **e.params)
        return VJP[e.op](gs, *ins, out=outs, **e.params)
    if need is not None:
        return VJP[e.op](gs[0], *ins, out=outs[0], need=need, **e.params)
    return VJP[e.op](gs[0], *ins, out=outs[0], **e.params)


# A VJP rule's IR depends only on the op, its params, the types of the cotangent, inputs and
# output, which of them are the same value, and literal values: the equations it emitted for one
# signature are copied for the next equation with that signature (a trace of a loop
# differentiates each step the same way), instead of running the rule again.
_TEMPLATES: dict[Any, Any] = {}
_UNCACHED = {"custom_vjp_call"}     # runs user code
_PARTIAL = PARTIAL_VJP | {"scan"}   # rules told which inputs need a gradient


def _vjp(b: Builder, e: Any, gs: list, ins: list, outs: list, need: tuple | None) -> Any:
    if e.op in _UNCACHED or OPS[e.op].multi_out or b.weak_inputs:
        return _rule(e, gs, ins, outs, need)
    vals = [gs[0], *ins, outs[0]]
    sig: list = []
    first: dict[int, int] = {}
    atoms = []
    for t in vals:
        if type(t) is not Traced or t.builder is not b:
            return _rule(e, gs, ins, outs, need)
        a = t.atom
        atoms.append(a)
        sig.append(a.key() if type(a) is Lit else (first.setdefault(a.id, len(first)), a.aval))
    try:    # params as given; equal dicts listed in another order only miss
        key = (e.op, tuple(e.params.items()), tuple(sig), need)
        tpl = _TEMPLATES.get(key)
    except TypeError:
        try:
            key = (e.op, _frozen_params(e.params), tuple(sig), need)
            tpl = _TEMPLATES.get(key)
        except TypeError:   # params that cannot be hashed
            return _rule(e, gs, ins, outs, need)
    if tpl is None:
        tpl = remember(_TEMPLATES, key, _record(e, atoms, sig, need), 4096)
    if tpl is False:
        return _rule(e, gs, ins, outs, need)
    in_ids, eqns, results = tpl
    env = {}
    for tid, a in zip(in_ids, atoms):
        env.setdefault(tid, a)
    source = b.source_override
    emitted = b.eqns
    for te in eqns:
        new_outs = [Var(v.aval) for v in te.outvars]
        emitted.append(Eqn(te.op, [a if type(a) is Lit else env[a.id] for a in te.inputs],
                           new_outs, te.params, source))
        for v, o in zip(te.outvars, new_outs):
            env[v.id] = o
    return tuple(None if r is None else Traced(b, r if type(r) is Lit else env[r.id])
                 for r in results)


def _record(e: Any, atoms: list, sig: list, need: tuple | None) -> Any:
    """Run the rule in a scratch builder: (template input var id per value, equations,
    results), or False when its IR cannot be replayed (constants, captured values)."""
    tb = Builder("vjp-rule")
    by_pos: dict[int, Traced] = {}
    vals, in_ids = [], []
    for a, s in zip(atoms, sig):
        if type(a) is Lit:
            vals.append(Traced(tb, a))
            in_ids.append(None)
            continue
        t = by_pos.get(s[0])
        if t is None:
            t = by_pos[s[0]] = tb.new_input(a.aval)
        vals.append(t)
        in_ids.append(t.atom.id)
    with tb.active():
        grads = _rule(e, vals[:1], vals[1:-1], vals[-1:], need)
    if tb.constvars or tb.captured:
        return False
    results = []
    for g in grads:
        if g is None:
            results.append(None)
        elif type(g) is Traced and g.builder is tb:
            results.append(g.atom)
        else:
            return False
    return in_ids, tb.eqns, results


def backward_pass(b: Builder, graph: Graph, args: Sequence[Any], cts: Sequence[Any],
                  wrt: Sequence[int]) -> tuple[list[Traced], list[Traced]]:
    """Emit into `b` the forward values of `graph` on `args` and the gradients, w.r.t. the
    inputs in `wrt`, of <outputs, cts>. Returns (outputs, gradients)."""
    with b.active():
        env = forward_values(b, graph, args)
        outs = [_read(b, env, a) for a in graph.outvars]
        live = _reaching(graph, wrt)
        sums = _Sums(b)
        for a, g in zip(graph.outvars, cts):
            if g is not None and not isinstance(a, Lit) and a.id in live:
                sums.add(a.id, g if isinstance(g, Traced) else Traced(b, b.atom(g)))
        for e in reversed(graph.eqns):
            if not any(v.id in sums.terms for v in e.outvars):
                continue
            b.source_override = f"{e.source or '?'} (backward of {e.op})"
            try:
                gs = [sums.pop(v.id) for v in e.outvars]
                ins = [_read(b, env, a) for a in e.inputs]
                outs_e = [env[v.id] for v in e.outvars]
                need = tuple(type(a) is not Lit and a.id in live for a in e.inputs) \
                    if e.op in _PARTIAL else None
                n_before = len(b.eqns)
                grads = _vjp(b, e, gs, ins, outs_e, need)
                sums.note_matmuls(n_before)
                for a, g in zip(e.inputs, grads):
                    if g is not None and not isinstance(a, Lit) and a.id in live:
                        sums.add(a.id, g)
            finally:
                b.source_override = None
        grads = []
        done: dict[int, Traced] = {}    # an input named twice in `wrt` gets its gradient twice
        for i in wrt:
            v = graph.invars[i]
            if v.id not in done:
                g = sums.pop(v.id)
                done[v.id] = g if g is not None else E.full(v.aval.shape, 0, v.aval.dtype)
            grads.append(done[v.id])
        sums.drop_merged()
    return outs, grads


class _Sums:
    """The gradient contributions to each variable, summed when the variable's gradient is
    needed. Contributions made by 2-d matmuls (a weight used at every step of a loop gets
    `h_t^T @ g_t` per step) are summed as one matmul of the concatenated operands: T rank-1
    products and T-1 additions become two concatenations and one GEMM with K = T."""

    def __init__(self, b: Builder):
        self.b = b
        self.terms: dict[int, list[Traced]] = {}
        self.uses: dict[int, int] = {}          # contribution var id -> times contributed
        self.matmuls: dict[int, Eqn] = {}       # var id -> the 2-d matmul (backward) making it
        self.merged: set[int] = set()           # id() of matmul equations merged away

    def add(self, var_id: int, g: Traced) -> None:
        self.terms.setdefault(var_id, []).append(g)
        if type(g.atom) is Var:
            self.uses[g.atom.id] = self.uses.get(g.atom.id, 0) + 1

    def note_matmuls(self, start: int) -> None:
        for e in self.b.eqns[start:]:
            if e.op == "matmul" and len(e.inputs[0].aval.shape) == 2 \
                    and len(e.inputs[1].aval.shape) == 2:
                self.matmuls[e.outvars[0].id] = e

    def pop(self, var_id: int) -> Traced | None:
        terms = self.terms.pop(var_id, None)
        if terms is None:
            return None
        if len(terms) > 2:
            terms = self._merge(terms)
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    def _merge(self, terms: list[Traced]) -> list[Traced]:
        b = self.b
        made = [t for t in terms if t.builder is b and type(t.atom) is Var
                and t.atom.id in self.matmuls and self.uses.get(t.atom.id) == 1]
        if len(made) < 3:
            return terms
        eqns = [self.matmuls[t.atom.id] for t in made]
        lhs = E.concatenate([Traced(b, e.inputs[0]) for e in eqns], 1)
        rhs = E.concatenate([Traced(b, e.inputs[1]) for e in eqns], 0)
        self.merged.update(id(e) for e in eqns)
        merged = {id(t) for t in made}
        return [E.matmul(lhs, rhs)] + [t for t in terms if id(t) not in merged]

    def drop_merged(self) -> None:
        """Remove the merged matmuls, unless some equation still reads one (a custom_vjp
        backward may use its product twice): that one stays and computes as before."""
        if not self.merged:
            return
        eqns = self.b.eqns
        read = {a.id for e in eqns if id(e) not in self.merged for a in e.inputs
                if type(a) is Var}
        dead = {id(e) for e in eqns if id(e) in self.merged and e.outvars[0].id not in read}
        if dead:
            eqns[:] = [e for e in eqns if id(e) not in dead]


def vjp_graph(graph: Graph, wrt: Sequence[int] | None = None) -> Graph:
    """(inputs..., output cotangents...) -> (outputs..., gradients of the `wrt` inputs)."""
    wrt = range(len(graph.invars)) if wrt is None else wrt
    b = Builder("vjp")
    args = [b.new_input(v.aval) for v in graph.invars]
    cts = [b.new_input(a.aval) for a in graph.outvars]
    outs, grads = backward_pass(b, graph, args, cts, list(wrt))
    return b.build(outs + grads)


def forward_pass(b: Builder, graph: Graph, args: Sequence[Any],
                 tangents: Sequence[Any]) -> tuple[list[Traced], list[Traced | None]]:
    """Emit into `b` the outputs of `graph` and their tangents (None where zero)."""
    with b.active():
        env = _input_env(b, graph, args)
        tan: dict[int, Traced] = {}
        for v, t in zip(graph.invars, tangents):
            if t is not None and _differentiable(v.aval):
                tan[v.id] = t if isinstance(t, Traced) else Traced(b, b.atom(t))
        for e in graph.eqns:
            ins = [_read(b, env, a) for a in e.inputs]
            outs = b.emit(e.op, [t.atom for t in ins], e.params, e.source)
            for v, o in zip(e.outvars, outs):
                env[v.id] = Traced(b, o)
            ts = [None if isinstance(a, Lit) else tan.get(a.id) for a in e.inputs]
            if all(t is None for t in ts) or e.op == "stop_gradient":
                continue
            out_vals = [env[v.id] for v in e.outvars]
            b.source_override = f"{e.source or '?'} (tangent of {e.op})"
            try:
                if OPS[e.op].multi_out:
                    t_out = JVP[e.op](*ts, *ins, out=out_vals, **e.params)
                else:
                    t_out = [JVP[e.op](*ts, *ins, out=out_vals[0], **e.params)]
            finally:
                b.source_override = None
            for v, t in zip(e.outvars, t_out):
                if t is not None and _differentiable(v.aval):
                    tan[v.id] = t
        outs = [_read(b, env, a) for a in graph.outvars]
        touts = [None if isinstance(a, Lit) else tan.get(a.id) for a in graph.outvars]
    return outs, touts


def jvp_graph(graph: Graph) -> Graph:
    """(inputs..., tangents...) -> (outputs..., output tangents...)."""
    b = Builder("jvp")
    args = [b.new_input(v.aval) for v in graph.invars]
    tans = [b.new_input(v.aval) for v in graph.invars]
    outs, touts = forward_pass(b, graph, args, tans)
    with b.active():
        touts = [t if t is not None else E.full(o.shape, 0, o.dtype)
                 for t, o in zip(touts, outs)]
    return b.build(outs + touts)

"""Forward + backward IR of a recorded Tensor graph, composed from per-op backward templates.

A recorded op's equations come from a template (see tensor.record); its reverse pass is
emitted once per template (and per which inputs need gradients), then copied for every node
that uses it. A graph seen for the first time — an RNN at a new sequence length — is thus
assembled by copying equations rather than differentiated and re-derived op by op."""
from __future__ import annotations

from typing import Any

from .. import ir
from ..ir.builder import Traced
from ..ir.core import Eqn, Lit, Var, is_float
from ..ir.ops import OPS
from ..ir.rules import VJP

_templates: dict = {}    # (template sig id, inputs needing grad, outputs with cts) -> template
TEMPLATE_LIMIT = 4096


class NoTemplate(Exception):
    """Some node cannot be composed from a template; differentiate the whole graph."""


def vjp_walk(eqns: list, args: list, out_vars: list, b: Any, env: dict, gouts: dict,
             subst: dict, create: bool) -> list:
    """Emit the reverse pass of one op's `eqns` (inputs `args`, entries as in Node.args);
    `env` maps forward vars to values (empty: read the recorded vars themselves), `subst`
    replaces saved values by unpacked ones. Returns a gradient (or None) per entry."""
    def read(a: Any) -> Traced:
        if isinstance(a, Lit):
            return Traced(b, a)
        t = subst.get(a.id)
        if t is None:
            t = env.get(a.id)
        return t if t is not None else Traced(b, a)

    if create:      # recompute the forward from the stand-ins, so its IR is differentiable
        for e in eqns:
            outs = b.emit(e.op, [read(a).atom for a in e.inputs], e.params, e.source)
            for v, o in zip(e.outvars, outs, strict=False):
                env[v.id] = Traced(b, o)
    live = {e[0].id for e in args
            if e[0] is not None and e[1] is not None and is_float(e[0].aval.dtype)}
    for e in eqns:
        if e.op != "stop_gradient" and any(not isinstance(a, Lit) and a.id in live
                                           for a in e.inputs):
            live.update(v.id for v in e.outvars if is_float(v.aval.dtype))
    ct: dict[int, Traced] = {}
    for i, g in gouts.items():
        v = out_vars[i]
        if v.id in live:
            ct[v.id] = g
    for e in reversed(eqns):
        gs = [ct.pop(v.id, None) for v in e.outvars]
        if all(g is None for g in gs):
            continue
        ins = [read(a) for a in e.inputs]
        outs = [read(v) for v in e.outvars]
        b.source_override = f"{e.source or '?'} (backward of {e.op})"
        if OPS[e.op].multi_out:
            grads = VJP[e.op](gs, *ins, out=outs, **e.params)
        else:
            grads = VJP[e.op](gs[0], *ins, out=outs[0], **e.params)
        for a, g in zip(e.inputs, grads, strict=False):
            if g is not None and not isinstance(a, Lit) and a.id in live:
                ct[a.id] = g if a.id not in ct else ct[a.id] + g
    return [ct.get(v.id) if v is not None and g is not None else None
            for v, g, _ in args]


def _backward_template(tpl: tuple, needs: tuple, has_ct: tuple) -> tuple | None:
    """(cotangent vars per output, equations, gradient atom or None per input, the forward
    op each equation is the backward of) for template `tpl`, or None if it captured
    constants."""
    in_ids, teqns, touts = tpl[0], tpl[1], tpl[2]
    outs = [v for v in touts if v is not None]
    by_id = {v.id: v for e in teqns for v in e.inputs if not isinstance(v, Lit)}
    args = [(by_id.get(i) or Var(outs[0].aval), True if need else None, None)
            for i, need in zip(in_ids, needs, strict=True)]
    b = ir.Builder("vjp-template")
    cts = [Var(v.aval) if c else None for v, c in zip(outs, has_ct, strict=True)]
    with b.active():
        grads = vjp_walk(teqns, args, outs, b, {},
                         {i: Traced(b, c) for i, c in enumerate(cts) if c is not None}, {},
                         False)
    if b.constvars:
        return None
    atoms = [None if g is None else g.atom for g in grads]
    needed = {a.id for a in atoms if a is not None and not isinstance(a, Lit)}
    eqns = []
    for e in reversed(b.eqns):    # the rules also emit gradients no input needs
        if any(v.id in needed for v in e.outvars):
            eqns.append(e)
            needed.update(a.id for a in e.inputs if not isinstance(a, Lit))
    eqns.reverse()
    ops = [e.source.rpartition(" (backward of ")[2].rstrip(")") for e in eqns]
    reads_ct = {c.id for c in cts if c is not None}
    pure = []       # which equations read no cotangent, even indirectly
    for e in eqns:
        p = not any(not isinstance(a, Lit) and a.id in reads_ct for a in e.inputs)
        if not p:
            reads_ct.update(v.id for v in e.outvars)
        pure.append(p)
    return cts, eqns, atoms, ops, pure


def compose(order: list, in_vars: list, in_gsrc: list, roots: list) -> tuple[ir.Graph, list]:
    """(graph, wrt): the graph (inputs..., root cotangents...) -> (roots..., gradients of
    the inputs `wrt`), from the nodes `order` (a grad_walk's)."""
    eqns: list = []
    envs = []
    for n in order:
        tpl = n.tpl
        if tpl is None:
            raise NoTemplate
        ne = n.eqns
        eqns.extend(ne)
        env = {i: e[0] for i, e in zip(tpl[0], n.args, strict=False)}
        for t, e in zip(tpl[1], ne, strict=True):
            for tv, v in zip(t.outvars, e.outvars, strict=True):
                env[tv.id] = v
        envs.append(env)
    ct_in = [Var(t._var.aval) for t in roots]
    ct: dict[int, Any] = {}
    seen: dict[tuple, list] = {}    # (template equation, inputs) -> outputs, for pure ones

    def accumulate(var: Var, g: Any, source: str | None) -> None:
        if type(g) is Lit:
            raise NoTemplate
        prev = ct.get(var.id)
        if prev is None:
            ct[var.id] = g
        else:
            s = Var(var.aval)
            eqns.append(Eqn("add", [prev, g], [s], {}, source))
            ct[var.id] = s
    for t, c in zip(roots, ct_in, strict=True):
        accumulate(t._var, c, None)
    for n, env in zip(reversed(order), reversed(envs), strict=True):
        gouts = [ct.pop(v.id, None) for v in n.out_vars]
        if all(g is None for g in gouts):
            continue
        tpl, source = n.tpl, n.src
        needs = tuple(e[1] is not None and is_float(e[0].aval.dtype) for e in n.args)
        has_ct = tuple(g is not None for g in gouts)
        key = (tpl[4], needs, has_ct)
        bt = _templates.get(key)
        if bt is None:
            if len(_templates) > TEMPLATE_LIMIT:
                _templates.clear()
            bt = _templates[key] = _backward_template(tpl, needs, has_ct)
        if bt is None:
            raise NoTemplate
        cts, beqns, grads, ops, pure = bt
        for c, g in zip(cts, gouts, strict=True):
            if c is not None:
                env[c.id] = g
        for e, op, p in zip(beqns, ops, pure, strict=True):
            ins = [a if type(a) is Lit else env[a.id] for a in e.inputs]
            if p:   # reads forward values only: the same for every node sharing them
                k = (id(e), *[id(a) for a in ins])
                made = seen.get(k)
                if made is not None:
                    for v, o in zip(e.outvars, made, strict=True):
                        env[v.id] = o
                    continue
            outs = []
            for v in e.outvars:
                o = env[v.id] = Var(v.aval)
                outs.append(o)
            if p:
                seen[k] = outs
            eqns.append(Eqn(e.op, ins, outs, e.params, f"{source or '?'} (backward of {op})"))
        for (var, gsrc, _), g in zip(n.args, grads, strict=True):
            if g is not None and gsrc is not None:
                accumulate(var, g if type(g) is Lit else env[g.id], source)
    wrt = [i for i, g in enumerate(in_gsrc) if g is not None]
    outs = [t._var for t in roots]
    for i in wrt:
        v = in_vars[i]
        g = ct.get(v.id)
        if g is None:
            g = Var(v.aval)
            eqns.append(Eqn("full", [], [g], {"shape": v.aval.shape, "value": 0,
                                               "dtype": v.aval.dtype}, None))
        outs.append(g)
    return ir.Graph(list(in_vars) + ct_in, eqns, outs), wrt

"""Forward + backward IR of a recorded Tensor graph, composed from per-op backward templates.

A recorded op's equations come from a template (see tensor_record.record); its reverse pass is
emitted once per template (and per which inputs need gradients), then copied for every node
that uses it. A graph seen for the first time — an RNN at a new sequence length — is thus
assembled by copying equations rather than differentiated and re-derived op by op."""
from __future__ import annotations

from typing import Any

from .. import ir
from ..ir.builder import Traced
from ..ir.core import Aval, Eqn, Lit, Var, is_float
from ..ir.ops import OPS
from ..ir.rules import VJP
from .autograd_graph import instantiate

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
    """(cotangent vars per output, equations, gradient atom or None per input, per equation
    (the forward op it is the backward of, whether it reads no cotangent, whether it is a
    2-d matmul making a contribution)) for template `tpl`, or None if it captured
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
    # which make a contribution a merge may sum (see _Composer.total)
    mm = [e.op == "matmul" and not p and len(e.inputs[0].aval.shape) == 2
          and len(e.inputs[1].aval.shape) == 2 for e, p in zip(eqns, pure, strict=True)]
    tr = [e.op == "transpose" and tuple(e.params["perm"]) == (1, 0) for e in eqns]
    return cts, eqns, atoms, list(zip(ops, pure, mm, tr, strict=True))


def compose(order: list, in_vars: list, in_gsrc: list, roots: list) -> tuple[ir.Graph, list]:
    """(graph, wrt): the graph (inputs..., root cotangents...) -> (roots..., gradients of
    the inputs `wrt`), from the nodes `order` (a grad_walk's)."""
    c = _Composer()
    envs = [c.forward(n) for n in order]
    ct_in = [Var(t._var.aval) for t in roots]
    for t, g in zip(roots, ct_in, strict=True):
        c.add(t._var, g)
    for n, env in zip(reversed(order), reversed(envs), strict=True):
        c.backward(n, env)
    wrt = [i for i, g in enumerate(in_gsrc) if g is not None]
    outs = [t._var for t in roots]
    for i in wrt:
        v = in_vars[i]
        g = c.total(v)
        if g is None:
            g = Var(v.aval)
            c.eqns.append(Eqn("full", [], [g], {"shape": v.aval.shape, "value": 0,
                                                 "dtype": v.aval.dtype}, None))
        outs.append(g)
    return ir.Graph(list(in_vars) + ct_in, c.finish(outs), outs), wrt


class _Composer:
    """The equations of one composed graph, and the gradient contributions not yet summed."""

    def __init__(self) -> None:
        self.eqns: list[Eqn] = []
        self.terms: dict[int, list] = {}    # var id -> gradient contributions
        self.shared: dict[tuple, list] = {}  # (template equation, inputs) -> outputs
        self.sources: dict[str | None, dict] = {}   # source -> {op: "source (backward of op)"}
        self.matmuls: dict[int, Eqn] = {}   # var id -> the 2-d matmul making a contribution
        self.transposes: dict[int, Eqn] = {}    # var id -> the 2-d transpose making it
        self.merged: set[int] = set()       # ids of equations a merge made unneeded
        self.concats: dict[tuple, Var] = {}     # (axis, operand ids) -> concatenation

    def forward(self, n: Any) -> dict:
        """Append node `n`'s equations; returns its template variable id -> variable."""
        tpl = n.tpl
        if tpl is None:
            raise NoTemplate
        env: dict = {}
        ne = n._eqns
        teqns = tpl[1]
        if ne is None and len(teqns) == 1 and len(n.out_vars) == 1:   # the common case
            te = teqns[0]
            for i, e in zip(tpl[0], n.args, strict=False):
                env[i] = e[0]
            out = n.out_vars[0]
            env[te.outvars[0].id] = out
            ne = n._eqns = [Eqn(te.op, [a if type(a) is Lit else env[a.id] for a in te.inputs],
                                [out], te.params, n.src)]
        elif ne is None:
            ne = n._eqns = instantiate(tpl, n.args, n.out_vars, n.src, env)
        else:
            env.update((i, e[0]) for i, e in zip(tpl[0], n.args, strict=False))
            for t, e in zip(tpl[1], ne, strict=True):
                for tv, v in zip(t.outvars, e.outvars, strict=True):
                    env[tv.id] = v
        self.eqns.extend(ne)
        return env

    def backward(self, n: Any, env: dict) -> None:
        """Append the reverse pass of node `n` (whose outputs' gradients are complete)."""
        outs = n.out_vars
        if len(outs) == 1:
            terms = self.terms.pop(outs[0].id, None)
            if terms is None:
                return
            gouts = (terms[0] if len(terms) == 1 else self._sum(outs[0], terms),)
            has_ct = (True,)
        else:
            gouts = [self.total(v) for v in outs]
            if all(g is None for g in gouts):
                return
            has_ct = tuple([g is not None for g in gouts])
        tpl, source = n.tpl, n.src
        needs = tuple([e[1] is not None and e[0].aval.dtype.kind == "f" for e in n.args])
        key = (tpl[4], needs, has_ct)
        bt = _templates.get(key)
        if bt is None:
            if len(_templates) > TEMPLATE_LIMIT:
                _templates.clear()
            bt = _templates[key] = _backward_template(tpl, needs, has_ct)
        if bt is None:
            raise NoTemplate
        cts, beqns, grads, infos = bt
        for c, g in zip(cts, gouts, strict=True):
            if c is not None:
                env[c.id] = g
        shared, eqns = self.shared, self.eqns
        wheres = self.sources.get(source)
        if wheres is None:
            wheres = self.sources[source] = {}
        for e, (op, p, mm, tr) in zip(beqns, infos, strict=True):
            ins = [a if type(a) is Lit else env[a.id] for a in e.inputs]
            if p:   # reads forward values only: the same for every node sharing them
                k = (id(e), *[id(a) for a in ins])
                made = shared.get(k)
                if made is not None:
                    for v, o in zip(e.outvars, made, strict=True):
                        env[v.id] = o
                    continue
            if len(e.outvars) == 1:
                v = e.outvars[0]
                out = env[v.id] = Var(v.aval)
                outs = [out]
            else:
                outs = []
                for v in e.outvars:
                    o = env[v.id] = Var(v.aval)
                    outs.append(o)
            if p:
                shared[k] = outs
            where = wheres.get(op)
            if where is None:
                where = wheres[op] = f"{source or '?'} (backward of {op})"
            new = Eqn(e.op, ins, outs, e.params, where)
            eqns.append(new)
            if mm:
                self.matmuls[outs[0].id] = new
            elif tr:
                self.transposes[outs[0].id] = new
        terms = self.terms
        for (var, gsrc, _), g in zip(n.args, grads, strict=True):
            if g is not None and gsrc is not None:
                if type(g) is Lit:
                    raise NoTemplate
                g = env[g.id]
                t = terms.get(var.id)
                if t is None:
                    terms[var.id] = [g]
                else:
                    t.append(g)

    def add(self, var: Var, g: Any) -> None:
        if type(g) is Lit:
            raise NoTemplate
        terms = self.terms.get(var.id)
        if terms is None:
            self.terms[var.id] = [g]
        else:
            terms.append(g)

    def total(self, var: Var) -> Var | None:
        """The sum of `var`'s gradient contributions (None if there are none). Contributions
        made by 2-d matmuls — a weight used at every step of a loop gets `h_t^T @ g_t` per
        step — are summed as one matmul of the concatenated operands."""
        terms = self.terms.pop(var.id, None)
        if terms is None:
            return None
        return self._sum(var, terms)

    def _sum(self, var: Var, terms: list) -> Var:
        if len(terms) > 2:
            terms = self._merge(var, terms)
        total = terms[0]
        for t in terms[1:]:
            s = Var(var.aval)
            self.eqns.append(Eqn("add", [total, t], [s], {}, None))
            total = s
        return total

    def _merge(self, var: Var, terms: list) -> list:
        made = [t for t in terms if t.id in self.matmuls]
        if len(made) < 3 or len({id(t) for t in made}) < len(made):
            return terms
        mms = [self.matmuls.pop(t.id) for t in made]
        self.merged.update(id(m) for m in mms)
        source = mms[0].source
        lhs = [m.inputs[0] for m in mms]
        flips = [self.transposes.get(x.id) for x in lhs]
        if all(f is not None for f in flips):   # [x_1^T .. x_n^T] = [x_1; ..; x_n]^T
            self.merged.update(id(f) for f in flips)
            stacked = self._concat([f.inputs[0] for f in flips], 0, source)
            cat_l = Var(Aval(stacked.aval.shape[::-1], stacked.aval.dtype))
            self.eqns.append(Eqn("transpose", [stacked], [cat_l], {"perm": (1, 0)}, source))
        else:
            cat_l = self._concat(lhs, 1, source)
        cat_r = self._concat([m.inputs[1] for m in mms], 0, source)
        out = Var(var.aval)
        self.eqns.append(Eqn("matmul", [cat_l, cat_r], [out], {}, source))
        merged = {t.id for t in made}
        return [out] + [t for t in terms if t.id not in merged]

    def _concat(self, xs: list, axis: int, source: str | None) -> Var:
        key = (axis, *[id(x) for x in xs])
        out = self.concats.get(key)
        if out is None:
            a = xs[0].aval
            shape = list(a.shape)
            shape[axis] = sum(x.aval.shape[axis] for x in xs)
            out = self.concats[key] = Var(Aval(tuple(shape), a.dtype))
            self.eqns.append(Eqn("concatenate", list(xs), [out], {"axis": axis}, source))
        return out

    def finish(self, outs: list) -> list:
        """The equations, without those a merge made unneeded (unless something else still
        reads them)."""
        merged = self.merged
        if not merged:
            return self.eqns
        read = {a.id for e in self.eqns if id(e) not in merged for a in e.inputs
                if type(a) is not Lit}
        read.update(a.id for a in outs if type(a) is not Lit)
        kept = {id(e) for e in self.eqns if id(e) in merged and e.outvars[0].id in read}
        while kept:     # what a kept equation reads is kept too
            more = {a.id for e in self.eqns if id(e) in kept for a in e.inputs
                    if type(a) is not Lit}
            merged = merged - kept
            kept = {id(e) for e in self.eqns if id(e) in merged and e.outvars[0].id in more}
        return [e for e in self.eqns if id(e) not in merged]

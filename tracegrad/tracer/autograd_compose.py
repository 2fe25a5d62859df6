"""Forward + backward of a recorded Tensor graph as a Plan: numpy steps over numbered slots,
assembled from per-op recipes without making any IR.

A recorded op's equations come from a template (see tensor_record.record). Each template gets
a forward recipe once — its equations as numpy steps over local numbers (its inputs, its
constants, the values it makes) — and a backward recipe per (which inputs need gradients,
which outputs have cotangents), from its reverse pass emitted once. A graph seen for the first
time — an RNN at a new sequence length — is assembled by renumbering those steps into slots,
so it costs a few microseconds per equation; its IR is built only if it gets hot enough to be
compiled (`Plan.graph`)."""
from __future__ import annotations

import bisect
import importlib
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from .. import ir
from ..ir.builder import Traced
from ..ir.core import Aval, Eqn, Lit, Var, is_float
from ..ir.ops import OPS
from ..ir.rules import VJP
from .autograd_graph import instantiate

_interp = importlib.import_module("tracegrad.ir.interpret")    # (ir.interpret: a function)
_step_fn = _interp._step_fn     # the numpy function ir.Program runs for an equation
_flip = _interp._flip           # a 2-d transpose
_dot, _ndot = _interp._dot, _interp._ndot     # a 2-d matmul, and one of contiguous operands
_errors_off, _errors_back = _interp.errors_off, _interp.errors_back     # (np.errstate, cheaply)

_recipes: dict = {}     # template sig id -> forward recipe (None: not plannable)
_brecipes: dict = {}    # (template sig id, inputs needing grad, outputs with cts) -> recipe
_synthetic: dict = {}   # (op, input avals, params) -> (step fn, equation describing it)
TEMPLATE_LIMIT = 4096
_CREATE = ("full", "iota")
# whether a step function always returns a new array (any other output is copied when
# returned)
_makes_new = _interp.makes_new


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
    (the forward op it is the backward of, whether it reads no cotangent)) for template
    `tpl`, or None if it captured constants."""
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
    return cts, eqns, atoms, list(zip(ops, pure, strict=True))


# ---- recipes ---------------------------------------------------------------------------------

def _const_of(a: Any, e: Eqn | None = None) -> tuple:
    """(key, value, what to write in IR) of a literal, or of a `full`/`iota` equation."""
    if e is None:
        return ("lit", a.aval.dtype.str, a.value.tobytes()), a.value, a
    v = e.outvars[0]
    val = np.asarray(OPS[e.op].ref(**e.params), v.aval.dtype).reshape(v.aval.shape)
    return ("eqn", id(e)), val, e


def _recipe(eqns: list, local: dict, k: int, consts: list) -> list | None:
    """`eqns` as steps (fn, local inputs, local outputs, arity, equation) over local numbers.
    `local` numbers the values already known (template var id -> number, `k` of them); the
    constants (literals, `full`/`iota` equations) are appended to `consts` and numbered next,
    then what the equations make, in order. None if some equation cannot be a step."""
    lit_no: dict[int, int] = {}
    for e in eqns:
        if e.op == "scan":
            return None
        for a in e.inputs:
            if type(a) is Lit and id(a) not in lit_no:
                lit_no[id(a)] = k + len(consts)
                consts.append(_const_of(a))
        if e.op in _CREATE and not e.inputs:
            local[e.outvars[0].id] = k + len(consts)
            consts.append(_const_of(None, e))
    k += len(consts)
    steps = []
    for e in eqns:
        if e.op in _CREATE and not e.inputs:
            continue
        ins = tuple([lit_no[id(a)] if type(a) is Lit else local[a.id] for a in e.inputs])
        multi = OPS[e.op].multi_out
        outs = []
        for v in e.outvars:
            local[v.id] = k
            outs.append(k)
            k += 1
        steps.append((_step_fn(e, multi), _getter(ins), tuple(outs), -1 if multi else len(ins),
                      e))
    return steps


def _getter(ins: tuple) -> Callable[[list], tuple]:
    """A function picking `ins` out of a list, as a tuple (comprehensions cost a frame)."""
    if len(ins) == 1:
        i = ins[0]
        return lambda loc: (loc[i],)
    if not ins:
        return lambda loc: ()
    return itemgetter(*ins)


class _Forward:
    """A template's equations as steps over local numbers: its inputs, then its constants,
    then the values its equations make."""
    __slots__ = ("n_in", "consts", "steps", "outs", "n_local", "local", "one")

    def __init__(self, tpl: tuple):
        in_ids, teqns, touts = tpl[0], tpl[1], tpl[2]
        self.local = local = {}
        for i, vid in enumerate(in_ids):
            local.setdefault(vid, i)
        self.n_in = len(in_ids)
        self.consts: list = []
        self.steps = _recipe(teqns, local, self.n_in, self.consts)
        # a template output that is one of its inputs was copied (see tensor_record._own_var)
        self.outs = [local[v.id] for v in touts if v is not None] if self.steps is not None \
            else None
        self.n_local = self.n_in + len(self.consts) + sum(len(s[2]) for s in self.steps or ())
        # the commonest recipe — one single-output step over the inputs, no constants — is
        # composed without a loop: (fn, getter, arity, equation)
        self.one = None
        if self.steps is not None and len(self.steps) == 1 and not self.consts:
            fn, ins, outs, arity, te = self.steps[0]
            if arity >= 0 and self.outs == [self.n_in]:
                self.one = (fn, ins, arity, te)


# How the composer treats a reverse-pass step (see _Backward)
PLAIN, SHARED, FLIP, PRODUCT = 0, 1, 2, 3
_ONE = (True,)


class _Backward:
    """A template's reverse pass as steps over the numbers of its forward recipe, extended by
    the cotangents, the reverse pass's constants and the values it makes. Per step (the
    forward op it is the backward of, its kind): PLAIN; SHARED, reading forward values only
    (made once for every node reading the same values); PRODUCT, a 2-d matmul whose result is
    a gradient contribution and nothing else, and FLIP, a shared 2-d transpose read only as
    the left operand of PRODUCTs — the composer defers both, so that a weight's per-step
    contributions `h_t^T @ g_t` can become one matmul of concatenations."""
    __slots__ = ("consts", "steps", "grads", "infos", "flat", "pairs")

    def __init__(self, fwd: _Forward, bt: tuple):
        cts, eqns, atoms, infos = bt
        local = dict(fwd.local)
        k = fwd.n_local
        for c in cts:
            if c is not None:
                local[c.id] = k
                k += 1
        self.consts: list = []
        self.steps = _recipe(eqns, local, k, self.consts)
        self.grads = []
        for g in atoms:
            if type(g) is Lit:
                raise NoTemplate
            self.grads.append(None if g is None else local[g.id])
        grad_ids = [g.id for g in atoms if g is not None]
        reads: dict[int, list] = {}
        for i, e in enumerate(eqns):
            for j, a in enumerate(e.inputs):
                if type(a) is Var:
                    reads.setdefault(a.id, []).append((i, j))
        kinds = [SHARED if p else PLAIN for _, p in infos]
        for i, e in enumerate(eqns):
            out = e.outvars[0].id
            if e.op == "matmul" and kinds[i] == PLAIN and e.inputs[0].aval.ndim == 2 and \
                    e.inputs[1].aval.ndim == 2 and grad_ids.count(out) == 1 and \
                    out not in reads:
                kinds[i] = PRODUCT
        for i, e in enumerate(eqns):
            out = e.outvars[0].id
            if e.op == "transpose" and kinds[i] == SHARED and e.inputs[0].aval.ndim == 2 and \
                    out in reads and out not in grad_ids and \
                    all(kinds[r] == PRODUCT and j == 0 for r, j in reads[out]):
                kinds[i] = FLIP
        # a step reading what this node's forward made is never shared (those values are its
        # own): PLAIN, so the composer does not look for it
        own = set(range(fwd.n_in + len(fwd.consts), fwd.n_local))
        for i, e in enumerate(eqns):
            if kinds[i] == SHARED and any(type(a) is Var and local[a.id] in own
                                          for a in e.inputs):
                kinds[i] = PLAIN
                own.update(local[v.id] for v in e.outvars)
        # (the equations making constants, `full` of zeros say, are not steps: see _recipe)
        self.infos = [(op, kind) for (op, _), kind, e in zip(infos, kinds, eqns, strict=True)
                      if e.inputs or e.op not in _CREATE]
        # per step what the composer reads, in one tuple: (fn, getter, arity, number of
        # outputs, kind, equation, op); and (input, local number) per gradient made
        self.flat = [(fn, ins, arity, len(outs), kind, te, op) for (fn, ins, outs, arity, te),
                     (op, kind) in zip(self.steps or (), self.infos, strict=True)]
        self.pairs = [(i, g) for i, g in enumerate(self.grads) if g is not None]


def _forward_recipe(tpl: tuple) -> _Forward | None:
    fwd = _recipes.get(tpl[4], False)
    if fwd is False:
        if len(_recipes) > TEMPLATE_LIMIT:
            _recipes.clear()
        fwd = _Forward(tpl)
        if fwd.steps is None:
            fwd = None
        _recipes[tpl[4]] = fwd
    return fwd


def _backward_recipe(tpl: tuple, fwd: _Forward, needs: tuple, has_ct: tuple) -> _Backward:
    key = (tpl[4], needs, has_ct)
    bwd = _brecipes.get(key)
    if bwd is None:
        if len(_brecipes) > TEMPLATE_LIMIT:
            _brecipes.clear()
        bt = _backward_template(tpl, needs, has_ct)
        try:
            bwd = _Backward(fwd, bt) if bt is not None else False
        except NoTemplate:
            bwd = False
        if bwd is not False and bwd.steps is None:
            bwd = False
        _brecipes[key] = bwd
    if bwd is False:
        raise NoTemplate
    return bwd


def _synth(op: str, ins: tuple, axis: int | None = None) -> tuple:
    """(step fn, equation) for an op the composer adds itself: `add` of two contributions,
    a 2-d `transpose`, a `matmul`, `concatenate` along `axis` of operands of one type."""
    a = ins[0]
    key = (op, axis, len(ins), a.shape, a.dtype, ins[-1].shape)
    hit = _synthetic.get(key)
    if hit is None:
        params = {"axis": axis} if op == "concatenate" else \
            {"perm": (1, 0)} if op == "transpose" else {}
        if op == "concatenate":     # operands of one type (the general rule is quadratic)
            shape = list(a.shape)
            shape[axis] *= len(ins)
            out = Aval(tuple(shape), a.dtype)
            v = Var(a)      # (one variable read n times: only the types are read)
            e = Eqn(op, [v] * len(ins), [Var(out)], params, None)
        else:
            out = _synth_type(op, ins) or OPS[op].rule(*ins, **params)
            e = Eqn(op, [Var(a) for a in ins], [Var(out)], params, None)
        hit = _synthetic[key] = (_synth_fn(op, ins, out, axis) or _step_fn(e, False), e)
    return hit


def _synth_type(op: str, ins: tuple) -> Aval | None:
    """The rule's result type of a 2-d transpose, or a 2-d matmul of one dtype, made without
    the rule's checks (every new length makes new ones); None for anything else."""
    a, b = ins[0], ins[-1]
    if len(a.shape) != 2 or len(b.shape) != 2 or a.dtype != b.dtype:
        return None
    if op == "transpose":
        return Aval(a.shape[::-1], a.dtype)
    if op == "matmul" and a.shape[1] == b.shape[0] and a.dtype.kind == "f":
        return Aval((a.shape[0], b.shape[1]), a.dtype)
    return None


def _synth_fn(op: str, ins: tuple, out: Aval, axis: int | None) -> Callable | None:
    """The function ir.Program picks for a composer-made equation (interpret._fast_fn), found
    without its general lookup (a new length makes new concatenations: this is their cost).
    None where that lookup is needed."""
    if not out.shape or any(a.dtype != out.dtype for a in (ins[:1] if op == "concatenate"
                                                            else ins)):     # (one type)
        return None
    if op == "concatenate":
        return _interp.concatenation(axis)
    if op == "matmul" and len(ins[0].shape) == 2 and len(ins[1].shape) == 2 and \
            out.dtype.kind == "f" and ins[0].shape[1] != 1:
        return _interp._dot
    if op == "transpose" and len(ins[0].shape) == 2:
        return _flip
    return None


# ---- plans -------------------------------------------------------------------------------

class Plan:
    """Numpy steps over slots computing a composed graph: `plan(args)` runs them as ir.Program
    would run the graph (the same numpy function per equation, so the same bits), and
    `plan.graph()` writes the graph as IR when it is to be compiled."""
    __slots__ = ("init", "steps", "meta", "outs", "n_in", "in_vars", "consts", "_graph",
                 "dots")

    def __call__(self, args: list) -> list:
        env = self.init.copy()
        env[:self.n_in] = args
        steps = self.steps
        if self.dots:   # its _ndots rest on the inputs being contiguous (see _contiguous_dots)
            for a in args:
                if not a.flags.forc:
                    steps = _checked(steps)
                    break
        token = _errors_off()
        try:
            for fn, ins, out, n in steps:
                if n == 2:
                    env[out] = fn(env[ins[0]], env[ins[1]])
                elif n == 1:
                    env[out] = fn(env[ins[0]])
                elif n >= 0:
                    env[out] = fn(*[env[i] for i in ins])
                else:
                    for k, o in zip(out, fn(*[env[i] for i in ins]), strict=True):
                        env[k] = o
        finally:
            _errors_back(token)
        return [env[k] if fresh else np.array(env[k]) for k, fresh in self.outs]

    def graph(self) -> ir.Graph:
        """The plan as an IR graph (made once)."""
        g = self._graph
        if g is None:
            atoms: dict[int, Any] = dict(enumerate(self.in_vars))
            eqns = []
            for k, (_, _, what) in self.consts.items():
                if type(what) is Lit:
                    atoms[k] = what
                else:
                    v = atoms[k] = Var(what.outvars[0].aval)
                    eqns.append(Eqn(what.op, [], [v], what.params, what.source))
            for (_, ins, out, n), (te, src, op) in zip(self.steps, self.meta, strict=True):
                outs = [Var(v.aval) for v in te.outvars]
                for k, v in zip(out if n < 0 else (out,), outs, strict=True):
                    atoms[k] = v
                source = src if op is None else f"{src or '?'} (backward of {op})"
                eqns.append(Eqn(te.op, [atoms[i] for i in ins], outs, te.params, source))
            g = self._graph = ir.Graph(list(self.in_vars), eqns,
                                       [atoms[k] for k, _ in self.outs])
        return g


def compose(order: list, in_vars: list, in_gsrc: list, roots: list) -> tuple[Plan, list]:
    """(plan, wrt): the plan (inputs..., root cotangents...) -> (roots..., gradients of the
    inputs `wrt`), from the nodes `order` (a grad_walk's)."""
    c = _Composer(in_vars, roots)
    locs, out_slots = c.forward(order)
    for t, k in zip(roots, c.ct_slots, strict=True):
        c.terms.setdefault(c.vslot[t._var.id], []).append(k)
    c.backward(order, locs, out_slots)
    wrt = [i for i, g in enumerate(in_gsrc) if g is not None]
    outs = [c.vslot[t._var.id] for t in roots]
    for i in wrt:
        aval = in_vars[i].aval
        g = c.total(i, aval)
        if g is None:
            g = c.const(("zeros", aval), np.zeros(aval.shape, aval.dtype),
                        Eqn("full", [], [Var(aval)], {"shape": aval.shape, "value": 0,
                                                      "dtype": aval.dtype}, None))
        outs.append(g)
    return c.finish(outs), wrt


class _Composer:
    """The steps of one plan, and the gradient contributions not yet summed."""

    def __init__(self, in_vars: list, roots: list) -> None:
        n_in = len(in_vars)
        self.in_vars = list(in_vars) + [Var(t._var.aval) for t in roots]
        self.ct_slots = list(range(n_in, len(self.in_vars)))
        self.n = len(self.in_vars)              # slots so far
        self.vslot: dict[int, int] = {v.id: k for k, v in enumerate(in_vars)}
        self.steps: list = []
        self.meta: list = []        # per step (equation, source, op it is the backward of)
        self.consts: dict[int, tuple] = {}      # slot -> (key, value, what to write in IR)
        self.const_slots: dict[Any, int] = {}   # key -> slot
        self.terms: dict[int, list] = {}        # slot -> contributions (slots, deferred)
        self.shared: dict[tuple, Any] = {}      # (recipe step, input slots) -> output slots
        self.concats: dict[tuple, int] = {}     # (axis, operand slots) -> concatenation
        self.avals: dict[int, Aval] = {}        # slot -> type, of the slots merges make
        self.recipe_consts: dict[int, tuple] = {}   # id(recipe's constants) -> (them, slots)

    def const(self, key: Any, value: Any, what: Any) -> int:
        k = self.const_slots.get(key)
        if k is None:
            k = self.const_slots[key] = self.n
            self.n += 1
            self.consts[k] = (key, value, what)
        return k

    def _consts(self, loc: list, consts: list) -> None:
        """Append the slots of a recipe's constants to `loc` (found once per recipe)."""
        hit = self.recipe_consts.get(id(consts))
        if hit is None:     # (kept with the list, so its id is not reused while we look)
            const_slots = self.const_slots
            slots = []
            for key, value, what in consts:
                k = const_slots.get(key)
                slots.append(k if k is not None else self.const(key, value, what))
            hit = self.recipe_consts[id(consts)] = (consts, slots)
        loc += hit[1]

    def _emit(self, fn: Any, ins: tuple, te: Eqn, source: Any, op: Any = None) -> int:
        out = self.n
        self.n = out + 1
        self.steps.append((fn, ins, out, len(ins)))
        self.meta.append((te, source, op))
        return out

    def forward(self, order: list) -> list:
        """Append the steps of the nodes `order`; returns per node the slot of each of its
        recipe's numbers, and the slot of its output (-1 if it has several). One loop over
        all nodes, its state in locals: per node this is a few list appends, and attribute
        traffic would be a good part of it."""
        vslot, steps, meta, recipes = self.vslot, self.steps, self.meta, _recipes
        locs: list = []
        out_slots: list = []
        k = self.n
        for n in order:
            tpl = n.tpl
            if tpl is None:
                raise NoTemplate
            fwd = recipes.get(tpl[4], False)
            if fwd is False:
                fwd = _forward_recipe(tpl)
            if fwd is None:
                raise NoTemplate
            args = n.args
            if len(args) == 2:
                loc = [vslot[args[0][0].id], vslot[args[1][0].id]]
            elif len(args) == 1:
                loc = [vslot[args[0][0].id]]
            else:
                loc = [vslot[e[0].id] for e in args]
            locs.append(loc)
            one = fwd.one
            if one is not None and len(loc) == fwd.n_in:
                fn, ins, arity, te = one
                steps.append((fn, ins(loc), k, arity))
                meta.append((te, n.src, None))
                loc.append(k)
                vslot[n.out_vars[0].id] = k
                out_slots.append(k)
                k += 1
                continue
            if fwd.consts:
                del loc[fwd.n_in:]
                self.n = k
                self._consts(loc, fwd.consts)
                k = self.n
            src = n.src
            for fn, ins, outs, arity, te in fwd.steps:
                if arity >= 0:
                    steps.append((fn, ins(loc), k, arity))
                    loc.append(k)
                    k += 1
                else:
                    out = tuple(range(k, k + len(outs)))
                    steps.append((fn, ins(loc), out, arity))
                    loc += out
                    k += len(outs)
                meta.append((te, src, None))
            outs = fwd.outs
            if len(outs) == 1:
                vslot[n.out_vars[0].id] = out = loc[outs[0]]
                out_slots.append(out)
            else:
                for v, i in zip(n.out_vars, outs, strict=True):
                    vslot[v.id] = loc[i]
                out_slots.append(-1)
        self.n = k
        return locs, out_slots

    def backward(self, order: list, locs: list, out_slots: list) -> None:
        """Append the reverse pass of the nodes `order` (last first; `locs` and `out_slots`
        as `forward` returned them): a node's outputs' gradients are complete when it is
        reached. As in `forward`, one loop with its state in locals; `self.n` is written back
        around the calls that emit steps themselves."""
        vslot, terms, shared = self.vslot, self.terms, self.shared
        steps, meta, brecipes, rconsts = self.steps, self.meta, _brecipes, self.recipe_consts
        k = self.n
        for j in range(len(order) - 1, -1, -1):
            o = out_slots[j]
            if o >= 0:      # one output, in slot o
                t = terms.pop(o, None)
                if t is None:
                    continue
                n, loc = order[j], locs[j]
                x = t[0]
                if len(t) > 1 or type(x) is list:
                    self.n = k
                    loc.append(self._sum(t, n.out_vars[0].aval))
                    k = self.n
                elif type(x) is int:
                    loc.append(x)
                elif type(x[0]) is int:     # a PRODUCT of two slots (as _slot emits it)
                    steps.append((x[2], (x[0], x[1]), k, 2))
                    meta.append((x[3], x[4], x[5]))
                    loc.append(k)
                    k += 1
                else:
                    self.n = k
                    loc.append(self._slot(x))
                    k = self.n
                has_ct = _ONE
            else:
                n, loc = order[j], locs[j]
                self.n = k
                gouts = [self._total_slot(vslot[v.id], v.aval) for v in n.out_vars]
                k = self.n
                if all(g is None for g in gouts):
                    continue
                has_ct = tuple([g is not None for g in gouts])
                loc += [g for g in gouts if g is not None]
            tpl, args = n.tpl, n.args
            if len(args) == 2:
                needs = (args[0][1] is not None, args[1][1] is not None)
            elif len(args) == 1:
                needs = (args[0][1] is not None,)
            else:
                needs = tuple([e[1] is not None for e in args])
            bwd = brecipes.get((tpl[4], needs, has_ct))
            if not bwd:
                bwd = _backward_recipe(tpl, _recipes.get(tpl[4]) or _forward_recipe(tpl),
                                       needs, has_ct)
            consts = bwd.consts
            if consts:
                hit = rconsts.get(id(consts))
                if hit is not None:
                    loc += hit[1]
                else:
                    self.n = k
                    self._consts(loc, consts)
                    k = self.n
            src = n.src
            for fn, ins, arity, n_outs, kind, te, op in bwd.flat:
                ins = ins(loc)
                if kind:
                    if kind == PRODUCT:     # left operand: a slot or a FLIP
                        loc.append((ins[0], ins[1], fn, te, src, op))
                        continue
                    key = (id(te), ins)
                    made = shared.get(key)
                    if made is not None:
                        if arity >= 0:
                            loc.append(made)
                        else:
                            loc += made
                        continue
                    if kind == FLIP:
                        made = shared[key] = [ins[0], fn, te, src, op, None]
                        loc.append(made)
                        continue
                if arity >= 0:
                    out = k
                    k += 1
                    loc.append(out)
                else:
                    out = tuple(range(k, k + n_outs))
                    k += n_outs
                    loc += out
                steps.append((fn, ins, out, arity))
                meta.append((te, src, op))
                if kind:
                    shared[key] = out
            # gradients of the inputs needing them (the recipe has no others); an input's
            # slot is its first number in `loc`
            for i, g in bwd.pairs:
                s = loc[i]
                t = terms.get(s)
                if t is None:
                    terms[s] = [loc[g]]
                else:
                    t.append(loc[g])
        self.n = k

    def _slot(self, x: Any) -> int:
        """The slot of a contribution, emitting it if it was deferred (a PRODUCT or FLIP)."""
        if type(x) is int:
            return x
        if type(x) is list:     # FLIP: [input, fn, equation, source, op, slot or None]
            if x[5] is None:
                x[5] = self._emit(x[1], (x[0],), x[2], x[3], x[4])
            return x[5]
        lhs, rhs, fn, te, src, op = x
        return self._emit(fn, (self._slot(lhs), rhs), te, src, op)

    def total(self, i: int, aval: Aval) -> int | None:
        """The slot of the summed gradient of input `i`, or None if nothing contributed."""
        return self._total_slot(i, aval)

    def _total_slot(self, k: int, aval: Aval) -> int | None:
        t = self.terms.pop(k, None)
        return None if t is None else self._sum(t, aval)

    def _sum(self, terms: list, aval: Aval) -> int:
        """Sum contributions (each of `aval`). Three or more made by 2-d matmuls — a weight
        used at every step of a loop gets `h_t^T @ g_t` per step — are summed as one matmul
        of the concatenated operands."""
        if len(terms) == 1:
            return self._slot(terms[0])
        products = [t for t in terms if type(t) is tuple]
        if len(products) >= 3:      # merged per operand types (batches may differ in size)
            te = products[0][3]
            if all(t[3] is te for t in products):   # one recipe step: one type
                terms = [self._merge(products)] + [t for t in terms if type(t) is not tuple]
            else:
                # recipe step -> the group of its operand types (found once per step: few)
                groups: dict[int, list] = {}
                alike: dict[tuple, list] = {}
                for t in products:
                    group = groups.get(id(t[3]))
                    if group is None:
                        te = t[3]
                        ty = (te.inputs[0].aval, te.inputs[1].aval)
                        group = alike.get(ty)
                        if group is None:
                            group = alike[ty] = []
                        groups[id(te)] = group
                    group.append(t)
                merged = [self._merge(group) for group in alike.values() if len(group) >= 3]
                terms = merged + [t for t in terms if type(t) is not tuple or
                                  len(groups[id(t[3])]) < 3]
        total = self._slot(terms[0])
        fn, te = _synth("add", (aval, aval))
        for t in terms[1:]:
            total = self._emit(fn, (total, self._slot(t)), te, None)
        return total

    def _merge(self, products: list) -> int:
        _, _, _, te0, source, op = products[0]
        a_l, a_r = te0.inputs[0].aval, te0.inputs[1].aval
        lhs = [p[0] for p in products]
        if all(type(x) is list for x in lhs):   # [x_1^T .. x_n^T] = [x_1; ..; x_n]^T
            stacked = self._concat([x[0] for x in lhs], 0, a_l.shape[::-1], a_l.dtype,
                                   source, op)
            fn, te = _synth("transpose", (self.avals[stacked],))
            cat_l = self._emit(fn, (stacked,), te, source, op)
            self.avals[cat_l] = te.outvars[0].aval
        else:
            cat_l = self._concat([self._slot(x) for x in lhs], 1, a_l.shape, a_l.dtype, source,
                                 op)
        cat_r = self._concat([p[1] for p in products], 0, a_r.shape, a_r.dtype, source, op)
        fn, te = _synth("matmul", (self.avals[cat_l], self.avals[cat_r]))
        return self._emit(fn, (cat_l, cat_r), te, source, op)

    def _concat(self, xs: list, axis: int, shape: tuple, dtype: Any, source: str | None,
                op: str | None) -> int:
        """Concatenate slots `xs`, each of `shape`, along `axis`."""
        key = (axis, *xs)
        out = self.concats.get(key)
        if out is None:
            shape = tuple(shape)    # (_synth's key, looked up before making the operand types)
            hit = _synthetic.get(("concatenate", axis, len(xs), shape, dtype, shape))
            fn, te = hit or _synth("concatenate", (Aval(shape, dtype),) * len(xs), axis)
            out = self.concats[key] = self._emit(fn, tuple(xs), te, source, op)
            self.avals[out] = te.outvars[0].aval
        return out

    def finish(self, outs: list) -> Plan:
        steps = _interp.in_place(self.steps, outs)
        fresh = {k for k in outs if _fresh(steps, k)}
        init = [None] * self.n
        for k, c in self.consts.items():
            init[k] = c[1]
        p = Plan()
        p.init = init
        p.steps = steps
        p.meta = self.meta
        p.n_in = len(self.in_vars)
        p.in_vars = self.in_vars
        p.consts = self.consts
        p._graph = None
        p.outs = [(k, k in fresh and outs.index(k) == j) for j, k in enumerate(outs)]
        p.dots = _contiguous_dots(steps, p.n_in, init)
        return p


def _contiguous_dots(steps: list, n_in: int, init: list) -> bool:
    """Make `_ndot` (np.ndarray.dot, without _dot's frame and its two looks at the operands'
    flags: the same BLAS call) every `_dot` of `steps` whose operands are contiguous when the
    plan's inputs are (interpret.contiguity); whether there are any. Plan templates copy the
    steps' functions, so the plans they write have the same ones."""
    known = _interp._known(len(init), range(n_in), [(k, v) for k, v in enumerate(init)
                                                     if v is not None])
    dots, _ = _interp.contiguity(steps, known)
    for j in dots:
        fn, ins, out, n = steps[j]
        steps[j] = (_ndot, ins, out, n)
    return bool(dots)


def _checked(steps: list) -> list:
    """`steps` with `_dot`'s checks back, for inputs not all contiguous (np.ndarray.dot of
    others may not make the BLAS call np.matmul makes)."""
    return [(_dot, *s[1:]) if s[0] is _ndot else s for s in steps]


def _first_out(step: tuple) -> int:
    out = step[2]
    return out if type(out) is int else out[0]


def _fresh(steps: list, k: int) -> bool:
    """Whether slot `k` is made by a step whose function returns a new array. Steps take
    their output slots in order, so the step making `k` is found by bisection."""
    i = bisect.bisect_left(steps, k, key=_first_out)
    if i == len(steps):
        return False
    fn, _, out, n = steps[i]
    return out == k and n >= 0 and _makes_new(fn)


def compose_graph(order: list, in_vars: list, in_gsrc: list, roots: list) -> tuple:
    """(graph, wrt) as `compose`, differentiated as one IR graph by ir.backward_pass (for
    nodes without templates)."""
    b = ir.Builder("backward")
    ins = [b.new_input(v.aval) for v in in_vars]
    cts = [b.new_input(t._var.aval) for t in roots]
    fwd = ir.Graph(in_vars, [e for n in order for e in n.eqns], [t._var for t in roots])
    wrt = [i for i, g in enumerate(in_gsrc) if g is not None]
    outs, grads = ir.backward_pass(b, fwd, ins, cts, wrt)
    return b.build(outs + grads), wrt


__all__ = ["NoTemplate", "Plan", "compose", "compose_graph", "instantiate", "vjp_walk"]

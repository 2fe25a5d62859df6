"""scan's reverse mode: the forward scan keeps the residuals the backward step reads, stacked,
and one scan in the other direction runs the backward step over them.

A body is split for reverse mode once (`_Linear`, shared by every length); what is built per
trace is O(1) in the length: the scan being differentiated upgraded to output its residuals,
the backward scan, and a constant's gradient that is a sum over steps of matmuls as one matmul
of the stacked operands."""
from __future__ import annotations

import collections
from typing import Any, Sequence

from . import emit as E
from .builder import Builder, Traced
from .core import Atom, Eqn, Graph, Var, is_float, remember
from .fission import aval, fission
from .ops import OPS
from .passes import dce


def _uses(order: Sequence[Eqn], outvars: Sequence[Atom]) -> dict[int, int]:
    """How many times each variable is read (by an equation or as an output)."""
    uses = collections.Counter([a.id for e in order for a in e.inputs if type(a) is Var])
    uses.update([a.id for a in outvars if type(a) is Var])
    return uses



class _Linear:
    """A scan body split for reverse mode. `fwd` is the body with residual outputs appended
    (the values the backward step reads), `bwd` the backward step, run in reverse order:
    (invariants, carry cotangents, per step: residuals, output cotangents) ->
    (carry cotangents, per step: constant gradient terms, input gradients), where `outs` says
    of each per-step result whether the scan outputs it or it is one of the step's inputs.
    `pre` computes the loop invariants the backward step reads (`W.T`) once, from the
    constants."""
    __slots__ = ("body", "fwd", "bwd", "pre", "res", "inv", "terms", "x_grads", "outs",
                 "step_read")

    def __init__(self, body: Graph, n_consts: int, n_carry: int, need: tuple, has_ct: tuple):
        self.body = body     # kept alive: the cache is keyed by its id
        C, K = n_consts, n_carry
        lb = Builder("scan-vjp")
        args = [lb.new_input(v.aval) for v in body.invars]
        cts = [lb.new_input(v.aval) if has_ct[i] else None for i, v in enumerate(body.outvars)]
        wrt = [i for i, v in enumerate(body.invars) if need[i]]
        outs, grads = _backward_pass(lb, body, args, cts, wrt)
        lin = lb.build(outs + grads)
        n_in = len(body.invars)
        arg_vars = lin.invars[:n_in]
        ct_vars = lin.invars[n_in:]
        # classify: 0 invariant (constants only), 1 primal (per step), 2 backward (cotangents)
        cat: dict[int, int] = {v.id: 0 for v in arg_vars[:C]}
        cat.update({v.id: 1 for v in arg_vars[C:]})
        cat.update({v.id: 2 for v in ct_vars})
        cat.update({v.id: 0 for v in lin.constvars})
        producer: dict[int, Eqn] = {}
        for e in lin.eqns:
            c = max([cat[a.id] for a in e.inputs if type(a) is Var], default=0)
            for v in e.outvars:
                cat[v.id] = c
                producer[v.id] = e
        n_out = len(outs)
        primal_outs = lin.outvars[:n_out]
        grad_outs = dict(zip(wrt, lin.outvars[n_out:]))
        # the backward step's results: carry cotangents, constant terms, input gradients
        uses = _uses(lin.eqns, lin.outvars)
        bwd_outs: list[Atom] = [grad_outs[i] for i in range(C, C + K) if need[i]]
        # per const needing a gradient: (its index, "sum" or which matmul operands are flipped)
        self.terms: list[tuple[int, Any]] = []
        for i in range(C):
            if not need[i]:
                continue
            g = grad_outs[i]
            e = producer.get(g.id) if type(g) is Var else None
            if e is not None and e.op == "matmul" and uses.get(g.id) == 1 and \
                    all(a.aval.ndim == 2 for a in e.inputs):
                # sum over steps of a_t @ b_t: one matmul after the loop, of the a_t side by
                # side and the b_t stacked; an operand made by transposing v_t is stacked as
                # v_t and transposed once
                flipped = []
                for a in e.inputs:
                    t = producer.get(a.id) if type(a) is Var else None
                    flip = t is not None and t.op == "transpose" and \
                        tuple(t.params["perm"]) == (1, 0) and uses.get(a.id) == 1
                    bwd_outs.append(t.inputs[0] if flip else a)
                    flipped.append(flip)
                self.terms.append((i, tuple(flipped)))
            else:
                bwd_outs.append(g)
                self.terms.append((i, "sum"))
        self.x_grads = [i - C - K for i in range(C + K, n_in) if need[i]]
        bwd_outs += [grad_outs[i] for i in range(C + K, n_in) if need[i]]
        # what the backward equations read from the forward: invariants and residuals
        bwd_eqns = _needed([e for e in lin.eqns if cat[e.outvars[0].id] == 2], bwd_outs)
        reads: dict[int, Atom] = {}
        for e in bwd_eqns:
            for a in e.inputs:
                if type(a) is Var and cat[a.id] < 2:
                    reads.setdefault(a.id, a)
        for a in bwd_outs:
            if type(a) is Var and cat[a.id] < 2:
                reads.setdefault(a.id, a)
        inv = [a for a in reads.values() if cat[a.id] == 0]
        res = [a for a in reads.values() if cat[a.id] == 1]
        # invariants: constants of the body are read directly, others computed by `pre`
        self.inv = [("const", arg_vars.index(a)) if a in arg_vars[:C] else ("pre", a)
                    for a in inv]
        pre_outs = [a for kind, a in self.inv if kind == "pre"]
        self.pre = _subgraph(lin, [e for e in lin.eqns if cat[e.outvars[0].id] == 0],
                             arg_vars[:C], pre_outs)
        self.inv = [(kind, pre_outs.index(a) if kind == "pre" else a) for kind, a in self.inv]
        # residuals: per-step inputs are read from the scan's inputs, others are fwd outputs
        x_pos = {v.id: q for q, v in enumerate(arg_vars[C + K:])}
        fwd_extra = [a for a in res if a.id not in x_pos]
        self.res = [("x", x_pos[a.id]) if a.id in x_pos else ("out", fwd_extra.index(a))
                    for a in res]
        self.fwd = _subgraph(lin, [e for e in lin.eqns if cat[e.outvars[0].id] < 2],
                             arg_vars, list(primal_outs) + fwd_extra)
        # ct_vars holds only the cotangents that exist; split them by position
        ct_iter = iter(ct_vars)
        ct_carry, ct_ys = [], []
        for i in range(len(body.outvars)):
            if has_ct[i]:
                (ct_carry if i < K else ct_ys).append(next(ct_iter))
        # a per-step result that is a per-step input of the backward step (a residual that is
        # a matmul operand) is read from the stacked input itself: not an output of the scan
        n_kc = sum(1 for i in range(C, C + K) if need[i])
        step_in = {v.id: q for q, v in enumerate(res + ct_ys)}
        self.outs: list[tuple[str, int]] = []     # per backward result after the carries
        outs_kept = bwd_outs[:n_kc]
        at: dict[int, int] = {}
        for a in bwd_outs[n_kc:]:
            q = step_in.get(a.id) if type(a) is Var else None
            if q is not None:
                self.outs.append(("in", q))
            elif type(a) is Var and a.id in at:      # one output, however often it is read
                self.outs.append(("out", at[a.id]))
            else:
                if type(a) is Var:
                    at[a.id] = len(outs_kept) - n_kc
                self.outs.append(("out", len(outs_kept) - n_kc))
                outs_kept.append(a)
        kept = _needed(bwd_eqns, outs_kept)
        read = {a.id for e in kept for a in e.inputs if type(a) is Var}
        read.update(a.id for a in outs_kept if type(a) is Var)
        self.step_read = [v.id in read for v in res + ct_ys]   # the others only pass through
        self.bwd = _subgraph(lin, kept, inv + ct_carry + [v for v, r in zip(
            res + ct_ys, self.step_read) if r], outs_kept, inputs_only=True)


def _needed(eqns: list[Eqn], outs: Sequence[Atom]) -> list[Eqn]:
    """The equations of `eqns` that `outs` need."""
    return dce(Graph([], eqns, list(outs))).eqns


def _subgraph(lin: Graph, eqns: list[Eqn], invars: list, outvars: list,
              inputs_only: bool = False) -> Graph:
    """The graph of the `eqns` of `lin` that `outvars` need, reading `invars` (and, unless
    `inputs_only`, `lin`'s constants)."""
    kept = _needed(eqns, outvars)
    read = {a.id for e in kept for a in e.inputs if type(a) is Var}
    read.update(a.id for a in outvars if type(a) is Var)
    pairs = [(v, c) for v, c in zip(lin.constvars, lin.consts)
             if v.id in read and v not in invars]
    if inputs_only and pairs:
        raise AssertionError("scan backward reads a constant it does not take")
    return Graph(list(invars), kept, list(outvars), [v for v, _ in pairs],
                 [c for _, c in pairs])


def _backward_pass(*args):
    from .autodiff import backward_pass    # autodiff's rule table holds scan's VJP
    return backward_pass(*args)


_LINEAR: dict[Any, _Linear] = {}


def scan_vjp(gs: list, *ins: Traced, out: list, body: Graph, length: int, n_consts: int,
             n_carry: int, reverse: bool = False, need: tuple | None = None) -> tuple:
    """The gradients of a scan's inputs: the forward scan keeps the residuals the backward
    step needs, stacked (the scan being differentiated is upgraded in place when it is in the
    same graph), then one scan in the other direction runs the backward step over them. A
    constant's gradient that is a sum over steps of matmuls is one matmul of the stacked
    operands laid side by side."""
    C, K, T = n_consts, n_carry, length
    n_y = len(body.outvars) - K
    if need is None:
        need = tuple(is_float(t.dtype) for t in ins)
    b = ins[0].builder if ins else out[0].builder
    need_body = tuple([need[i] for i in range(C)]
                      + [is_float(v.aval.dtype) for v in body.invars[C:C + K]]
                      + [need[i] and is_float(v.aval.dtype)
                         for i, v in enumerate(body.invars[C + K:], C + K)])
    ys_ct_pos = [q for q in range(n_y) if is_float(body.outvars[K + q].aval.dtype)
                 and gs[K + q] is not None]
    has_ct = tuple([is_float(v.aval.dtype) for v in body.outvars[:K]]
                   + [q in ys_ct_pos for q in range(n_y)])
    key = (id(body), C, K, need_body, has_ct)
    lin = _LINEAR.get(key)
    if lin is None or lin.body is not body:
        lin = remember(_LINEAR, key, _Linear(body, C, K, need_body, has_ct), 512)
    consts, xs = ins[:C], ins[C + K:]
    res_outs = _forward_with_residuals(b, lin, ins, out, body, T, C, K, reverse)
    # loop invariants of the backward step
    pre_vals = b.inline(lin.pre, consts) if lin.pre.eqns or lin.pre.outvars else []
    inv = [consts[a] if kind == "const" else pre_vals[a] for kind, a in lin.inv]
    ct_carry = [gs[i] if gs[i] is not None else E.zeros_like(out[i])
                for i in range(K) if is_float(body.outvars[i].aval.dtype)]
    step_ins = [xs[q] if kind == "x" else res_outs[q] for kind, q in lin.res]
    step_ins += [gs[K + q] for q in ys_ct_pos]
    atoms = [b.atom(v) for v in inv + ct_carry + [v for v, r in zip(step_ins, lin.step_read)
                                                  if r]]
    params = {"body": lin.bwd, "length": T, "n_consts": len(inv), "n_carry": len(ct_carry)}
    if not reverse:
        params["reverse"] = True
    res = _emit_scan(b, atoms, params)
    n_kc = len(ct_carry)
    carry_grads = res[:n_kc]
    per_step = [step_ins[q] if kind == "in" else res[n_kc + q] for kind, q in lin.outs]
    grads: list[Any] = [None] * len(ins)
    k = 0
    for i in range(C, C + K):
        if is_float(body.invars[i].aval.dtype):
            if need[i]:
                grads[i] = carry_grads[k]
            k += 1
    col = 0
    for i, how in lin.terms:
        if how != "sum":
            lhs_t, rhs_t = how
            lhs, rhs = per_step[col], per_step[col + 1]
            # sum_t a_t @ b_t = [a_0 a_1 ...] @ [b_0; b_1; ...]
            lhs = _flip(b, _rows(b, lhs)) if lhs_t else _cols(b, lhs)
            rhs = _flip(b, _cols(b, rhs)) if rhs_t else _rows(b, rhs)
            grads[i] = _put(b, "matmul", [lhs, rhs], {},
                            (lhs.aval.shape[0], rhs.aval.shape[1]))
            col += 2
        else:
            grads[i] = _put(b, "reduce_sum", per_step[col], _AXES0,
                            per_step[col].aval.shape[1:])
            col += 1
    for q in lin.x_grads:
        if need[C + K + q]:
            grads[C + K + q] = per_step[col]
        col += 1
    return tuple(grads)


_FLIP, _AXES0, _SWAP01 = {"perm": (1, 0)}, {"axes": (0,)}, {"perm": (1, 0, 2)}


def _put(b: Builder, op: str, x: Any, params: dict, shape: tuple | None = None) -> Traced:
    """Record `op` on `x` (one value or a list), of type `shape` and the inputs' dtype when
    given (the result's shape follows from the inputs' here), else typed by its rule: the
    scan's VJP makes a few such equations per trace, each with a new length in its type."""
    ins = [b.atom(t) for t in (x if type(x) is list else [x])]
    dt = ins[0].aval.dtype
    if shape is None or any(a.aval.dtype != dt for a in ins):
        out_aval = OPS[op].rule(*[a.aval for a in ins], **params)
    else:
        out_aval = aval(shape, dt)
    v = Var(out_aval)
    b.eqns.append(Eqn(op, ins, [v], params, b.source_override))
    return Traced(b, v)


def _flip(b: Builder, x: Traced) -> Traced:
    """The transpose of 2-d `x`."""
    r, c = x.aval.shape
    return _put(b, "transpose", x, _FLIP, (c, r))


def _rows(b: Builder, stacked: Traced) -> Traced:
    """The 2-d steps of `stacked` (T, r, c) one under the other: (T r, c)."""
    t, r, c = stacked.aval.shape
    return _put(b, "reshape", stacked, {"shape": (t * r, c)}, (t * r, c))


def _cols(b: Builder, stacked: Traced) -> Traced:
    """The 2-d steps of `stacked` (T, r, c) side by side: (r, T c)."""
    t, r, c = stacked.aval.shape
    if r != 1:
        stacked = _put(b, "transpose", stacked, _SWAP01, (r, t, c))
    return _put(b, "reshape", stacked, {"shape": (r, t * c)}, (r, t * c))


def _emit_scan(b: Builder, atoms: list, params: dict) -> list[Traced]:
    """Record a scan built here (its types hold by construction: no rule check)."""
    body, K, T = params["body"], params["n_carry"], params["length"]
    avals = body.out_avals
    outs = [Var(a) for a in avals[:K]] + [Var(aval((T,) + a.shape, a.dtype))
                                          for a in avals[K:]]
    e = Eqn("scan", atoms, outs, params, b.source_override)
    b.eqns += fission(e) or [e]
    return [Traced(b, v) for v in outs]


def _forward_with_residuals(b: Builder, lin: _Linear, ins: Sequence[Traced], out: list,
                            body: Graph, T: int, C: int, K: int, reverse: bool
                            ) -> list[Traced]:
    """The stacked residual outputs of `lin.fwd`. The scan equation that made `out` is
    upgraded to run `lin.fwd` when it is in `b`; otherwise a forward scan runs again."""
    n_extra = len(lin.fwd.outvars) - len(body.outvars)
    if n_extra == 0:
        return []
    eqn = _producer(b, out)
    if eqn is None or eqn.params["body"] is not body:
        atoms = [b.atom(v) for v in ins]
        params = {"body": lin.fwd, "length": T, "n_consts": C, "n_carry": K}
        if reverse:
            params["reverse"] = True
        return _emit_scan(b, atoms, params)[len(body.outvars):]
    extra = [Var(aval((T,) + v.aval.shape, v.aval.dtype))
             for v in lin.fwd.outvars[len(body.outvars):]]
    eqn.outvars = eqn.outvars + extra
    eqn.params = {**eqn.params, "body": lin.fwd}
    split = fission(eqn)
    if split is not None:    # the residuals no carry needs are made after the loop
        at = next(i for i in range(len(b.eqns) - 1, -1, -1) if b.eqns[i] is eqn)
        b.eqns[at:at + 1] = split
    return [Traced(b, v) for v in extra]


def _producer(b: Builder, out: list) -> Eqn | None:
    first = next((t.atom for t in out if type(t) is Traced and t.builder is b), None)
    if type(first) is not Var or first is not out[0].atom:
        return None
    for e in reversed(b.eqns):
        if e.outvars[0] is first:
            return e if e.op == "scan" and len(e.outvars) == len(out) else None
    return None

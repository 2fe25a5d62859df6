"""The scan primitive beyond its definition: unrolling, forward mode, and its bodies' passes.

`scan[body, length, n_consts, n_carry, reverse](consts, carry, xs) -> (carry, ys)` runs
`body: (consts, carry, x_t) -> (carry, y_t)` `length` times; each x and y is stacked along a
leading axis of size `length` (see `ops._scan`). Bodies are shared by the equations (and the
traces) of one loop, so the work done per body here is remembered by the body's identity,
the body kept alive next to the result so its id stays its own.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import emit as E
from .builder import Builder, Traced, bind
from .core import Eqn, Graph, Var, is_float, remember
from .fission import fission
from .unroll import has_scan, split_inputs, unroll_scans


# ---- forward mode ------------------------------------------------------------------------------

# (id(body), n_consts, n_carry, tangent masks) -> (body, the JVP body, its layout)
_JVP_BODIES: dict[Any, tuple[Graph, Graph, Any]] = {}


def _carried_tangents(body: Graph, n_consts: int, n_carry: int, const_mask: tuple,
                      carry_mask: tuple, x_mask: tuple) -> tuple[tuple, tuple]:
    """Which carries have a tangent at some iteration (a carry whose initial tangent is zero
    gets one when an input with a tangent reaches it), and which ys have one."""
    from .autodiff import _reaching
    k = n_carry
    while True:
        wrt = [i for i, m in enumerate(const_mask + carry_mask + x_mask) if m]
        live = _reaching(body, wrt)
        outs = tuple(type(a) is Var and a.id in live and is_float(a.aval.dtype)
                     for a in body.outvars)
        grown = tuple(a or b for a, b in zip(carry_mask, outs[:k]))
        if grown == carry_mask:
            return carry_mask, outs[k:]
        carry_mask = grown


def _jvp_body(body: Graph, n_consts: int, n_carry: int, const_mask: tuple,
              carry_in_mask: tuple, x_mask: tuple) -> tuple[Graph, tuple, tuple]:
    """The body J of the tangent scan, with its (carry mask, y mask):
    (consts, dconsts, carry, dcarry, x, dx) -> (carry', dcarry', dy); the d* hold the
    positions of the masks. Primal ys are not outputs: the original scan computes them."""
    key = (id(body), n_consts, n_carry, const_mask, carry_in_mask, x_mask)
    hit = _JVP_BODIES.get(key)
    if hit is not None and hit[0] is body:
        return hit[1], *hit[2]
    from .autodiff import forward_pass
    from .passes import optimize
    carry_mask, y_mask = _carried_tangents(body, n_consts, n_carry, const_mask,
                                           carry_in_mask, x_mask)
    jb = Builder("scan-jvp")
    avals = body.in_avals
    sections = [(avals[:n_consts], const_mask), (avals[n_consts:n_consts + n_carry], carry_mask),
                (avals[n_consts + n_carry:], x_mask)]
    args: list[Traced] = []
    tans: list[Traced | None] = []
    for section, mask in sections:
        primal = [jb.new_input(a) for a in section]
        tangent = {i: jb.new_input(a) for i, (a, m) in enumerate(zip(section, mask)) if m}
        args += primal
        tans += [tangent.get(i) for i in range(len(section))]
    outs, touts = forward_pass(jb, body, args, tans)
    with jb.active():
        dcarry = [touts[i] if touts[i] is not None else E.zeros_like(outs[i])
                  for i, m in enumerate(carry_mask) if m]
        dys = [touts[n_carry + j] if touts[n_carry + j] is not None
               else E.zeros_like(outs[n_carry + j]) for j, m in enumerate(y_mask) if m]
    jvp = optimize(jb.build(outs[:n_carry] + dcarry + dys))
    remember(_JVP_BODIES, key, (body, jvp, (carry_mask, y_mask)), 1024)
    return jvp, carry_mask, y_mask


def scan_jvp(*args: Any, out: list, body: Graph, length: int, n_consts: int,
             n_carry: int, reverse: bool = False) -> list:
    """JVP["scan"]: one scan of the JVP body carrying the tangents beside the primal carry;
    the tangents of stacked xs and ys are stacked like them."""
    n = len(args) // 2
    ts, xs = args[:n], args[n:]
    c, k = n_consts, n_carry
    const_mask = tuple(t is not None for t in ts[:c])
    carry_in_mask = tuple(t is not None for t in ts[c:c + k])
    x_mask = tuple(t is not None for t in ts[c + k:])
    jvp, carry_mask, y_mask = _jvp_body(body, c, k, const_mask, carry_in_mask, x_mask)

    def tangent(t: Any, x: Any) -> Any:
        return t if t is not None else E.full(tuple(x.shape), 0, x.dtype)

    def section(vals: Sequence[Any], tans: Sequence[Any], mask: tuple) -> list:
        return list(vals) + [tangent(t, x) for t, x, m in zip(tans, vals, mask) if m]

    inputs = section(xs[:c], ts[:c], const_mask) + section(xs[c:c + k], ts[c:c + k],
                                                           carry_mask)
    inputs += section(xs[c + k:], ts[c + k:], x_mask)
    n_dc = sum(carry_mask)
    res = bind("scan", *inputs, body=jvp, length=length, n_consts=c + sum(const_mask),
               n_carry=k + n_dc, **({"reverse": True} if reverse else {}))
    dcarry, dys = iter(res[k:k + n_dc]), iter(res[k + n_dc:])
    return [next(dcarry) if m else None for m in carry_mask] + \
        [next(dys) if m else None for m in y_mask]


# ---- optimising bodies -------------------------------------------------------------------------

# id(body) -> (body, the optimised body taking its constants as leading consts, the constants)
_OPTIMIZED: dict[int, tuple[Graph, Graph, list[tuple[Var, np.ndarray]]]] = {}


def optimize_bodies(graph: Graph, optimize: Any) -> Graph:
    """`graph` with each scan's body optimised (by `optimize`, recursively) and the body's
    constants moved out to `graph`'s, read by the scan as leading consts: after `ir.optimize`
    no body holds a constant, so the native backend finds every array among the graph's. The
    work the carry does not need is then moved out of the loop (`fission`)."""
    eqns = []
    constvars, consts = list(graph.constvars), list(graph.consts)
    hoisted: dict[int, Var] = {}     # id(array) -> its constvar in `graph`
    changed = False
    for e in graph.eqns:
        if e.op != "scan":
            eqns.append(e)
            continue
        body = e.params["body"]
        new, lifted = _optimized_body(body, optimize)
        if new is body:
            split = fission(e)
            changed = changed or split is not None
            eqns += split or [e]
            continue
        changed = True
        extra = []
        for v, c in lifted:
            w = hoisted.get(id(c))
            if w is None or w.aval != v.aval:
                w = hoisted[id(c)] = Var(v.aval)
                constvars.append(w)
                consts.append(c)
            extra.append(w)
        params = dict(e.params, body=new, n_consts=e.params["n_consts"] + len(lifted))
        opt = Eqn("scan", extra + list(e.inputs), e.outvars, params, e.source)
        eqns += fission(opt) or [opt]
    if not changed:
        return graph
    return Graph(graph.invars, eqns, list(graph.outvars), constvars, consts)


def _optimized_body(body: Graph, optimize: Any) -> tuple[Graph, list[tuple[Var, np.ndarray]]]:
    hit = _OPTIMIZED.get(id(body))
    if hit is not None and hit[0] is body:
        return hit[1], hit[2]
    opt = optimize(body)
    unchanged = (not body.constvars and len(opt.eqns) == len(body.eqns)
                 and all(a.outvars is b.outvars and a.params is b.params
                         for a, b in zip(opt.eqns, body.eqns))
                 and all(a is b for a, b in zip(opt.outvars, body.outvars)))
    if unchanged:
        new, lifted = body, []
    else:
        # the constvars become the leading inputs: the same Vars, now bound by the scan
        new = Graph(opt.constvars + opt.invars, opt.eqns, opt.outvars)
        lifted = list(zip(opt.constvars, opt.consts))
        remember(_OPTIMIZED, id(new), (new, new, []), 4096)   # optimised: its own fixed point
    remember(_OPTIMIZED, id(body), (body, new, lifted), 4096)
    return new, lifted


__all__ = ["has_scan", "optimize_bodies", "scan_jvp", "split_inputs", "unroll_scans"]

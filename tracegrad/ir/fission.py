"""Loop fission: the work of a scan's body that does not need the carry, done once on the
stacked arrays instead of once per step.

Before the scan go the body's equations that read only constants (`W.T`: computed once) and
those that read only the per-step inputs and constants (`reshape(x_t) @ U`: one matmul of the
stacked xs). After it go the equations no carry needs that only make per-step outputs (the
residual `1 - h_t * h_t` of tanh's derivative: one elementwise op on the stacked h). What is
left is the body proper, interned per body so every length shares it."""
from __future__ import annotations

from typing import Any

from .core import Atom, Aval, Eqn, Graph, Lit, Var, remember
from .ops import OPS

_ELEMENTWISE = {"unary", "binary", "compare", "select"}
_NOT_HOISTED = {"custom_vjp_call", "scan"}     # (a scan on constants only is, as is)

# id(body), n_consts, n_carry -> (body, the plan or None)
_PLANS: dict[Any, tuple[Graph, Any]] = {}
_AVALS: dict[tuple, Aval] = {}


def aval(shape: tuple, dtype: Any) -> Aval:
    """The Aval of `shape` and `dtype`, one object per type: making one costs microseconds
    (several per scan made each trace), and equal avals that are one object compare at once
    in the memo tables they key."""
    key = (shape, dtype)
    a = _AVALS.get(key)
    if a is None:
        a = remember(_AVALS, key, Aval(shape, dtype), 4096)
    return a


def fission(e: Eqn) -> list[Eqn] | None:
    """The equations computing scan equation `e` with its body's carry-free work moved out
    (they define every output of `e`), or None when nothing moves."""
    p = e.params
    body = p["body"]
    key = (id(body), p["n_consts"], p["n_carry"])
    hit = _PLANS.get(key)
    if hit is None or hit[0] is not body:
        hit = remember(_PLANS, key, (body, _plan(body, p["n_consts"], p["n_carry"])), 2048)
    plan = hit[1]
    return None if plan is None else _apply(plan, e)


class _Plan:
    __slots__ = ("new_body", "pre", "post", "consts_in", "xs_in", "ys_out", "n_carry")

    def __init__(self, new_body: Graph, pre: list, post: list, consts_in: list, xs_in: list,
                 ys_out: list, n_carry: int):
        self.new_body = new_body
        self.pre = pre              # [(body eqn, "inv" | "batch")], in order
        self.post = post            # [body eqn], in order
        self.consts_in = consts_in  # body var ids the new body's constants are
        self.xs_in = xs_in          # body var ids the new body's per-step inputs are
        self.ys_out = ys_out        # per y: ("body", k) | ("outer" | "copy", body atom)
        self.n_carry = n_carry


def _plan(body: Graph, C: int, K: int) -> _Plan | None:
    invars = body.invars
    kind: dict[int, str] = {v.id: "I" for v in invars[:C]}       # I: loop invariant outside
    kind.update({v.id: "B" for v in invars[C:C + K]})              # B: only inside the body
    kind.update({v.id: "S" for v in invars[C + K:]})               # S: stacked outside
    kind.update({v.id: "B" for v in body.constvars})
    avals = {v.id: v.aval for v in list(invars) + list(body.constvars)}
    pre: list[tuple[Eqn, str]] = []
    stay: list[Eqn] = []
    for e in body.eqns:
        ks = [kind[a.id] if type(a) is Var else "L" for a in e.inputs]
        for v in e.outvars:
            avals[v.id] = v.aval
        if "B" not in ks and "S" not in ks and e.op != "custom_vjp_call":
            pre.append((e, "inv"))
            kind.update({v.id: "I" for v in e.outvars})
        elif "B" not in ks and e.op not in _NOT_HOISTED and len(e.outvars) == 1 and \
                _batch(e, [_probe(a, k) for a, k in zip(e.inputs, ks)], 2) is not None:
            pre.append((e, "batch"))
            kind[e.outvars[0].id] = "S"
        else:
            stay.append(e)
            kind.update({v.id: "B" for v in e.outvars})
    # after the loop: what no carry needs, read only by such equations or as a per-step output
    outs = body.outvars
    cone = {a.id for a in outs[:K] if type(a) is Var}
    readers: dict[int, list[Eqn]] = {}
    for e in stay:
        for a in e.inputs:
            if type(a) is Var:
                readers.setdefault(a.id, []).append(e)
    y_ids = {a.id for a in outs[K:] if type(a) is Var}
    pinned = {v.id for v in invars[C:C + K]} | {v.id for v in body.constvars}
    moved: set[int] = set()
    for e in reversed(stay):
        if any(v.id in cone for v in e.outvars):
            cone.update(a.id for a in e.inputs if type(a) is Var)
            continue
        v = e.outvars[0]
        rs = readers.get(v.id, [])
        if len(e.outvars) != 1 or e.op in _NOT_HOISTED or (not rs and v.id not in y_ids) or \
                any(id(r) not in moved for r in rs) or \
                any(type(a) is Var and a.id in pinned for a in e.inputs):
            cone.update(a.id for a in e.inputs if type(a) is Var)   # stays: what it reads too
            continue
        ks = ["L" if type(a) is Lit else "I" if kind[a.id] == "I" else "S" for a in e.inputs]
        if _batch(e, [_probe(a, k) for a, k in zip(e.inputs, ks)], 2) is None:
            cone.update(a.id for a in e.inputs if type(a) is Var)
            continue
        moved.add(id(e))
    post = [e for e in stay if id(e) in moved]
    stay = [e for e in stay if id(e) not in moved]
    post_made = {e.outvars[0].id for e in post}
    # per-step outputs: made in the body, or outside (hoisted, moved, a per-step input)
    exports: list[Var] = []
    seen: set[int] = set()
    for e in post:
        for a in e.inputs:
            if type(a) is Var and kind[a.id] == "B" and a.id not in post_made and \
                    a.id not in seen:
                seen.add(a.id)
                exports.append(a)
    ys_out: list[tuple[str, Any]] = []
    body_ys: list[Atom] = []
    for a in outs[K:]:      # made after the loop ("outer"), or before it or a step's input
        if type(a) is Var and a.id in post_made:
            ys_out.append(("outer", a))
        elif type(a) is Var and kind[a.id] == "S":
            ys_out.append(("copy", a))
        else:
            ys_out.append(("body", len(body_ys)))
            body_ys.append(a)
    if not pre and not post and all(w == "body" for w, _ in ys_out):
        return None
    read = {a.id for e in stay for a in e.inputs if type(a) is Var}
    read.update(a.id for a in list(outs[:K]) + body_ys + exports if type(a) is Var)
    consts_in = [v.id for v in invars[:C] if v.id in read] + [v.id for e, m in pre if m == "inv"
                                              for v in e.outvars if v.id in read]
    xs_in = [v.id for v in invars[C + K:] if v.id in read] + \
        [e.outvars[0].id for e, m in pre if m == "batch" and e.outvars[0].id in read]
    var_of = {v.id: v for v in list(invars)}
    var_of.update({v.id: v for e, _ in pre for v in e.outvars})
    new_invars = [var_of[i] for i in consts_in] + list(invars[C:C + K]) + \
        [var_of[i] for i in xs_in]
    new_body = Graph(new_invars, stay, list(outs[:K]) + body_ys + exports,
                     list(body.constvars), list(body.consts))
    return _Plan(new_body, pre, post, consts_in, xs_in, ys_out, K)


def _probe(a: Atom, k: str) -> tuple:
    """An input of a candidate batched equation, stacked over a length of 2, for `_batch`."""
    if k == "L":
        return a, "L"
    return Var(aval((2,) + a.aval.shape, a.aval.dtype) if k == "S" else a.aval), k


def _apply(plan: _Plan, e: Eqn) -> list[Eqn]:
    p = e.params
    C, K, T = p["n_consts"], p["n_carry"], p["length"]
    body = p["body"]
    src = e.source
    env: dict[int, tuple[Atom, str]] = {}
    for v, a in zip(body.invars[:C], e.inputs[:C]):
        env[v.id] = (a, "I")
    for v, a in zip(body.invars[C + K:], e.inputs[C + K:]):
        env[v.id] = (a, "S")
    eqns: list[Eqn] = []
    for be, mode in plan.pre:
        ins = [(a, "L") if type(a) is Lit else env[a.id] for a in be.inputs]
        if mode == "inv":
            outs = [Var(v.aval) for v in be.outvars]
            eqns.append(Eqn(be.op, [a for a, _ in ins], outs, be.params, be.source or src))
            env.update({v.id: (o, "I") for v, o in zip(be.outvars, outs)})
        else:
            env[be.outvars[0].id] = (_batch(be, ins, T, eqns, src), "S")
    new_body = plan.new_body
    n_ys = sum(1 for w, _ in plan.ys_out if w == "body")
    exports = new_body.outvars[K + n_ys:]
    ys_vars = e.outvars[K:]
    body_ys = [v for (w, _), v in zip(plan.ys_out, ys_vars) if w == "body"]
    export_vars = [Var(aval((T,) + a.aval.shape, a.aval.dtype)) for a in exports]
    env.update({a.id: (v, "S") for a, v in zip(exports, export_vars)})
    inputs = [env[i][0] for i in plan.consts_in] + list(e.inputs[C:C + K]) + \
        [env[i][0] for i in plan.xs_in]
    params = dict(p, body=new_body, n_consts=len(plan.consts_in))
    scan_outs = list(e.outvars[:K]) + body_ys + export_vars
    if scan_outs:       # (no carry and every output made outside: the loop has gone)
        eqns.append(Eqn("scan", inputs, scan_outs, params, src))
    # the moved equations; a per-step output made outside is written into the scan's output
    want: dict[int, Var] = {}
    copies: list[tuple[Atom, Var]] = []
    for (w, a), v in zip(plan.ys_out, ys_vars):
        if w == "copy" or (w == "outer" and a.id in want):
            copies.append((a, v))
        elif w == "outer":
            want[a.id] = v
    for be in plan.post:
        ins = [(a, "L") if type(a) is Lit else env[a.id] for a in be.inputs]
        env[be.outvars[0].id] = (_batch(be, ins, T, eqns, src, want.get(be.outvars[0].id)),
                                 "S")
    for a, v in copies:
        eqns.append(Eqn("reshape", [env[a.id][0]], [v], {"shape": v.aval.shape}, src))
    return fold_reshapes(eqns, {v.id for v in e.outvars})


def _batch(e: Eqn, ins: list[tuple[Atom, str]], T: int, eqns: list[Eqn] | None = None,
           source: str | None = None, out: Var | None = None) -> Atom | None:
    """The outer value of body equation `e` at every step, (T, *its shape), computed from
    `ins` (outer atoms: "S" stacked, "I" invariant, "L" literal) by equations appended to
    `eqns`, the last writing `out` when given; None when `e` cannot be batched so (`eqns`
    None: only asking)."""
    op, params = e.op, e.params
    o = e.outvars[0].aval
    whole = aval((T,) + o.shape, o.dtype)
    steps: list[tuple[str, list, dict, Aval]] = []    # (op, inputs, params, result)

    def add(op_: str, args: list, ps: dict, result: Aval) -> Any:
        steps.append((op_, args, ps, result))
        return ("step", len(steps) - 1)

    kinds = [k for _, k in ins]
    atoms = [a for a, _ in ins]
    kind = OPS[op].kind
    if kind in _ELEMENTWISE:
        args: list = []
        for a, k in ins:
            if k == "S" and a.aval.ndim - 1 < o.ndim:     # line its axes up with the output's
                shape = (T,) + (1,) * (o.ndim - a.aval.ndim + 1) + a.aval.shape[1:]
                args.append(add("reshape", [a], {"shape": shape}, aval(shape, a.aval.dtype)))
            elif k == "I" and a.aval.ndim > o.ndim:
                return None
            else:
                args.append(a)
        if "S" not in kinds:
            return None
        add(op, args, params, whole)
    elif op == "matmul":
        if not _matmul(atoms, kinds, T, o, whole, add):
            return None
    elif any(k != "S" for k in kinds):
        return None
    elif op == "reshape":
        add(op, atoms, {"shape": whole.shape}, whole)
    elif op == "transpose":
        add(op, atoms, {"perm": (0,) + tuple(q + 1 for q in params["perm"])}, whole)
    elif op == "slice":
        add(op, atoms, {"index": ((0, T, 1),) + tuple(params["index"])}, whole)
    elif op == "pad_slice":
        add(op, atoms, {"shape": whole.shape, "index": ((0, T, 1),) + tuple(params["index"])},
            whole)
    elif op == "update_slice":
        add(op, atoms, {"index": ((0, T, 1),) + tuple(params["index"])}, whole)
    elif op == "concatenate":
        add(op, atoms, {"axis": params["axis"] + 1}, whole)
    elif op == "broadcast":
        a = atoms[0]
        x = a
        if a.aval.ndim - 1 < o.ndim:
            shape = (T,) + (1,) * (o.ndim - a.aval.ndim + 1) + a.aval.shape[1:]
            x = add("reshape", [a], {"shape": shape}, aval(shape, a.aval.dtype))
        add(op, [x], {"shape": whole.shape}, whole)
    elif kind == "reduce" and "axes" in params:
        add(op, atoms, {"axes": tuple(q + 1 for q in params["axes"])}, whole)
    elif op in ("argmax", "argmin"):
        add(op, atoms, {"axis": params["axis"] + 1}, whole)
    else:
        return None
    if eqns is None:     # asked: check the steps' types once, when the plan is made
        return atoms[0] if _typed(steps) else None
    made: list[Var] = []
    for i, (op_, args, ps, result) in enumerate(steps):
        v = out if (out is not None and i == len(steps) - 1) else Var(result)
        real = [made[x[1]] if type(x) is tuple else x for x in args]
        eqns.append(Eqn(op_, real, [v], ps, e.source or source))
        made.append(v)
    return made[-1]


def _typed(steps: list) -> bool:
    avals: list[Aval] = []
    for op, args, ps, result in steps:
        ins = [avals[x[1]] if type(x) is tuple else x.aval for x in args]
        try:
            got = OPS[op].rule(*ins, **ps)
        except (ValueError, TypeError):
            return False
        if got != result:
            return False
        avals.append(result)
    return True


def _matmul(atoms: list, kinds: list, T: int, o: Aval, whole: Aval, add: Any) -> bool:
    """The steps of a matmul of 2-d operands, one of them or both stacked."""
    a, b = atoms
    if a.aval.ndim - (kinds[0] == "S") != 2 or b.aval.ndim - (kinds[1] == "S") != 2:
        return False
    m, n = o.shape
    dt = o.dtype
    if kinds == ["S", "S"]:
        add("matmul", [a, b], {}, whole)
    elif kinds == ["S", "I"]:        # x_t @ C for every t: one (T m, k) @ (k, n)
        k = a.aval.shape[2]
        rows = add("reshape", [a], {"shape": (T * m, k)}, aval((T * m, k), dt))
        prod = add("matmul", [rows, b], {}, aval((T * m, n), dt))
        add("reshape", [prod], {"shape": whole.shape}, whole)
    elif kinds == ["I", "S"]:        # C @ x_t = (x_t^T @ C^T)^T
        k = b.aval.shape[1]
        bt = add("transpose", [b], {"perm": (0, 2, 1)}, aval((T, n, k), dt))
        rows = add("reshape", [bt], {"shape": (T * n, k)}, aval((T * n, k), dt))
        ct = add("transpose", [a], {"perm": (1, 0)}, aval((k, m), dt))
        prod = add("matmul", [rows, ct], {}, aval((T * n, m), dt))
        back = add("reshape", [prod], {"shape": (T, n, m)}, aval((T, n, m), dt))
        add("transpose", [back], {"perm": (0, 2, 1)}, whole)
    else:
        return False
    return True




def fold_reshapes(eqns: list[Eqn], visible: set[int]) -> list[Eqn]:
    """`eqns` with each reshape of a reshape made here reading the first one's input, and the
    reshapes then unread dropped (their values are `visible` outside, or not)."""
    made: dict[int, Eqn] = {}
    out: list[Eqn] = []
    for e in eqns:
        if e.op == "reshape" and type(e.inputs[0]) is Var:
            src = made.get(e.inputs[0].id)
            if src is not None:
                e = Eqn("reshape", [src.inputs[0]], e.outvars, e.params, e.source)
            made[e.outvars[0].id] = e
        out.append(e)
    read = {a.id for e in out for a in e.inputs if type(a) is Var}
    return [e for e in out if not (e.op == "reshape" and e.outvars[0].id not in read
                                   and e.outvars[0].id not in visible)]


__all__ = ["aval", "fission", "fold_reshapes"]

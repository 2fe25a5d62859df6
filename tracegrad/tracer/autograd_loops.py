"""Backward plans for recorded graphs holding a loop — a run of identical node blocks, like an
RNN's steps — made for a new length by slot arithmetic instead of composing them again.

A graph whose walk is `prefix + body * n + suffix` has a structure key without n (`loop_of`).
Its first two lengths are composed as usual (autograd_compose), recording which node made each
slot; the plan of one is then written as a template (per body iteration: its steps, reading
slots of its own, the previous or the next iteration, or of the loop's first or last one),
and the template is used only if it gives back both composed plans step for step. Any other
length of the structure is then instantiated: the same numpy steps in the same order, so the
same bits, for the cost of numbering them."""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..ir.core import Var
from .autograd_compose import Plan, _Composer, _fresh, _synth, compose

WRT = 1 << 48       # in a walk's key, the bit of an input's first reference needing a gradient
MIN_ITERS = 3       # body iterations (after the loop's first) a structure needs
_REPEAT = re.compile(r"(.+?)\1{2,}", re.S)
_FAILED = "failed"  # a structure whose plans are not instances of one template
_cache: dict = {}   # structure key -> (n, plan, marks) seen once | Template | _FAILED
CACHE_SIZE = 256
# Off by default: measured on bench `dynamic` (Tensor), a new length costs ~60-100 us to
# find the loop plus ~100-200 us to instantiate, against ~220-490 us to compose, and the
# second length of a structure pays ~1 ms to derive and check the template: no net gain yet.
ENABLED = False


class _NoLoop(Exception):
    pass


# ---- finding the loop --------------------------------------------------------------------------

class Layout:
    """Where the loop is in a walk: nodes [0, pre) (what comes before, and the loop's first
    iteration, whose reads of earlier values differ), then `m` iterations of `p` nodes, then
    the rest; inputs: `i_pre` first read before the body, `q` per iteration, `j` after."""
    __slots__ = ("pre", "p", "m", "i_pre", "q", "j", "r", "n_in")

    @property
    def end(self) -> int:
        return self.pre + self.m * self.p


def loop_of(order: list, key: tuple, n_roots: int) -> tuple[tuple, Layout] | None:
    """(structure key, layout) of a grad_walk's nodes and key when they hold a loop of at
    least MIN_ITERS + 1 iterations, else None. The key names nodes by position and inputs by
    slot, so body iteration k + 1's part of it is iteration k's with node references moved
    by p nodes, new inputs by q slots and references to earlier values kept: checked for all
    iterations at once."""
    starts = []
    i = 0
    for n in order:
        starts.append(i)
        i += 1 + len(n.args)
    if len(key) - i != n_roots or len(order) < 4:
        return None
    codes: dict = {}
    chars = "".join([codes.setdefault(key[s], chr(0x100 + len(codes))) for s in starts])
    best = None
    for found in _REPEAT.finditer(chars):
        if best is None or found.end() - found.start() > best.end() - best.start():
            best = found
    if best is None:
        return None
    p = len(best.group(1))
    n = (best.end() - best.start()) // p
    if n < MIN_ITERS + 1:
        return None
    lay = Layout()
    pre = lay.pre = best.start() + p
    lay.p, m = p, n - 1
    lay.m = m
    end = pre + m * p
    b0 = starts[pre]
    width = starts[pre + p] - b0
    if (starts[end] if end < len(starts) else i) - b0 != m * width:
        return None
    arity = [len(x.args) for x in order[pre:end]]
    if arity[:p] * m != arity:
        return None
    if any(type(x) is not int for x in key[:b0]):
        return None
    lay.i_pre = i_pre = _inputs_before(key, starts, pre)
    delta = []
    q = 0
    body_sigs = {s - b0 for s in starts[pre:pre + p]}
    for s, x in enumerate(key[b0:b0 + width]):
        if s in body_sigs:
            delta.append(0)
        elif type(x) is not int:
            return None
        elif x < 0:
            delta.append(-(p << 16) if (-1 - x) >> 16 >= pre - p else 0)
        elif x & (WRT - 1) >= i_pre:
            if x & (WRT - 1) == i_pre + q:
                q += 1
            delta.append(None)      # set below, once q is known
        else:
            delta.append(0)
    lay.q = q
    delta = [q if d is None else d for d in delta]
    try:
        rows = np.array(key[b0:b0 + m * width], dtype=np.int64).reshape(m, width)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (rows[1:] - rows[:-1] == np.array(delta, dtype=np.int64)).all():
        return None
    tail = []
    j_base = i_pre + m * q
    lay.j = 0
    sig_at = set(starts[end:])
    for s in range(starts[end] if end < len(starts) else i, len(key)):
        x = key[s]
        if s in sig_at:
            tail.append(x)
        elif type(x) is not int:
            return None
        elif x < 0:
            j, pos = divmod(-1 - x, 1 << 16)
            tail.append(x if j < pre else ("B", j - end, pos))
        elif x & (WRT - 1) >= i_pre:
            k = x & (WRT - 1)
            if k == j_base + lay.j:
                lay.j += 1
            tail.append(("j", k - j_base, x >= WRT))
        else:
            tail.append(x)
    return (pre, p, key[:b0 + width], tuple(tail)), lay


def _inputs_before(key: tuple, starts: list, stop: int) -> int:
    """How many inputs the nodes before `stop` read first."""
    new = 0
    for a, b in zip(starts[:stop], starts[1:stop + 1], strict=True):
        for x in key[a + 1:b]:
            if x >= 0 and x & (WRT - 1) == new:
                new += 1
    return new


# ---- recording a composition --------------------------------------------------------------------

class _Recorder(_Composer):
    """A composer noting, at each node's forward and backward, the first slot it makes."""

    def __init__(self, in_vars: list, roots: list) -> None:
        super().__init__(in_vars, roots)
        self.marks: list = []       # (first slot, phase, node index)
        self.fi = 0
        self.bi = -1

    def forward(self, n: Any) -> list:
        self.marks.append((self.n, 0, self.fi))
        self.fi += 1
        return super().forward(n)

    def backward(self, n: Any, loc: list) -> None:
        if self.bi < 0:
            self.bi = self.fi - 1
        self.marks.append((self.n, 1, self.bi))
        self.bi -= 1
        super().backward(n, loc)
        if self.bi < 0:
            self.marks.append((self.n, 2, 0))


def compose_recorded(order: list, in_vars: list, in_gsrc: list, roots: list) -> tuple:
    """(plan, wrt, marks): `compose` noting where each slot was made."""
    rec: list = []

    class Rec(_Recorder):
        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            rec.append(self)
    plan, wrt = compose(order, in_vars, in_gsrc, roots, Rec)
    return plan, wrt, rec[0].marks


# ---- templates ---------------------------------------------------------------------------------

F, B, T, INPUT = 0, 1, 2, 3      # phases: forward, backward, totals; body inputs
PRE, BODY, SUF, END = 0, 1, 2, 3
_FOLLOW = ("transpose", "matmul", "add")    # composer-made steps reading a concatenation
EDGE = 3        # iterations this close to either end may differ from the others


class Template:
    """A plan written for any number of body iterations: per group of slots (phase, region)
    its items, each a constant ("c", key), a step ("s", fn, arity, outputs, references) or
    None (a step's further output); references name slots by group, offset and iteration."""
    __slots__ = ("lay", "groups", "inner", "edges", "outs", "values", "m_min", "progs")


def _group(ph: int, node: int, lay: Layout) -> tuple:
    if ph == T:
        return (T, END, 0)
    if node < lay.pre:
        return (ph, PRE, 0)
    if node < lay.end:
        return (ph, BODY, (node - lay.pre) // lay.p)
    return (ph, SUF, 0)


def _anchor(k: int, m: int) -> tuple:
    return (0, k) if k <= m - 1 - k else (1, m - 1 - k)


def derive(plan: Plan, marks: list, lay: Layout) -> Template | None:
    """The template of a composed plan, or None if its steps are not the same in every
    body iteration (except the EDGE first and last ones)."""
    size = len(plan.init)
    m, n_all = lay.m, plan.n_in
    lay.r = n_all - (lay.i_pre + m * lay.q + lay.j)
    lay.n_in = n_all - lay.r
    gid: list = [None] * size
    base: dict = {}
    for i, (s0, ph, node) in enumerate(marks):
        s1 = marks[i + 1][0] if i + 1 < len(marks) else size
        if s1 > s0:
            g = _group(ph, node, lay)
            base.setdefault(g, s0)
            gid[s0:s1] = [g] * (s1 - s0)
    first = {}
    for i, st in enumerate(plan.steps):
        out = st[2]
        first[out if type(out) is int else out[0]] = i

    def ref(s: int, g: tuple) -> tuple:
        if s < lay.i_pre:
            return ("I", s)
        if s < lay.n_in - lay.j:
            k, o = divmod(s - lay.i_pre, lay.q)
            return _body_ref(INPUT, k, o, g)
        if s < lay.n_in:
            return ("J", s - (lay.n_in - lay.j))
        if s < n_all:
            return ("C", s - lay.n_in)
        h = gid[s]
        if h[1] == BODY:
            return _body_ref(h[0], h[2], s - base[h], g)
        return ("g", h[:2], s - base[h])

    def _body_ref(ph: int, k: int, o: int, g: tuple) -> tuple:
        if g[1] == BODY:
            if -1 <= k - g[2] <= 1:
                return ("r", ph, k - g[2], o)
            return ("K", ph, _anchor(k, m), o)
        return ("A", ph, k, o)

    t = Template()
    t.lay = lay
    t.values = {}
    descs: dict = {}
    resized: set = set()    # (group, offset) of concatenations over iterations, and after
    for g, s0 in base.items():
        items, metas = [], []
        s = s0
        while s < size and gid[s] == g:
            if s in plan.consts:
                c = plan.consts[s]
                t.values[c[0]] = c
                items.append(("c", c[0]))
            elif s in first:
                i = first[s]
                fn, ins, out, arity = plan.steps[i]
                refs = tuple([ref(x, g) for x in ins])
                resize = None
                if g[1] != BODY:
                    refs = _runs(refs, m)
                    te = plan.meta[i][0]
                    if any(r[0] == "R" for r in refs):
                        if te.op != "concatenate":
                            return None
                        resize = "cat"
                    elif any(r[0] == "g" and (r[1], r[2]) in resized for r in refs):
                        if te.op not in _FOLLOW:
                            return None
                        resize = "follow"
                    if resize:
                        resized.add((g[:2], s - s0))
                n_out = 1 if type(out) is int else len(out)
                items.append(("s", fn, arity, n_out, refs, resize))
                metas.append(plan.meta[i])
            else:
                items.append(None)
            s += 1
        descs[g] = (tuple(items), metas)
    empty = ((), [])
    inner = {ph: descs.get((ph, BODY, m // 2), empty) for ph in (F, B)}
    edges: dict = {}
    for (ph, region, k), d in descs.items():
        if region == BODY and d[0] != inner[ph][0]:
            a = _anchor(k, m)
            if a[1] >= EDGE:
                return None
            edges[(ph, a)] = d
    for ph in (F, B):       # an iteration making no slots
        for k in range(m):
            if (ph, BODY, k) not in descs and inner[ph][0]:
                a = _anchor(k, m)
                if a[1] >= EDGE:
                    return None
                edges[(ph, a)] = empty
    t.groups = {g[:2]: d for g, d in descs.items() if g[1] != BODY}
    t.inner, t.edges = inner, edges
    t.progs = {id(items): _prog(items) for items, _ in
               [*t.groups.values(), *inner.values(), *edges.values()]}
    t.outs = _runs(tuple([ref(k, (T, END, 0)) for k, _ in plan.outs]), m)
    return t


def _runs(refs: tuple, m: int) -> tuple:
    """`refs` with absolute references to body iterations ("A") anchored at the closer end
    of the loop, and runs of them over consecutive iterations written as one ("R")."""
    if not any(r[0] == "A" for r in refs):
        return refs
    out = []
    i = 0
    while i < len(refs):
        r = refs[i]
        if r[0] != "A":
            out.append(r)
            i += 1
            continue
        ph, k, o = r[1:]
        j, d = i + 1, 0
        if j < len(refs) and refs[j][:2] == ("A", ph) and refs[j][3] == o and \
                abs(refs[j][2] - k) == 1:
            d = refs[j][2] - k
            while j < len(refs) and refs[j][:2] == ("A", ph) and refs[j][3] == o and \
                    refs[j][2] - refs[j - 1][2] == d:
                j += 1
        if d:
            out.append(("R", ph, o, _anchor(k, m), _anchor(refs[j - 1][2], m), d))
            i = j
        else:
            out.append(("K", ph, _anchor(k, m), o))
            i += 1
    return tuple(out)


def instantiate(t: Template, m: int, in_vars: list) -> Plan | None:
    """The plan of `t`'s structure with `m` body iterations, or None if the template cannot
    say (an iteration near both ends that differs at each, a reference out of the loop)."""
    lay, edges, inner = t.lay, t.edges, t.inner
    n_in = lay.i_pre + m * lay.q + lay.j
    s = n_in + lay.r
    base: dict = {}
    order: list = []       # (group or None, description, first slot, iteration)

    def group(g: tuple) -> None:
        nonlocal s
        base[g] = s
        d = t.groups.get(g)
        if d is not None:
            order.append((d, s, -1))
            s += len(d[0])

    def body(ph: int, ks: Any) -> list:
        nonlocal s
        at = [0] * m
        for k in ks:
            d = edges.get((ph, (0, k)))
            d1 = edges.get((ph, (1, m - 1 - k)))
            if d is None:
                d = inner[ph] if d1 is None else d1
            elif d1 is not None:
                raise _NoLoop
            at[k] = s
            order.append((d, s, k))
            s += len(d[0])
        return at

    try:
        group((F, PRE))
        fb = body(F, range(m))
        group((F, SUF))
        group((B, SUF))
        bb = body(B, range(m - 1, -1, -1))
        group((B, PRE))
        group((T, END))
        at = {F: fb, B: bb, INPUT: [lay.i_pre + k * lay.q for k in range(m)]}
        init: list = [None] * s
        consts: dict = {}
        steps: list = []
        meta: list = []
        avals: dict = {}    # slot -> type, of resized steps' outputs
        append = steps.append
        pad = [None] * 4        # per phase, the iterations' first slots, padded by None
        for ph in (F, B, INPUT):
            pad[ph] = [None, *at[ph], None]
        for (items, metas), s0, k in order:
            prog, resizes = t.progs[id(items)]
            mi = 0
            for o, it, fast in prog:
                slot = s0 + o
                if fast is not None:
                    fn, arity, p0, d0, x0, p1, d1, x1 = fast
                    try:
                        if arity == 2:
                            append((fn, (pad[p0][k + d0] + x0, pad[p1][k + d1] + x1), slot,
                                    2))
                        else:
                            append((fn, (pad[p0][k + d0] + x0,), slot, 1))
                    except TypeError:   # an iteration out of the loop
                        raise _NoLoop from None
                    if resizes:
                        meta.append(metas[mi])
                        mi += 1
                    continue
                if it[0] == "c":
                    c = t.values[it[1]]
                    init[slot] = c[1]
                    consts[slot] = c
                    continue
                _, fn, arity, n_out, refs, resize = it
                ins: list = []
                for r in refs:
                    _resolve(r, k, m, at, base, n_in, lay, ins)
                mt = metas[mi]
                mi += 1
                if resize:      # the composer's own equation for the new types
                    te = mt[0]
                    if resize == "cat":
                        arity = len(ins)
                        fn, te = _synth("concatenate", (te.inputs[0].aval,) * arity,
                                        te.params["axis"])
                    else:
                        fn, te = _synth(te.op, tuple([avals.get(x) or v.aval for x, v in
                                                      zip(ins, te.inputs, strict=True)]))
                    avals[slot] = te.outvars[0].aval
                    mt = (te, mt[1], mt[2])
                append((fn, tuple(ins), slot if arity >= 0 else
                        tuple(range(slot, slot + n_out)), arity))
                if resizes:
                    meta.append(mt)
            if not resizes:
                meta += metas
        outs: list = []
        for r in t.outs:
            _resolve(r, -1, m, at, base, n_in, lay, outs)
    except _NoLoop:
        return None
    fresh = {k for k in outs if _fresh(steps, k)}
    p = Plan()
    p.init, p.steps, p.meta, p.consts, p._graph = init, steps, meta, consts, None
    p.n_in, p.in_vars = n_in + lay.r, in_vars
    p.outs = [(k, k in fresh and outs.index(k) == j) for j, k in enumerate(outs)]
    return p


def _prog(items: tuple) -> tuple:
    """A description as (offset, item, fast form or None, whether step types may change);
    a fast form — (fn, arity, phase, offset + 1, slot, ...) — for a step reading one or two
    slots of its own or a neighbouring iteration, the common case, made without _resolve."""
    prog = []
    for o, it in enumerate(items):
        if it is None:
            continue
        fast = None
        if it[0] == "s":
            _, fn, arity, n_out, refs, resize = it
            if 1 <= arity <= 2 and arity == len(refs) and all(r[0] == "r" for r in refs):
                fast = (fn, arity, *[x for r in refs for x in (r[1], r[2] + 1, r[3])])
                if arity == 1:
                    fast += (0, 0, 0)
        prog.append((o, it, fast))
    return tuple(prog), any(it is not None and it[0] == "s" and it[5] for it in items)


def _resolve(r: tuple, k: int, m: int, at: dict, base: dict, n_in: int, lay: Layout,
             out: list) -> None:
    """Append the slot(s) reference `r` names, from body iteration `k` (-1: outside)."""
    kind = r[0]
    if kind == "r":
        kk = k + r[2]
        if not 0 <= kk < m:
            raise _NoLoop
        out.append(at[r[1]][kk] + r[3])
    elif kind == "g":
        out.append(base[r[1]] + r[2])
    elif kind == "I":
        out.append(r[1])
    elif kind == "K":
        a, x = r[2]
        kk = x if a == 0 else m - 1 - x
        if not 0 <= kk < m:
            raise _NoLoop
        out.append(at[r[1]][kk] + r[3])
    elif kind == "R":
        _, ph, o, (a0, x0), (a1, x1), d = r
        k0 = x0 if a0 == 0 else m - 1 - x0
        k1 = x1 if a1 == 0 else m - 1 - x1
        if not (0 <= k0 < m and 0 <= k1 < m and (k1 - k0) * d >= 0):
            raise _NoLoop
        bases = at[ph]
        out += [bases[kk] + o for kk in range(k0, k1 + d, d)]
    elif kind == "C":
        out.append(n_in + r[1])
    elif kind == "J":
        out.append(n_in - lay.j + r[1])
    else:
        raise _NoLoop


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans run the same steps on the same slots."""
    return a.n_in == b.n_in and len(a.init) == len(b.init) and a.outs == b.outs and \
        a.steps == b.steps and \
        {k: c[0] for k, c in a.consts.items()} == {k: c[0] for k, c in b.consts.items()}


# ---- the cache ---------------------------------------------------------------------------------

def loop_plan(order: list, in_vars: list, in_gsrc: list, roots: list, key: tuple
              ) -> tuple[Plan, list] | None:
    """(plan, wrt) as `compose` gives them, for a grad_walk's nodes and key (its roots'
    references included) holding a loop; None for any other graph. The first two lengths of
    a structure are composed; when both are instances of one template, later ones are
    instantiated from it."""
    found = loop_of(order, key, len(roots)) if ENABLED else None
    if found is None:
        return None
    skey, lay = found
    state = _cache.get(skey)
    if type(state) is Template:
        if lay.m >= state.m_min:
            plan = instantiate(state, lay.m, list(in_vars) + [Var(t._var.aval) for t in roots])
            if plan is not None:
                return plan, [i for i, g in enumerate(in_gsrc) if g is not None]
        return None
    if state is _FAILED:
        return None
    plan, wrt, marks = compose_recorded(order, in_vars, in_gsrc, roots)
    if len(_cache) > CACHE_SIZE:
        _cache.clear()
    if state is None:
        _cache[skey] = (lay, plan, marks)
    elif state[0].m != lay.m:
        _cache[skey] = _template(state, (lay, plan, marks))
    return plan, wrt


def _template(one: tuple, other: tuple) -> Template | str:
    """The template of two composed lengths of one structure, if it gives back both."""
    small, big = sorted((one, other), key=lambda s: s[0].m)
    t = derive(big[1], big[2], big[0])
    if t is None:
        return _FAILED
    for lay, plan, _ in (big, small):
        made = instantiate(t, lay.m, plan.in_vars)
        if made is None or not same_plan(made, plan):
            return _FAILED
    t.m_min = small[0].m
    return t

"""Loop forms: a traced graph written as (before, body, after) with the body's repeat count
left out, so the traces of one Python loop at any length have one form (see ir.template).

The form is in relative terms (an input is "the value made d equations back", a graph input
by its position), the slices' starts per step as a start and a step, and the literals inside
the loop by value; the literals outside it are left out and listed apart (a mean's 1/T
changes with the length), so what a form says, with its count and those literals, is the
whole graph. A trace that differs anywhere else (one constant, one shape, a step reading
from two steps back) has another form."""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

from .core import Graph, Lit, Var
from .loops import MIN_EQNS, MIN_TRIPS, _full_params
from .passes import _frozen_params

class Form(NamedTuple):
    """A loop's trace with its trip count and outside literals left out (hashable)."""
    before: tuple       # the equations' codes before the run
    body: tuple         # one block's
    after: tuple        # after the run
    outs: tuple         # the outputs'
    starts: tuple       # the slices' starts (see _starts_pattern)
    inside: tuple       # the literals inside the run: ((body position, input), key)
    in_avals: tuple
    consts: tuple       # the graph's constants, by identity


_CODES: dict[Any, int] = {}     # an equation's relative form -> an int
_NEXT = itertools.count()        # never handed out twice: forms made before a clear stay apart


def _params_key(op: str, params: dict, frozen: bool = False) -> Any:
    if not params:
        return ()
    if frozen:
        return _frozen_params(params)
    return _full_params(params) if op == "full" else tuple(params.items())


def _codes(graph: Graph, values: bool = False) -> tuple[list[int], list[tuple], list, list] | None:
    """Per equation an int naming its op, params, output types and inputs (a literal by its
    type, a graph input by its position, a value made in the graph by how many equations back
    and which output); a slice's start indices are left out of it and listed apart, as
    (position, starts), and so are the literals, as (position, input, literal). Also the
    outputs' forms. `values`: literals named by their bits instead (none listed apart). None
    if some equation cannot be named."""
    where: dict[int, int] = {}
    for k, v in enumerate(graph.invars):
        where[v.id] = -1 - k
    base = len(graph.invars)
    for k, v in enumerate(graph.constvars):
        where[v.id] = -1 - base - k
    codes: list[int] = []
    append = codes.append
    starts: list[tuple] = []
    lits: list[tuple] = []
    table, get = _CODES, _CODES.get
    for i, e in enumerate(graph.eqns):
        op, ins, outs, params = e.op, e.inputs, e.outvars, e.params
        here = i << 8
        if len(ins) == 2 and type(ins[0]) is Var and type(ins[1]) is Var:
            w0, w1 = where[ins[0].id], where[ins[1].id]
            refs: Any = (here - w0 if w0 >= 0 else w0, here - w1 if w1 >= 0 else w1)
        elif len(ins) == 1 and type(ins[0]) is Var:
            w0 = where[ins[0].id]
            refs = here - w0 if w0 >= 0 else w0
        else:
            refs = tuple([(here - where[a.id] if where[a.id] >= 0 else where[a.id])
                          if type(a) is Var else a.key() if values else a.aval.dtype.str
                          for a in ins])
            if not values:
                lits += [(i, k, a) for k, a in enumerate(ins) if type(a) is Lit]
        if not params:
            ps: Any = ()
        elif op == "slice":
            index = params["index"]
            starts.append((i, tuple([s for s, _, _ in index])))
            ps = ("slice", tuple([(stop - s, step) for s, stop, step in index]))
        else:
            ps = _params_key(op, params)
        if len(outs) == 1:
            out = outs[0]
            key = (op, ps, out.aval, refs)
        elif len(outs) > 255:
            return None
        else:
            key = (op, ps, tuple([v.aval for v in outs]), refs)
        try:
            c = get(key)
        except TypeError:       # params that cannot be hashed as they are
            key = (key[0], _params_key(op, params, True)) + key[2:]
            try:
                c = get(key)
            except TypeError:
                return None
        if c is None:
            if len(table) > 1 << 16:
                table.clear()
            c = table[key] = next(_NEXT)
        append(c)
        if len(outs) == 1:
            where[outs[0].id] = here
        else:
            for pos, v in enumerate(outs):
                where[v.id] = here | pos
    end = len(graph.eqns) << 8
    outs = [a.key() if type(a) is Lit else
            (end - where[a.id] if where[a.id] >= 0 else where[a.id]) for a in graph.outvars]
    return codes, starts, lits, outs


def loop_form(graph: Graph) -> tuple[Form, int, list] | None:
    """(form, n, literals): the graph's first run of >= MIN_TRIPS equal blocks (>= MIN_EQNS
    equations), n blocks long; a hashable form equal for graphs equal but for n and the
    literals outside the run (a mean's 1/T); those literals, in order. When the blocks found
    differ in a literal, the graph is looked at again with every literal's value in the form
    (no literals then change). None when the graph has no such run or cannot be named."""
    if not isinstance(graph, Graph):
        raise TypeError(f"loop_form: expected an ir.Graph, got {type(graph).__name__}")
    named = _codes(graph)
    if named is None:
        return None
    found = _run(graph, named)
    if found is None and named[2]:
        named = _codes(graph, values=True)
        found = _run(graph, named) if named is not None else None
    return found


def _run(graph: Graph, named: tuple) -> tuple[Form, int, list] | None:
    """loop_form of a graph named by _codes."""
    codes, starts, lits, outs = named
    size = len(codes)
    nxt = [size] * size
    seen: dict[int, int] = {}
    for i in range(size - 1, -1, -1):
        c = codes[i]
        nxt[i] = seen.get(c, size)
        seen[c] = i
    i = 0
    while i < size:
        p = nxt[i] - i
        if i + MIN_TRIPS * p <= size and p * MIN_TRIPS >= MIN_EQNS:
            body = codes[i:i + p]
            reps = 1
            while i + (reps + 1) * p <= size and \
                    codes[i + reps * p:i + (reps + 1) * p] == body:
                reps += 1
            if reps >= MIN_TRIPS and p * reps >= MIN_EQNS:
                pattern = _starts_pattern(starts, i, p, reps)
                if pattern is None:
                    return None
                inside = _run_literals(lits, i, p, reps)
                if inside is None:
                    return None
                # (the consts by identity: whoever keeps a form keeps them alive with it,
                # as jit's families do in their graphs, so an id is never another array's;
                # a function making a new constant array each trace has a new form each time)
                form = Form(tuple(codes[:i]), tuple(body), tuple(codes[i + reps * p:]),
                            tuple(outs), pattern, inside, tuple(graph.in_avals),
                            tuple([id(c) for c in graph.consts]))
                end = i + reps * p
                return form, reps, [a for at, _, a in lits if at < i or at >= end]
        i += 1
    return None


def _run_literals(lits: list[tuple], i: int, p: int, reps: int) -> tuple | None:
    """The literals inside the run as part of a form: per (position in the body, input),
    its value, which must be the same in every block. None when it is not."""
    end = i + reps * p
    seen: dict[tuple, Any] = {}
    for at, k, a in lits:
        if i <= at < end:
            key = a.key()
            if seen.setdefault(((at - i) % p, k), key) != key:
                return None
    return tuple(sorted(seen.items()))


def _starts_pattern(starts: list[tuple], i: int, p: int, reps: int) -> tuple | None:
    """The slices' start indices as part of a form: per position in the body, its starts in
    the first block and the step between blocks, which must be the same for every block;
    before the run as they are; after it, by position from its end, and at a position
    where the body slices, relative to where the next block would start (a loop found
    turned by some equations leaves the last step's first ones after the run). None when
    the blocks' starts are not evenly spaced."""
    end = i + reps * p
    out: list = []
    after: list = []
    per_pos: dict[int, list] = {}
    for at, s in starts:
        if at < i:
            out.append((at, s))
        elif at < end:
            per_pos.setdefault((at - i) % p, []).append(s)
        else:
            after.append((at - end, s))
    steps = {}
    for q in sorted(per_pos):
        seq = per_pos[q]
        first = seq[0]
        step = steps[q] = tuple([b - a for a, b in zip(first, seq[1])])
        for k, s in enumerate(seq):
            if any(x != f + k * d for x, f, d in zip(s, first, step)):
                return None
        out.append((q, first, step))
    for j, s in after:
        seq = per_pos.get(j) if j < p else None
        if seq is not None and len(seq[0]) == len(s):
            nxt = [f + reps * d for f, d in zip(seq[0], steps[j])]
            out.append(("next", j, tuple([x - y for x, y in zip(s, nxt)])))
        else:
            out.append(("after", j, s))
    return tuple(out)

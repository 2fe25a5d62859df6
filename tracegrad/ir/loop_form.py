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

from .core import Graph, Lit, Var, remember
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
    valued: tuple       # the keys of literals after the run written by value (in maps)


_KINDS: dict[Any, int] = {}     # (op, params, output types), by value -> an int (a kind)
_CODES: dict[Any, int] = {}     # (kind, inputs as _codes names them) -> an int (a code)
_SEEN: dict[tuple, tuple] = {}  # (op, id(params), id(output type), inputs) -> (code, params,
#                                 output type, a slice's starts): _CODES by identity (_code)
_NEXT = itertools.count()        # never handed out twice: forms made before a clear stay apart


def _params_key(op: str, params: dict, frozen: bool = False) -> Any:
    if not params:
        return ()
    if frozen:
        return _frozen_params(params)
    return _full_params(params) if op == "full" else tuple(params.items())


def _code(op: str, params: dict, out: Any, refs: Any, remembered: bool = True
          ) -> tuple | None:
    """(code, params or None, out, starts) for an equation: `code` the int naming its op,
    params (a slice's starts left out), output type(s) `out` and inputs `refs` (see _codes),
    `starts` a slice's start indices (else None); None if the params cannot be hashed.
    `remembered`: kept in _SEEN, by the identity of the params and the type (a function's
    traces share them; the entry holds both, so their ids are no other's while it is
    there), for _codes to find without hashing them."""
    starts = None
    if not params:
        ps: Any = ()
    elif op == "slice":
        index = params["index"]
        starts = tuple([s for s, _, _ in index])
        ps = ("slice", tuple([(stop - s, step) for s, stop, step in index]))
    else:
        ps = _params_key(op, params)
    key = (op, ps, out)
    try:
        kind = _KINDS.get(key)
    except TypeError:       # params that cannot be hashed as they are
        key = (op, _params_key(op, params, True), out)
        try:
            kind = _KINDS.get(key)
        except TypeError:
            return None
    if kind is None:
        if len(_KINDS) > 1 << 16:
            _KINDS.clear()
        kind = _KINDS[key] = next(_NEXT)
    key = (kind, refs)
    code = _CODES.get(key)
    if code is None:
        if len(_CODES) > 1 << 16:
            _CODES.clear()
        code = _CODES[key] = next(_NEXT)
    p = params or None
    hit = (code, p, out, starts)
    if remembered:
        remember(_SEEN, (op, id(p), id(out), refs), hit, 1 << 14)
    return hit


def _codes(graph: Graph, values: bool = False
           ) -> tuple[list[int], list[tuple], list, list, dict, list] | None:
    """Per equation an int naming its op, params, output types and inputs (a literal by its
    type, a graph input by its position, a value made in the graph by how many equations back
    and which output); a slice's start indices are left out of it and listed apart, as
    (position, starts), and so are the literals, as (position, input, literal). Also the
    outputs' forms, where each variable is made (see `_after`) and each equation's depth.
    `values`: literals named by their bits instead (none listed apart). None if some
    equation cannot be named."""
    where: dict[int, int] = {}
    for k, v in enumerate(graph.invars):
        where[v.id] = -1 - k
    base = len(graph.invars)
    for k, v in enumerate(graph.constvars):
        where[v.id] = -1 - base - k
    codes: list[int] = []
    append = codes.append
    size = len(graph.eqns)
    # 1 + the deepest input's (see _shift); a graph input's `where >> 8` is negative: it
    # reads one of the zeros past the equations'
    depth = [0] * (size + 1 + (len(where) >> 8))
    starts: list[tuple] = []
    lits: list[tuple] = []
    seen = _SEEN.get
    for i, e in enumerate(graph.eqns):
        ins, outs = e.inputs, e.outvars
        here = i << 8
        if len(ins) == 2 and type(ins[0]) is Var and type(ins[1]) is Var:
            w0, w1 = where[ins[0].id], where[ins[1].id]
            refs: Any = (here - w0 if w0 >= 0 else w0, here - w1 if w1 >= 0 else w1)
            d, d1 = depth[w0 >> 8], depth[w1 >> 8]
            depth[i] = (d if d > d1 else d1) + 1
        elif len(ins) == 1 and type(ins[0]) is Var:
            w0 = where[ins[0].id]
            refs = here - w0 if w0 >= 0 else w0
            depth[i] = depth[w0 >> 8] + 1
        else:
            refs = tuple([(here - where[a.id] if where[a.id] >= 0 else where[a.id])
                          if type(a) is Var else a.key() if values else a.aval.dtype.str
                          for a in ins])
            if not values:
                lits += [(i, k, a) for k, a in enumerate(ins) if type(a) is Lit]
            depth[i] = max([depth[where[a.id] >> 8] for a in ins if type(a) is Var],
                           default=0) + 1
        if len(outs) == 1:
            v = outs[0]
            where[v.id] = here
            hit = seen((e.op, id(e.params or None), id(v.aval), refs))
            if hit is None:
                hit = _code(e.op, e.params, v.aval, refs)
                if hit is None:
                    return None
        elif len(outs) > 255:
            return None
        else:
            for pos, v in enumerate(outs):
                where[v.id] = here | pos
            hit = _code(e.op, e.params, tuple([v.aval for v in outs]), refs, False)
            if hit is None:
                return None
        append(hit[0])
        if hit[3] is not None:
            starts.append((i, hit[3]))
    del depth[size:]
    end = size << 8
    outs = [a.key() if type(a) is Lit else
            (end - where[a.id] if where[a.id] >= 0 else where[a.id]) for a in graph.outvars]
    return codes, starts, lits, outs, where, depth


def loop_form(graph: Graph) -> tuple[Form, int, list] | None:
    """(form, n, literals): the graph's first run of >= MIN_TRIPS equal blocks (>= MIN_EQNS
    equations), n blocks long; a hashable form equal for graphs equal but for n and the
    literals outside the run (a mean's 1/T); those literals, in order. When the blocks found
    differ in a literal, the graph is looked at again with every literal's value in the form
    (no literals then change); when no blocks are equal as written, again with the values
    made before the loop that every step reads (a bias scaled, `xs @ U` sliced per step)
    named by where they are made (see `_hoisted`). None when the graph has no such run or
    cannot be named."""
    if not isinstance(graph, Graph):
        raise TypeError(f"loop_form: expected an ir.Graph, got {type(graph).__name__}")
    named = _codes(graph)
    if named is None:
        return None
    found = _run(graph, named)
    if found is None and named[2]:
        valued = _codes(graph, values=True)
        found = _run(graph, valued) if valued is not None else None
    if found is None:
        found = _hoisted(graph, named)
    return found


def _runs(codes: list):
    """The runs of >= MIN_TRIPS equal blocks (>= MIN_EQNS equations) of `codes`, as
    (start, period, blocks), in order of their start (for each start, the period of the
    next equal code)."""
    size = len(codes)
    nxt = None
    for i in range(size):
        if i < PROBED:
            # (most loops start a few equations in: the first starts' next equal codes are
            # looked up, within the longest period that fits, before a table of them all)
            try:
                p = codes.index(codes[i], i + 1, i + 1 + (size - i) // MIN_TRIPS) - i
            except ValueError:
                continue
        else:
            if nxt is None:
                nxt = _next_equal(codes)
            p = nxt[i] - i
        if i + MIN_TRIPS * p <= size and p * MIN_TRIPS >= MIN_EQNS:
            body = codes[i:i + p]
            reps = 1
            while i + (reps + 1) * p <= size and \
                    codes[i + reps * p:i + (reps + 1) * p] == body:
                reps += 1
            if reps >= MIN_TRIPS and p * reps >= MIN_EQNS:
                yield i, p, reps


PROBED = 8      # how many starts _runs looks the next equal code up for


def _next_equal(codes: list) -> list[int]:
    """Per position, that of the next equal code (len(codes) if none)."""
    size = len(codes)
    nxt = [size] * size
    seen: dict[Any, int] = {}
    for i in range(size - 1, -1, -1):
        c = codes[i]
        nxt[i] = seen.get(c, size)
        seen[c] = i
    return nxt


def _run(graph: Graph, named: tuple) -> tuple[Form, int, list] | None:
    """loop_form of a graph named by _codes: its first run, blocks compared as named."""
    codes = named[0]
    for i, p, reps in _runs(codes):
        return _form(graph, named, i, p, reps, tuple(codes[i:i + p]))
    return None


def _hoisted(graph: Graph, named: tuple) -> tuple[Form, int, list] | None:
    """loop_form when no blocks are equal as _codes names them: a step reading a value made
    before the loop (`b * 2`, `xs @ U` then sliced) reads it from further back each step.
    Runs are looked for with every value made in the graph left unnamed, then checked: per
    body position and input, every block must read the same value made before the run
    (named by where it is made) or the value as many equations back."""
    eqns = graph.eqns
    where = named[4]
    table: dict[Any, int] = {}
    coarse = []
    for e in eqns:
        ps = _eqn_params(e)
        if ps is None:
            return None
        refs = tuple([(where[a.id] if where[a.id] < 0 else where[a.id] & 255)
                      if type(a) is Var else a.aval.dtype.str for a in e.inputs])
        key = (e.op, ps, tuple([v.aval for v in e.outvars]), refs)
        coarse.append(table.setdefault(key, len(table)))
    for i, p, reps in _runs(coarse):
        body = _body_reads(graph, where, i, p, reps)
        if body is not None:
            return _form(graph, named, i, p, reps, body)
    return None


def _body_reads(graph: Graph, where: dict, i: int, p: int, reps: int) -> tuple | None:
    """The run's body with each input named alike in every block (see _hoisted), or None."""
    eqns = graph.eqns
    body = []
    for q in range(p):
        e0 = eqns[i + q]
        refs: list[Any] = []
        for k, a in enumerate(e0.inputs):
            if type(a) is Lit:
                refs.append(a.aval.dtype.str)     # (values: _run_literals)
                continue
            w0 = where[a.id]
            if w0 < 0:
                refs.append(w0)     # a graph input (coarse codes equal: in every block)
                continue
            ws = [where[eqns[i + b * p + q].inputs[k].id] for b in range(reps)]
            if (w0 >> 8) < i and all(w == w0 for w in ws):
                refs.append(("made", w0))
                continue
            d = ((i + q) << 8) - w0
            if any(((i + b * p + q) << 8) - w != d for b, w in enumerate(ws)):
                return None
            refs.append(d)
        body.append((e0.op, _eqn_params(e0), tuple([v.aval for v in e0.outvars]),
                     tuple(refs)))
    return tuple(body)


def _form(graph: Graph, named: tuple, i: int, p: int, reps: int, body: tuple
          ) -> tuple[Form, int, list] | None:
    """The form of the run at i (period p, reps blocks, `body` its first block's codes)."""
    codes, starts, lits, outs, where, depth = named
    end = i + reps * p
    shift = _shift(depth, i, p, reps)
    if shift is None:
        return None
    last = (end - p) << 8
    if all(type(a) is not Var or where[a.id] < 0 or where[a.id] >= last
           for e in graph.eqns[end:] for a in e.inputs) and \
            all(type(a) is not Var or where[a.id] < 0 or where[a.id] >= last
                for a in graph.outvars):
        # what follows the run reads only its last block: as _codes names it (how many
        # equations back) it is the same at any length
        tail, collapse, members, valued = tuple(codes[end:]), None, (), ()
    else:
        # (named by value, _codes listed no literals: then none is named by its type)
        after = _after(graph, where, i, p, reps, not lits, depth, shift)
        if after is None:
            return None
        tail, outs, collapse, members, valued = after
    if collapse is not None:        # positions after the run as _after counts them
        moved = []
        for at, st in starts:
            if at >= end:
                off = at - end
                if off in members:
                    return None     # a slice per step after the loop: not described
                at = end + collapse[off]
            moved.append((at, st))
        starts = moved
    pattern = _starts_pattern(starts, i, p, reps)
    if pattern is None:
        return None
    inside = _run_literals(lits, i, p, reps)
    if inside is None:
        return None
    # (the consts by identity: whoever keeps a form keeps them alive with it, as jit's
    # families do in their graphs, so an id is never another array's; a function making a
    # new constant array each trace has a new form each time)
    form = Form(_before(graph, named, i, reps, not lits), body, tail, tuple(outs), pattern,
                inside, tuple(graph.in_avals), tuple([id(c) for c in graph.consts]), valued)
    return form, reps, [a for at, _, a in lits
                        if at < i or at >= end and at - end not in members]


def _before(graph: Graph, named: tuple, i: int, reps: int, values: bool) -> tuple:
    """The equations before the run as _codes names them or, when some slice there is as
    long as the run (`xs[:T]`), named again so that every length has one form: in that slice
    and in what reads it, directly or not (`reshape(xs[:T], (T, H)) @ U`), each integer
    equal to the run's length is written "n" and the types are left out (they follow from
    the rest); the form with its length still says what every integer is."""
    eqns = graph.eqns[:i]
    grown: set[int] = set()     # variables whose types may change with the length
    for e in eqns:
        if e.op == "slice" and any(stop - start == reps for start, stop, _ in
                                   e.params["index"]) or \
                any(type(a) is Var and a.id in grown for a in e.inputs):
            grown.update(v.id for v in e.outvars)
    codes = named[0]
    if not grown:
        return tuple(codes[:i])
    where = named[4]
    out: list[Any] = []
    for k, e in enumerate(eqns):
        if e.outvars[0].id not in grown:
            out.append(codes[k])
            continue
        here = k << 8
        refs = tuple([(here - where[a.id] if where[a.id] >= 0 else where[a.id])
                      if type(a) is Var else a.key() if values else a.aval.dtype.str
                      for a in e.inputs])
        out.append((e.op, _length_named(_eqn_params(e), reps), refs))
    return tuple(out)     # (_eqn_params names what _codes did: it could name them all)


def _length_named(x: Any, n: int) -> Any:
    """`x` (nested tuples, as _eqn_params names params) with every integer n written "n"."""
    if type(x) is int:
        return "n" if x == n else x
    if type(x) is tuple:
        return tuple([_length_named(v, n) for v in x])
    return x


MAP_WIDTH = 4       # the most equations per step of a per-step map after a loop looked for


def _eqn_params(e: Any) -> Any:
    """An equation's params as _codes names them (a slice's starts left out), or None if
    they cannot be hashed."""
    params = e.params
    if not params:
        return ()
    if e.op == "slice":
        return ("slice", tuple([(stop - s, step) for s, stop, step in params["index"]]))
    ps = _params_key(e.op, params)
    try:
        hash(ps)
    except TypeError:
        try:
            ps = _params_key(e.op, params, True)
            hash(ps)
        except TypeError:
            return None
    return ps


def _shift(depth: list[int], at: int, width: int, count: int, like: int | None = None
           ) -> int | None:
    """How much deeper each of `count` groups of `width` equations from `at` is than the
    one before (from the last three groups), or None when the equations that deepen do not
    all deepen alike (or, given `like`, not all by `like`: a map after the loop must keep
    pace with the loop). The first transition is left out when there are more: the first
    group may read values made before it. Why: roll_loops sorts equations by depth, and a
    loop whose recurrences deepen at different rates (`h = tanh(h @ W + x)`: 3 a step;
    `g = g * x`: 1) falls into blocks that change with the length, so the graphs made for
    two or three lengths do not tell those for others."""
    shift = like or 0
    for k in range(max(min(2, count - 2), count - 3), count - 1):     # (the last two)
        base = at + k * width
        for q in range(base, base + width):
            s = depth[q + width] - depth[q]
            if s and s != shift:
                if shift:
                    return None
                shift = s
    return shift


def _anchor(k: int, reps: int) -> tuple:
    """Block boundary k (0..reps) of a run: from its start when in its first half, else from
    its end (a stack of every step's value is (start 0, end 0) at any length)."""
    return ("start", k) if 2 * k < reps else ("end", k - reps)


def _after(graph: Graph, where: dict, i: int, p: int, reps: int, values: bool,
           depth: list[int], shift: int) -> tuple[tuple, tuple, dict, set, tuple] | None:
    """The equations after the run and the graph's outputs, named free of the run's length:
    a value made before the run by where it is made; one of the run by its block (anchored:
    _anchor), position and output; and a map over the steps — equal groups of up to
    MAP_WIDTH equations, the k-th reading block c + k (`tg.stack(hs)`'s reshapes) or group
    k of an earlier map, and maybe the group before it (a chain: Python's `sum(losses)`) —
    as one entry, its first and last block anchored; one group of a map by its place. An
    input list naming every output of a map in order, or values of consecutive blocks
    (`concatenate`), is one entry; what reads it may have types that change with the
    length, so theirs are left out (they follow from the rest). Returns (equations,
    outputs, after offset -> position among the entries, the offsets inside maps, the
    maps' literals), or None when something cannot be named so."""
    eqns = graph.eqns
    end = i + reps * p
    rows = eqns[end:]
    n_rows = len(rows)

    def raw(a: Any, by_value: bool) -> Any:
        if type(a) is Lit:
            return ("lit", a.key() if values or by_value else a.aval.dtype.str)
        w = where[a.id]
        if w < 0:
            return w
        at, o = w >> 8, w & 255
        if at < i:
            return ("made", at, o)
        if at < end:
            k, q = divmod(at - i, p)
            return ("run", k, q, o)
        return ("after", at - end, o)

    def element(j0: int, e: int, w: int) -> tuple | None:
        """Group e of a would-be map at offset j0 of width w, named alike for every e."""
        s = j0 + e * w
        sig = []
        reads = False
        for t in range(w):
            x = rows[s + t]
            ps = _eqn_params(x)
            if ps is None or x.op == "slice":
                return None
            refs = []
            for a in x.inputs:
                r = raw(a, True)
                if type(r) is tuple:
                    if r[0] == "run":
                        r = ("step", r[1] - e, r[2], r[3])
                        reads = True
                    elif r[0] == "after":
                        if r[1] >= s:
                            r = ("own", r[1] - s, r[2])
                        elif r[1] >= s - w and (e or s >= w and all(
                                k not in members for k in range(s - w, s))):
                            # the group before (the first's: the equations before the map):
                            # a chain over the steps, such as Python's sum(losses)
                            r = ("prev", r[1] - (s - w), r[2])
                        elif r[1] >= j0:
                            return None     # reads a group before the previous one
                        elif r[1] in members:     # a group of an earlier map
                            mk, e2, t2 = members[r[1]]
                            r = ("elem", mk, e2 - e, t2, r[2])
                            reads = True
                refs.append(r)
            sig.append((x.op, ps, tuple([v.aval for v in x.outvars]), tuple(refs)))
        return tuple(sig) if reads else None

    maps: list[tuple] = []      # (offset, width, groups, first group's names)
    members: dict[int, tuple] = {}      # offset -> (map, group, position in the group)
    # (a map reads two blocks at least: most loops' after sections read only the last)
    blocks = {(where[a.id] >> 8) - i for x in rows for a in x.inputs
              if type(a) is Var and i <= where[a.id] >> 8 < end}
    j = 0 if len({b // p for b in blocks}) > 1 else n_rows
    while j < n_rows:
        found = None
        for w in range(1, MAP_WIDTH + 1):
            if j + 2 * w > n_rows:
                break
            first = element(j, 0, w)
            if first is None:
                continue
            m = 1
            while j + (m + 1) * w <= n_rows and element(j, m, w) == first:
                m += 1
            if m >= 2:
                found = (j, w, m, first)
                break
        if found is None:
            j += 1
        else:
            j0, w, m, _ = found
            if _shift(depth, end + j0, w, m, shift) is None:
                return None     # a chain deepening faster than the loop (see _shift)
            for e in range(m):
                for t in range(w):
                    members[j0 + e * w + t] = (len(maps), e, t)
            maps.append(found)
            j += w * m
    collapse: dict[Any, int] = {}
    starts_at = {m[0]: k for k, m in enumerate(maps)}
    j = n = 0
    while j < n_rows:
        k = starts_at.get(j)
        if k is None:
            collapse[j] = n
            j += 1
        else:
            collapse[("map", k)] = n
            j += maps[k][1] * maps[k][2]
        n += 1

    def named_after(r: tuple) -> tuple:
        off = r[1]
        if off in members:      # one group of a map (the last of a chain): by its place
            mk, e, t = members[off]
            return ("group", collapse[("map", mk)], _anchor(e, maps[mk][2]), t, r[2])
        return ("after", collapse[off], r[2])

    out: list = []
    changing: set[int] = set()      # offsets whose types may change with the length
    j = 0
    while j < n_rows:
        k = starts_at.get(j)
        if k is not None:
            j0, w, m, first = maps[k]
            steps = [r[1] for _, _, _, refs in first for r in refs
                     if type(r) is tuple and r[0] == "step"]
            if steps:       # a map over blocks c .. c + m - 1
                c = min(steps)
                span: tuple = (_anchor(c, reps), _anchor(c + m, reps))
            else:           # a map over the groups of an earlier map
                c = 0
                mk, d = next((r[1], r[2]) for _, _, _, refs in first for r in refs
                             if type(r) is tuple and r[0] == "elem")
                span = ("groups", collapse[("map", mk)], d, m - maps[mk][2])
            sig = []
            for op, ps, avals, refs in first:
                names = []
                for r in refs:
                    kind = r[0] if type(r) is tuple else None
                    if kind == "after":
                        r = named_after(r)
                    elif kind == "step":      # relative to the map's first block
                        r = ("step", r[1] - c, r[2], r[3])
                    elif kind == "elem":
                        r = ("elem", collapse[("map", r[1])]) + r[2:]
                    names.append(r)
                sig.append((op, ps, avals, tuple(names)))
            out.append(("map", span, w, tuple(sig)))
            j += w * m
            continue
        x = rows[j]
        ps = _eqn_params(x)
        if ps is None:
            return None
        refs = [raw(a, False) for a in x.inputs]
        names = []
        grows = False
        y = 0
        while y < len(refs):
            r = refs[y]
            kind = r[0] if type(r) is tuple else None
            if kind == "after" and r[1] in members:
                mk, e, t = members[r[1]]
                j0, w, m, first = maps[mk]
                if e == 0 and refs[y:y + m] == [("after", j0 + g * w + t, r[2])
                                                for g in range(m)]:
                    names.append(("all", collapse[("map", mk)], t, r[2]))
                    grows = True
                    y += m
                    continue
            if kind == "run":
                _, b, q, o = r
                g = 1
                while y + g < len(refs) and refs[y + g] == ("run", b + g, q, o):
                    g += 1
                if g >= 2:
                    names.append(("blocks", _anchor(b, reps), _anchor(b + g, reps), q, o))
                    grows = True
                    y += g
                    continue
                names.append(("run", _anchor(b, reps), q, o))
            elif kind == "after":
                grows = grows or r[1] in changing
                names.append(named_after(r))
            else:
                names.append(r)
            y += 1
        if grows:
            changing.add(j)
        out.append((x.op, ps, None if grows else tuple([v.aval for v in x.outvars]),
                    tuple(names)))
        j += 1
    outs = []
    for a in graph.outvars:
        r = a.key() if type(a) is Lit else raw(a, False)
        kind = r[0] if type(r) is tuple else None
        if kind == "run":
            r = ("run", _anchor(r[1], reps), r[2], r[3])
        elif kind == "after":
            r = named_after(r)
        outs.append(r)
    # the maps' literals, named by value (roll_loops compares them so too: see Template.fits)
    valued = {r[1] for m in maps for _, _, _, refs in m[3] for r in refs
              if type(r) is tuple and r[0] == "lit" and type(r[1]) is tuple}
    return tuple(out), tuple(outs), collapse, set(members), tuple(sorted(valued))


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
        count = len(seq)
        for f, d, col in zip(first, step, zip(*seq)):     # (per index, every block's)
            if col != (tuple(range(f, f + count * d, d)) if d else (f,) * count):
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

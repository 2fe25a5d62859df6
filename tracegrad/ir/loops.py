"""Loops in the IR: rolling the unrolled trace of a Python loop into a `scan`.

A trace of `for t in range(T): h = step(h, t)` holds T copies of the step. Differentiating,
optimising and preparing it for the interpreter would cost O(T) work for every new T. The
`roll_loops` pass finds the repeated block and writes it as one `scan` equation whose body is
shared by every trace with the same step (bodies are interned by structure), so the work done
per body (its linearisation for the VJP, its interpreter loop) is done once for all T. The
steps' inputs are read as one stacked array (`xs[t]` for every t is one slice of `xs`), the
work no carry needs is moved out as batched ops (`fission`), and the VJP runs over stacked
residuals (`scan_vjp`), so what is built per trace after rolling is O(1) in T."""
from __future__ import annotations

import collections
import itertools
import math
from typing import Any, Sequence

import numpy as np

from .core import Atom, Eqn, Graph, Lit, Var, remember
from .fission import aval, fission, fold_reshapes
from .passes import _frozen_params
from .rows import join_rows

_UNROLLABLE = {"custom_vjp_call"}     # runs user code when differentiated: left as traced
_BODIES: dict[Any, Graph] = {}       # the body's structure -> the one graph of it
_EQN_KEYS: dict[Any, int] = {}       # an equation up to its input variables -> an int
_KEY_INTS = itertools.count()        # atomic: threads rolling at once never share an int


def _survey(eqns: Sequence[Eqn], outvars: Sequence[Atom]
            ) -> tuple[list[int], dict[int, Eqn], dict[int, int]]:
    """In one pass: each equation's distance from the graph inputs (1 + the deepest
    producer), the equation making each variable, and how many times each variable is read
    (by an equation or as an output)."""
    depth_of: dict[int, int] = {}
    producer: dict[int, Eqn] = {}
    uses: dict[int, int] = {}
    get_depth, get_uses = depth_of.get, uses.get
    out = []
    for e in eqns:
        d = 0
        for a in e.inputs:
            if type(a) is Var:
                i = a.id
                uses[i] = get_uses(i, 0) + 1
                k = get_depth(i, 0)
                if k > d:
                    d = k
        d += 1
        out.append(d)
        for v in e.outvars:
            depth_of[v.id] = d
            producer[v.id] = e
    for a in outvars:
        if type(a) is Var:
            uses[a.id] = get_uses(a.id, 0) + 1
    return out, producer, uses


def _key_table(order: Sequence[Eqn]) -> list[int]:
    """Per equation a small int, equal for equations equal up to the identity of their input
    variables."""
    table = _EQN_KEYS
    get = table.get
    keys = []
    for pos, e in enumerate(order):
        op, ins, outs, params = e.op, e.inputs, e.outvars, e.params
        if op in _UNROLLABLE:
            keys.append(-1 - pos)
            continue
        try:     # params as given (equal dicts listed in another order only miss a roll)
            ps = (tuple(params.items()) if op != "full" else _full_params(params)) \
                if params else ()
            n = len(ins)
            if len(outs) == 1 and n <= 2 and Lit not in map(type, ins):    # most: flat
                k = (op, ps, ins[0].aval, ins[1].aval, outs[0].aval) if n == 2 else \
                    (op, ps, ins[0].aval, outs[0].aval) if n == 1 else (op, ps, outs[0].aval)
            else:
                k = ((op, tuple([a.aval if type(a) is Var else a.key() for a in ins]),
                      tuple([v.aval for v in outs])), ps)
            n = get(k)
        except TypeError:
            try:
                k = ((op, tuple([a.aval if type(a) is Var else a.key() for a in ins]),
                      tuple([v.aval for v in outs])), _frozen_params(params))
                n = get(k)
            except TypeError:      # params that cannot be hashed
                keys.append(-1 - pos)
                continue
        if n is None:   # ints are never handed out twice (bodies are keyed by them)
            n = table[k] = next(_KEY_INTS)
        keys.append(n)
    return keys


def _full_params(params: dict) -> tuple:
    """`full`'s params with the sign of a zero value told apart (-0.0 == 0.0)."""
    v = params.get("value")
    signed = isinstance(v, (float, np.floating))     # (np.float64 is not `float`)
    return tuple(params.items()) + ((math.copysign(1.0, v),) if signed else ())


def _read_from(order: Sequence[Eqn], end: int, outvars: Sequence[Atom]) -> set[int]:
    """The variables read at position `end` of `order` or later, or as outputs."""
    read = {a.id for e in order[end:] for a in e.inputs if type(a) is Var}
    read.update([a.id for a in outvars if type(a) is Var])
    return read


MIN_TRIPS = 3       # a run of fewer blocks, or of fewer equations in all, is not rolled
MIN_EQNS = 8


def roll_loops(graph: Graph, min_trips: int = MIN_TRIPS, min_eqns: int = MIN_EQNS) -> Graph:
    """`graph` with every run of >= `min_trips` repeated blocks (>= `min_eqns` equations in
    all) that passes values from one block to the next rolled into a `scan`; the graph itself
    when there is none. The equations are first put in a topological order by depth, which
    groups the steps' work on the carried values into equal blocks; the steps' work on their
    own inputs (`xs[t] @ U`), sorted ahead of the loop, then moves back into the body."""
    min_trips = max(min_trips, 2)      # a loop is at least two blocks (flow compares them)
    eqns = graph.eqns
    n = len(eqns)
    if n < min_eqns:
        return graph
    if len(_EQN_KEYS) > 1 << 16:
        _EQN_KEYS.clear()
    depth, producer, uses = _survey(eqns, graph.outvars)
    order = [eqns[i] for i in sorted(range(n), key=depth.__getitem__)]
    keys = _key_table(order)
    key_of = dict(zip(map(id, order), keys))
    nxt = [n] * n
    seen: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = seen.get(keys[i], n)
        seen[keys[i]] = i
    for past in (False, True):      # (see _roll_pass's `past`: only if nothing rolled)
        out, sunk, rolled = _roll_pass(graph, order, keys, key_of, nxt, producer, uses,
                                       min_trips, min_eqns, past)
        if rolled:
            break
    if not rolled:
        return graph
    if sunk:
        out = [e for e in out if id(e) not in sunk]
    rolled_graph = Graph(graph.invars, out, graph.outvars, graph.constvars, graph.consts)
    if any(e.op == "concatenate" for e in out):
        rolled_graph = join_rows(rolled_graph)
    return rolled_graph


def _roll_pass(graph: Graph, order: list[Eqn], keys: list[int], key_of: dict[int, int],
               nxt: list[int], producer: dict[int, Eqn], uses: dict[int, int],
               min_trips: int, min_eqns: int, past: bool) -> tuple[list, set, bool]:
    """One pass of roll_loops over `order` (equations sorted by depth): (the equations, with
    the runs rolled into scans; those moved into a body; whether any rolled). The period of
    a run starting at an equation is the distance to the next equal one; with `past`, to the
    next equal one far enough on: in a block whose equations come in equal groups (a
    two-layer RNN's three `h @ W`), the next equal one is the group's next. (Only tried when
    nothing rolled without it: where both roll, starting a block at the first of a group can
    carry more values than starting it later.)"""
    n = len(order)
    sunk: set[int] = set()
    failed: dict[tuple[int, int], int] = {}   # (key, period) -> end of the run that failed
    out: list[Eqn] = []
    rolled = False
    i = 0
    while i < n:
        j = nxt[i]
        while past and j < n and (j - i) * min_trips < min_eqns:
            j = nxt[j]
        p = j - i
        if i + min_trips * p <= n and p * min_trips >= min_eqns and \
                failed.get((keys[i], p), -1) < i + min_trips * p:
            body_keys = keys[i:i + p]
            reps = 1
            while i + (reps + 1) * p <= n and keys[i + reps * p:i + (reps + 1) * p] == body_keys:
                reps += 1
            long_enough = reps >= min_trips and p * reps >= min_eqns
            if long_enough and (j != nxt[i] and _repeats(keys, i, p) or
                                not _carried(order[i:i + p], order[i + p:i + 2 * p])):
                # a shorter block repeated (found past the next equal equation: several steps
                # of a loop too short to roll, `tanh(h @ w)`), or equal steps passing nothing
                # on (every step's `xs[t]`): not rolled
                failed[(keys[i], p)] = i + reps * p
            elif long_enough:
                blocks = [order[i + k * p:i + (k + 1) * p] for k in range(reps)]
                end = i + reps * p
                # the loop's first step may have begun before the blocks found
                turned = _rotate(blocks, order, end, producer, key_of, uses)
                if turned is not None:
                    blocks, flow, pre, end = turned
                    sunk.update(id(e) for e in pre)
                else:
                    # a flow that fails in some blocks fails in all: first tried on three
                    flow = _flow(blocks) if len(blocks) < 6 or _flow(blocks[:3]) else None
                if flow is not None:    # move the steps' own work on their inputs in
                    kept = [list(blk) for blk in blocks]
                    moved = _sink(flow[2], blocks, producer, key_of, uses, order)
                    if moved:
                        deeper = _flow(blocks)
                        if deeper is not None:
                            flow = deeper
                            sunk.update(id(e) for e in moved)
                        else:
                            blocks = kept
                if flow is not None:
                    out += _scan_eqns(blocks, flow, _read_from(order, end, graph.outvars),
                                      key_of, producer, uses, sunk)
                    rolled = True
                    pop = producer.pop   # now inside a scan: never moved into another
                    [pop(v.id, None) for e in itertools.chain.from_iterable(blocks)
                     for v in e.outvars]
                    i = end
                    continue
                failed[(keys[i], p)] = i + reps * p   # its tails would fail the same way
        out.append(order[i])
        i += 1
    return out, sunk, rolled


def _repeats(keys: list[int], i: int, p: int) -> bool:
    """Whether the block of `keys` at i, p long, is a shorter block repeated."""
    return any(p % d == 0 and keys[i:i + p - d] == keys[i + d:i + p] for d in range(1, p))


def _carried(first: list[Eqn], second: list[Eqn]) -> bool:
    """Whether block `second` reads a value block `first` makes (no loop, turned or not,
    without)."""
    made = {v.id for e in first for v in e.outvars}
    return any(type(a) is Var and a.id in made for e in second for a in e.inputs)


def _rotate(blocks: list[list[Eqn]], order: list[Eqn], end: int,
            producer: dict[int, Eqn], key_of: dict[int, int], uses: dict[int, int]
            ) -> tuple | None:
    """The blocks of a loop found mid-step (the sort by depth can put a step's first equation,
    `h @ W`, with the previous block) turned to begin where the step does: while the value a
    block's last equation passes to the next block is, for the first block, made by an equal
    equation before the loop, that equation becomes the first of a first block and every
    block gives its last equation to the next; the last one's, with the equations after the
    loop, must then make one more whole block. Returns (blocks, flow, equations taken from
    before the loop, end of the loop in `order`) or None."""
    p = len(blocks[0])
    keys = [key_of[id(e)] for e in blocks[0]]
    pre: list[Eqn] = []
    for r in range(1, p):
        last = blocks[0][-1]
        made_by_last = {v.id for v in last.outvars}
        init = next((blocks[0][j].inputs[q] for j, e in enumerate(blocks[1])
                     for q, a in enumerate(e.inputs)
                     if type(a) is Var and a.id in made_by_last), None)
        made = producer.get(init.id) if type(init) is Var else None
        if made is None or key_of.get(id(made)) != key_of[id(last)] or any(
                uses.get(v.id, 0) != sum(1 for e in blocks[0] for a in e.inputs if a is v)
                for v in made.outvars):
            return None
        blocks = [[made] + blocks[0][:-1]] + [[blocks[k - 1][-1]] + blocks[k][:-1]
                                             for k in range(1, len(blocks))]
        pre.append(made)
        keys = keys[-1:] + keys[:-1]
        # the last block's last r equations, left over, and those after the loop: one block?
        more = order[end - r:end + p - r]
        if len(more) == p and [key_of.get(id(e)) for e in more] == keys:
            whole = _flow(blocks + [more])
            if whole is not None:
                return blocks + [more], whole, pre, end + p - r
    return None


def _sink(xs: list[list[Atom]], blocks: list[list[Eqn]], producer: dict[int, Eqn],
          key_of: dict[int, int], uses: dict[int, int], order: list[Eqn]) -> list[Eqn]:
    """Prepend to each block the equations made before the loop whose results only that
    block reads, alike in every block (`xs[t] @ U` sorted ahead of the loop moves into the
    body, then what made its `xs[t]`...), in the order they had. Returns those moved."""
    groups: list[list[Eqn]] = []          # per equation moved: it in every block
    extra: list[list[Eqn]] = [[] for _ in blocks]
    seen: set[int] = set()
    work = list(xs)
    while work:
        atoms = work.pop()
        made = [producer.get(a.id) for a in atoms]
        if None in made:
            continue                      # made in the loop, or not in this graph
        ids = [id(e) for e in made]
        if not seen.isdisjoint(ids) or len(set(ids)) != len(ids):
            continue                      # moved already, or one value read by two steps
        key = key_of[ids[0]]
        if key < 0 or any([key_of[i] != key for i in ids]) or len(made[0].outvars) != 1:
            continue                      # not made alike (equal keys: equal output counts)
        if not all([uses[a.id] == 1 or uses[a.id] == sum(
                1 for e in blk + ext for b in e.inputs if b is a)
                for a, blk, ext in zip(atoms, blocks, extra)]):
            continue
        seen.update(ids)
        groups.append(made)
        for ext, e in zip(extra, made):
            ext.append(e)
        for q in range(len(made[0].inputs)):
            ins = [e.inputs[q] for e in made]
            if type(ins[0]) is Var and any(a is not ins[0] for a in ins):
                work.append(ins)
    if not groups:
        return []
    if len(groups) > 1:     # producers before their readers, as in `order`
        if len(groups) < 8:
            groups.sort(key=lambda g: order.index(g[0]))
        else:
            position = {id(e): k for k, e in enumerate(order)}
            groups.sort(key=lambda g: position[id(g[0])])
    for k, blk in enumerate(blocks):
        blk[:0] = [g[k] for g in groups]
    return [e for g in groups for e in g]


def _flow(blocks: list[list[Eqn]]) -> tuple | None:
    """How values flow into `blocks` (equal op for op), or None when not like a loop's: each
    input of a block's equation must be, in every block, the same literal, an earlier value of
    the same block, the previous block's value at one place (a carry), one outer value (a
    constant), or an outer value per block (a per-step input). Returns (per equation, per
    input: how the body reads it; the constants; the carries: (j, o) of the value -> its init;
    the per-step inputs, each as its value in every block; (where each value of the blocks
    is, its width))."""
    reps, p = len(blocks), len(blocks[0])
    width = max([len(e.outvars) for e in blocks[0]])
    stride = p * width             # value o of equation j of block k is (k * p + j) * width + o
    if width == 1 and all(e.outvars for e in blocks[0]):     # (equal blocks: one suffices)
        where = {e.outvars[0].id: c for c, e in enumerate(itertools.chain.from_iterable(blocks))}
    else:
        where = {}
        code = 0
        for blk in blocks:
            for e in blk:
                for o, v in enumerate(e.outvars):
                    where[v.id] = code + o
                code += width
    first, second = blocks[0], blocks[1]
    if not any(type(a) is Var and where.get(a.id, stride) < stride
               for e in second for a in e.inputs):
        return None                 # nothing carried: independent steps gain nothing
    consts: dict[int, Var] = {}
    carries: dict[tuple[int, int], Atom] = {}
    xs: list[list[Atom]] = []
    plan: list[list[tuple]] = []
    get = where.get
    for j in range(p):
        row = []
        for q, a0 in enumerate(first[j].inputs):
            if type(a0) is Lit:
                row.append(("lit", a0))
                continue
            c = get(a0.id)
            if c is not None:            # made earlier in the same block (block 0, so c < stride)
                if c // width >= j:
                    return None          # read before it is made: not a block in order
                for k in range(1, reps):
                    if get(blocks[k][j].inputs[q].id) != c + k * stride:
                        return None
                row.append(("in", divmod(c, width)))
                continue
            c = get(second[j].inputs[q].id)
            if c is not None:            # the previous block's value: a carry
                if c >= stride:
                    return None
                for k in range(2, reps):
                    if get(blocks[k][j].inputs[q].id) != c + (k - 1) * stride:
                        return None
                src = divmod(c, width)
                if carries.setdefault(src, a0) is not a0:
                    return None
                row.append(("carry", src))
                continue
            atoms = [blk[j].inputs[q] for blk in blocks]
            if all([a is a0 for a in atoms]):      # (a0 is not made in a block)
                consts.setdefault(a0.id, a0)
                row.append(("const", a0.id))
                continue
            if any([a.id in where for a in atoms]):
                return None              # read from another block
            row.append(("x", len(xs)))
            xs.append(atoms)
        plan.append(row)
    return plan, consts, xs, carries, (where, width)


def _scan_eqns(blocks: list[list[Eqn]], flow: tuple, after: set[int],
               key_of: dict[int, int], producer: dict[int, Eqn], uses: dict[int, int],
               dropped: set[int]) -> list[Eqn]:
    """The equations computing `blocks`: the per-step inputs stacked, the scan, and the
    per-step values read after the loop (their ids in `after`) taken out of its stacked
    outputs. Equations made dead (the steps' `xs[t]`) are added to `dropped`."""
    plan, consts, xs, carries, (where, width) = flow
    reps = len(blocks)
    first, last = blocks[0], blocks[-1]
    stride = len(first) * width
    read_after: dict[tuple[int, int], list[int]] = {}    # (j, o) -> the blocks read after
    for vid in after:
        c = where.get(vid)
        if c is not None:
            k, c = divmod(c, stride)
            src = divmod(c, width)
            if k < reps - 1 or src not in carries:     # (the last carry is the scan's)
                read_after.setdefault(src, []).append(k)
    ys = sorted(read_after)
    const_at = {vid: k for k, vid in enumerate(consts)}
    shape = (tuple([key_of[id(e)] for e in first]),
             tuple([tuple([(kind, const_at[arg]) if kind == "const" else
                           (kind,) if kind == "lit" else (kind, arg) for kind, arg in row])
                    for row in plan]), tuple(carries), tuple(ys))
    body = _BODIES.get(shape)
    if body is None:
        body = remember(_BODIES, shape, _body(first, flow, ys), 1024)
    source = first[0].source
    eqns: list[Eqn] = []
    # reads of each per-step input inside the loop: as many per block as the body reads it
    per_block = collections.Counter([arg for row in plan for kind, arg in row if kind == "x"])
    inside: dict[int, int] = {}
    for q, atoms in enumerate(xs):
        n = per_block[q]
        for a in atoms:
            inside[a.id] = inside.get(a.id, 0) + n
    stacked = [_stack(atoms, producer, eqns, source) for atoms in xs]
    still_read = {a.id for e in eqns for a in e.inputs if type(a) is Var}
    get_producer, get_uses = producer.get, uses.get
    for vid, n in inside.items():     # the steps' own slices, read by no one else, are dead now
        e = get_producer(vid)
        if e is not None and e.op == "slice" and get_uses(vid) == n and vid not in still_read:
            dropped.add(id(e))
    inputs: list[Atom] = list(consts.values()) + list(carries.values()) + stacked
    outvars = [last[j].outvars[o] for j, o in carries]
    taken: list[Eqn] = []
    for j, o in ys:
        a = first[j].outvars[o].aval
        whole = Var(aval((reps,) + a.shape, a.dtype))
        outvars.append(whole)
        for k in sorted(read_after[(j, o)]):
            v = blocks[k][j].outvars[o]
            index = ((k, k + 1, 1),) + tuple((0, d, 1) for d in a.shape)
            part = Var(aval((1,) + a.shape, a.dtype))
            taken.append(Eqn("slice", [whole], [part], {"index": index}, source))
            taken.append(Eqn("reshape", [part], [v], {"shape": a.shape}, source))
    scan = Eqn("scan", inputs, outvars, {"body": body, "length": reps,
                                         "n_consts": len(consts), "n_carry": len(carries)},
               source)
    visible = {v.id for v in scan.outvars[:len(carries)]} | {e.outvars[0].id for e in taken}
    return fold_reshapes(eqns + (fission(scan) or [scan]) + taken, visible)


def _stack(atoms: list[Atom], producer: dict[int, Eqn], eqns: list[Eqn],
           source: str | None) -> Var:
    """The per-step values `atoms` as one array stacked along a new leading axis, made by
    equations appended to `eqns`: one `slice` when they are slices of one array at evenly
    spaced positions of one axis (`xs[t]`), else a concatenate of each."""
    a = atoms[0].aval
    n = len(atoms)
    out = aval((n,) + a.shape, a.dtype)
    made = [producer.get(x.id) for x in atoms]
    axis = _evenly_spaced(made)
    if axis is not None:
        k, start, step = axis
        src = made[0].inputs[0]
        index = list(made[0].params["index"])
        index[k] = (start, start + n * step, step)
        part_shape = a.shape[:k] + (n,) + a.shape[k + 1:]
        part = Var(aval(part_shape, a.dtype))
        eqns.append(Eqn("slice", [src], [part], {"index": tuple(index)}, source))
        if k:
            perm = (k,) + tuple(i for i in range(len(a.shape)) if i != k)
            moved = Var(aval(tuple(part_shape[p] for p in perm), a.dtype))
            eqns.append(Eqn("transpose", [part], [moved], {"perm": perm}, source))
            part = moved
        whole = Var(out)
        eqns.append(Eqn("reshape", [part], [whole], {"shape": out.shape}, source))
        return whole
    one = aval((1,) + a.shape, a.dtype)
    parts = []
    for x in atoms:
        v = Var(one)
        eqns.append(Eqn("reshape", [x], [v], {"shape": one.shape}, source))
        parts.append(v)
    whole = Var(out)
    eqns.append(Eqn("concatenate", parts, [whole], {"axis": 0}, source))
    return whole


def _evenly_spaced(made: list[Eqn | None]) -> tuple[int, int, int] | None:
    """(axis, start, step) when `made` are slices of one array equal but on one axis, where
    each takes the one element start + t * step; else None."""
    e0, e1 = made[0], made[1]
    if e0 is None or e1 is None or e0.op != "slice" or e1.op != "slice":
        return None
    src, idx0 = e0.inputs[0], e0.params["index"]
    diff = [j for j, (a, b) in enumerate(zip(idx0, e1.params["index"])) if a != b]
    if len(diff) != 1:
        return None
    k = diff[0]
    head, tail = idx0[:k], idx0[k + 1:]
    if type(idx0) is tuple and len(idx0[k]) == 3 and idx0[k][1] == idx0[k][0] + 1 and \
            idx0[k][2] == 1 and e1.params["index"][k][0] != idx0[k][0]:
        # the usual `xs[t]`: each index as expected
        a = idx0[k][0]
        step = e1.params["index"][k][0] - a
        if all([e is not None and e.op == "slice" and e.inputs[0] is src and
                e.params["index"] == head + ((s, s + 1, 1),) + tail
                for e, s in zip(made, range(a, a + len(made) * step, step))]):
            return k, a, step
    starts = []
    for e in made:
        if e is None or e.op != "slice" or e.inputs[0] is not src:
            return None
        idx = e.params["index"]
        r = range(*idx[k])
        if len(r) != 1 or idx[:k] != head or idx[k + 1:] != tail:
            return None
        starts.append(r[0])
    step = starts[1] - starts[0]
    if step == 0 or any(b - a != step for a, b in zip(starts, starts[1:])):
        return None
    return k, starts[0], step


def _body(first: list[Eqn], flow: tuple, ys: list[tuple[int, int]]) -> Graph:
    """The scan body: the first block's equations reading the body's inputs."""
    plan, consts, xs, carries, _ = flow
    c_in = {vid: Var(v.aval) for vid, v in consts.items()}
    carry_src = list(carries)
    k_in = {src: Var(first[src[0]].outvars[src[1]].aval) for src in carry_src}
    x_in = [Var(atoms[0].aval) for atoms in xs]
    made: dict[tuple[int, int], Var] = {}
    eqns = []
    for j, (e, row) in enumerate(zip(first, plan)):
        ins: list[Atom] = []
        for kind, arg in row:
            if kind == "lit":
                ins.append(arg)
            elif kind == "in":
                ins.append(made[arg])
            elif kind == "carry":
                ins.append(k_in[arg])
            elif kind == "const":
                ins.append(c_in[arg])
            else:
                ins.append(x_in[arg])
        outs = [Var(v.aval) for v in e.outvars]
        for o, v in enumerate(outs):
            made[(j, o)] = v
        eqns.append(Eqn(e.op, ins, outs, e.params, e.source))
    return Graph(list(c_in.values()) + [k_in[s] for s in carry_src] + x_in, eqns,
                 [made[s] for s in carry_src] + [made[y] for y in ys])


def scans_of(graph: Graph) -> tuple[int, list[tuple[int, Graph]]]:
    """How many of `graph`'s equations are not scans, and each scan's (length, body): what
    its sizes are counted from (here and in the native backend's estimate). Remembered on the
    graph; a graph written from a template has it before its equations are written (see
    ir.template)."""
    made = graph.__dict__.get("_scans")
    if made is None:
        scans = [(e.params["length"], e.params["body"]) for e in graph.eqns if e.op == "scan"]
        made = graph.__dict__["_scans"] = (len(graph.eqns) - len(scans), scans)
    return made


def unrolled_size(graph: Graph) -> int:
    """The number of equations `graph` has with its scans unrolled; remembered on the
    graph."""
    n = graph.__dict__.get("_unrolled_size")
    if n is None:
        others, scans = scans_of(graph)
        n = others + sum(length * unrolled_size(body) for length, body in scans)
        graph.__dict__["_unrolled_size"] = n
    return n

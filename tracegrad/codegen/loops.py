"""Loop nests for fused groups: elementwise roots and reductions in one nest, and argmax/argmin.

The domain is walked in row-major order, so loads stay contiguous. The first `p` axes are
flattened into one task loop that a thread pool splits into a fixed number of tasks (fixed at
compile time, so results never depend on the thread count). Each reduction accumulates in a
stack slot (a register after SROA) over its innermost run of reduced axes, then folds into
its output; a reduction over a task-split axis writes one partial result per task, which a
combine function folds in task order afterwards."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ..ir import OPS, Eqn
from .dtypes import const, i64, is_bool, is_float, load_elem, reg_type, store_elem
from .elements import ElementReader
from .kernel import Kernel
from .plan import Group
from .scalar import TRANSCENDENTAL, intrinsic

MAX_TASKS = 64
GRAIN = 1 << 18   # work units (elements x op cost) per task; less runs as one task

_ELEMENTWISE = {"unary", "binary", "compare", "select"}
_COMBINE = {"reduce_sum": "add", "reduce_prod": "mul", "reduce_max": "max",
            "reduce_min": "min"}


def identity(op: str, dtype: np.dtype) -> ir.Constant:
    kind = _COMBINE[op]
    if kind in ("add", "mul"):
        return const(dtype, 0 if kind == "add" else 1)
    hi = kind == "min"
    if is_float(dtype):
        return const(dtype, np.inf if hi else -np.inf)
    if is_bool(dtype):
        return const(dtype, hi)
    info = np.iinfo(dtype)
    return const(dtype, info.max if hi else info.min)


def combine(b: ir.IRBuilder, op: str, acc: ir.Value, v: ir.Value, dtype: np.dtype):
    kind = _COMBINE[op]
    if is_bool(dtype):
        return b.or_(acc, v) if kind in ("add", "max") else b.and_(acc, v)
    if is_float(dtype):
        if kind == "add":   # reassociation lets the vectoriser keep one sum per lane
            return b.fadd(acc, v, flags=("reassoc",))
        if kind == "mul":
            return b.fmul(acc, v, flags=("reassoc",))
        return intrinsic(b, "llvm.maximum" if kind == "max" else "llvm.minimum", [acc, v])
    if kind == "add":
        return b.add(acc, v)
    if kind == "mul":
        return b.mul(acc, v)
    return intrinsic(b, "llvm.smax" if kind == "max" else "llvm.smin", [acc, v])


def external(k: Kernel, producers: dict) -> dict:
    """The typed pointers of the variables a group reads but does not compute."""
    return {key: p for key, p in k.ptrs.items() if isinstance(key, int) and key not in producers}


def split(group: Group) -> tuple[int, int]:
    """(p, n_tasks): how many leading axes form the task loop and into how many tasks."""
    d = group.domain
    if not d:
        return 0, 1
    cost = 1 + sum(8 if e.op in TRANSCENDENTAL else 1 for e in group.eqns)
    tasks = min(MAX_TASKS, group.size * cost // GRAIN)
    p = 1
    while p < len(d) and math.prod(d[:p]) < max(tasks, 1):
        p += 1
    outer = math.prod(d[:p])
    if tasks < 2 or outer < 2:
        return (1, 1)
    tasks = min(tasks, outer)
    chunk = -(-outer // tasks)
    return p, -(-outer // chunk)


@dataclass
class _Red:
    eqn: Eqn
    axes: frozenset
    kept: list[int]
    q: int          # first reduced axis
    e: int          # level whose loop the accumulator spans (reset before, flush after)
    partial: bool   # one output per task, folded by the combine function
    plain: bool     # the accumulator covers all it reduces: flush stores, no init needed

    @property
    def out_size(self) -> int:
        return self.eqn.out.aval.size


def reductions(group: Group, p: int, n_tasks: int) -> list[_Red]:
    n = len(group.domain)
    out = []
    for r in group.reductions:
        axes = frozenset(r.params["axes"])
        q = min(axes) if axes else n
        s = n
        while s > 0 and (s - 1) in axes:
            s -= 1
        e = s if s >= p else (0 if s == 0 else p)
        out.append(_Red(r, axes, [i for i in range(n) if i not in axes], q, e,
                        q < p and n_tasks > 1, axes == frozenset(range(e, n))))
    return out


def emit_loop_group(k: Kernel, group: Group, producers: dict, p: int, n_tasks: int,
                    partial_keys: dict[int, object],
                    block: tuple[int, bool] | None = None) -> None:
    """`block`: (chunk, columns?) for an epilogue of a 2-d matmul split the same way: task t
    covers rows (or columns) t*chunk up to (t+1)*chunk of the domain, and p must be 1."""
    b = k.b
    d = group.domain
    n = len(d)
    reads = ElementReader(b, producers, external(k, producers))
    reds = reductions(group, p, n_tasks)
    accs = {id(r): k.alloca(reg_type(r.eqn.out.aval.dtype)) for r in reds}
    idx: list = [None] * n

    def target(r: _Red) -> tuple[ir.Value, ir.Value | None]:
        if r.partial:
            return k.ptrs[partial_keys[id(r.eqn)]], b.mul(k.task, i64(r.out_size))
        return k.ptrs[r.eqn.out.id], None

    def out_ptr(r: _Red, flat: ir.Value | None = None) -> ir.Value:
        base, off = target(r)
        if flat is None:
            shape = [d[j] for j in r.kept]
            flat = reads.linear([idx[j] for j in r.kept], shape)
        if off is not None:
            flat = b.add(flat, off)
        return b.gep(base, [flat], inbounds=True)

    def fill_all(r: _Red) -> None:
        dt = r.eqn.out.aval.dtype
        k.for_range(i64(0), i64(r.out_size),
                    lambda j: store_elem(b, identity(r.eqn.op, dt), out_ptr(r, j), dt))

    def fill_from(r: _Red, level: int) -> None:   # init the outputs the loops below touch
        dt = r.eqn.out.aval.dtype
        k.for_each([j for j in r.kept if j > level], d, idx,
                   lambda: store_elem(b, identity(r.eqn.op, dt), out_ptr(r), dt))

    def reset(level: int) -> None:
        for r in reds:
            if r.e == level:
                b.store(identity(r.eqn.op, r.eqn.out.aval.dtype), accs[id(r)])

    def flush(level: int) -> None:
        for r in reds:
            if r.e != level:
                continue
            dt = r.eqn.out.aval.dtype
            v = b.load(accs[id(r)])
            ptr = out_ptr(r)
            if not r.plain:
                v = combine(b, r.eqn.op, load_elem(b, ptr, dt), v, dt)
            store_elem(b, v, ptr, dt)

    def body() -> None:
        # Evaluate same-shape elementwise members in program order first: each then finds
        # its operands memoised, so long chains never recurse deeply. Unused values are
        # removed by LLVM (all of them are pure).
        for e in group.eqns:
            if e.out.aval.shape == d and OPS[e.op].kind in _ELEMENTWISE:
                reads.value(e.out, idx)
        for v in group.roots:
            val = reads.value(v, idx)
            ptr = b.gep(k.ptrs[v.id], [reads.linear(idx, d)], inbounds=True)
            store_elem(b, val, ptr, v.aval.dtype)
        for r in reds:
            val = reads.value(r.eqn.inputs[0], idx)
            acc = accs[id(r)]
            b.store(combine(b, r.eqn.op, b.load(acc), val, r.eqn.out.aval.dtype), acc)

    def level(lv: int) -> None:
        reset(lv)
        for r in reds:
            if not r.plain and not r.partial and r.q == lv and r.q >= p:
                fill_from(r, lv)
        if lv == n:
            body()
        else:
            def step(i, lv=lv):
                idx[lv] = i
                level(lv + 1)
            start, stop = (col_lo, col_hi) if lv == 1 and cols else (i64(0), i64(d[lv]))
            k.for_range(start, stop, step)
        flush(lv)

    for r in reds:
        if not r.plain and (r.partial or r.q < p):
            fill_all(r)
    if n == 0:
        level(0)
        return
    reset(0)

    outer = math.prod(d[:p])
    chunk, cols = block if block is not None else (-(-outer // n_tasks), False)
    if cols:
        lo, hi = i64(0), i64(outer)
        col_lo, col_hi = k.task_range(d[1], chunk)
    else:
        lo, hi = k.task_range(outer, chunk)

    if _tiled(group, p, reds, block):
        def element() -> None:     # (a reduction's accumulator spans one element here)
            reset(n)
            body()
            flush(n)
        _tile_loops(k, reads, d, p, idx, lo, hi, element)
        flush(0)
        return

    def outer_step(o):
        idx[:p] = [o] if p == 1 else reads.delinear(o, d[:p])
        level(p)
    k.for_range(lo, hi, outer_step)
    flush(0)


TILE = 16                # rows and columns of a tile (see _tiled) ...
TILE_MIN_SIZE = 1 << 17  # ... for domains of at least this many elements


def _tiled(group: Group, p: int, reds: list, block: tuple | None) -> bool:
    """Whether an elementwise group runs its last two axes in TILE x TILE tiles rather than
    row by row: when it reads something through a transpose of its last axis, whose elements
    along a row of the domain are a column of the stored array, a row apart. Row by row each
    of those reads is another cache line (and page); in a tile the lines one row of the tile
    reads serve the tile's next rows too. a.T + b of 1024x1024 on the 2-vCPU Intel Xeon:
    2.80 ms row by row, 0.46 in tiles of 16 (32: 0.58, 64: 0.60; jax.jit 1.15, numpy 7.6);
    784x512: 0.25 -> 0.10 ms; a batch of them, 4x1024x1024 transposed (0, 2, 1), 11.4 ms
    row by row, against 0.90 for a plain add. Below TILE_MIN_SIZE elements the arrays stay
    in cache anyway, and narrow tiles cost more than they save (x + x.T of 300x300: 20 us
    row by row, 29 in tiles of 16). Reductions may come along where they need nothing per
    row: one over leading axes split across the tasks, each element added to its output in
    memory, keeps its order of summation (the rows of a task are still visited in order for
    each column): sum(a.T * b, axis=0) of 1024x1024 2.76 -> 0.39 ms (jax.jit 1.7-2.7); one
    over everything, one accumulator per task, sums in tile order, fixed when compiling like
    the tasks: sum(a.T) of 2048x2048 9.85 -> 2.14 ms (jax.jit 20.8). A reduction along the
    rows (its accumulator reset and stored per row) keeps the row walk."""
    d = group.domain
    return (len(d) >= 2 and p < len(d) and block is None
            and all(r.e == len(d) and not r.plain and r.q < p or r.e == 0 for r in reds)
            and d[-1] > TILE and math.prod(d[:-1] if p == len(d) - 1 else d[p:-1]) > TILE
            and math.prod(d) >= TILE_MIN_SIZE
            and any(e.op == "transpose" and e.params["perm"][-1] != len(e.params["perm"]) - 1
                    for e in group.eqns))


def _tile_loops(k: Kernel, reads: ElementReader, d: tuple, p: int, idx: list, lo: ir.Value,
                hi: ir.Value, body) -> None:
    """This task's part of the domain `d`, its last two axes tile by tile: the rows (all
    axes but the last, flattened) in bands of TILE, each band's tiles left to right, each
    tile row by row. When the task loop covers every axis but the last (p = n - 1), the rows
    are the task's range lo..hi of it; else, for each index lo..hi of the first p axes, the
    rows are the axes between. (A band may straddle two matrices of a batch: each element is
    still visited once.)"""
    b = k.b
    n = len(d)

    def clipped(start: ir.Value, end: ir.Value) -> ir.Value:
        stop = b.add(start, i64(TILE))
        return b.select(b.icmp_signed("<", stop, end), stop, end)

    def tiles(r_lo: ir.Value, r_hi: ir.Value, first: int) -> None:
        """Rows r_lo..r_hi of axes first..n-2 (flattened), in tiles."""
        shape = d[first:n - 1]

        def band(q):
            r0 = b.add(r_lo, b.mul(q, i64(TILE)))
            r1 = clipped(r0, r_hi)

            def tile(t):
                c0 = b.mul(t, i64(TILE))
                c1 = clipped(c0, i64(d[-1]))

                def row(r):
                    idx[first:n - 1] = [r] if len(shape) == 1 else reads.delinear(r, shape)

                    def col(j):
                        idx[n - 1] = j
                        body()
                    k.for_range(c0, c1, col)
                k.for_range(r0, r1, row)
            k.for_range(i64(0), i64(-(-d[-1] // TILE)), tile)
        bands = b.sdiv(b.add(b.sub(r_hi, r_lo), i64(TILE - 1)), i64(TILE))
        k.for_range(i64(0), bands, band)

    if p == n - 1:
        tiles(lo, hi, 0)
        return

    def outer_step(o):
        idx[:p] = [o] if p == 1 else reads.delinear(o, d[:p])
        tiles(i64(0), i64(math.prod(d[p:n - 1])), p)
    k.for_range(lo, hi, outer_step)


def emit_combine(k: Kernel, r: _Red, n_tasks: int, partial_key) -> None:
    """Fold the per-task partial results in task order: deterministic for any thread count."""
    b = k.b
    dt = r.eqn.out.aval.dtype
    part, out = k.ptrs[partial_key], k.ptrs[r.eqn.out.id]

    def each(j):
        acc = load_elem(b, b.gep(part, [j], inbounds=True), dt)
        for t in range(1, n_tasks):
            v = load_elem(b, b.gep(part, [b.add(j, i64(t * r.out_size))], inbounds=True), dt)
            acc = combine(b, r.eqn.op, acc, v, dt)
        store_elem(b, acc, b.gep(out, [j], inbounds=True), dt)
    k.for_range(i64(0), i64(r.out_size), each)


def emit_argreduce(k: Kernel, group: Group, producers: dict) -> None:
    """argmax/argmin along one axis: first occurrence wins, and the first NaN beats all."""
    b = k.b
    (e,) = group.reductions
    axis, d = e.params["axis"], group.domain
    x = e.inputs[0]
    dt = x.aval.dtype
    reads = ElementReader(b, producers, external(k, producers))
    best_v, best_i = k.alloca(reg_type(dt)), k.alloca(ir.IntType(64))
    kept = [j for j in range(len(d)) if j != axis]
    idx: list = [None] * len(d)
    better = ">" if e.op == "argmax" else "<"

    def inner(j):
        idx[axis] = j
        v, bv = reads.value(x, idx), b.load(best_v)
        if is_float(dt):
            upd = b.or_(b.fcmp_ordered(better, v, bv),
                        b.and_(b.fcmp_unordered("uno", v, v), b.fcmp_ordered("ord", bv, bv)))
        elif is_bool(dt):
            upd = b.icmp_unsigned(better, v, bv)
        else:
            upd = b.icmp_signed(better, v, bv)
        b.store(b.select(upd, v, bv), best_v)
        b.store(b.select(upd, j, b.load(best_i)), best_i)

    def each() -> None:     # one output: the first element, then the rest compared
        idx[axis] = reads.c(0)
        b.store(reads.value(x, idx), best_v)
        b.store(i64(0), best_i)
        k.for_range(i64(1), i64(d[axis]), inner)
        ptr = b.gep(k.ptrs[e.out.id], [reads.linear([idx[j] for j in kept],
                                                     [d[j] for j in kept])], inbounds=True)
        b.store(b.load(best_i), ptr)
    k.for_each(kept, d, idx, each)

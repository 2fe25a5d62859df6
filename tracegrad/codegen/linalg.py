"""Kernels that are not loop fusions: matmul (BLAS GEMM or a generated loop), scatter_add and
an update written in place.

GEMM choice, measured on the dev machine (2-core AMD EPYC, AVX2; one call, inputs in cache):
  8x8x8      generated loop  6 us   scipy sgemm  9 us
  32x32x32   generated loop 10 us   scipy sgemm 14 us
  64x64x64   generated loop 41 us   scipy sgemm 18 us
  128x784x512 generated loop 3.8 ms  scipy sgemm 1.4 ms (one thread)
so matmuls of at least BLAS_MIN_WORK multiply-adds call OpenBLAS ?gemm through a function
pointer (runtime/blas.py finds it), and smaller or integer ones use the i-k-j loop (vectorised over
the output row). Big GEMMs are split by rows (or batch) into pool tasks, each calling OpenBLAS
with its thread-local thread count set to 1: OpenBLAS's own threads spin after each call and
fought with our pool, making whole steps 3-10x slower on 2 cores. Each task re-packs the
operand it shares with the others, so the split is as coarse as the pool allows: one task per
thread (more only for very large GEMMs). The mlp_step GEMMs on one thread: 1 or 2 tasks
12.2 ms, 4 tasks 14.3 ms, 8 tasks 14.8 ms.

On a target with AVX-512 (`packs`), those GEMMs run as our own packed GEMM (`_panels`),
split the same way: 10-35% faster than OpenBLAS's sgemm at mlp_step's shapes on one thread,
and mlp_step from 1.67 to 1.45 ms.

Products of a few rows skip ?gemm, which packs all of B before multiplying (`few_rows`): 2 to
12 rows times a stored B run as a generated loop streaming B once, each of its rows serving
every row of C from registers (`_rows_by_k`), and up to 12 rows times a transposed B (a
backward's `g @ W.T`) read it in place as rows of dot products (`_dots`), both split by
columns across the pool. Measured, 2 threads, 2-vCPU AMD EPYC (Zen 4), best of 14 x 300 calls:
  (4..12, 784) @ (784, 512)    sgemm  76-142 us   rows  44-70 us   (16 rows: 111 vs 95;
  (4..12, 512) @ (512, 512)    sgemm  54-94 us    rows  36-49 us    20: 78 vs 106)
  (4..12, 512) @ (784, 512)^T  sgemm 142-234 us   dots  55-106 us  (16 rows: 177 vs 182)
  (1..12, 10) @ (512, 10)^T    i-k-j   8-31 us    dots   6-14 us   (16 rows: sgemm 8 vs 18)
mlp_step (best of 15 x 20 steps) at batch 4-10 went from 0.47-0.65 ms to 0.36-0.49 ms. A single
row keeps the i-k-j loop (it streams B already); from 13 rows, with a contraction shorter than
DOTS_MIN_K, and for integers, the choice is as before. The i-k-j loop of many rows (an outer
product: mlp_step's weight gradients at batch 1) is split by rows, so that the update fused
after it reads each task's block of the product from cache (`loop_tasks`): mlp_step at batch
1 went from 0.56 to 0.39 ms on the 2-vCPU Intel Xeon.

Thin products (`thin`) skip ?gemm too: a contraction of at most 16 (`_thin_k`, mlp_step's
backward (128, 10) @ (10, 512)) or a product at most 16 columns wide (`_thin_n`, its last
layer (128, 512) @ (512, 10) and weight gradient (512, 128) @ (128, 10)), from 16 rows. At these
sizes ?gemm on one thread is no faster than the generated loops (16-20 against 15-22 us), and
two ?gemm calls at once on the two threads slow each other down (a (128, 10) @ (10, 256) took
12.3 us alone, 31 us each with its other half running beside it), so splitting ?gemm gained
nothing; the generated loops split by rows. In mlp_step (2-vCPU Intel Xeon) the last layer's
forward went from 25.5 to 17.4 us and the stage of the two backward products from 54 to 41 us:
the step from 2.04 to 1.99 ms."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from llvmlite import ir

from ..ir import Var
from .dtypes import I8, I32, I64, VOID, const, i64, is_float, load_elem, store_elem
from .kernel import Kernel, if_then
from .scalar import lower_elementwise
from .plan import Group

BLAS_MIN_WORK = 1 << 16
ROWS_BY_K = range(2, 13)    # rows of a product with a stored B that `_rows_by_k` runs
KC = 64               # rows of B `_rows_by_k` reads in one chunk
DOTS_MAX_ROWS = 12    # rows of a product with a transposed B that `_dots` runs ...
DOTS_MIN_K = 8        # ... from this contraction length
THIN = 16             # a contraction this short, or a product this narrow, runs as `_thin_k`
THIN_MIN_ROWS = 16    # or `_thin_n` from this many rows ...
THIN_PACK = 1 << 16   # ... when the copy of B it may need takes at most this many bytes
THIN_R, THIN_U = 4, 2  # `_thin_k`'s block: rows by vector registers of columns
GEMM_SPLIT_WORK = 1 << 21    # multiply-adds below which a GEMM runs as one task
GEMM_TASK_WORK = 1 << 26     # at most this many multiply-adds per task (per thread round)
MAX_GEMM_TASKS = 64
MR = 8                # rows of C a block of `_panels` sums in registers
KC_PANEL = 192        # rows of B in one packed panel (192 x 2 AVX-512 registers: 24 KiB)
A_PACK_BYTES = 96 << 10     # A's rows `_panels` packs at a time (128 float32 rows x 192)
SLOT_PAR, SLOT_SGEMM, SLOT_DGEMM, SLOT_BLAS_THREADS = 0, 1, 2, 3


def gemm_dims(group: Group) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a matmul group, with 1-d operands as 1-row / 1-column matrices."""
    (a, ta), (bb, tb) = group.operands
    sa, sb = a.aval.shape, bb.aval.shape
    if ta:
        sa = sa[:-2] + (sa[-1], sa[-2])
    if tb:
        sb = sb[:-2] + (sb[-1], sb[-2])
    m = 1 if len(sa) == 1 else sa[-2]
    k = sa[-1]
    n = 1 if len(sb) == 1 else sb[-1]
    batch = math.prod(sa[:-2]) if len(sa) > 2 else 1
    return batch, m, k, n


def gemm_slot(group: Group) -> int:
    return SLOT_SGEMM if group.eqns[0].out.aval.dtype == np.float32 else SLOT_DGEMM


def uses_blas(group: Group) -> bool:
    batch, m, k, n = gemm_dims(group)
    dt = group.eqns[0].out.aval.dtype
    # A row vector times a stored matrix, or an outer product, streams B once in the i-k-j
    # loop, while ?gemm packs all of B first: mlp_step at batch 1 took 1.7 ms with sgemm.
    vector = (m == 1 and not group.operands[1][1]) or k == 1
    return is_float(dt) and m * k * n >= BLAS_MIN_WORK and not vector and \
        few_rows(group) is None and thin(group) is None


def few_rows(group: Group) -> str | None:
    """"rows" (`_rows_by_k`) or "dots" (`_dots`) for a float product of a few rows that runs
    faster as a generated loop than through ?gemm (see the module docstring); else None."""
    batch, m, k, n = gemm_dims(group)
    if batch != 1 or not is_float(group.eqns[0].out.aval.dtype):
        return None
    if group.operands[1][1]:
        return "dots" if m <= DOTS_MAX_ROWS and k >= DOTS_MIN_K else None
    return "rows" if m in ROWS_BY_K else None


def thin(group: Group) -> str | None:
    """"k" (`_thin_k`) for a float product of at least THIN_MIN_ROWS rows whose contraction is
    2 to THIN long and that is at least 2 * THIN columns wide, "n" (`_thin_n`) for one at
    most THIN columns wide with a contraction of at least THIN, which generated loops run
    faster than ?gemm (see the module docstring); else None. A B that would need a packed
    copy bigger than THIN_PACK bytes keeps ?gemm."""
    batch, m, kk, n = gemm_dims(group)
    dt = group.eqns[0].out.aval.dtype
    if batch != 1 or not is_float(dt) or m < THIN_MIN_ROWS:    # (so not `few_rows`)
        return None
    (_, ta), (_, tb) = group.operands
    packed = kk * n * dt.itemsize <= THIN_PACK
    # (an outer product, kk = 1, keeps the i-k-j loop: as `_thin_k` its SGD update at
    # mlp_step's batch 1, 784x512, was no faster, 42.5 against 41 us, within the noise)
    if 1 < kk <= THIN and n >= 2 * THIN and (packed or not tb):
        return "k"
    if 0 < n <= THIN and kk >= THIN and (packed or ta or tb):
        return "n"
    return None


def emit_matmul(k: Kernel, group: Group, blas: bool,
                split: tuple[int, int, bool], int_bits: int = 32, own: bool = False) -> None:
    """`split`: what `gemm_tasks` chose, and `int_bits` the width of ?gemm's integer
    arguments, for a BLAS matmul; `own`: run one that would call BLAS as `_panels`."""
    b = k.b
    (a, ta), (bb, tb) = group.operands
    out = group.eqns[0].out
    dt = out.aval.dtype
    batch, m, kk, n = gemm_dims(group)
    pa, pb, pc = k.ptrs[a.id], k.ptrs[bb.id], k.ptrs[out.id]
    if m * n == 0:
        return
    if kk == 0:   # an empty contraction is all zeros
        k.for_range(i64(0), i64(batch * m * n),
                    lambda j: b.store(const(dt, 0), b.gep(pc, [j], inbounds=True)))
        if group.acc is not None:
            _accumulate(k, group, (i64(0), i64(m)), (i64(0), i64(n)))
        return
    if own:
        _panels(k, group, ta, tb, pa, pb, pc, split)
        return
    if blas:
        _blas(k, group, ta, tb, pa, pb, pc, split, ir.IntType(int_bits))
        return
    # this task's rows or columns of C (see loop_tasks; split products have one batch)
    rows, cols = (i64(0), i64(m)), (i64(0), i64(n))
    if split[0] > 1:
        if split[2]:
            cols = k.task_range(n, split[1])
        else:
            rows = k.task_range(m, split[1])
    _generated(k, group, pa, pb, pc, rows, cols)
    if group.acc is not None:
        _accumulate(k, group, rows, cols)


def _scale(k: Kernel, group: Group) -> ir.Value:
    """The c of an accumulating product's w - c * p (see plan.Group.acc)."""
    c = group.acc[1]
    if isinstance(c, Var):
        return k.b.load(k.ptrs[c.id])
    return const(c.aval.dtype, c.value.item())


def _accumulate(k: Kernel, group: Group, rows: tuple, cols: tuple) -> None:
    """Rows x columns of C become w - c * C (or w + c * C): the loop the product took in,
    operation for operation (generated products; ?gemm adds onto a copy of w instead)."""
    b = k.b
    w, _, subtract = group.acc
    pw, pc = k.ptrs[w.id], k.ptrs[group.eqns[0].out.id]
    n = group.domain[1]
    c = _scale(k, group)

    def row(i):
        def col(j):
            at = b.add(b.mul(i, i64(n)), j)
            cp = b.gep(pc, [at], inbounds=True)
            t = b.fmul(c, b.load(cp))
            wv = b.load(b.gep(pw, [at], inbounds=True))
            b.store(b.fsub(wv, t) if subtract else b.fadd(wv, t), cp)
        k.for_range(*cols, col)
    k.for_range(*rows, row)


def _generated(k: Kernel, group: Group, pa, pb, pc, rows: tuple, cols: tuple) -> None:
    """Rows x columns of C = op(A) op(B) by generated loops."""
    b = k.b
    (a, ta), (bb, tb) = group.operands
    dt = group.eqns[0].out.aval.dtype
    batch, m, kk, n = gemm_dims(group)
    # element (i, j) of op(A) lives at i*sa0 + j*sa1 of the stored operand
    sa0, sa1 = (1, m) if ta else (kk, 1)
    sb0, sb1 = (1, kk) if tb else (n, 1)
    shape = thin(group)
    if shape is not None:   # (split by rows only)
        (_thin_k if shape == "k" else _thin_n)(k, dt, pa, pb, pc, kk, n, (sa0, sa1),
                                               (sb0, sb1), rows)
        return
    kind = few_rows(group)
    if kind is not None:    # (split by columns only)
        (_dots if kind == "dots" else _rows_by_k)(k, dt, pa, pb, pc, m, kk, n, sa0, sa1, *cols)
        return

    def each_batch(t):
        oa, ob, oc = (b.mul(t, i64(s)) for s in (m * kk, kk * n, m * n))

        def row(i):
            crow = b.add(oc, b.mul(i, i64(n)))
            k.for_range(*cols, lambda j: b.store(
                const(dt, 0), b.gep(pc, [b.add(crow, j)], inbounds=True)))

            def red(p):
                aip = b.load(b.gep(pa, [b.add(oa, b.add(b.mul(i, i64(sa0)),
                                                        b.mul(p, i64(sa1))))], inbounds=True))
                brow = b.add(ob, b.mul(p, i64(sb0)))

                def col(j):
                    cp = b.gep(pc, [b.add(crow, j)], inbounds=True)
                    bv = b.load(b.gep(pb, [b.add(brow, b.mul(j, i64(sb1)))], inbounds=True))
                    prod = b.fmul(aip, bv) if is_float(dt) else b.mul(aip, bv)
                    b.store(b.fadd(b.load(cp), prod) if is_float(dt) else
                            b.add(b.load(cp), prod), cp)
                k.for_range(*cols, col)
            k.for_range(i64(0), i64(kk), red)
        k.for_range(*rows, row)
    k.for_range(i64(0), i64(batch), each_batch)


def _dot(k: Kernel, acc: ir.Value, dt, pa, arow: ir.Value, sa1: int, pb, b_at: Callable,
         kk: int, reassoc: bool) -> ir.Value:
    """The sum over p < kk of A[arow + p * sa1] * B[b_at(p)], accumulated in stack slot
    `acc` from 0 in p order; with `reassoc`, reassociated (one partial sum per vector lane,
    fixed by the compiled code, as reductions do)."""
    b = k.b
    flags = ("reassoc",) if reassoc else ()
    b.store(const(dt, 0), acc)

    def red(p):
        av = b.load(b.gep(pa, [b.add(arow, b.mul(p, i64(sa1)))], inbounds=True))
        bv = b.load(b.gep(pb, [b_at(p)], inbounds=True))
        b.store(b.fadd(b.load(acc), b.fmul(av, bv), flags=flags), acc)
    k.for_range(i64(0), i64(kk), red)
    return b.load(acc)


def _rows_by_k(k: Kernel, dt, pa, pb, pc, m: int, kk: int, n: int, sa0: int, sa1: int,
               j0: ir.Value, j1: ir.Value) -> None:
    """Columns j0..j1 of C = op(A) B for a few rows (B stored row-major), B read once: for
    each block of one vector register's width of columns, the block of every row of C
    accumulates in a register over p (k-i-j order within the block), one vector load of B's
    row p serving all rows. p goes in chunks of KC rows, each chunk over all the blocks
    (partial sums kept in C), so the rows a chunk reads stay in cache from one block to the
    next even when B's row length is a power of two (its rows then share cache sets). Each
    element sums its products in p order from 0, as the i-k-j loop does: the same bits."""
    b = k.b
    ft = pc.type.pointee
    w = 32 // dt.itemsize      # an AVX2 register's elements
    u = -(-4 // m)      # registers per row: at least 4 sums at once hide the add latency
    width = w * u
    blocks = b.sdiv(b.sub(j1, j0), i64(width))
    vt = ir.VectorType(ft, w)
    accs = [[k.alloca(vt) for _ in range(u)] for _ in range(m)]
    align = dt.itemsize
    k.for_range(i64(0), i64(m), lambda i: k.for_range(j0, j1, lambda j: b.store(
        const(dt, 0), b.gep(pc, [b.add(b.mul(i, i64(n)), j)], inbounds=True))))

    def chunk(c):
        p0 = b.mul(c, i64(KC))
        p1 = b.add(p0, i64(KC))
        p1 = b.select(b.icmp_signed("<", p1, i64(kk)), p1, i64(kk))

        def block(q):
            jb = b.add(j0, b.mul(q, i64(width)))
            cps = []
            for i, row in enumerate(accs):
                cp = b.gep(pc, [b.add(i64(i * n), jb)], inbounds=True)
                cp = b.bitcast(cp, vt.as_pointer())
                cps.append(cp)
                for v, acc in enumerate(row):
                    b.store(b.load(b.gep(cp, [i64(v)], inbounds=True), align=align), acc)

            def red(p):
                bp = b.gep(pb, [b.add(b.mul(p, i64(n)), jb)], inbounds=True)
                bp = b.bitcast(bp, vt.as_pointer())
                bvs = [b.load(b.gep(bp, [i64(v)], inbounds=True), align=align)
                       for v in range(u)]
                for i, row in enumerate(accs):
                    a = b.load(b.gep(pa, [b.add(i64(i * sa0), b.mul(p, i64(sa1)))],
                                     inbounds=True))
                    av = _splat(b, a, vt)
                    for acc, bv in zip(row, bvs):
                        b.store(b.fadd(b.load(acc), b.fmul(av, bv)), acc)
            k.for_range(p0, p1, red)
            for cp, row in zip(cps, accs):
                for v, acc in enumerate(row):
                    b.store(b.load(acc), b.gep(cp, [i64(v)], inbounds=True), align=align)
        k.for_range(i64(0), blocks, block)
    k.for_range(i64(0), i64(-(-kk // KC)), chunk)
    # the columns after the last whole block, one at a time
    acc1 = k.alloca(ft)

    def col(j):
        k.for_range(i64(0), i64(m), lambda i: b.store(
            _dot(k, acc1, dt, pa, b.mul(i, i64(sa0)), sa1, pb,
                 lambda p: b.add(b.mul(p, i64(n)), j), kk, False),
            b.gep(pc, [b.add(b.mul(i, i64(n)), j)], inbounds=True)))
    k.for_range(b.add(j0, b.mul(blocks, i64(width))), j1, col)


def _dots(k: Kernel, dt, pa, pb, pc, m: int, kk: int, n: int, sa0: int, sa1: int,
          j0: ir.Value, j1: ir.Value) -> None:
    """Columns j0..j1 of C = op(A) B^T with B stored as (n, k) rows: each element is the dot
    product of a row of op(A) with a row of B, both read along p in place (no transposed
    copy). A float sum reassociates (one partial sum per vector lane, fixed by the compiled
    code: deterministic), as reductions do."""
    b = k.b
    acc = k.alloca(pc.type.pointee)

    def col(j):     # B's row j, read from cache for every row of C
        brow = b.mul(j, i64(kk))
        k.for_range(i64(0), i64(m), lambda i: b.store(
            _dot(k, acc, dt, pa, b.mul(i, i64(sa0)), sa1, pb, lambda p: b.add(brow, p), kk,
                 True),
            b.gep(pc, [b.add(b.mul(i, i64(n)), j)], inbounds=True)))
    k.for_range(j0, j1, col)


def _splat(b: ir.IRBuilder, x: ir.Value, vt: ir.VectorType) -> ir.Value:
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, vt.count), [0] * vt.count))


def _fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x * y + z rounded once (scalars or vectors)."""
    t = x.type
    scalar = t.element if isinstance(t, ir.VectorType) else t
    name = "llvm.fma." + (f"v{t.count}" if t is not scalar else "") + \
        ("f64" if isinstance(scalar, ir.DoubleType) else "f32")
    try:
        fn = b.module.get_global(name)
    except KeyError:
        fn = ir.Function(b.module, ir.FunctionType(t, [t] * 3), name)
    return b.call(fn, [x, y, z])


def _vector(b: ir.IRBuilder, p: ir.Value, at: ir.Value, vt: ir.VectorType) -> ir.Value:
    """The address of vt.count elements of p from `at` (unaligned)."""
    return b.bitcast(b.gep(p, [at], inbounds=True), vt.as_pointer())


def _lanes_sum(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The sum of v's lanes, in a fixed order: halves added until one lane is left."""
    w = v.type.count
    while w > 1:
        h = w // 2
        lo, hi = (b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(s, s + h))))
                  for s in (0, h))
        v, w = b.fadd(lo, hi), h
    return b.extract_element(v, ir.Constant(I32, 0))


def _packed(k: Kernel, src, rows: int, cols: int, strides: tuple[int, int]) -> ir.Value:
    """A stack copy, row-major (rows, cols), of the matrix whose element (r, c) is at
    r * strides[0] + c * strides[1] of `src` (see THIN_PACK for its size)."""
    b = k.b
    ft = src.type.pointee
    dst = b.bitcast(k.alloca(ir.ArrayType(ft, rows * cols)), ft.as_pointer())

    def row(r):
        k.for_range(i64(0), i64(cols), lambda c: b.store(
            b.load(b.gep(src, [b.add(b.mul(r, i64(strides[0])), b.mul(c, i64(strides[1])))],
                         inbounds=True)),
            b.gep(dst, [b.add(b.mul(r, i64(cols)), c)], inbounds=True)))
    k.for_range(i64(0), i64(rows), row)
    return dst


def _thin_k(k: Kernel, dt, pa, pb, pc, kk: int, n: int, sa: tuple, sb: tuple,
            rows: tuple) -> None:
    """Rows `rows` of C = op(A) op(B) for a contraction of at most THIN: blocks of THIN_R rows
    by THIN_U vector registers of columns, each summed in registers over the whole (unrolled)
    contraction from one vector load of B's row p and a broadcast of A's element per row.
    A transposed B is first copied row-major to the stack (it is small: kk rows). Each
    element sums its products in p order, each step one fused multiply-add (one rounding, as
    ?gemm's; a target without FMA instructions calls libm's fma)."""
    b = k.b
    ft = pc.type.pointee
    vt = ir.VectorType(ft, 32 // dt.itemsize)
    w, align = vt.count, dt.itemsize
    if sb[1] != 1:
        pb = _packed(k, pb, kk, n, sb)
    width = w * THIN_U
    blocks = n // width

    def a_at(i, p):
        return b.load(b.gep(pa, [b.add(b.mul(i, i64(sa[0])), i64(p * sa[1]))], inbounds=True))

    def c_at(i, j):
        return b.gep(pc, [b.add(b.mul(i, i64(n)), j)], inbounds=True)

    def rows_from(i0, count: int):
        def block(q):
            jb = b.mul(q, i64(width))
            sums = [[None] * THIN_U for _ in range(count)]
            for p in range(kk):
                bvs = [b.load(_vector(b, pb, b.add(i64(p * n), b.add(jb, i64(v * w))), vt),
                              align=align) for v in range(THIN_U)]
                for r in range(count):
                    av = _splat(b, a_at(b.add(i0, i64(r)), p), vt)
                    for v in range(THIN_U):
                        sums[r][v] = (b.fmul(av, bvs[v]) if p == 0 else
                                      _fma(b, av, bvs[v], sums[r][v]))
            for r in range(count):
                for v in range(THIN_U):
                    cp = c_at(b.add(i0, i64(r)), b.add(jb, i64(v * w)))
                    b.store(sums[r][v], b.bitcast(cp, vt.as_pointer()), align=align)
        k.for_range(i64(0), i64(blocks), block)

        def col(j):     # the columns after the last whole block
            for r in range(count):
                total = None
                for p in range(kk):
                    a = a_at(b.add(i0, i64(r)), p)
                    bv = b.load(b.gep(pb, [b.add(i64(p * n), j)], inbounds=True))
                    total = b.fmul(a, bv) if p == 0 else _fma(b, a, bv, total)
                b.store(total, c_at(b.add(i0, i64(r)), j))
        k.for_range(i64(blocks * width), i64(n), col)

    r0, r1 = rows
    whole = b.sdiv(b.sub(r1, r0), i64(THIN_R))
    k.for_range(i64(0), whole, lambda q: rows_from(b.add(r0, b.mul(q, i64(THIN_R))), THIN_R))
    k.for_range(b.add(r0, b.mul(whole, i64(THIN_R))), r1, lambda i: rows_from(i, 1))


def _thin_n(k: Kernel, dt, pa, pb, pc, kk: int, n: int, sa: tuple, sb: tuple,
            rows: tuple) -> None:
    """Rows `rows` of C = op(A) op(B) for a product at most THIN columns wide, all n sums of
    a row (or of a vector of rows) in registers at once:
    - op(A) stored transposed (its columns contiguous): a vector of rows of C per register,
      from a vector load of A's row p and a broadcast of B's element (p, j) per column;
    - else each element a dot product along p of A's row with B's column, a vector of
      partial sums per column (B copied transposed to the stack if it is stored row-major),
      the lanes then added in a fixed order and the last kk % w products after them.
    Float sums reassociate this way, deterministically (as `_dots`' do), each step one fused
    multiply-add; a row computes the same way whichever task it falls to (the rows after
    the last whole vector of a task's rows, as a vector lane would), so the split by rows
    does not change results."""
    b = k.b
    ft = pc.type.pointee
    vt = ir.VectorType(ft, 32 // dt.itemsize)
    w, align = vt.count, dt.itemsize
    sums = [k.alloca(vt) for _ in range(n)]
    zero = ir.Constant(vt, [0.0] * w)
    r0, r1 = rows

    def c_at(i, j: int):
        return b.gep(pc, [b.add(b.mul(i, i64(n)), i64(j))], inbounds=True)

    if sa[0] == 1 and sa[1] != 1:      # op(A)[i, p] at i + p * (A's rows)
        def block(q):
            i0 = b.add(r0, b.mul(q, i64(w)))
            for s in sums:
                b.store(zero, s)

            def red(p):
                av = b.load(_vector(b, pa, b.add(i0, b.mul(p, i64(sa[1]))), vt), align=align)
                for j, s in enumerate(sums):
                    bv = b.load(b.gep(pb, [b.add(b.mul(p, i64(sb[0])), i64(j * sb[1]))],
                                      inbounds=True))
                    b.store(_fma(b, av, _splat(b, bv, vt), b.load(s)), s)
            k.for_range(i64(0), i64(kk), red)
            for j, s in enumerate(sums):
                v = b.load(s)
                for r in range(w):
                    b.store(b.extract_element(v, ir.Constant(I32, r)),
                            c_at(b.add(i0, i64(r)), j))
        whole = b.sdiv(b.sub(r1, r0), i64(w))
        k.for_range(i64(0), whole, block)
        one = [k.alloca(ft) for _ in range(n)]

        def row(i):     # the rows after the last whole vector of them, as one lane would be
            for s in one:
                b.store(const(dt, 0), s)

            def red(p):
                a = b.load(b.gep(pa, [b.add(i, b.mul(p, i64(sa[1])))], inbounds=True))
                for j, s in enumerate(one):
                    bv = b.load(b.gep(pb, [b.add(b.mul(p, i64(sb[0])), i64(j * sb[1]))],
                                      inbounds=True))
                    b.store(_fma(b, a, bv, b.load(s)), s)
            k.for_range(i64(0), i64(kk), red)
            for j, s in enumerate(one):
                b.store(b.load(s), c_at(i, j))
        k.for_range(b.add(r0, b.mul(whole, i64(w))), r1, row)
        return
    # op(A)[i, p] at i * kk + p; B's column j wanted at j * kk + p
    if sb[0] != 1:
        pb = _packed(k, pb, n, kk, (sb[1], sb[0]))
    tails = [k.alloca(ft) for _ in range(n)]
    chunks = kk // w

    def row(i):
        arow = b.mul(i, i64(kk))
        for s in sums:
            b.store(zero, s)

        def red(q):
            p = b.mul(q, i64(w))
            av = b.load(_vector(b, pa, b.add(arow, p), vt), align=align)
            for j, s in enumerate(sums):
                bv = b.load(_vector(b, pb, b.add(i64(j * kk), p), vt), align=align)
                b.store(_fma(b, av, bv, b.load(s)), s)
        k.for_range(i64(0), i64(chunks), red)
        for s, t in zip(sums, tails):
            b.store(_lanes_sum(b, b.load(s)), t)

        def rest(p):
            a = b.load(b.gep(pa, [b.add(arow, p)], inbounds=True))
            for j, t in enumerate(tails):
                bv = b.load(b.gep(pb, [b.add(i64(j * kk), p)], inbounds=True))
                b.store(_fma(b, a, bv, b.load(t)), t)
        k.for_range(i64(chunks * w), i64(kk), rest)
        for j, t in enumerate(tails):
            b.store(b.load(t), c_at(i, j))
    k.for_range(r0, r1, row)


LOOP_SPLIT_WORK = 1 << 18    # multiply-adds from which a generated product is split
SPLIT_MIN_ROWS = 16          # rows of C per task, at least, for a split by rows
SPLIT_MIN_OUT = 1 << 15      # ... and elements of C from which a short contraction splits


def loop_tasks(group: Group, threads: int) -> tuple[int, int, bool]:
    """(tasks, rows or columns per task, split columns?) for a generated matmul of one batch
    big enough to split: a product of a few rows (`few_rows`) by columns, the i-k-j loop of
    at least 2 * SPLIT_MIN_ROWS rows (an outer product: mlp_step's weight gradients at batch
    1) and a thin product (`thin`) of as many by rows. (A row vector times B stays one
    task: split by columns it measured slower, a (1, 300) @ (300, 1000) with its bias and
    tanh 31 against 22 us.)
    Each task then writes its own block of C, and an epilogue fused into the product (the
    SGD update) reads that block while it is in cache instead of C coming back from memory:
    at batch 1 the 784x512 update took 245 us after the product as one task, 94 split, and
    512x300 42 against 22 (so an outer product splits by its size, SPLIT_MIN_OUT, not by
    its multiply-adds).
    Each element is still summed by one task in one order, so the split never changes
    results. Batched products run as one task."""
    batch, m, kk, n = gemm_dims(group)
    if threads < 2 or batch != 1 or kk == 0:     # (an empty contraction: zeros, one task)
        return 1, m, False
    work = m * kk * n
    if few_rows(group) is None and m >= 2 * SPLIT_MIN_ROWS and \
            (work >= LOOP_SPLIT_WORK or m * n >= SPLIT_MIN_OUT):
        tasks = min(threads, m // SPLIT_MIN_ROWS)
        chunk = -(-m // tasks)
        return -(-m // chunk), chunk, False
    if few_rows(group) is None or work < LOOP_SPLIT_WORK or n < 64:
        return 1, m, False
    tasks = min(threads, n // 32)
    chunk = -(-n // tasks)
    return -(-n // chunk), chunk, True


def gemm_tasks(group: Group, threads: int) -> tuple[int, int, bool]:
    """(tasks, rows or columns per task, split columns?) for a BLAS matmul on a pool of
    `threads`. Big ones are split along M or N, whichever makes each task re-pack the smaller
    operand (a row split re-packs all of B per task, a column split all of A), into a multiple
    of `threads` tasks. Tasks are fixed when compiling, so one compiled function gives the
    same bits on any pool; but a split hands ?gemm other sub-products, which OpenBLAS may
    block (and so sum) otherwise: code compiled for another thread count can differ in the
    last bits (review: (7, 300) @ (300, 1000), 29 elements up to 1.7e-5 apart)."""
    batch, m, kk, n = gemm_dims(group)
    work = batch * m * kk * n
    if threads < 2 or work < GEMM_SPLIT_WORK:
        return 1, m, False
    rounds = -(-work // (threads * GEMM_TASK_WORK))
    tasks = min(MAX_GEMM_TASKS, threads * rounds)
    if batch > 1:
        return batch, m, False
    cols = m < n
    dim = n if cols else m
    tasks = min(tasks, dim // 32)
    if tasks < 2:
        return 1, m, False
    chunk = -(-dim // tasks)
    return -(-dim // chunk), chunk, cols


def _blas(k: Kernel, group: Group, ta: bool, tb: bool, pa, pb, pc,
          split: tuple[int, int, bool], it: ir.IntType) -> None:
    """Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T through ?gemm."""
    b = k.b
    batch, m, kk, n = gemm_dims(group)
    tasks, chunk, cols = split
    ft = pa.type.pointee
    ip = it.as_pointer()
    fnty = ir.FunctionType(VOID, [I8.as_pointer()] * 2 + [ip] * 3 + [ft.as_pointer()] * 2
                           + [ip] + [ft.as_pointer()] + [ip] + [ft.as_pointer()] * 2
                           + [ip])
    fp = b.bitcast(k.ptrs["gemm"], fnty.as_pointer())

    def cell(t: ir.Type, v) -> ir.Value:
        p = k.alloca(t)
        b.store(v if isinstance(v, ir.Value) else ir.Constant(t, v), p)
        return p

    # the thread-local OpenBLAS thread count is set to 1 around our calls, then restored
    set_threads = k.ptrs["blas_threads"]
    has_setter = b.icmp_unsigned("!=", set_threads, ir.Constant(set_threads.type, None))
    setter = b.bitcast(set_threads, ir.FunctionType(I32, [I32]).as_pointer())
    old = k.alloca(I32)
    b.store(ir.Constant(I32, 0), old)
    if_then(b, has_setter, lambda: b.store(b.call(setter, [ir.Constant(I32, 1)]), old))

    trans_b = cell(I8, ord("T") if tb else ord("N"))
    trans_a = cell(I8, ord("T") if ta else ord("N"))
    kp = cell(it, kk)
    lda = cell(it, kk if tb else n)    # leading dim of the stored B
    ldb = cell(it, m if ta else kk)    # leading dim of the stored A
    ldc = cell(it, n)
    if group.acc is None:
        alpha, beta = cell(ft, 1.0), cell(ft, 0.0)
    else:   # C = w - c * op(A) op(B): alpha = -c onto a copy of w's block (beta = 1)
        c = _scale(k, group)
        alpha, beta = cell(ft, b.fneg(c) if group.acc[2] else c), cell(ft, 1.0)
        pw = k.ptrs[group.acc[0].id]    # (never C's buffer: both live at this stage)

    def call(t, r0, nrows, c0=None, ncols=None):
        # rows r0.. of op(A) start at r0 * (row stride) of the stored A, columns c0.. of
        # op(B) at c0 * (column stride) of the stored B; C's block at r0 * n + c0
        c0 = i64(0) if c0 is None else c0
        ncols = ir.Constant(it, n) if ncols is None else ncols
        ob = b.add(b.mul(t, i64(kk * n)), b.mul(c0, i64(kk if tb else 1)))
        oc = b.add(b.add(b.mul(t, i64(m * n)), b.mul(r0, i64(n))), c0)
        oa = b.add(b.mul(t, i64(m * kk)), b.mul(r0, i64(1 if ta else kk)))
        if group.acc is not None:
            wide = (lambda v: v) if it.width == 64 else (lambda v: b.sext(v, I64))
            _copy_block(k, pw, pc, oc, wide(nrows), wide(ncols), n)
        b.call(fp, [trans_b, trans_a, cell(it, ncols), cell(it, nrows), kp, alpha,
                    b.gep(pb, [ob], inbounds=True), lda,
                    b.gep(pa, [oa], inbounds=True), ldb, beta,
                    b.gep(pc, [oc], inbounds=True), ldc])

    if tasks == 1:
        k.for_range(i64(0), i64(batch), lambda t: call(t, i64(0), ir.Constant(it, m)))
    elif batch > 1:
        call(k.task, i64(0), ir.Constant(it, m))
    else:
        start = b.mul(k.task, i64(chunk))
        left = b.sub(i64(n if cols else m), start)
        left = left if it.width == 64 else b.trunc(left, it)
        size = b.select(b.icmp_signed("<", left, ir.Constant(it, chunk)), left,
                        ir.Constant(it, chunk))
        if cols:
            call(i64(0), i64(0), ir.Constant(it, m), start, size)
        else:
            call(i64(0), start, size)
    if_then(b, has_setter, lambda: b.call(setter, [b.load(old)]))


def packs(group: Group, vector_bits: int) -> bool:
    """Whether a matmul big enough for ?gemm (`uses_blas`; whether or not a BLAS is found)
    runs as `_panels` instead: on a target with 512-bit vectors (32 registers: its block of
    MR x 2 vectors sums in 16 of them), for a product at least one panel (2 vectors) wide."""
    batch, m, kk, n = gemm_dims(group)
    dt = group.eqns[0].out.aval.dtype
    return vector_bits >= 512 and uses_blas(group) and n >= 2 * (64 // dt.itemsize)


def _panels(k: Kernel, group: Group, ta: bool, tb: bool, pa, pb, pc,
            split: tuple[int, int, bool]) -> None:
    """C = op(A) op(B) as a packed GEMM of our own (BLIS's loops): for each block of at
    most KC_PANEL of the contraction, and each chunk of up to A_PACK_BYTES of A's rows,
    the chunk is packed to the stack in slices of MR rows (p-major, MR elements per p: what
    the block of C reads by broadcasts, contiguous), then each panel of NR = 2 vector
    registers of B's columns is packed (contiguous, kept in L1; a transposed B, and a
    row-major A, in squares transposed in registers), and each slice of the chunk sums its
    products with the panel in MR x 2 registers: per p, two vector loads of the panel's row
    and one broadcast per row. Partial sums go to C between blocks of the contraction; the
    last block stores an accumulating product's w - c * p (`Group.acc`) directly. Each
    element sums its products in p order, one fused multiply-add each, whatever the task
    split: the same bits on any pool.
    Edges are static (shapes are): a last panel narrower than NR is zero-padded in the
    buffer and stored element by element, a last slice of rows has its own MR.
    Measured, one thread (2-vCPU Intel Xeon, AVX-512; best of 3 x 300 calls, 2 runs),
    against OpenBLAS's sgemm in numpy: (128, 784) @ (784, 512) 571-594 us against 701-705;
    (128, 512) @ (512, 512)^T 379-389 against 479-490 (445 with B transposed by scalar
    copies); (512, 128)^T @ (128, 512) 332-367 against 540-562; (784, 128)^T @ (128, 512)
    548-572 against 600-650 (593-632 with A read in place: its rows alias in L1 where their
    stride is a multiple of 4 KiB). Square products on 2 threads, against numpy's sgemm on
    2 threads: 512^3 1.10-1.13x its speed, 1024^3 0.77-0.90x (?gemm split as our tasks:
    0.61-0.79x). In mlp_step the step went from 1.67 to 1.46 ms."""
    gemm = _PanelGemm(k, group, ta, tb, pa, pb, pc)
    b = k.b
    batch, m, kk, n = gemm_dims(group)
    tasks, chunk, cols = split
    if tasks == 1:
        k.for_range(i64(0), i64(batch), lambda t: gemm.product(t, i64(0), m, i64(0), n))
        return
    if batch > 1:
        gemm.product(k.task, i64(0), m, i64(0), n)
        return
    start = b.mul(k.task, i64(chunk))
    rest = (n if cols else m) - (tasks - 1) * chunk

    def share(size: int):
        if cols:
            gemm.product(i64(0), i64(0), m, start, size)
        else:
            gemm.product(i64(0), start, size, i64(0), n)
    if rest == chunk:
        share(chunk)
        return
    with b.if_else(b.icmp_signed("==", k.task, i64(tasks - 1))) as (last, other):
        with last:
            share(rest)
        with other:
            share(chunk)


class _ProbedAttributes(ir.values.FunctionAttributes):
    """A function's attributes, plus stack probes: a frame of more than a page (the packing
    buffers of `_panels`, ~120 KiB) touches each page as it grows, so a thread whose stack
    is too small faults on its guard page instead of writing past it."""

    def _to_list(self, ret_type):
        return [*super()._to_list(ret_type), '"probe-stack"="inline-asm"']


class _PanelGemm:
    """The code of `_panels` for one matmul group: its shapes, operands, packing buffer and
    the stack slots of its sums."""

    def __init__(self, k: Kernel, group: Group, ta: bool, tb: bool, pa, pb, pc):
        fn = k.body_fn
        if not isinstance(fn.attributes, _ProbedAttributes):
            fn.attributes = _ProbedAttributes([*fn.attributes, "nounwind"])
        self.k, self.b = k, k.b
        self.ta, self.tb, self.pa, self.pb, self.pc = ta, tb, pa, pb, pc
        _, self.m, self.kk, self.n = gemm_dims(group)
        dt = group.eqns[0].out.aval.dtype
        self.align = dt.itemsize
        self.w = 64 // dt.itemsize              # lanes of a 512-bit register
        self.vt = ir.VectorType(pc.type.pointee, self.w)
        self.nr = 2 * self.w
        self.blocks = -(-self.kk // KC_PANEL)
        self.kc = -(-self.kk // self.blocks)
        # rows of A packed at a time: MR-row slices, each p-major (MR elements per p)
        self.mc = max(MR, A_PACK_BYTES // (self.kc * dt.itemsize) // MR * MR)
        self.buf, self.abuf = (self._stack(pc.type.pointee, size)
                               for size in (self.kc * self.nr, self.mc * self.kc))
        self.sums = [[k.alloca(self.vt) for _ in range(2)] for _ in range(MR)]
        self.zero = ir.Constant(self.vt, [0.0] * self.w)
        self.acc = None
        if group.acc is not None:   # C = w -/+ c * product: -c or c onto w in the last block
            c = _scale(k, group)
            self.acc = (_splat(self.b, self.b.fneg(c) if group.acc[2] else c, self.vt),
                        k.ptrs[group.acc[0].id])

    def _stack(self, ft: ir.Type, size: int) -> ir.Value:
        slot = self.k.alloca(ir.ArrayType(ft, size))
        slot.align = 64
        return self.b.bitcast(slot, ft.as_pointer())

    def product(self, t, r0, rows: int, c0, width: int) -> None:
        """Rows r0 .. r0 + rows by columns c0 .. c0 + width of batch t's C."""
        k, b, kc, nr, mc = self.k, self.b, self.kc, self.nr, self.mc
        offsets = [b.mul(t, i64(s)) for s in (self.m * self.kk, self.kk * self.n,
                                             self.m * self.n)]

        def block(q):
            p0 = b.mul(q, i64(kc))
            left = b.sub(i64(self.kk), p0)
            size = b.select(b.icmp_signed("<", left, i64(kc)), left, i64(kc))
            where = (offsets, p0, size, b.icmp_signed("==", q, i64(0)),
                     b.icmp_signed("==", q, i64(self.blocks - 1)))

            def chunk(i0, count: int):     # rows i0 .. i0 + count of C, A's packed first
                self.pack_a(offsets[0], i0, count, p0, size)

                def panel(j0, cols: int):
                    self.pack(offsets[1], p0, size, j0, cols)
                    full = count // MR
                    if full:
                        k.for_range(i64(0), i64(full), lambda s: self.micro(
                            where, i0, s, MR, j0, cols))
                    if count % MR:
                        self.micro(where, i0, i64(full), count % MR, j0, cols)
                whole = width // nr
                if whole:
                    k.for_range(i64(0), i64(whole),
                                lambda jp: panel(b.add(c0, b.mul(jp, i64(nr))), nr))
                if width % nr:
                    panel(b.add(c0, i64(whole * nr)), width % nr)
            if rows // mc:
                k.for_range(i64(0), i64(rows // mc),
                            lambda ic: chunk(b.add(r0, b.mul(ic, i64(mc))), mc))
            if rows % mc:
                chunk(b.add(r0, i64(rows // mc * mc)), rows % mc)
        k.for_range(i64(0), i64(self.blocks), block)

    def pack_a(self, oa, i0, count: int, p0, size) -> None:
        """Rows i0 .. i0 + count of op(A), its columns p0 .. p0 + size, into `abuf`: slice s
        (rows i0 + s * MR ..) from s * MR * kc, element (i, p) of it at p * MR + i (a
        transposed A: MR-element copies; else MR x MR squares transposed in registers)."""
        k, b, align, kc = self.k, self.b, self.align, self.kc
        st = ir.VectorType(self.vt.element, MR)
        sa0, sa1 = (1, self.m) if self.ta else (self.kk, 1)

        def a_at(i, p):     # (i, p) of op(A), i from i0 and p from p0
            return b.add(oa, b.add(b.mul(b.add(i0, i), i64(sa0)),
                                   b.mul(b.add(p0, p), i64(sa1))))

        def to(s, p, i: int = 0):
            return b.add(b.mul(s, i64(MR * kc)), b.add(b.mul(p, i64(MR)), i64(i)))

        def whole(s):
            r = b.mul(s, i64(MR))
            if self.ta:
                k.for_range(i64(0), size, lambda p: b.store(
                    b.load(_vector(b, self.pa, a_at(r, p), st), align=align),
                    _vector(b, self.abuf, to(s, p), st), align=align))
                return
            squares = b.sdiv(size, i64(MR))
            done = b.mul(squares, i64(MR))

            def square(q):
                p = b.mul(q, i64(MR))
                rows = [b.load(_vector(b, self.pa, a_at(b.add(r, i64(i)), p), st), align=align)
                        for i in range(MR)]
                for c, x in enumerate(_transposed(b, rows)):
                    b.store(x, _vector(b, self.abuf, to(s, b.add(p, i64(c))), st), align=align)
            k.for_range(i64(0), squares, square)
            k.for_range(done, size, lambda p: [
                b.store(b.load(b.gep(self.pa, [a_at(b.add(r, i64(i)), p)], inbounds=True)),
                        b.gep(self.abuf, [to(s, p, i)], inbounds=True))
                for i in range(MR)])
        if count // MR:
            k.for_range(i64(0), i64(count // MR), whole)
        if count % MR:
            s = i64(count // MR)
            k.for_range(i64(0), size, lambda p: [
                b.store(b.load(b.gep(self.pa, [a_at(i64(count // MR * MR + i), p)],
                                     inbounds=True)),
                        b.gep(self.abuf, [to(s, p, i)], inbounds=True))
                for i in range(count % MR)])

    def pack(self, ob, p0, size, j0, width: int) -> None:
        """Rows p0 .. p0 + size of op(B)'s columns j0 .. j0 + width into the buffer, row p at
        p * nr, zeros past `width`."""
        k, b, w, nr, vt, buf = self.k, self.b, self.w, self.nr, self.vt, self.buf
        kk, n, pb, align = self.kk, self.n, self.pb, self.align

        def at(p, v: int):
            return _vector(b, buf, b.add(b.mul(p, i64(nr)), i64(v * w)), vt)
        if not self.tb and width == nr:
            def row(p):
                src = b.add(ob, b.add(b.mul(b.add(p0, p), i64(n)), j0))
                for v in range(2):
                    x = b.load(_vector(b, pb, b.add(src, i64(v * w)), vt), align=align)
                    b.store(x, at(p, v), align=align)
            k.for_range(i64(0), size, row)
            return
        done = i64(0)
        if self.tb and width == nr:  # w x w squares of B's rows, transposed in registers
            squares = b.sdiv(size, i64(w))
            done = b.mul(squares, i64(w))

            def square(q):
                p = b.mul(q, i64(w))
                for v in range(2):
                    rows = [b.load(_vector(b, pb, b.add(ob, b.add(
                        b.mul(b.add(j0, i64(v * w + r)), i64(kk)), b.add(p0, p))), vt),
                        align=align) for r in range(w)]
                    for c, x in enumerate(_transposed(b, rows)):
                        b.store(x, at(b.add(p, i64(c)), v), align=align)
            k.for_range(i64(0), squares, square)

        def col(j):     # (a transposed B: along its row j0 + j)
            at_j = b.add(j0, j)

            def row(p):
                src = (b.add(b.mul(at_j, i64(kk)), b.add(p0, p)) if self.tb else
                       b.add(b.mul(b.add(p0, p), i64(n)), at_j))
                b.store(b.load(b.gep(pb, [b.add(ob, src)], inbounds=True)),
                        b.gep(buf, [b.add(b.mul(p, i64(nr)), j)], inbounds=True))
            k.for_range(done, size, row)
        k.for_range(i64(0), i64(width), col)
        if width < nr:
            zero = ir.Constant(vt.element, 0.0)
            k.for_range(i64(0), size, lambda p: k.for_range(
                i64(width), i64(nr), lambda j: b.store(
                    zero, b.gep(buf, [b.add(b.mul(p, i64(nr)), j)], inbounds=True))))

    def micro(self, where, r0, s, mr: int, j0, width: int) -> None:
        """Rows of packed slice s (mr of them, from r0 + s * MR) of C by the packed panel's
        columns j0 .. j0 + width: sums in registers over the block's p, started from C's
        partial sums after the first block."""
        k, b, w, vt, align = self.k, self.b, self.w, self.vt, self.align
        (_, _, oc), _, size, first, last = where
        i0 = b.add(r0, b.mul(s, i64(MR)))
        nv = -(-width // w)
        sums = self.sums

        def c_at(i: int, v: int):
            return b.add(oc, b.add(b.mul(b.add(i0, i64(i)), i64(self.n)),
                                   b.add(j0, i64(v * w))))

        def load(p, i: int, v: int):    # C's (or w's) elements, zeros past the panel
            lanes = min(w, width - v * w)
            if lanes == w:
                return b.load(_vector(b, p, c_at(i, v), vt), align=align)
            x = self.zero
            for e in range(lanes):
                x = b.insert_element(x, b.load(b.gep(p, [b.add(c_at(i, v), i64(e))],
                                                     inbounds=True)), ir.Constant(I32, e))
            return x

        def store(x, i: int, v: int):
            lanes = min(w, width - v * w)
            if lanes == w:
                b.store(x, _vector(b, self.pc, c_at(i, v), vt), align=align)
                return
            for e in range(lanes):
                b.store(b.extract_element(x, ir.Constant(I32, e)),
                        b.gep(self.pc, [b.add(c_at(i, v), i64(e))], inbounds=True))

        for i in range(mr):
            for v in range(nv):
                start = self.zero if self.blocks == 1 else \
                    b.select(first, self.zero, load(self.pc, i, v))
                b.store(start, sums[i][v])
        a_slice = b.mul(s, i64(MR * self.kc))

        def step(p):
            bvs = [b.load(_vector(b, self.buf, b.add(b.mul(p, i64(self.nr)), i64(v * w)), vt),
                          align=64) for v in range(nv)]    # (rows of nr: 128 bytes)
            at = b.add(a_slice, b.mul(p, i64(MR)))
            for i in range(mr):
                a = b.load(b.gep(self.abuf, [b.add(at, i64(i))], inbounds=True))
                av = _splat(b, a, vt)
                for v in range(nv):
                    b.store(_fma(b, av, bvs[v], b.load(sums[i][v])), sums[i][v])
        k.for_range(i64(0), size, step)
        for i in range(mr):
            for v in range(nv):
                x = b.load(sums[i][v])
                if self.acc is not None:
                    scale, pw = self.acc
                    done = _fma(b, scale, x, load(pw, i, v))
                    x = done if self.blocks == 1 else b.select(last, done, x)
                store(x, i, v)


def _transposed(b: ir.IRBuilder, rows: list) -> list:
    """The columns of the square matrix whose rows are the vectors `rows` (w of w lanes):
    log2(w) rounds, each swapping the off-diagonal blocks of size d of every 2d x 2d block
    by two-source shuffles."""
    w = len(rows)
    rows = list(rows)
    d = w // 2
    while d:
        lo = ir.Constant(ir.VectorType(I32, w), [c if c & d == 0 else w + c - d
                                                 for c in range(w)])
        hi = ir.Constant(ir.VectorType(I32, w), [c + d if c & d == 0 else w + c
                                                 for c in range(w)])
        for i in range(w):
            if i & d == 0:
                x, y = rows[i], rows[i + d]
                rows[i], rows[i + d] = b.shuffle_vector(x, y, lo), b.shuffle_vector(x, y, hi)
        d //= 2
    return rows


def _copy_block(k: Kernel, src, dst, at: ir.Value, nrows: ir.Value, ncols: ir.Value,
                n: int) -> None:
    """nrows rows of ncols elements from offset `at` of `src` to the same place in `dst`
    (row-major, rows of n)."""
    b = k.b

    def row(i):
        start = b.add(at, b.mul(i, i64(n)))
        k.for_range(i64(0), ncols, lambda j: b.store(
            b.load(b.gep(src, [b.add(start, j)], inbounds=True)),
            b.gep(dst, [b.add(start, j)], inbounds=True)))
    k.for_range(i64(0), nrows, row)


def _scattered(k: Kernel, e, g, ind, size: int,
               write: Callable[[ir.Value, ir.Value], None]) -> None:
    """The loops of a scatter: for each entry (pre, m, post) of the updates `g` (an array
    pre x mid x post, idx of mid entries along the axis of `size` at e.out), in order,
    write(the updates' element offset, the output's). Indices wrap once if negative and are
    then clamped (as take reads them); a zero-size axis writes nothing. g and idx may be
    (0-d) literals (`write` gets offset 0 then)."""
    b = k.b
    axis = e.params["axis"]
    pre = math.prod(e.out.aval.shape[:axis])
    mid = ind.aval.size
    post = math.prod(g.aval.shape[axis + ind.aval.ndim:])
    pi = k.ptrs[ind.id] if isinstance(ind, Var) else None

    def outer(i):
        def each(m):
            j = b.load(b.gep(pi, [m], inbounds=True)) if pi is not None else \
                i64(int(ind.value))
            if j.type != I64:
                j = b.sext(j, I64)
            j = b.select(b.icmp_signed("<", j, i64(0)), b.add(j, i64(size)), j)
            # clamp like take does, so the gradient lands where the forward read
            j = b.select(b.icmp_signed("<", j, i64(0)), i64(0), j)
            j = b.select(b.icmp_signed(">", j, i64(size - 1)), i64(max(size - 1, 0)), j)
            ok = b.icmp_unsigned("<", j, i64(size))
            fn = b.block.function
            yes, done = fn.append_basic_block("in"), fn.append_basic_block("skip")
            b.cbranch(ok, yes, done)
            b.position_at_end(yes)
            src = b.mul(b.add(b.mul(i, i64(mid)), m), i64(post))
            dst = b.mul(b.add(b.mul(i, i64(size)), j), i64(post))
            k.for_range(i64(0), i64(post), lambda c: write(b.add(src, c), b.add(dst, c)))
            b.branch(done)
            b.position_at_end(done)
        k.for_range(i64(0), i64(mid), each)
    k.for_range(i64(0), i64(pre), outer)


def _reader(k: Kernel, a, dt: np.dtype) -> Callable[[ir.Value], ir.Value]:
    """Element `at` of operand `a` (an array, or a 0-d literal: its value anywhere)."""
    b = k.b
    if isinstance(a, Var):
        p = k.ptrs[a.id]
        return lambda at: load_elem(b, b.gep(p, [at], inbounds=True), dt)
    return lambda at: const(dt, a.value.item())


def emit_scatter_add(k: Kernel, group: Group) -> None:
    """out = zeros; out[pre, idx[mid], post] += g[pre, mid, post] (see `_scattered`; a
    scalar index's gradient of a sum is the literal 1.0)."""
    b = k.b
    e = group.eqns[0]
    g, ind = e.inputs
    out, dt = e.out, e.out.aval.dtype
    po = k.ptrs[out.id]
    k.for_range(i64(0), i64(out.aval.size),
                lambda j: b.store(const(dt, 0), b.gep(po, [j], inbounds=True)))
    read = _reader(k, g, dt)

    def write(src, dst):
        dp = b.gep(po, [dst], inbounds=True)
        x, y = b.load(dp), read(src)
        b.store(b.fadd(x, y) if is_float(dt) else b.add(x, y), dp)
    _scattered(k, e, g, ind, e.params["size"], write)


def emit_scatter(k: Kernel, group: Group) -> None:
    """out = x; then, in order, out[pre, idx[m], post] = v[pre, m, post] (mode "set": the
    last of a repeated index wins) or combined with it by mul, min or max (as the
    elementwise ops: min and max carry a NaN)."""
    b = k.b
    e = group.eqns[0]
    x, v, ind = e.inputs
    mode = e.params["mode"]
    out, dt = e.out, e.out.aval.dtype
    po = k.ptrs[out.id]
    read_x, read_v = _reader(k, x, dt), _reader(k, v, dt)
    k.for_range(i64(0), i64(out.aval.size), lambda j: store_elem(
        b, read_x(j), b.gep(po, [j], inbounds=True), dt))

    def write(src, dst):
        dp = b.gep(po, [dst], inbounds=True)
        y = read_v(src)
        if mode != "set":
            y = lower_elementwise(b, mode, {}, [load_elem(b, dp, dt), y], [dt, dt], dt)
        store_elem(b, y, dp, dt)
    _scattered(k, e, v, ind, x.aval.shape[e.params["axis"]], write)


def emit_copy(k: Kernel, src, dst, aval) -> None:
    """dst = src, element for element (an update's operand, into the update's buffer)."""
    b = k.b
    ps, pd = k.ptrs[src], k.ptrs[dst]
    k.for_range(i64(0), i64(aval.size), lambda j: store_elem(
        b, load_elem(b, b.gep(ps, [j], inbounds=True), aval.dtype),
        b.gep(pd, [j], inbounds=True), aval.dtype))


def emit_update(k: Kernel, e, steps: tuple) -> None:
    """out[slice] = v, `out`'s pointer at the slice's first element (see module.lower_update):
    element i of v (row-major) goes `sum(i_d * steps[d])` elements past it. v may be a
    literal."""
    b = k.b
    v = e.inputs[1]
    dt, sub = e.out.aval.dtype, v.aval.shape
    po = k.ptrs[e.out.id]
    pv = k.ptrs.get(v.id) if isinstance(v, Var) else None

    def level(d: int, src: ir.Value, dst: ir.Value) -> None:
        if d == len(sub):
            val = load_elem(b, b.gep(pv, [src], inbounds=True), dt) if pv is not None \
                else const(dt, v.value.item())
            store_elem(b, val, b.gep(po, [dst], inbounds=True), dt)
            return
        k.for_range(i64(0), i64(sub[d]), lambda i: level(
            d + 1, b.add(b.mul(src, i64(sub[d])), i),
            b.add(dst, b.mul(i, i64(steps[d])))))
    level(0, i64(0), i64(0))


__all__ = ["emit_copy", "emit_matmul", "emit_scatter", "emit_scatter_add", "emit_update",
           "few_rows", "gemm_dims", "gemm_slot", "gemm_tasks", "loop_tasks", "packs", "uses_blas"]

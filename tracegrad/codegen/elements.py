"""The value of a fused variable at a multi-index, computed in registers.

Inside a loop body, `ElementReader.value(var, idx)` walks from a root back to the loads:
elementwise ops recurse at the (broadcast) index, views (broadcast, transpose, slice, reshape,
pad_slice, update_slice, concatenate, take) rewrite the index, creation ops compute the
element from the index, and variables that live in buffers are loaded. Results are memoised
per (variable, index), so a value used twice at the same point is computed once."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from llvmlite import ir

from ..ir import OPS, Eqn, Lit, Var
from .dtypes import F64, I1, I64, const, i64, is_float, load_elem
from .scalar import lower_elementwise
from .scalar import math as emit_math

_ELEMENTWISE = {"unary", "binary", "compare", "select"}


def row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def slice_range(dim: int, s: tuple) -> range:
    """The positions a (start, stop, step) entry selects: `range(*s)`, as the shape rule
    (the tracer normalises with slice.indices, so x[::-1] is (n-1, -1, -1))."""
    return range(*s)


class ElementReader:
    def __init__(self, b: ir.IRBuilder, producers: dict[int, Eqn],
                 pointers: dict[int, ir.Value]):
        self.b = b
        self.producers = producers     # fused var id -> the equation computing it
        self.pointers = pointers       # materialised var id -> typed base pointer
        self.memo: dict[tuple, tuple] = {}
        self._consts: dict[int, ir.Constant] = {}

    def c(self, n: int) -> ir.Constant:
        hit = self._consts.get(n)
        if hit is None:
            hit = self._consts[n] = i64(n)
        return hit

    # -- index arithmetic
    def linear(self, idx: Sequence[ir.Value], shape: Sequence[int]) -> ir.Value:
        b = self.b
        lin = None
        for i, st in zip(idx, row_major_strides(shape), strict=False):
            if isinstance(i, ir.Constant) and i.constant == 0:
                continue
            term = i if st == 1 else b.mul(i, self.c(st), flags=("nsw",))
            lin = term if lin is None else b.add(lin, term, flags=("nsw",))
        return self.c(0) if lin is None else lin

    def delinear(self, lin: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
        out = []
        for d, st in zip(shape, row_major_strides(shape), strict=False):
            if d == 1:
                out.append(self.c(0))
                continue
            q = lin if st == 1 else self.b.udiv(lin, self.c(st))
            out.append(q if st * d >= math.prod(shape) else self.b.urem(q, self.c(d)))
        return out

    def broadcast_index(self, idx, out_shape, in_shape) -> tuple:
        lead = len(out_shape) - len(in_shape)
        return tuple(self.c(0) if d == 1 else idx[lead + j] for j, d in enumerate(in_shape))

    def reshape_index(self, idx, out_shape, in_shape) -> tuple:
        """Map an index through a reshape, dividing only inside dimension groups whose
        products differ (a reshape that adds or drops 1s costs nothing)."""
        if 0 in out_shape:
            return tuple(self.c(0) for _ in in_shape)
        outs = [(i, d) for i, d in enumerate(out_shape) if d != 1]
        ins = [(j, d) for j, d in enumerate(in_shape) if d != 1]
        res = [self.c(0)] * len(in_shape)
        a = k = 0
        while a < len(outs) or k < len(ins):
            a1, k1 = a + 1, k + 1
            po, pi = outs[a][1], ins[k][1]
            while po != pi:
                if po < pi:
                    po *= outs[a1][1]
                    a1 += 1
                else:
                    pi *= ins[k1][1]
                    k1 += 1
            if a1 - a == 1 and k1 - k == 1:
                res[ins[k][0]] = idx[outs[a][0]]
            else:
                lin = self.linear([idx[i] for i, _ in outs[a:a1]], [d for _, d in outs[a:a1]])
                parts = self.delinear(lin, [d for _, d in ins[k:k1]])
                for (j, _), v in zip(ins[k:k1], parts, strict=True):
                    res[j] = v
            a, k = a1, k1
        return tuple(res)

    def clamp(self, v: ir.Value, hi: int) -> ir.Value:
        b = self.b
        v = b.select(b.icmp_signed("<", v, self.c(0)), self.c(0), v)
        return b.select(b.icmp_signed(">", v, self.c(hi)), self.c(hi), v)

    # -- values
    def value(self, a, idx: Sequence[ir.Value]) -> ir.Value:
        if isinstance(a, Lit):
            return const(a.dtype, a.value)
        key = (a.id,) + tuple(id(i) for i in idx)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = (self._compute(a, tuple(idx)), idx)
        return hit[0]

    def load(self, v: Var, idx) -> ir.Value:
        ptr = self.b.gep(self.pointers[v.id], [self.linear(idx, v.aval.shape)], inbounds=True)
        return load_elem(self.b, ptr, v.aval.dtype)

    def _compute(self, v: Var, idx: tuple) -> ir.Value:
        if v.id in self.pointers:
            return self.load(v, idx)
        e = self.producers[v.id]
        op, p, ins = e.op, e.params, e.inputs
        if OPS[op].kind in _ELEMENTWISE or op == "convert":
            args = [self.value(x, self.broadcast_index(idx, v.aval.shape, x.aval.shape))
                    for x in ins]
            return lower_elementwise(self.b, op, p, args, [x.aval.dtype for x in ins],
                                     v.aval.dtype)
        x = ins[0] if ins else None
        if op == "broadcast":
            return self.value(x, self.broadcast_index(idx, v.aval.shape, x.aval.shape))
        if op == "transpose":
            src = [None] * len(idx)
            for i, axis in enumerate(p["perm"]):
                src[axis] = idx[i]
            return self.value(x, src)
        if op == "reshape":
            return self.value(x, self.reshape_index(idx, v.aval.shape, x.aval.shape))
        if op == "slice":
            src = []
            for i, d, s in zip(idx, x.aval.shape, p["index"], strict=False):
                r = slice_range(d, s)
                if len(r) == 1:
                    src.append(self.c(r.start))
                    continue
                j = i if r.step == 1 else self.b.mul(i, self.c(r.step), flags=("nsw",))
                src.append(j if r.start == 0 else self.b.add(j, self.c(r.start)))
            return self.value(x, src)
        if op == "pad_slice":
            return self._pad_slice(v, x, idx, p)
        if op == "update_slice":
            return self._update_slice(x, ins[1], idx, p)
        if op == "concatenate":
            return self._concatenate(v, ins, idx, p["axis"])
        if op == "take":
            return self._take(x, ins[1], idx, p["axis"])
        if op == "iota":
            i = idx[p["dimension"]]
            return self._from_i64(i, v.aval.dtype)
        if op == "full":
            return const(v.aval.dtype, p["value"])
        if op == "random":
            return self._random(v, x, idx, p)
        raise NotImplementedError(f"cannot fuse {op}")

    def _from_i64(self, i: ir.Value, dtype: np.dtype) -> ir.Value:
        from .dtypes import reg_type
        t = reg_type(dtype)
        if is_float(dtype):
            return self.b.sitofp(i, t)
        if t == I1:
            return self.b.icmp_signed("!=", i, self.c(0))
        return i if t == I64 else self.b.trunc(i, t)

    def _in_slice(self, idx, shape, index) -> tuple[ir.Value, list]:
        """Whether the element at `idx` of an array of `shape` lies in its slice `index`, and
        its index in the slice (clamped in range, so it may be read either way)."""
        b = self.b
        inside = ir.Constant(I1, 1)
        src = []
        for i, d, s in zip(idx, shape, index, strict=False):
            r = slice_range(d, s)
            rel = b.sub(i, self.c(r.start))
            if r.step == 1:
                q = rel
            else:
                q = b.sdiv(rel, self.c(r.step))
                exact = b.icmp_signed("==", b.srem(rel, self.c(r.step)), self.c(0))
                inside = b.and_(inside, exact)
            inside = b.and_(inside, b.icmp_unsigned("<", q, self.c(len(r))))
            src.append(self.clamp(q, len(r) - 1))
        return inside, src

    def _pad_slice(self, v: Var, g, idx, p) -> ir.Value:
        zero = const(v.aval.dtype, 0)
        if g.aval.size == 0:
            return zero
        inside, src = self._in_slice(idx, p["shape"], p["index"])
        return self.b.select(inside, self.value(g, src), zero)

    def _update_slice(self, x, u, idx, p) -> ir.Value:
        if u.aval.size == 0:
            return self.value(x, idx)
        inside, src = self._in_slice(idx, x.aval.shape, p["index"])
        return self.b.select(inside, self.value(u, src), self.value(x, idx))

    def _concatenate(self, v: Var, xs, idx, axis: int) -> ir.Value:
        b = self.b
        parts, off = [], 0
        for x in xs:
            n = x.aval.shape[axis]
            if n:
                parts.append((off, n, x))
            off += n
        if not parts:   # every input is empty, so is the result: the loop never runs
            return const(v.aval.dtype, 0)
        result = None
        for off, n, x in reversed(parts):
            local = self.clamp(b.sub(idx[axis], self.c(off)), n - 1)
            val = self.value(x, idx[:axis] + (local,) + idx[axis + 1:])
            if result is None:
                result = val
            else:
                result = b.select(b.icmp_signed("<", idx[axis], self.c(off + n)), val, result)
        return result

    def _take(self, x, ind, idx, axis: int) -> ir.Value:
        b = self.b
        k = ind.aval.ndim
        j = self.value(ind, idx[axis:axis + k])
        if j.type != I64:
            j = b.sext(j, I64)
        n = x.aval.shape[axis]
        j = b.select(b.icmp_signed("<", j, self.c(0)), b.add(j, self.c(n)), j)
        # out-of-range indices are clamped: native code never reads outside a buffer
        j = self.clamp(j, max(n - 1, 0))
        return self.value(x, idx[:axis] + (j,) + idx[axis + k:])

    def _random(self, v: Var, seed, idx, p) -> ir.Value:
        b = self.b
        lin = self.linear(idx, v.aval.shape)
        base = b.mul(self.value(seed, ()), self.c(0xD1B54A32D192ED03 - (1 << 64)))

        def uniform(stream: int) -> ir.Value:
            x = b.add(b.add(b.shl(lin, self.c(1)), self.c(stream)), base)
            x = b.add(x, self.c(0x9E3779B97F4A7C15 - (1 << 64)))
            x = b.mul(b.xor(x, b.lshr(x, self.c(30))), self.c(0xBF58476D1CE4E5B9 - (1 << 64)))
            x = b.mul(b.xor(x, b.lshr(x, self.c(27))), self.c(0x94D049BB133111EB - (1 << 64)))
            x = b.xor(x, b.lshr(x, self.c(31)))
            u = b.uitofp(b.lshr(x, self.c(40)), F64)
            return b.fmul(u, ir.Constant(F64, 2.0 ** -24))

        u = uniform(0)
        if p["dist"] == "normal":
            u2 = uniform(1)
            r = emit_math(b, "log1p", [b.fneg(u)])
            from .scalar import intrinsic
            r = intrinsic(b, "llvm.sqrt", [b.fmul(ir.Constant(F64, -2.0), r)])
            c = emit_math(b, "cos", [b.fmul(ir.Constant(F64, 2 * np.pi), u2)])
            u = b.fmul(r, c)
        if v.aval.dtype == np.float32:
            return b.fptrunc(u, ir.FloatType())
        return u

"""How numpy dtypes map to LLVM types: in registers (bool is i1) and in memory (bool is i8)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..ir import Graph, Lit

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()
PTR = I8.as_pointer()

# (no unsigned type: the lowerings compare, divide, convert and index as signed integers;
# a graph with another dtype runs on the interpreter, see unsupported_dtype)
_REG = {
    np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.int32): I32,
    np.dtype(np.int64): I64, np.dtype(np.bool_): I1, np.dtype(np.int8): I8,
}


def unsupported_dtype(graph: Graph) -> np.dtype | None:
    """A dtype of `graph` (its inputs, constants, literals and results, its scans' bodies
    included) that the native backend has no type for, or None."""
    seen = {a.aval.dtype for a in (*graph.invars, *graph.constvars)}
    for e in graph.eqns:
        for a in e.inputs:
            if type(a) is Lit:
                seen.add(a.aval.dtype)
        for v in e.outvars:
            seen.add(v.aval.dtype)
        for p in e.params.values():
            if isinstance(p, Graph):
                bad = unsupported_dtype(p)
                if bad is not None:
                    return bad
    for d in seen:
        if d not in _REG:
            return d
    return None


def reg_type(dtype: np.dtype) -> ir.Type:
    """The LLVM type a value of `dtype` has in registers."""
    try:
        return _REG[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"the native backend does not support dtype {dtype}") from None


def mem_type(dtype: np.dtype) -> ir.Type:
    """The LLVM type an element of `dtype` has in a buffer (bool is a byte, as numpy)."""
    t = reg_type(dtype)
    return I8 if t is I1 else t


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def is_bool(dtype: np.dtype) -> bool:
    return np.dtype(dtype) == np.bool_


def const(dtype: np.dtype, value) -> ir.Constant:
    """A register constant of `dtype` holding `value` (a Python or numpy scalar)."""
    t = reg_type(dtype)
    if isinstance(t, ir.IntType):
        v = int(np.asarray(value).astype(np.dtype(dtype)).item()) if t is not I1 else int(
            bool(value))
        return ir.Constant(t, v)
    return ir.Constant(t, float(np.asarray(value).astype(np.dtype(dtype)).item()))


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def load_elem(b: ir.IRBuilder, ptr: ir.Value, dtype: np.dtype) -> ir.Value:
    v = b.load(ptr)
    return b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if is_bool(dtype) else v


def store_elem(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, dtype: np.dtype) -> None:
    b.store(b.zext(v, I8) if is_bool(dtype) else v, ptr)

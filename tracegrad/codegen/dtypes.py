"""How numpy dtypes map to LLVM types: in registers (bool is i1) and in memory (bool is i8)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()
PTR = I8.as_pointer()

_REG = {
    np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.int32): I32,
    np.dtype(np.int64): I64, np.dtype(np.bool_): I1, np.dtype(np.int8): I8,
    np.dtype(np.uint8): I8,
}


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

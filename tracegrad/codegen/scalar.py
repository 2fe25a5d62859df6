"""Scalar lowering of the elementwise primitives: one LLVM value in, one out, straight-line.

Fused loop bodies are built from these; keeping them branch-free lets the loop vectoriser
turn every fused chain into SIMD code."""
from __future__ import annotations

import contextvars
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from .dtypes import F32, F64, I1, I64, const, is_bool, is_float, reg_type

TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic",
                  "erf", "pow"}
_INTRINSIC = {"exp", "log", "sin", "cos", "pow"}
_LIBM = {"log1p", "expm1", "tan", "tanh", "erf"}


def _vecmath() -> Callable | None:
    try:
        from .vecmath import emit_math
    except Exception:   # not written yet, or mid-edit: the libm fallback stays correct
        return None
    return emit_math


def module_of(b: ir.IRBuilder) -> ir.Module:
    return b.block.function.module


def intrinsic(b: ir.IRBuilder, name: str, args: Sequence[ir.Value]) -> ir.Value:
    t = args[0].type   # llvmlite only knows some intrinsics' arity: spell the type out
    fnty = ir.FunctionType(t, [t] * len(args))
    fn = module_of(b).declare_intrinsic(name, [t], fnty)
    return b.call(fn, list(args))


def _libm(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    m = module_of(b)
    cname = name + ("f" if x.type == ir.FloatType() else "")
    fn = m.globals.get(cname)
    if fn is None:
        fn = ir.Function(m, ir.FunctionType(x.type, [x.type]), cname)
        fn.attributes.add("nounwind")
        fn.attributes.add("willreturn")
    return b.call(fn, [x])


# Small loops gain little from vectorisation but pay compile time for every inlined copy of a
# polynomial: while this is set, math functions are emitted once per module and called.
OUTLINE_MATH: contextvars.ContextVar[bool] = contextvars.ContextVar("outline", default=False)


def math(b: ir.IRBuilder, name: str, args: Sequence[ir.Value]) -> ir.Value:
    """A transcendental function: vecmath's vectorisable code when present, else libm."""
    if OUTLINE_MATH.get():
        return b.call(_outlined(module_of(b), name, [a.type for a in args]), list(args))
    return _inline_math(b, name, args)


def _outlined(m: ir.Module, name: str, types: list[ir.Type]) -> ir.Function:
    fname = f"tg_{name}_{types[0]}"
    fn = m.globals.get(fname)
    if fn is None:
        fn = ir.Function(m, ir.FunctionType(types[0], types), fname)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        fb = ir.IRBuilder(fn.append_basic_block("entry"))
        fb.ret(_inline_math(fb, name, list(fn.args)))
    return fn


def _inline_math(b: ir.IRBuilder, name: str, args: Sequence[ir.Value]) -> ir.Value:
    emit = _vecmath()
    if emit is not None:
        return emit(b, name, list(args))
    if name in _INTRINSIC:
        return intrinsic(b, f"llvm.{name}", args)
    if name in _LIBM:
        return _libm(b, name, args[0])
    if name == "logistic":
        x = args[0]
        one = ir.Constant(x.type, 1.0)
        e = intrinsic(b, "llvm.exp", [b.fneg(x)])
        return b.fdiv(one, b.fadd(one, e))
    raise NotImplementedError(name)


def _int_pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """x**max(y, 0) by square-and-multiply over every exponent bit, branch-free."""
    bits = x.type.width
    one = ir.Constant(x.type, 1)
    result, base = one, x
    for i in range(bits - 1):   # the sign bit never contributes: y < 0 counts as 0
        bit = b.trunc(b.lshr(y, ir.Constant(y.type, i)), I1)
        result = b.select(bit, b.mul(result, base), result)
        base = b.mul(base, base)
    return b.select(b.icmp_signed("<", y, ir.Constant(y.type, 0)), one, result)


def _floor_div(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """numpy's floor_divide: x // 0 is 0 (numpy warns; the division is never made, it
    would trap), and y == -1 is a wrapping negation so INT_MIN // -1 cannot trap."""
    t = x.type
    zero, one, minus1 = ir.Constant(t, 0), ir.Constant(t, 1), ir.Constant(t, -1)
    is_m1 = b.icmp_signed("==", y, minus1)
    safe = b.select(b.or_(b.icmp_signed("==", y, zero), is_m1), one, y)
    q = b.sdiv(x, safe)
    r = b.srem(x, safe)
    adjust = b.and_(b.icmp_signed("!=", r, zero),
                    b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                  b.icmp_signed("<", safe, zero)))
    q = b.sub(q, b.zext(adjust, t))
    q = b.select(b.icmp_signed("==", y, zero), zero, q)
    return b.select(is_m1, b.sub(zero, x), q)


def _convert(b: ir.IRBuilder, x: ir.Value, src: np.dtype, dst: np.dtype) -> ir.Value:
    st, dt = reg_type(src), reg_type(dst)
    if src == dst:
        return x
    if is_bool(dst):
        if is_float(src):
            return b.fcmp_unordered("!=", x, ir.Constant(st, 0.0))
        return b.icmp_unsigned("!=", x, ir.Constant(st, 0))
    if is_float(src) and is_float(dst):
        return b.fpext(x, dt) if dt == F64 else b.fptrunc(x, dt)
    if is_float(src):
        # plain fptosi is poison out of range; the saturating form is defined everywhere
        name = f"llvm.fptosi.sat.i{dt.width}.{'f32' if st == F32 else 'f64'}"
        fn = module_of(b).declare_intrinsic(name, (), ir.FunctionType(dt, [st]))
        return b.call(fn, [x])
    if is_float(dst):
        return b.uitofp(x, dt) if is_bool(src) else b.sitofp(x, dt)
    if is_bool(src):
        return b.zext(x, dt)
    if st.width < dt.width:
        return b.sext(x, dt)
    return b.trunc(x, dt)


_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _compare(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: np.dtype):
    if is_float(dtype):
        if op == "ne":
            return b.fcmp_unordered("!=", x, y)
        return b.fcmp_ordered(_FCMP[op], x, y)
    if is_bool(dtype):
        return b.icmp_unsigned(_FCMP[op], x, y)
    return b.icmp_signed(_FCMP[op], x, y)


def _sign(b: ir.IRBuilder, x: ir.Value, dtype: np.dtype) -> ir.Value:
    t = x.type
    if is_float(dtype):
        zero = ir.Constant(t, 0.0)
        pos = b.uitofp(b.fcmp_ordered(">", x, zero), t)
        neg = b.uitofp(b.fcmp_ordered("<", x, zero), t)
        # NaN and +-0 stay themselves, as numpy's sign
        nonzero = b.fcmp_ordered("!=", x, zero)
        return b.select(nonzero, b.fsub(pos, neg), x)
    zero = ir.Constant(t, 0)
    return b.sub(b.zext(b.icmp_signed(">", x, zero), t), b.zext(b.icmp_signed("<", x, zero), t))


def lower_elementwise(b: ir.IRBuilder, op: str, params: dict, args: Sequence[ir.Value],
                      in_dtypes: Sequence[np.dtype], out_dtype: np.dtype) -> ir.Value:
    """The scalar value of `op` applied to `args` (register values of `in_dtypes`)."""
    dt = in_dtypes[-1]
    fl, bl = is_float(dt), is_bool(dt)
    if op in ("stop_gradient",):
        return args[0]
    if op == "convert":
        return _convert(b, args[0], in_dtypes[0], out_dtype)
    if op == "select":
        return b.select(args[0], args[1], args[2])
    if op in _FCMP:
        return _compare(b, op, args[0], args[1], dt)
    if op == "and":
        return b.and_(args[0], args[1])
    if op == "or":
        return b.or_(args[0], args[1])
    if op == "not":
        return b.xor(args[0], ir.Constant(I1, 1)) if bl else b.icmp_unsigned(
            "==", args[0], ir.Constant(args[0].type, 0))
    x = args[0]
    if len(args) == 1:
        if op == "neg":
            return b.fneg(x) if fl else b.sub(ir.Constant(x.type, 0), x)
        if op == "abs":
            if fl:
                return intrinsic(b, "llvm.fabs", [x])
            neg = b.sub(ir.Constant(x.type, 0), x)
            return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), neg, x)
        if op == "sign":
            return _sign(b, x, dt)
        if op == "sqrt":
            return intrinsic(b, "llvm.sqrt", [x])
        if op in TRANSCENDENTAL:
            return math(b, op, [x])
        raise NotImplementedError(f"no lowering for unary {op}")
    y = args[1]
    if bl and op in ("add", "max"):
        return b.or_(x, y)
    if bl and op in ("mul", "min"):
        return b.and_(x, y)
    if op == "add":
        return b.fadd(x, y) if fl else b.add(x, y)
    if op == "sub":
        return b.fsub(x, y) if fl else b.sub(x, y)
    if op == "mul":
        return b.fmul(x, y) if fl else b.mul(x, y)
    if op == "div":
        return b.fdiv(x, y) if fl else _floor_div(b, x, y)
    if op == "max":
        return intrinsic(b, "llvm.maximum" if fl else "llvm.smax", [x, y])
    if op == "min":
        return intrinsic(b, "llvm.minimum" if fl else "llvm.smin", [x, y])
    if op == "pow":
        if fl and isinstance(y, ir.Constant) and y.constant == 2.0:
            # x ** 2 (a squared error): one product, not the pow polynomial (var of 4096x256
            # over axis 0 took 1.25 ms through pow, 0.19 through x * x); x * x is exact to
            # the half ulp, and pow's special values (nan, inf, -0) square alike
            return b.fmul(x, x)
        return math(b, "pow", [x, y]) if fl else _int_pow(b, x, y)
    raise NotImplementedError(f"no lowering for binary {op}")


def i64_of(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An index value widened to i64."""
    return v if v.type == I64 else b.sext(v, I64)


__all__ = ["TRANSCENDENTAL", "const", "i64_of", "intrinsic", "lower_elementwise", "math"]

"""The entry's own argument checks: it is handed the Python lists of input and output arrays
and reads the numpy array objects itself, so a call costs Python one list and one native call
however many arguments the graph has.

Each input must be an exact `numpy.ndarray` (the type's address is in table slot
`SLOT_NDARRAY`) with the compiled rank, shape and dtype, C-contiguous and aligned, in native
byte order. The entry returns 0 and runs the graph, or, before touching anything, returns the
1-based position of the first argument that is not (-1: a list of the wrong length); the
runtime then converts or rejects the arguments in Python, with a message naming what was
wrong, and calls again. Outputs are arrays the runtime has just allocated: only their data
pointers are read.

The offsets below are CPython's and numpy's object layouts on 64-bit builds (numpy 1.x and
2.x share them); the runtime checks every one against live objects when it is imported, and
on a build where they differ runs graphs on the interpreter instead.

The entry runs with the GIL released, so it reads the arrays' shapes and dtypes without it:
another thread changing an argument's shape in place (`x.shape = ...`, `x.resize(...)`)
during the call races with it, as it would with numpy's own loops. The list is the
runtime's own; the arrays in it stay referenced until the call returns."""
from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
from llvmlite import ir

from .dtypes import I8, I32, I64, PTR, i64

SLOT_NDARRAY = 4
OB_TYPE = 8              # PyObject.ob_type
OB_SIZE = 16             # PyVarObject.ob_size: a list's length
LIST_ITEMS = 24          # PyListObject.ob_item
ARRAY_DATA = 16          # PyArrayObject_fields.data, .nd, .dimensions, .descr, .flags
ARRAY_ND = 24
ARRAY_DIMS = 32
ARRAY_DESCR = 56
ARRAY_FLAGS = 64
DESCR_BYTEORDER = 26     # PyArray_Descr.byteorder, .type_num
DESCR_TYPE_NUM = 28
C_CONTIGUOUS_ALIGNED = 0x0001 | 0x0100     # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
SWAPPED = ord(">" if sys.byteorder == "little" else "<")     # a descr's non-native order


def type_number(dtype: np.dtype) -> int:
    """The type number the entry expects for `dtype`: that of the canonical dtype of its
    kind and size (int64 is numpy's `long` or `longlong`, equal dtypes of two numbers; the
    disk cache files both under one key)."""
    return np.dtype(np.dtype(dtype).str).num


def _field(b: ir.IRBuilder, obj: ir.Value, offset: int, ty: ir.Type) -> ir.Value:
    return b.load(b.bitcast(b.gep(obj, [i64(offset)], inbounds=True), ty.as_pointer()))


def _items(b: ir.IRBuilder, lst: ir.Value) -> ir.Value:
    return _field(b, lst, LIST_ITEMS, PTR.as_pointer())


def emit_unbox(b: ir.IRBuilder, table: ir.Value, args: ir.Value, outs: ir.Value,
               inputs: Sequence[tuple[int, tuple[int, ...], np.dtype]],
               outputs: Sequence[int]) -> None:
    """Check the list `args` against `inputs` ((slot, shape, dtype) each), returning the
    position of a bad one from the function `b` is in, then store the data pointers of the
    inputs and of the list `outs` into their slots (`outputs`). Leaves `b` after the stores."""
    fn = b.function
    fail = fn.append_basic_block("bad_args")
    ok_len = b.icmp_signed("==", _field(b, args, OB_SIZE, I64), i64(len(inputs)))
    reasons, came_from = [ir.Constant(I32, -1)], [b.block]
    unbox = b.append_basic_block("unbox")
    b.cbranch(ok_len, unbox, fail)
    b.position_at_end(unbox)
    ndarray = b.load(b.gep(table, [i64(SLOT_NDARRAY)], inbounds=True))
    items = _items(b, args)
    objs = []
    for i, (_, shape, dtype) in enumerate(inputs):
        obj = b.load(b.gep(items, [i64(i)], inbounds=True))
        objs.append(obj)
        # the fields of an array are read only once the object is known to be one, and its
        # dimensions once it is known to have as many as the compiled shape
        is_array = b.icmp_unsigned("==", _field(b, obj, OB_TYPE, PTR), ndarray)
        nd_ok = b.append_basic_block(f"arg{i}_rank")
        _check(b, is_array, nd_ok, fail, reasons, came_from, i)
        nd = _field(b, obj, ARRAY_ND, I32)
        fields = b.append_basic_block(f"arg{i}_fields")
        _check(b, b.icmp_signed("==", nd, ir.Constant(I32, len(shape))), fields, fail,
               reasons, came_from, i)
        flags = b.and_(_field(b, obj, ARRAY_FLAGS, I32), ir.Constant(I32, C_CONTIGUOUS_ALIGNED))
        good = b.icmp_signed("==", flags, ir.Constant(I32, C_CONTIGUOUS_ALIGNED))
        descr = _field(b, obj, ARRAY_DESCR, PTR)
        num = _field(b, descr, DESCR_TYPE_NUM, I32)
        good = b.and_(good, b.icmp_signed("==", num, ir.Constant(I32, type_number(dtype))))
        order = _field(b, descr, DESCR_BYTEORDER, I8)
        good = b.and_(good, b.icmp_signed("!=", order, ir.Constant(I8, SWAPPED)))
        if shape:
            dims = _field(b, obj, ARRAY_DIMS, I64.as_pointer())
            for k, n in enumerate(shape):
                d = b.load(b.gep(dims, [i64(k)], inbounds=True))
                good = b.and_(good, b.icmp_signed("==", d, i64(n)))
        _check(b, good, b.append_basic_block(f"arg{i}_ok"), fail, reasons, came_from, i)
    outs_items = _items(b, outs)
    stores = [(slot, obj) for (slot, _, _), obj in zip(inputs, objs, strict=True)]
    stores += [(slot, b.load(b.gep(outs_items, [i64(k)], inbounds=True)))
               for k, slot in enumerate(outputs)]
    for slot, obj in stores:
        b.store(_field(b, obj, ARRAY_DATA, PTR), b.gep(table, [i64(slot)], inbounds=True))
    here = b.block
    b.position_at_end(fail)
    phi = b.phi(I32)
    for r, blk in zip(reasons, came_from, strict=True):
        phi.add_incoming(r, blk)
    b.ret(phi)
    b.position_at_end(here)


def _check(b: ir.IRBuilder, ok: ir.Value, then: ir.Block, fail: ir.Block, reasons: list,
           came_from: list, i: int) -> None:
    reasons.append(ir.Constant(I32, i + 1))
    came_from.append(b.block)
    b.cbranch(ok, then, fail)
    b.position_at_end(then)

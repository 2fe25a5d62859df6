"""A kernel: a body `void body(i64 task, T* noalias buf0, ...)` that runs one task of a group,
plus a wrapper `void k(i8** bufs, i64 task)` that loads the buffers from the table, which is
what the thread pool calls. Single-task kernels are called from the entry directly. The
`noalias` arguments (kept as scoped alias metadata when inlined) let the vectoriser move loads
past stores without runtime overlap checks."""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import numpy as np
from llvmlite import ir

from .dtypes import I1, I64, PTR, VOID, i64, mem_type

KERNEL_TYPE = ir.FunctionType(VOID, [PTR.as_pointer(), I64])


class Kernel:
    def __init__(self, module: ir.Module, name: str,
                 buffers: list[tuple[Hashable, int, np.dtype]],
                 body: ir.Function | None = None, offsets: dict | None = None):
        """`buffers`: (key, slot in the table, element dtype) for every buffer it touches.
        `body`: an identical group's body to call instead of emitting a new one. `offsets`:
        key -> elements the body's pointer starts past the buffer's (an update's slice)."""
        self.offsets = offsets or {}
        self.module = module
        self.fresh = body is None
        self.buffers = buffers
        self.fn = ir.Function(module, KERNEL_TYPE, name)
        self.fn.linkage = "internal"
        # kept out of the entry: many small functions optimise in linear time, one huge one
        # does not (121 kernels inlined into the entry took 4x longer at O3)
        self.fn.attributes.add("noinline")
        arg_types = [I64] + [mem_type(dt).as_pointer() for _, _, dt in buffers]
        if body is None:
            body = ir.Function(module, ir.FunctionType(VOID, arg_types), name + "_body")
            body.linkage = "internal"
            for a in body.args[1:]:
                a.add_attribute("noalias")
        self.body_fn = body
        self.task = self.body_fn.args[0]
        self.arg_types = arg_types
        self.ptrs = {key: a for (key, _, _), a in zip(buffers, self.body_fn.args[1:], strict=False)}
        # the wrapper: load each pointer from its slot and call the body
        wb = ir.IRBuilder(self.fn.append_basic_block("entry"))
        table, task = self.fn.args
        args = [task]
        for (key, slot, _dt), t in zip(buffers, arg_types[1:], strict=False):
            args.append(self._pointer(wb, table, key, slot, t))
        wb.call(self.body_fn, args)
        wb.ret_void()
        if self.fresh:
            self.b = ir.IRBuilder(self.body_fn.append_basic_block("entry"))
            self.entry_block = self.b.block

    def alloca(self, t: ir.Type) -> ir.Value:
        """A stack slot in the entry block (SROA turns it into SSA values)."""
        with self.b.goto_block(self.entry_block):
            if self.entry_block.instructions:
                self.b.position_before(self.entry_block.instructions[0])
            return self.b.alloca(t)

    def task_range(self, size: int, chunk: int) -> tuple[ir.Value, ir.Value]:
        """(start, stop) of this task's share of 0..size: chunk after chunk, the last cut."""
        b = self.b
        lo = b.mul(self.task, ir.Constant(I64, chunk))
        hi = b.add(lo, ir.Constant(I64, chunk))
        return lo, b.select(b.icmp_signed("<", hi, ir.Constant(I64, size)), hi,
                            ir.Constant(I64, size))

    def for_range(self, start: ir.Value, stop: ir.Value,
                  body: Callable[[ir.Value], None]) -> None:
        b = self.b
        pre = b.block
        header = self.fn_append("loop")
        inner = self.fn_append("body")
        done = self.fn_append("done")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), inner, done)
        b.position_at_end(inner)
        body(i)
        i.add_incoming(b.add(i, ir.Constant(I64, 1), flags=("nsw",)), b.block)
        b.branch(header)
        b.position_at_end(done)

    def for_each(self, axes: Sequence[int], dims: Sequence[int], idx: list,
                 body: Callable[[], None]) -> None:
        """Loops nested over `axes` (outermost first), axis j from 0 to dims[j], its
        index in idx[j]; `body` runs innermost."""
        def nest(t: int) -> None:
            if t == len(axes):
                body()
                return

            def step(i: ir.Value, j: int = axes[t]) -> None:
                idx[j] = i
                nest(t + 1)
            self.for_range(i64(0), i64(dims[axes[t]]), step)
        nest(0)

    def fn_append(self, name: str) -> ir.Block:
        return self.body_fn.append_basic_block(name)

    def finish(self) -> Kernel:
        if self.fresh:
            self.b.ret_void()
        return self

    def call_body(self, b: ir.IRBuilder, table: ir.Value) -> None:
        """Call the body straight from `b` (the entry), for a kernel run as one task."""
        args = [ir.Constant(I64, 0)]
        for (key, slot, _dt), t in zip(self.buffers, self.arg_types[1:], strict=True):
            args.append(self._pointer(b, table, key, slot, t))
        b.call(self.body_fn, args)

    def _pointer(self, b: ir.IRBuilder, table: ir.Value, key: Hashable, slot: int,
                 t: ir.Type) -> ir.Value:
        p = b.bitcast(b.load(b.gep(table, [ir.Constant(I64, slot)], inbounds=True)), t)
        off = self.offsets.get(key, 0)
        return b.gep(p, [ir.Constant(I64, off)], inbounds=True) if off else p


def if_then(b: ir.IRBuilder, cond: ir.Value, then: Callable[[], None]) -> None:
    fn = b.block.function
    yes, done = fn.append_basic_block("then"), fn.append_basic_block("endif")
    b.cbranch(cond, yes, done)
    b.position_at_end(yes)
    then()
    b.branch(done)
    b.position_at_end(done)


__all__ = ["I1", "KERNEL_TYPE", "Kernel", "if_then"]

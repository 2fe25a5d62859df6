"""A compiled graph: checks arguments, fills the buffer table, makes the one native call."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..codegen import Layout
from ..codegen.module import ARRAY_DATA_OFFSET, FIRST_SLOT
from ..ir import Graph, Lit
from .blas import blas_threads_address, gemm_addresses
from .pool import parallel_for_address


def _check_array_layout() -> None:
    a = np.empty(3)
    if ctypes.c_void_p.from_address(id(a) + ARRAY_DATA_OFFSET).value != a.ctypes.data:
        raise ImportError("tracegrad: unexpected numpy array object layout; the native "
                          "backend cannot read array data pointers on this build")


_check_array_layout()

ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ALIGN = 64


class _Frame:
    """One buffer table and workspace; a call that finds the shared one busy makes its own."""

    def __init__(self, layout: Layout, consts: Sequence[np.ndarray]):
        self.table = (ctypes.c_void_p * max(layout.n_slots, FIRST_SLOT))()
        self.addr = ctypes.addressof(self.table)
        self.table[0] = parallel_for_address()
        if layout.blas:   # finding BLAS imports scipy.linalg: only for graphs that use it
            self.table[1], self.table[2] = gemm_addresses()
            self.table[3] = blas_threads_address()
        self.keep = list(consts)
        for slot, j in layout.const_slots:
            self.table[slot] = consts[j].ctypes.data
        self.workspace = np.empty(layout.workspace_size + _ALIGN, np.uint8)
        base = self.workspace.ctypes.data
        base += -base % _ALIGN
        for slot, off in layout.workspace:
            self.table[slot] = base + off


class Executable:
    """`exe(args) -> outputs`: runs the whole graph in one native call. Outputs are fresh
    arrays owned by the caller. `.llvm_ir` and `.asm` give the optimised code."""

    def __init__(self, graph: Graph, layout: Layout, address: int, tracker: Any,
                 key: str, code_text: Callable[[str], str]):
        self.graph = graph
        self.layout = layout
        self.key = key
        self._tracker = tracker            # keeps the code loaded
        self._entry = ENTRY_TYPE(address)
        self._code_text = code_text
        self._texts: dict[str, str] = {}
        self._in = [(v.aval.shape, v.aval.dtype) for v in graph.invars]
        self._consts = [np.ascontiguousarray(c, dtype=v.aval.dtype)
                        for v, c in zip(graph.constvars, graph.consts, strict=False)]
        self._out_avals = [a.aval for a in graph.outvars]
        self._lits = [a.value if isinstance(a, Lit) else None for a in graph.outvars]
        self._frame = _Frame(layout, self._consts)
        self._in_slots = list(layout.input_slots)
        slots = [(k, w[1]) for k, w in enumerate(layout.outputs) if w[0] == "slot"]
        self._out_slots = [s for _, s in slots]
        self._slot_avals = [self._out_avals[k] for k, _ in slots]
        self._simple = len(slots) == len(layout.outputs)
        self._lock = threading.Lock()

    @property
    def llvm_ir(self) -> str:
        return self._text("llvm_ir")

    @property
    def asm(self) -> str:
        return self._text("asm")

    def _text(self, what: str) -> str:
        if what not in self._texts:
            self._texts[what] = self._code_text(what)
        return self._texts[what]

    def _convert(self, i: int, a: Any) -> np.ndarray:
        """The slow path: non-arrays, wrong types, and layouts native code cannot read."""
        shape, dtype = self._in[i]
        if not isinstance(a, np.ndarray):
            try:
                a = np.asarray(a)
            except Exception:
                raise TypeError(f"argument {i} of type {type(a).__name__} is not an "
                                "array") from None
            if a.dtype == object:
                raise TypeError(f"argument {i} of type {type(a).__name__} is not an array")
        if a.shape != shape or a.dtype != dtype:
            raise TypeError(f"argument {i} must be {dtype}{list(shape)}, got "
                            f"{a.dtype}{list(a.shape)}")
        if type(a) is not np.ndarray:
            a = np.asarray(a)
        if not a.flags.c_contiguous or not a.flags.aligned:
            a = np.ascontiguousarray(a)
        return a

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._in):
            raise TypeError(f"compiled graph takes {len(self._in)} arguments, got {len(args)}")
        arrays = list(args)
        for i, (a, (shape, dtype)) in enumerate(zip(arrays, self._in, strict=True)):
            if (type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype
                    or not (a.flags.c_contiguous and a.flags.aligned)):
                arrays[i] = self._convert(i, a)
        outs = [np.empty(av.shape, av.dtype) for av in self._slot_avals]
        shared = self._lock.acquire(blocking=False)
        try:
            frame = self._frame if shared else _Frame(self.layout, self._consts)
            table = frame.table
            for slot, a in zip(self._in_slots, arrays, strict=True):
                table[slot] = id(a)
            for slot, o in zip(self._out_slots, outs, strict=True):
                table[slot] = id(o)
            self._entry(frame.addr)
        finally:
            if shared:
                self._lock.release()
        if self._simple:
            return outs
        return self._assemble(arrays, outs)

    def _assemble(self, arrays: list, outs: list) -> list[np.ndarray]:
        results: list[np.ndarray] = []
        it = iter(outs)
        for k, where in enumerate(self.layout.outputs):
            kind = where[0]
            if kind == "slot":
                results.append(next(it))
            elif kind == "arg":
                results.append(np.array(arrays[where[1]]))
            elif kind == "const":
                results.append(np.array(self._consts[where[1]]))
            elif kind == "lit":
                results.append(np.array(self._lits[k]))
            else:
                results.append(np.array(results[where[1]]))
        return results

    def __repr__(self) -> str:
        return (f"<Executable {self.key[:12]}: {len(self.graph.eqns)} eqns, "
                f"{self.layout.n_kernels} kernels>")

"""A compiled graph: checks arguments, fills the buffer table, makes the one native call."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..codegen import Layout
from ..ir import Graph, Lit
from .blas import gemm_addresses
from .pool import PARALLEL_FOR_ADDR

ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ALIGN = 64


class _Frame:
    """One buffer table and workspace; a call that finds the shared one busy makes its own."""

    def __init__(self, layout: Layout, consts: Sequence[np.ndarray]):
        self.table = (ctypes.c_void_p * max(layout.n_slots, 3))()
        self.addr = ctypes.addressof(self.table)
        sgemm, dgemm = gemm_addresses()
        self.table[0], self.table[1], self.table[2] = PARALLEL_FOR_ADDR, sgemm, dgemm
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

    def _check(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._in):
            raise TypeError(f"compiled graph takes {len(self._in)} arguments, got {len(args)}")
        arrays = []
        for i, (a, (shape, dtype)) in enumerate(zip(args, self._in, strict=False)):
            if not isinstance(a, np.ndarray):
                try:
                    a = np.asarray(a)
                except Exception:
                    raise TypeError(f"argument {i} of type {type(a).__name__} is not an "
                                    "array") from None
            if a.shape != shape or a.dtype != dtype:
                raise TypeError(f"argument {i} must be {dtype}{list(shape)}, got "
                                f"{a.dtype}{list(a.shape)}")
            if not a.flags.c_contiguous or not a.flags.aligned:
                a = np.ascontiguousarray(a)
            arrays.append(a)
        return arrays

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        arrays = self._check(args)
        lay = self.layout
        outs: dict[int, np.ndarray] = {}
        shared = self._lock.acquire(blocking=False)
        try:
            frame = self._frame if shared else _Frame(lay, self._consts)
            table = frame.table
            for slot, a in zip(lay.input_slots, arrays, strict=False):
                table[slot] = a.ctypes.data
            for k, where in enumerate(lay.outputs):
                if where[0] == "slot":
                    av = self._out_avals[k]
                    o = outs[k] = np.empty(av.shape, av.dtype)
                    table[where[1]] = o.ctypes.data
            self._entry(frame.addr)
        finally:
            if shared:
                self._lock.release()
        results = []
        for k, where in enumerate(lay.outputs):
            kind = where[0]
            if kind == "slot":
                results.append(outs[k])
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

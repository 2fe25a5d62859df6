"""A compiled graph: allocates the outputs and makes the one native call, which checks the
arguments itself (codegen/unbox.py); arguments it rejects are converted or reported here."""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..codegen import Layout, unbox
from ..codegen.module import FIRST_SLOT
from ..ir import Graph, Lit
from .blas import blas_threads_address, gemm_addresses, one_blas_thread
from .pool import parallel_for_address


def _layout_problem() -> str | None:
    """Why the entry cannot read lists and arrays at the offsets of codegen/unbox.py on this
    build, or None when it can. The build comes first, then the fields that are read in
    place; the two pointers the entry follows (a list's items, an array's dimensions) are
    followed only once the fields holding them were found where expected, so a build with
    another layout gets a reason, not a crash. Probe values are distinct (a 3-item list, a
    7x5 array): a field read at another's offset cannot pass."""
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} is not CPython"
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return "not a 64-bit build"
    if "t" in getattr(sys, "abiflags", ""):    # (3.13's; its objects have other headers)
        return "a free-threaded build"

    def word(addr: int, ty: type = ctypes.c_ssize_t) -> int:
        return ty.from_address(addr).value

    def flags(x: np.ndarray) -> int:
        return word(id(x) + unbox.ARRAY_FLAGS, ctypes.c_int32) & unbox.C_CONTIGUOUS_ALIGNED

    a = np.empty((9, 5), np.float32)[:7]
    lst = [a, None, None]
    descr = id(a.dtype)
    swapped = a.dtype.newbyteorder()
    unaligned = np.zeros(9, np.uint8)[1:].view(np.float32)
    in_place = [word(id(lst) + unbox.OB_TYPE), word(id(lst) + unbox.OB_SIZE),
                word(id(a) + unbox.OB_TYPE), word(id(a) + unbox.ARRAY_DATA),
                word(id(a) + unbox.ARRAY_ND, ctypes.c_int32), word(id(a) + unbox.ARRAY_DESCR),
                flags(a), flags(a[:, ::2]), flags(unaligned),
                word(descr + unbox.DESCR_TYPE_NUM, ctypes.c_int32),
                word(descr + unbox.DESCR_BYTEORDER, ctypes.c_char),
                ord(word(id(swapped) + unbox.DESCR_BYTEORDER, ctypes.c_char))]
    if in_place != [id(list), 3, id(np.ndarray), a.ctypes.data, 2, descr,
                    unbox.C_CONTIGUOUS_ALIGNED, 1 << 8, 1, a.dtype.num,
                    a.dtype.byteorder.encode(), unbox.SWAPPED]:
        return "unexpected list or numpy array object layout"
    items, dims = word(id(lst) + unbox.LIST_ITEMS), word(id(a) + unbox.ARRAY_DIMS)
    if [_peek(items), _peek(dims), _peek(dims + 8)] != [id(a), 7, 5]:
        return "unexpected list or numpy array object layout"
    return None


def _peek(addr: int) -> int | None:
    """The word at `addr`, or None where it cannot be read: the C library writes it to a pipe
    (a bad address is an error of the call, EFAULT, not a crash). Without a C library to
    ask (Windows), read directly, which _layout_problem does only once the fields around it
    were found where expected."""
    if _write is None:
        return ctypes.c_ssize_t.from_address(addr).value
    if not 0 < addr < 1 << 63:
        return None
    try:
        r, w = os.pipe()
    except OSError:     # (out of file descriptors)
        return ctypes.c_ssize_t.from_address(addr).value
    try:
        if _write(w, addr, 8) != 8:
            return None
        data = os.read(r, 8)
    finally:
        os.close(r)
        os.close(w)
    return int.from_bytes(data, sys.byteorder, signed=True) if len(data) == 8 else None


def _libc_write() -> Any:
    try:
        fn = ctypes.CDLL(None).write
    except (OSError, AttributeError, TypeError):    # no process-wide C library (Windows)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_ssize_t
    return fn


_write = _libc_write()


# Set at import: with a reason here, the tracer runs graphs on the interpreter (tracegrad.
# runtime does not register itself) and compiling a graph raises (check_layout, which
# runtime.cache asks before it builds an Executable).
LAYOUT_PROBLEM = _layout_problem()


def check_layout() -> None:
    """Raise unless compiled graphs can read their arguments on this Python."""
    if LAYOUT_PROBLEM:
        raise RuntimeError("tracegrad: compiled graphs cannot read their arguments on this "
                           f"Python ({LAYOUT_PROBLEM}); run them on the interpreter "
                           "(tg.config.disable_jit = True)")

ENTRY_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p)
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
        self.table[unbox.SLOT_NDARRAY] = id(np.ndarray)
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
        slots = [(k, w[1]) for k, w in enumerate(layout.outputs) if w[0] == "slot"]
        self._slot_avals = [(self._out_avals[k].shape, self._out_avals[k].dtype)
                            for k, _ in slots]
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
        """Argument `i` as the array the entry takes, or why it cannot be."""
        shape, dtype = self._in[i]
        if not isinstance(a, np.ndarray):
            not_array = (f"argument {i} of type {type(a).__name__} is not an array "
                         f"(expected {dtype}{list(shape)})")
            try:
                a = np.asarray(a)
            except Exception:
                raise TypeError(not_array) from None
            if a.dtype == object:
                raise TypeError(not_array)
        elif type(a) is not np.ndarray:     # (a subclass's own shape or dtype is not read)
            a = np.asarray(a)
        if a.shape != shape or a.dtype != dtype:
            raise TypeError(f"argument {i} must be {dtype}{list(shape)}, got "
                            f"{a.dtype}{list(a.shape)}")
        if not a.flags.c_contiguous or not a.flags.aligned:
            a = np.array(a, order="C")    # (a copy: an unaligned contiguous one stays as is)
        if a.dtype.num != unbox.type_number(dtype):     # an equal dtype of another number
            a = a.view(np.dtype(dtype.str))
        return a

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        # (a list of our own: the entry reads it with the GIL released)
        arrays = list(args)
        outs = [np.empty(shape, dtype) for shape, dtype in self._slot_avals]
        bad = self._run(arrays, outs)
        if bad:
            if len(arrays) != len(self._in):
                want = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in self._in[:6])
                more = ", ..." if len(self._in) > 6 else ""
                raise TypeError(f"compiled graph takes {len(self._in)} arguments ({want}{more}), "
                                f"got {len(arrays)}")
            arrays = [self._convert(i, a) for i, a in enumerate(arrays)]
            bad = self._run(arrays, outs)
            if bad:
                i = bad - 1
                raise RuntimeError(f"internal error: the compiled entry rejected argument {i} "
                                   f"({arrays[i].dtype}{list(arrays[i].shape)}, flags "
                                   f"{arrays[i].flags.num:#x}) that its checks accept")
        if self._simple:
            return outs
        return self._assemble(arrays, outs)

    def _run(self, arrays: list, outs: list) -> int:
        if self.layout.blas:
            with one_blas_thread():
                return self._run_entry(arrays, outs)
        return self._run_entry(arrays, outs)

    def _run_entry(self, arrays: list, outs: list) -> int:
        if self._lock.acquire(blocking=False):
            try:
                return self._entry(self._frame.addr, id(arrays), id(outs))
            finally:
                self._lock.release()
        frame = _Frame(self.layout, self._consts)     # (held until the call returns)
        return self._entry(frame.addr, id(arrays), id(outs))

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

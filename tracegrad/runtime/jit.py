"""Loading object code into the ORC LLJIT; code is unloaded when its tracker is collected."""
from __future__ import annotations

import functools
import itertools
import threading

import llvmlite.binding as llvm

from .target import target_machine

_names = itertools.count()
_lock = threading.Lock()


@functools.cache
def _lljit() -> llvm.LLJIT:
    return llvm.create_lljit_compiler(target_machine())


# An unloaded library still leaves its JITDylib (~9 KB) in the LLJIT, so graphs load into a
# fresh LLJIT every LOADS_PER_JIT libraries; a retired one is freed with its last library.
LOADS_PER_JIT = 1000
_graph_jit: list = []   # [LLJIT, libraries loaded into it]


def load_object(obj: bytes, symbol: str) -> tuple[llvm.ResourceTracker, int]:
    """Link `obj` as a fresh library; return (tracker keeping it loaded, address of symbol)."""
    with _lock:
        if not _graph_jit or _graph_jit[1] >= LOADS_PER_JIT:
            _graph_jit[:] = [llvm.create_lljit_compiler(target_machine()), 0]
        _graph_jit[1] += 1
        lib = (llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
               .export_symbol(symbol))
        tracker = lib.link(_graph_jit[0], f"tg{next(_names)}")
        tracker.lljit = _graph_jit[0]   # the LLJIT outlives its libraries
    return tracker, tracker[symbol]

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


def load_object(obj: bytes, symbol: str) -> tuple[llvm.ResourceTracker, int]:
    """Link `obj` as a fresh library; return (tracker keeping it loaded, address of symbol)."""
    with _lock:
        lib = (llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
               .export_symbol(symbol))
        tracker = lib.link(_lljit(), f"tg{next(_names)}")
    return tracker, tracker[symbol]

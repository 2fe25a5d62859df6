"""The compile cache: in memory (LRU; evicted code is unloaded) and on disk (object code).

Disk entries are keyed by the graph's structural hash, the host target (CPU name and
features) and the tracegrad version. An entry is `MAGIC + sha256(payload) + payload` with
payload = layout JSON length, layout JSON, object code; it is written to a temporary file
and renamed into place, so readers never see a partial entry. A corrupt or truncated entry
is reported with a warning and rebuilt."""
from __future__ import annotations

import collections
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import warnings
from typing import Any, Sequence

import numpy as np

from .. import __version__
from ..codegen import ENTRY, Layout
from ..codegen.plan import has_matmul
from ..ir import Graph, structural_hash
from . import stats
from .blas import blas_int_bits
from .compiler import compile_object, optimised_module
from .executable import Executable, check_layout
from .jit import load_object
from .pool import num_threads
from .target import emit_assembly, gemm_vector_bits, target_id

MAGIC = b"TGOBJ001"


def backend_revision() -> str:
    """A digest of the code generator's, ir/unroll.py's and the runtime's source (the pass
    pipeline, the BLAS binding), of llvmlite's version and numpy's (the entry compares numpy's
    type numbers, which numpy 2 changed on some platforms): changing any of them invalidates
    cached code.
    It is of the source this process imported (taken when this module loads, after codegen/
    and the rest of runtime/): read later, it would file code compiled by the old modules
    under the edited files' key, where a process running the new code would load it."""
    return _BACKEND_REVISION


def _source_digest() -> str:
    import llvmlite

    from .. import codegen
    h = hashlib.sha256(f"{llvmlite.__version__}|numpy {np.__version__}".encode())
    for folder in (os.path.dirname(codegen.__file__), os.path.dirname(__file__)):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(name.encode() + f.read())
    from ..ir import unroll      # (which scans native code unrolls, and how)
    with open(unroll.__file__, "rb") as f:
        h.update(b"unroll.py" + f.read())
    return h.hexdigest()[:16]


_BACKEND_REVISION = _source_digest()


def cache_dir() -> str:
    return os.environ.get("TRACEGRAD_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tracegrad")


def memory_limit() -> int:
    return int(os.environ.get("TRACEGRAD_CACHE_SIZE", "256"))


def disk_enabled() -> bool:
    return os.environ.get("TRACEGRAD_DISK_CACHE", "1") not in ("0", "")


def blas_for(graph: Graph) -> int:
    """How large matmuls of `graph` call BLAS: the width of its integer arguments, or 0 for
    generated loops. Asked only of graphs with a matmul: finding BLAS may import scipy.linalg
    (~0.4 s)."""
    return blas_int_bits() if has_matmul(graph) else 0


def cache_key(graph: Graph) -> str:
    # GEMMs are split for the pool's size (results do not depend on it, speed does)
    text = "|".join([structural_hash(graph), target_id(), __version__, backend_revision(),
                     f"blas={blas_for(graph)}", f"threads={num_threads()}",
                     f"gemm={gemm_vector_bits()}"])
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(key: str) -> str:
    return os.path.join(cache_dir(), key[:2], key + ".tgo")


def _read_entry(path: str) -> tuple[bytes, Layout] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(f"tracegrad: cannot read cache entry {path}: {e}; recompiling", stacklevel=2)
        return None
    try:
        if data[:8] != MAGIC:
            raise ValueError("bad magic")
        digest, payload = data[8:40], data[40:]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("checksum mismatch (truncated or corrupt)")
        (n,) = struct.unpack("<Q", payload[:8])
        layout = Layout.from_json(json.loads(payload[8:8 + n]))
        return payload[8 + n:], layout
    except Exception as e:
        warnings.warn(f"tracegrad: ignoring corrupt cache entry {path} ({e}); recompiling",
                      stacklevel=2)
        return None


def _write_entry(path: str, obj: bytes, layout: Layout) -> None:
    meta = json.dumps(layout.to_json()).encode()
    payload = struct.pack("<Q", len(meta)) + meta + obj
    data = MAGIC + hashlib.sha256(payload).digest() + payload
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        warnings.warn(f"tracegrad: cannot write cache entry {path}: {e}", stacklevel=2)


def _code_text(graph: Graph, mod_holder: list) -> Any:
    def text(what: str) -> str:
        if not mod_holder:   # loaded from disk: rebuild the module (no recompile of code)
            mod_holder.append(optimised_module(graph, blas_for(graph), num_threads())[1])
        mod = mod_holder[0]
        return str(mod) if what == "llvm_ir" else emit_assembly(mod)
    return text


def compile_graph(graph: Graph) -> Executable:
    """Compile `graph` (or load its object code from the disk cache) into an Executable."""
    check_layout()
    key = cache_key(graph)
    hit = _memory.get(key)
    if hit is not None:
        stats.memory_hits += 1
        return hit
    exe = _build(graph, key)
    _memory.put(key, exe)
    return exe


def may_have_compiled() -> bool:
    """False when no lookup can hit: nothing compiled in this process and no entry on disk
    (a cold cache), so a caller can skip hashing a graph to look it up."""
    if _memory.items:
        return True
    if not disk_enabled():
        return False
    now = time.monotonic()
    where = cache_dir()
    seen = _listed
    if seen[0] == where and now - seen[1] < RELIST_S:
        return seen[2]    # listed a moment ago: listing the folder costs 50-150 us a retrace
    try:
        with os.scandir(where) as entries:
            found = any(e.is_dir() for e in entries)
    except OSError:
        found = False
    _listed[:] = [where, now, found]
    return found


# (folder, when, found anything) of the last listing; another process filling or clearing the
# folder meanwhile only costs lookups skipped or missed until the next listing
RELIST_S = 1.0
_listed: list = [None, 0.0, False]


def find_compiled(graph: Graph) -> Executable | None:
    """`graph`'s code if this process or the disk cache already has it; never compiles."""
    check_layout()
    key = cache_key(graph)
    hit = _memory.get(key)
    if hit is not None:
        stats.memory_hits += 1
        return hit
    if disk_enabled() and os.path.exists(entry_path(key)):
        exe = _build(graph, key)
        _memory.put(key, exe)
        return exe
    return None


def _build(graph: Graph, key: str) -> Executable:
    path = entry_path(key)
    found = _read_entry(path) if disk_enabled() else None
    holder: list = []
    if found is not None:
        obj, layout = found
        stats.disk_hits += 1
    else:
        obj, layout, mod = compile_object(graph, key, blas_for(graph), num_threads())
        holder.append(mod)
        if disk_enabled():
            _write_entry(path, obj, layout)
            _listed[:] = [cache_dir(), time.monotonic(), True]    # it has something now
    tracker, addr = load_object(obj, ENTRY)
    return Executable(graph, layout, addr, tracker, key, _code_text(graph, holder))


def run_graph(graph: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    """Run `graph` natively on `args`, compiling it the first time it is seen."""
    return compile_graph(graph)(args)


class _LRU:
    def __init__(self) -> None:
        self.items: collections.OrderedDict[str, Executable] = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> Executable | None:
        with self.lock:
            exe = self.items.get(key)
            if exe is not None:
                self.items.move_to_end(key)
            return exe

    def put(self, key: str, exe: Executable) -> None:
        with self.lock:
            self.items[key] = exe
            while len(self.items) > max(memory_limit(), 1):
                # dropping the last reference releases the tracker: the code is unloaded
                self.items.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


_memory = _LRU()


def clear_memory_cache() -> None:
    _memory.clear()

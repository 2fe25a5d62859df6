"""Where large matmuls find BLAS ?gemm, and OpenBLAS's per-thread thread-count setter, so our
kernels can call GEMM single-threaded from each pool thread instead of stacking OpenBLAS's own
threads on top of ours.

First choice: the OpenBLAS bundled with numpy's wheels (ILP64: 64-bit integer arguments, and
no scipy import). On the 2-core Zen 3 dev machine its single-threaded sgemm is ~10% faster on
mlp_step's 128-row GEMMs than scipy's (0.3.31 vs 0.3.30; 128x784x512: 1175 vs 1299 us), with
bitwise equal results. Second: scipy's BLAS (LP64), through the stable C entry points of
scipy.linalg.cython_blas. TRACEGRAD_BLAS=scipy skips the first, =none both."""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
from typing import NamedTuple


class Gemm(NamedTuple):
    sgemm: int
    dgemm: int
    set_threads: int     # int openblas_set_num_threads_local(int), or 0
    int_bits: int        # width of the Fortran integer arguments: 32 or 64


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _numpy_openblas() -> Gemm | None:
    import numpy
    libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas64*.so*")):
        try:
            lib = ctypes.CDLL(path)
            return Gemm(_address(lib, "scipy_sgemm_64_"), _address(lib, "scipy_dgemm_64_"),
                        _address(lib, "openblas_set_num_threads_local"), 64)
        except (OSError, AttributeError):
            continue
    return None


def _scipy_blas() -> Gemm | None:
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name_of = ctypes.pythonapi.PyCapsule_GetName
    name_of.restype = ctypes.c_char_p
    name_of.argtypes = [ctypes.py_object]
    out = []
    for name in ("sgemm", "dgemm"):
        cap = cython_blas.__pyx_capi__[name]
        out.append(get(cap, name_of(cap)))
    return Gemm(out[0], out[1], _scipy_threads_setter(), 32)


def _scipy_threads_setter() -> int:
    import scipy
    libs = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*.so*")):
        try:
            return _address(ctypes.CDLL(path), "openblas_set_num_threads_local")
        except (OSError, AttributeError):
            continue
    return 0


@functools.cache
def gemm() -> Gemm | None:
    """The ?gemm large matmuls call, or None (then they use generated loops)."""
    choice = os.environ.get("TRACEGRAD_BLAS", "").lower()
    if choice == "none":
        return None
    found = _numpy_openblas() if choice != "scipy" else None
    return found or _scipy_blas()


def gemm_addresses() -> tuple[int, int]:
    """(sgemm, dgemm), or (0, 0) without BLAS."""
    g = gemm()
    return (g.sgemm, g.dgemm) if g else (0, 0)


def blas_threads_address() -> int:
    """`int openblas_set_num_threads_local(int)` of the BLAS in use, or 0 if not found."""
    g = gemm()
    return g.set_threads if g else 0


def blas_int_bits() -> int:
    """Width of the BLAS integer arguments (32 or 64), 0 without BLAS."""
    g = gemm()
    return g.int_bits if g else 0


class OneBlasThread:
    """`with one_blas_thread():` around a native call whose kernels call ?gemm from our pool
    threads: OpenBLAS's thread count is 1 meanwhile, so it does not stack its own threads on
    ours. `openblas_set_num_threads_local` acts process-wide in OpenBLAS's pthreads builds
    (numpy's and scipy's wheels), so set/restore pairs that overlap in time (two tasks, two
    Python threads) can leave the count at 1 for good; here the first of the overlapping
    calls sets it and the last restores it, under a lock. (The kernels' own set/restore
    around each ?gemm, for builds where the count is per thread, then finds 1 and keeps it.)"""

    def __init__(self, setter: int):
        self._set = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(setter) if setter else None
        self._lock = threading.Lock()
        self._depth = 0
        # Whether the count is (or may be) 1 by our doing, and what to restore: an interrupt
        # between the set and the depth's change (Ctrl-C in __enter__ or __exit__) leaves
        # them so the next use limits without re-reading the count and restores it.
        self._limited = False
        self._saved = 0
        if self._set is not None:
            self._saved = self._set(1)
            self._set(self._saved)

    def __enter__(self) -> None:
        if self._set is not None:
            with self._lock:
                if self._depth == 0:
                    if self._limited:
                        self._set(1)
                    else:
                        self._limited = True
                        self._saved = self._set(1)
                self._depth += 1

    def __exit__(self, *exc) -> None:
        if self._set is not None:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._set(self._saved)
                    self._limited = False


@functools.cache
def _guard(setter: int) -> OneBlasThread:
    return OneBlasThread(setter)     # (one per library: its users share the count)


def one_blas_thread() -> OneBlasThread:
    """The guard of the BLAS compiled kernels call."""
    return _guard(blas_threads_address())


@functools.cache
def numpy_one_blas_thread() -> OneBlasThread:
    """The guard of numpy's own OpenBLAS, which interpreted graphs' matmuls run on (the same
    object as one_blas_thread() when compiled kernels call numpy's OpenBLAS too)."""
    import numpy
    libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*.so*")):
        try:
            return _guard(_address(ctypes.CDLL(path), "openblas_set_num_threads_local"))
        except (OSError, AttributeError):
            continue
    return _guard(0)

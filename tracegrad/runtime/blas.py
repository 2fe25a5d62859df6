"""Addresses of scipy's BLAS ?gemm (stable C entry points of scipy.linalg.cython_blas), and of
OpenBLAS's per-thread thread-count setter, so our kernels can call GEMM single-threaded from
each pool thread instead of stacking OpenBLAS's own threads on top of ours."""
from __future__ import annotations

import ctypes
import functools
import glob
import os


@functools.cache
def gemm_addresses() -> tuple[int, int]:
    """(sgemm, dgemm), or (0, 0) without scipy (then large matmuls use generated loops)."""
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return 0, 0
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
    return out[0], out[1]


@functools.cache
def blas_threads_address() -> int:
    """`int openblas_set_num_threads_local(int)` of scipy's OpenBLAS, or 0 if not found."""
    if gemm_addresses()[0] == 0:
        return 0
    import scipy
    libs = os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*.so*")):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value or 0
    return 0

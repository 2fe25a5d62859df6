"""Addresses of scipy's BLAS ?gemm (stable C entry points of scipy.linalg.cython_blas)."""
from __future__ import annotations

import ctypes
import functools


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
    out = []
    for name in ("sgemm", "dgemm"):
        cap = cython_blas.__pyx_capi__[name]
        ctypes.pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
        ctypes.pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
        out.append(get(cap, ctypes.pythonapi.PyCapsule_GetName(cap)))
    return out[0], out[1]

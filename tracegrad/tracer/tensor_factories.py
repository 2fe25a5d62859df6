"""Creating Tensors: `tensor ones zeros full randn rand eye arange linspace ones_like
zeros_like`. Outside any trace they return Tensors (leaves); inside a `jit`/`grad` trace they
produce traced values, so the same code works in both worlds."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..ir import emit as E
from ..ir.builder import Traced, current_builder
from ..ir.builder import _state
from ..ir.core import is_float
from . import numpy_api as tnp
from .random import next_seed, numpy_rng
from .tensor import Tensor

float32 = np.dtype(np.float32)


def _shape(shape: Sequence[Any]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(d) for d in shape)


def _leaf(value: np.ndarray, requires_grad: bool) -> Tensor:
    if requires_grad and not is_float(value.dtype):
        raise RuntimeError("Only Tensors of floating point dtype can require gradients")
    return Tensor._leaf(value, bool(requires_grad))


def _tracing() -> bool:
    return current_builder() is not None


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A leaf Tensor holding a copy of `data` (Python floats become float32)."""
    if isinstance(data, Tensor):
        value = data._val().copy()
    elif isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        value = np.asarray([x._val() if isinstance(x, Tensor) else x for x in data])
    elif isinstance(data, Traced):
        raise TypeError("tg.tensor() of a traced value; inside a trace use the value itself")
    else:
        value = np.array(data)
        if value.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)):
            value = value.astype(float32)
        if value.dtype.kind in "OcSUVMm":   # object, complex, strings, records, datetimes
            raise TypeError(f"tg.tensor: cannot convert {type(data).__name__} of dtype "
                            f"{value.dtype} to a Tensor")
    if dtype is not None:
        value = value.astype(np.dtype(dtype))
    return _leaf(value, requires_grad)


def as_tensor(data: Any, dtype: Any = None) -> Tensor:
    if isinstance(data, Tensor) and (dtype is None or data.dtype == np.dtype(dtype)):
        return data
    return tensor(data, dtype)


def from_numpy(array: np.ndarray) -> Tensor:
    return Tensor._leaf(array)


def full(shape: Sequence[int], fill_value: Any, dtype: Any = None,
         requires_grad: bool = False) -> Any:
    if dtype is None:
        dtype = E.dtype_of(fill_value) if isinstance(fill_value, (bool, int, float)) else \
            float32
    if _tracing():
        return tnp.full_traced(shape, fill_value, dtype)
    return _leaf(np.full(tuple(int(d) for d in shape), fill_value, np.dtype(dtype)),
                 requires_grad)


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    if dtype is None and not requires_grad:
        if _state.stack:    # in a trace: what full_traced makes
            return E.full(_shape(shape), 0, float32)
        try:
            return Tensor._leaf(np.zeros(shape, float32))     # zeros(2, 3), zeros((2, 3))
        except TypeError:
            pass
    return full(_shape(shape), 0, dtype or float32, requires_grad)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    if dtype is None and not requires_grad and not _state.stack:
        try:
            return Tensor._leaf(np.ones(shape, float32))
        except TypeError:
            pass
    return full(_shape(shape), 1, dtype or float32, requires_grad)


def _like(x: Any, value: Any, dtype: Any, requires_grad: bool) -> Any:
    if dtype is None:
        dtype = x.dtype if isinstance(x, (Tensor, Traced)) else E.dtype_of(x)
    if isinstance(x, Traced):
        return tnp.full_traced(x.shape, value, dtype)
    return full(tuple(np.shape(x)) if not isinstance(x, Tensor) else x.shape, value, dtype,
                requires_grad)


def zeros_like(x: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    return _like(x, 0, dtype, requires_grad)


def ones_like(x: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    return _like(x, 1, dtype, requires_grad)


def full_like(x: Any, fill_value: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    return _like(x, fill_value, dtype, requires_grad)


def _random(shape: tuple, dist: str, dtype: Any, requires_grad: bool) -> Any:
    dtype = np.dtype(dtype or float32)
    if _tracing():
        return E.random(shape, np.asarray(next_seed(), np.int64), dist, dtype)
    rng = numpy_rng()
    value = rng.standard_normal(shape) if dist == "normal" else rng.random(shape)
    return _leaf(np.asarray(value, dtype), requires_grad)


def randn(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    """Standard normal draws from the generator `tg.manual_seed` seeds."""
    return _random(_shape(shape), "normal", dtype, requires_grad)


def rand(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    """Uniform [0, 1) draws from the generator `tg.manual_seed` seeds."""
    return _random(_shape(shape), "uniform", dtype, requires_grad)


def randn_like(x: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    return randn(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def rand_like(x: Any, dtype: Any = None, requires_grad: bool = False) -> Any:
    return rand(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def eye(n: int, m: int | None = None, dtype: Any = None, requires_grad: bool = False) -> Any:
    if _tracing():
        return tnp.eye_traced(n, m, dtype)
    return _leaf(np.eye(n, m, dtype=np.dtype(dtype or float32)), requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None,
           requires_grad: bool = False) -> Any:
    if _tracing():
        return tnp.arange_traced(start, end, step, dtype)
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = float32 if any(isinstance(v, float) for v in (start, end, step)) else np.int64
    return _leaf(np.arange(start, end, step).astype(dtype), requires_grad)


def linspace(start: float, end: float, steps: int = 100, dtype: Any = None,
             requires_grad: bool = False) -> Any:
    if _tracing():
        return tnp.linspace_traced(start, end, steps, dtype)
    return _leaf(np.linspace(start, end, steps).astype(dtype or float32), requires_grad)

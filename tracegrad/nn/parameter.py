"""What modules hold and optimizers update: parameters and buffers as `tg.Tensor`s when the
Tensor API is present, numpy arrays otherwise; one place that knows how to read, write and
detach either kind."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import is_float
from ..ir.builder import Traced


def tensor_type() -> type | None:
    """`tg.Tensor`, or None while the Tensor API is absent."""
    from .. import tracer
    mod = getattr(tracer, "tensor", None)
    return getattr(mod, "Tensor", None)


def to_numpy(x: Any) -> np.ndarray:
    """The concrete value of an array, scalar or Tensor (never of a traced value)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Traced):
        raise TypeError("a traced value has no concrete value here; return it from the "
                        "traced function instead")
    t = tensor_type()
    if t is not None and isinstance(x, t):
        return np.asarray(x.detach().numpy())
    return np.asarray(x)


def parameter(value: Any, requires_grad: bool = True) -> Any:
    """A fresh trainable leaf holding a copy of `value`."""
    arr = np.array(to_numpy(value))
    t = tensor_type()
    if t is None:
        return arr
    from .. import tracer
    return tracer.tensor.tensor(arr, requires_grad=requires_grad and is_float(arr.dtype))


def buffer(value: Any) -> Any:
    """State that is saved with the module but not trained (running statistics)."""
    return parameter(value, requires_grad=False)


def is_tensor(x: Any) -> bool:
    t = tensor_type()
    return t is not None and isinstance(x, t)


def grad_of(p: Any) -> np.ndarray | None:
    g = getattr(p, "grad", None) if is_tensor(p) else None
    return None if g is None else to_numpy(g)


def assign(p: Any, value: Any) -> Any:
    """Overwrite `p`'s value in place (as `p.copy_(value)` under no_grad); returns `p`."""
    arr = to_numpy(value)
    if tuple(arr.shape) != tuple(np.shape(p) if not is_tensor(p) else p.shape):
        raise ValueError(f"cannot assign a value of shape {tuple(arr.shape)} to a parameter "
                         f"of shape {tuple(p.shape)}")
    if is_tensor(p):
        from ..tracer import tensor as tmod
        tmod.assign_(p, arr)
        return p
    p[...] = arr
    return p


def detach(x: Any) -> Any:
    """`x` without a gradient path: Tensor.detach, stop_gradient when tracing."""
    if is_tensor(x):
        return x.detach()
    if isinstance(x, Traced):
        from ..tracer.numpy_api import stop_gradient
        return stop_gradient(x)
    return x

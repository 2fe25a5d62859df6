"""What modules hold and optimizers update: `Parameter`s (leaf Tensors that require grad)
and buffers (leaf Tensors that do not), and one place that knows how to read, write and
detach them next to plain arrays and traced values."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import is_float
from ..ir.builder import Traced
from ..tracer import tensor as T
from ..tracer.tensor import Tensor


class Parameter(Tensor):
    """A Tensor that is a module parameter: assigning one to a Module attribute registers
    it. `Parameter(data)` copies `data` into a new leaf that requires grad (if float)."""
    __slots__ = ()

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> Parameter:
        arr = np.array(to_numpy(data) if data is not None else np.zeros(0, np.float32))
        t = T.tensor(arr, requires_grad=requires_grad and is_float(arr.dtype))
        t.__class__ = cls        # same layout (no new slots): a leaf Tensor that knows its role
        return t

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


def to_numpy(x: Any) -> np.ndarray:
    """The concrete value of an array, scalar or Tensor (never of a traced value)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, Traced):
        raise TypeError("a traced value has no concrete value here; return it from the "
                        "traced function instead")
    if isinstance(x, Tensor):
        return np.asarray(x._val())     # (its value: no alias made)
    return np.asarray(x)


def parameter(value: Any, requires_grad: bool = True) -> Parameter:
    return Parameter(value, requires_grad)


def buffer(value: Any) -> Tensor:
    """State saved with the module but not trained (running statistics): a plain leaf."""
    return T.tensor(np.array(to_numpy(value)))


def is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def grad_of(p: Any) -> np.ndarray | None:
    g = p.grad if isinstance(p, Tensor) else None
    return None if g is None else to_numpy(g)


def assign(p: Any, value: Any) -> Any:
    """Overwrite `p`'s value in place (as `p.copy_(value)` under no_grad); returns `p`."""
    arr = to_numpy(value)
    if tuple(arr.shape) != tuple(p.shape):
        raise ValueError(f"cannot assign a value of shape {tuple(arr.shape)} to a parameter "
                         f"of shape {tuple(p.shape)}")
    if isinstance(p, Tensor):
        return T.assign_(p, arr)
    p[...] = arr
    return p


def detach(x: Any) -> Any:
    """`x` without a gradient path: Tensor.detach, stop_gradient when tracing."""
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, Traced):
        from ..tracer.numpy_api import stop_gradient
        return stop_gradient(x)
    return x

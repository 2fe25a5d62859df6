"""Array methods on traced values (`x.sum()`, `x.T`, `x.reshape(...)`, `x[1:]`), the same
spelling numpy arrays and Tensors offer, and jax's `x.at[index].set(v)`."""
from __future__ import annotations

from typing import Any

from ..ir import emit as E
from ..ir.builder import Traced
from . import numpy_api as tnp
from .indexing import _At, getitem, int_index

METHODS = {
    "sum": tnp.sum, "mean": tnp.mean, "max": tnp.max, "min": tnp.min, "prod": tnp.prod,
    "argmax": tnp.argmax, "argmin": tnp.argmin, "exp": tnp.exp, "log": tnp.log,
    "tanh": tnp.tanh, "sigmoid": tnp.sigmoid, "relu": tnp.relu, "sqrt": tnp.sqrt,
    "abs": tnp.abs, "pow": tnp.pow, "sin": tnp.sin, "cos": tnp.cos, "reshape": tnp.reshape,
    "view": tnp.reshape, "transpose": tnp.transpose, "matmul": tnp.matmul, "dot": tnp.dot,
    "astype": tnp.astype, "squeeze": tnp.squeeze, "unsqueeze": tnp.expand_dims,
    "clip": tnp.clip, "clamp": tnp.clip, "logsumexp": tnp.logsumexp, "square": tnp.square,
    "all": tnp.all, "any": tnp.any, "var": tnp.var, "std": tnp.std,
}


def _matmul(self: Traced, other: Any) -> Any:
    if type(other) is Traced:   # (another traced value cannot be a Tensor: no dispatch)
        if 0 < len(self.atom.aval.shape) <= 2 and 0 < len(other.atom.aval.shape) <= 2:
            return E.matmul(self, other)     # tnp.matmul's common case: no batch dimensions
        return tnp.matmul.raw(self, other)
    return tnp.matmul(self, other)


def _getitem(self: Traced, index: Any) -> Any:
    if type(index) is int:      # x[t]: indexing's common case, without the dispatch
        return int_index(self, index)
    return getitem(self, index)


def install() -> None:
    for name, fn in METHODS.items():
        setattr(Traced, name, fn)
    Traced.__getitem__ = _getitem
    # `@` broadcasts batch dimensions like np.matmul (the primitive needs equal batches)
    Traced.__matmul__ = _matmul
    Traced.__rmatmul__ = lambda self, other: tnp.matmul(other, self)
    Traced.T = property(lambda self: tnp.transpose(self))
    Traced.mT = property(lambda self: tnp.swapaxes(self, -1, -2))
    Traced.t = lambda self: tnp.transpose(self)
    Traced.at = property(_At)   # x.at[index].set(v): JAX's functional index updates
    Traced.__array_ufunc__ = None   # numpy defers `ndarray op traced` to our reflected ops


install()

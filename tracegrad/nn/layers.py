"""The standard layers: Linear, Embedding, activations, Dropout, containers and losses."""
from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

import numpy as np

from ..tracer import numpy_api as tnp
from . import functional as F
from . import init
from .module import Module


class Linear(Module):
    """y = x @ weight.T + bias, with `weight` [out_features, in_features] (PyTorch's layout
    and initialisation: uniform in +-1/sqrt(in_features))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: Any = np.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        w = init.kaiming_uniform((out_features, in_features), a=math.sqrt(5), dtype=dtype)
        self.register_parameter("weight", w)
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.register_parameter("bias", init.uniform(out_features, -bound, bound, dtype)
                                if bias else None)

    def forward(self, x: Any) -> Any:
        y = tnp.matmul(x, tnp.transpose(self.weight))
        return y if self.bias is None else tnp.add(y, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: `weight[indices]`, rows initialised from N(0, 1). The row at
    `padding_idx` starts at zero and receives no gradient."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype: Any = np.float32):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        w = init.normal((num_embeddings, embedding_dim), dtype=dtype)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.register_parameter("weight", w)

    def forward(self, indices: Any) -> Any:
        out = tnp.take(self.weight, indices, axis=0)
        if self.padding_idx is None:
            return out
        keep = tnp.expand_dims(tnp.not_equal(indices, self.padding_idx), -1)
        return tnp.where(keep, out, 0.0)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class Dropout(Module):
    """Zero elements with probability p (scaling the rest by 1/(1-p)) in training mode; the
    identity in eval mode. Under `tg.jit`/`tg.grad`, pass `seed=` to `module.apply`."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Any) -> Any:
        if not self.training or self.p == 0:
            return x
        return F.dropout(x, self.p, True, seed=self._dropout_seed(x))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _Elementwise(Module):
    fn: Any = None

    def forward(self, x: Any) -> Any:
        return type(self).fn(x)


class ReLU(_Elementwise):
    fn = staticmethod(tnp.relu)


class Tanh(_Elementwise):
    fn = staticmethod(tnp.tanh)


class Sigmoid(_Elementwise):
    fn = staticmethod(tnp.sigmoid)


class Identity(_Elementwise):
    fn = staticmethod(lambda x: x)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Any) -> Any:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Any:
        return F.softmax(x, axis=self.dim)


class LogSoftmax(Softmax):
    def forward(self, x: Any) -> Any:
        return F.log_softmax(x, axis=self.dim)


class Flatten(Module):
    """Flatten dimensions start_dim..end_dim into one."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        s, e = (tnp._axis(d, len(shape), what="Flatten") for d in (self.start_dim, self.end_dim))
        return tnp.reshape(x, shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:])


class Sequential(Module):
    """Modules applied in order; `Sequential(a, b)` names them "0", "1"."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int | slice) -> Any:
        mods = list(self._modules.values())
        return Sequential(*mods[i]) if isinstance(i, slice) else mods[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of submodules whose parameters the parent sees."""

    def __init__(self, modules: Iterable[Module] = ()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class CrossEntropyLoss(Module):
    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        self.weight, self.ignore_index = weight, ignore_index
        self.reduction, self.label_smoothing = reduction, label_smoothing

    def forward(self, logits: Any, labels: Any) -> Any:
        return F.cross_entropy(logits, labels, reduction=self.reduction, weight=self.weight,
                               ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, x: Any, y: Any) -> Any:
        return F.mse_loss(x, y, reduction=self.reduction)

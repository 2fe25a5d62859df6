"""Normalisation layers: BatchNorm1d (batch statistics in training, running statistics in
eval) and LayerNorm."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..tracer import numpy_api as tnp
from . import init
from .module import Module


def _normalize(x: Any, mean: Any, var: Any, eps: float) -> Any:
    return tnp.div(tnp.sub(x, mean), tnp.sqrt(tnp.add(var, eps)))


class BatchNorm1d(Module):
    """Normalise each feature of a [N, C] or [N, C, L] input. In training mode: by the batch
    mean and biased variance, updating `running_mean`/`running_var` (unbiased) with
    `momentum`; in eval mode: by the running statistics. The mode is `train()`/`eval()`,
    independent of `tg.no_grad`."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 dtype: Any = np.float32):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", init.ones(num_features, dtype) if affine else None)
        self.register_parameter("bias", init.zeros(num_features, dtype) if affine else None)
        if track_running_stats:
            self.register_buffer("running_mean", init.zeros(num_features, dtype))
            self.register_buffer("running_var", init.ones(num_features, dtype))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64))

    def forward(self, x: Any) -> Any:
        shape = tuple(x.shape)
        if len(shape) not in (2, 3) or shape[1] != self.num_features:
            raise ValueError(f"BatchNorm1d({self.num_features}) expects input of shape [N, "
                             f"{self.num_features}] or [N, {self.num_features}, L], got "
                             f"{shape}")
        axes = (0,) if len(shape) == 2 else (0, 2)
        bshape = (1, self.num_features) + ((1,) if len(shape) == 3 else ())
        if self.training or not self.track_running_stats:
            mean = tnp.mean(x, axis=axes, keepdims=True)
            var = tnp.mean(tnp.square(tnp.sub(x, mean)), axis=axes, keepdims=True)
            if self.training and self.track_running_stats:
                self._track(mean, var, math.prod(shape) // self.num_features)
        else:
            mean = tnp.reshape(self.running_mean, bshape)
            var = tnp.reshape(self.running_var, bshape)
        y = _normalize(x, mean, var, self.eps)
        if self.affine:
            y = tnp.add(tnp.mul(y, tnp.reshape(self.weight, bshape)),
                        tnp.reshape(self.bias, bshape))
        return y

    def _track(self, mean: Any, var: Any, n: int) -> None:
        m = self.momentum
        unbiased = tnp.mul(tnp.reshape(var, (self.num_features,)), n / max(n - 1, 1))
        mean = tnp.reshape(mean, (self.num_features,))
        # the running statistics carry no gradient (PyTorch updates them under no_grad)
        new_mean = tnp.add(tnp.mul(self.running_mean, 1 - m), tnp.mul(mean, m))
        new_var = tnp.add(tnp.mul(self.running_var, 1 - m), tnp.mul(unbiased, m))
        self._update_buffer("running_mean", tnp.stop_gradient(new_mean))
        self._update_buffer("running_var", tnp.stop_gradient(new_var))
        self._update_buffer("num_batches_tracked", tnp.add(self.num_batches_tracked, 1))

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class LayerNorm(Module):
    """Normalise over the last `len(normalized_shape)` dimensions (biased variance)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, dtype: Any = np.float32):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        self.elementwise_affine = elementwise_affine
        self.register_parameter("weight", init.ones(shape, dtype) if elementwise_affine
                                else None)
        self.register_parameter("bias", init.zeros(shape, dtype) if elementwise_affine
                                else None)

    def forward(self, x: Any) -> Any:
        n = len(self.normalized_shape)
        if tuple(x.shape[-n:]) != self.normalized_shape:
            raise ValueError(f"LayerNorm{self.normalized_shape} got input of shape "
                             f"{tuple(x.shape)}")
        axes = tuple(range(len(x.shape) - n, len(x.shape)))
        mean = tnp.mean(x, axis=axes, keepdims=True)
        var = tnp.mean(tnp.square(tnp.sub(x, mean)), axis=axes, keepdims=True)
        y = _normalize(x, mean, var, self.eps)
        if self.elementwise_affine:
            y = tnp.add(tnp.mul(y, self.weight), self.bias)
        return y

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")

"""Composite neural-network functions written from primitives (`tg.nn.functional`)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import emit as E
from ..ir.builder import Traced
from ..tracer import numpy_api as tnp
from ..tracer.dispatch import op
from ..tracer.random import next_seed
from ..tracer.tensor import tensor
from .parameter import is_tensor

relu = tnp.relu
sigmoid = tnp.sigmoid
tanh = tnp.tanh
logsumexp = tnp.logsumexp


def _axis(axis: Any, dim: Any) -> Any:
    return dim if dim is not None else axis


def _empty_along(x: Any, axis: Any) -> bool:
    """Whether `x`'s axis `axis` (in range) has no elements: softmax over it is empty."""
    shape = E.shape_of(x)
    return isinstance(axis, (int, np.integer)) and -len(shape) <= axis < len(shape) and \
        shape[axis] == 0


def _reduce(loss: Any, reduction: str) -> Any:
    if reduction == "mean":
        return tnp.mean.raw(loss)
    if reduction == "sum":
        return tnp.sum.raw(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


@op("LogSoftmax")
def log_softmax(x: Any, axis: int = -1, dim: int | None = None) -> Any:
    axis = _axis(axis, dim)
    x = E.to_float(tnp._arr(x))
    if _empty_along(x, axis):      # nothing to normalise: the result is empty too
        return E.full(E.shape_of(x), 0.0, E.dtype_of(x))
    # (x - max) - log(sum(exp(x - max))): adding the max back and subtracting it again, as
    # x - logsumexp(x) does, loses the small term to rounding when the logits are large
    m = E.stop_gradient(tnp.max.raw(x, axis, keepdims=True))
    m = E.where(E.less(E.abs(m), math.inf), m, 0.0)    # an all -inf row stays -inf, not nan
    shifted = E.sub(x, m)
    return E.sub(shifted, E.log(tnp.sum.raw(E.exp(shifted), axis, keepdims=True)))


@op("Softmax")
def softmax(x: Any, axis: int = -1, dim: int | None = None) -> Any:
    axis = _axis(axis, dim)
    x = E.to_float(tnp._arr(x))
    if _empty_along(x, axis):
        return E.full(E.shape_of(x), 0.0, E.dtype_of(x))
    m = E.stop_gradient(tnp.max.raw(x, axis, keepdims=True))
    e = E.exp(E.sub(x, m))
    return E.div(e, tnp.sum.raw(e, axis, keepdims=True))


def cross_entropy(logits: Any, labels: Any, reduction: str = "mean", axis: int = -1,
                  dim: int | None = None, weight: Any = None, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> Any:
    """Softmax cross-entropy of `logits` [..., C] against integer class `labels` [...], as
    torch's: `weight` [C] weighs each class (a mean divides by the weights of the labels),
    a label equal to `ignore_index` counts for nothing (nor in the mean), and
    `label_smoothing` e mixes the one-hot target with e / C of every class. A label out of
    range raises IndexError where it is known (arrays, Tensors); traced, it adds nothing."""
    if is_tensor(labels) or is_tensor(logits) and isinstance(labels, (np.ndarray, list)):
        # (recorded beside a Tensor, the labels are an input, a traced value: checked here)
        ndim = len(np.shape(logits))
        n = np.shape(logits)[tnp._axis(_axis(axis, dim), ndim, what="cross_entropy")] \
            if ndim else 0
        _check_labels(np.asarray(labels._val() if is_tensor(labels) else labels), n,
                      ignore_index)
    return _cross_entropy(logits, labels, reduction, _axis(axis, dim), weight, ignore_index,
                          float(label_smoothing))


def _check_labels(labels: np.ndarray, n: int, ignore_index: int) -> None:
    bad = labels[((labels < 0) | (labels >= n)) & (labels != ignore_index)]
    if bad.size:
        raise IndexError(f"Target {bad.flat[0]} is out of bounds.")   # PyTorch's wording


@op("NllLoss")
def _cross_entropy(logits: Any, labels: Any, reduction: str, axis: int, weight: Any,
                   ignore_index: int, smoothing: float) -> Any:
    logits = E.to_float(tnp._arr(logits))
    labels = tnp._arr(labels)
    ndim = len(E.shape_of(logits))
    axis = tnp._axis(axis, ndim, what="cross_entropy")
    if axis != ndim - 1:   # the class axis goes last
        logits = E.transpose(logits, [i for i in range(ndim) if i != axis] + [axis])
    if not np.issubdtype(E.dtype_of(labels), np.integer):
        raise TypeError(f"cross_entropy: labels must be integer class indices, got "
                        f"{E.dtype_of(labels)}")
    shape = tuple(E.shape_of(logits))
    if tuple(E.shape_of(labels)) != shape[:-1]:
        raise ValueError(f"cross_entropy: labels of shape {tuple(E.shape_of(labels))} do not "
                         f"match logits of shape {shape} (expected {shape[:-1]})")
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {smoothing}")
    if isinstance(labels, (np.ndarray, np.generic)):   # traced labels cannot be checked here
        _check_labels(np.asarray(labels), shape[-1], ignore_index)
    dtype = E.dtype_of(logits)
    if weight is not None:
        weight = E.convert(tnp._arr(weight), dtype)
        if tuple(E.shape_of(weight)) != shape[-1:]:
            raise ValueError(f"cross_entropy: weight of shape {tuple(E.shape_of(weight))} "
                             f"does not match {shape[-1]} classes")
    logp = log_softmax.raw(logits, -1)
    last = (len(shape) - 1,)
    # (a label out of range, traced, matches no class: it adds nothing)
    classes = E.iota(shape, len(shape) - 1, E.dtype_of(labels))
    onehot = E.equal(classes, E.reshape(labels, shape[:-1] + (1,)))
    if 0 <= ignore_index < shape[-1]:      # a class of its own: its labels match it
        onehot = E.logical_and(onehot, E.not_equal(classes, ignore_index))
    if weight is not None:
        onehot_w = E.where(onehot, E.broadcast_to(weight, shape), 0.0)
        loss = E.neg(E.reduce_sum(E.mul(onehot_w, logp), last))
        counts = E.reduce_sum(onehot_w, last)       # each row's weight (0: ignored)
    else:
        loss = E.neg(E.reduce_sum(E.where(onehot, logp, 0.0), last))
        counts = None
    if smoothing:
        kept = E.not_equal(labels, ignore_index)
        every = logp if weight is None else E.mul(logp, weight)
        smooth = E.where(kept, E.neg(E.reduce_sum(every, last)), 0.0)
        loss = E.add(E.mul(1.0 - smoothing, loss), E.mul(smoothing / shape[-1], smooth))
    if reduction != "mean":
        return _reduce(loss, reduction)
    if counts is None:      # the mean over the labels not ignored (torch's: NaN if none is)
        counts = E.convert(E.not_equal(labels, ignore_index), dtype)
    return E.div(tnp.sum.raw(loss), tnp.sum.raw(counts))


@op("BinaryCrossEntropyWithLogits")
def binary_cross_entropy_with_logits(z: Any, y: Any, reduction: str = "mean") -> Any:
    """max(z,0) - z*y + log1p(exp(-|z|)): stable for any logit."""
    z = E.to_float(tnp._arr(z))
    y = E.convert(tnp._arr(y), E.dtype_of(z))
    if tuple(E.shape_of(y)) != tuple(E.shape_of(z)):     # (torch's check: no broadcasting)
        raise ValueError(f"binary_cross_entropy_with_logits: target size "
                         f"{tuple(E.shape_of(y))} must be the same as input size "
                         f"{tuple(E.shape_of(z))}")
    loss = E.add(E.sub(E.maximum(z, 0.0), E.mul(z, y)), E.log1p(E.exp(E.neg(E.abs(z)))))
    return _reduce(loss, reduction)


@op("MseLoss")
def mse_loss(x: Any, y: Any, reduction: str = "mean") -> Any:
    d = E.sub(tnp._arr(x), tnp._arr(y))
    return _reduce(E.mul(d, d), reduction)


@op("Gelu")
def gelu(x: Any, approximate: str = "none") -> Any:
    x = E.to_float(tnp._arr(x))
    if approximate == "tanh":
        inner = E.mul(math.sqrt(2 / math.pi), E.add(x, E.mul(0.044715, E.mul(x, E.mul(x, x)))))
        return E.mul(E.mul(0.5, x), E.add(1.0, E.tanh(inner)))
    return E.mul(E.mul(0.5, x), E.add(1.0, E.erf(E.mul(x, 1 / math.sqrt(2)))))


def dropout(x: Any, p: float = 0.5, training: bool = True, seed: Any = None) -> Any:
    """Zero each element with probability p and scale the rest by 1/(1-p) when training.

    The mask is a pure function of `seed` (an int, or an int64 scalar array/Tensor/traced
    value). Without one: eagerly, a fresh seed from `tg.manual_seed`'s generator; under
    `tg.jit`/`tg.grad` a seed is required (a constant would give the same mask every call)."""
    if seed is None and training and 0 < p < 1:
        if isinstance(x, Traced):
            raise ValueError("dropout inside a traced function needs seed=: pass a traced "
                             "int64 scalar (e.g. the step number) as an argument")
        if is_tensor(x):   # a graph input, not a literal: each step's graph stays the same
            seed = tensor(np.int64(next_seed()))
    return _dropout(x, p, training, seed=seed)


@op("Dropout")
def _dropout(x: Any, p: float, training: bool, seed: Any) -> Any:
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    x = tnp._arr(x)
    if not training or p == 0:
        return x
    if p == 1:
        return E.mul(x, 0.0)
    seed = next_seed() if seed is None else seed
    u = E.random(E.shape_of(x), seed, "uniform", E.dtype_of(x))
    return E.where(E.greater_equal(u, p), E.div(x, 1.0 - p), 0.0)

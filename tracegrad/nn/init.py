"""Standard initialisers (PyTorch's formulas), drawing from the `tg.manual_seed` generator.

Each returns a new numpy array of the given shape; modules wrap it as a parameter. The
`fan_in`/`fan_out` conventions are PyTorch's: a weight is `[out_features, in_features, ...]`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..tracer.random import numpy_rng

_GAINS = {"linear": 1.0, "identity": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3,
          "relu": math.sqrt(2.0), "selu": 0.75}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity, as `torch.nn.init.calculate_gain`."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity in _GAINS:
        return _GAINS[nonlinearity]
    if nonlinearity.startswith("conv"):
        return 1.0
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight shaped `[out, in, *receptive]`."""
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need at least 2 dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _shape(shape: Any) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


def uniform(shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = np.float32) -> np.ndarray:
    return numpy_rng().uniform(low, high, _shape(shape)).astype(dtype)


def normal(shape: Any, mean: float = 0.0, std: float = 1.0, dtype: Any = np.float32) -> np.ndarray:
    return (mean + std * numpy_rng().standard_normal(_shape(shape))).astype(dtype)


def zeros(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.zeros(_shape(shape), dtype)


def ones(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.ones(_shape(shape), dtype)


def xavier_uniform(shape: Any, gain: float = 1.0, dtype: Any = np.float32) -> np.ndarray:
    fan_in, fan_out = fans(_shape(shape))
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform(shape, -bound, bound, dtype)


def xavier_normal(shape: Any, gain: float = 1.0, dtype: Any = np.float32) -> np.ndarray:
    fan_in, fan_out = fans(_shape(shape))
    return normal(shape, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), dtype)


def _kaiming_std(shape: Any, a: float, mode: str, nonlinearity: str) -> float:
    fan_in, fan_out = fans(_shape(shape))
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform(shape: Any, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", dtype: Any = np.float32) -> np.ndarray:
    bound = math.sqrt(3.0) * _kaiming_std(shape, a, mode, nonlinearity)
    return uniform(shape, -bound, bound, dtype)


def kaiming_normal(shape: Any, a: float = 0.0, mode: str = "fan_in",
                   nonlinearity: str = "leaky_relu", dtype: Any = np.float32) -> np.ndarray:
    return normal(shape, 0.0, _kaiming_std(shape, a, mode, nonlinearity), dtype)

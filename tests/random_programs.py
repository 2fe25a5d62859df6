"""Random differentiable programs for the property and differential tests: a program is a list
of steps over broadcast-compatible values, and runs on any numpy-like library (tracegrad,
numpy, jax.numpy, torch) through a small adapter."""
from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# Each op is written from the library's primitives; inputs are kept in each op's domain
# (log of 1 + x^2, exp of tanh x) so that any composition stays finite.
UNARY: dict[str, Callable] = {
    "sin": lambda L, x: L.sin(x),
    "cos": lambda L, x: L.cos(x),
    "tanh": lambda L, x: L.tanh(x),
    "sigmoid": lambda L, x: L.sigmoid(x),
    "erf": lambda L, x: L.erf(x),
    "exp": lambda L, x: L.exp(L.tanh(x)),
    "log": lambda L, x: L.log(1.0 + x * x),
    "log1p": lambda L, x: L.log1p(x * x),
    "expm1": lambda L, x: L.expm1(L.tanh(x)),
    "sqrt": lambda L, x: L.sqrt(1.0 + x * x),
    "reciprocal": lambda L, x: 1.0 / (1.0 + x * x),
    "square": lambda L, x: x * x,
    "affine": lambda L, x: 0.5 * x - 0.25,
    "neg": lambda L, x: -x,
    "abs": lambda L, x: L.abs(x),
    "relu": lambda L, x: L.relu(x),
}
BINARY: dict[str, Callable] = {
    "add": lambda L, x, y: x + y,
    "sub": lambda L, x, y: x - y,
    "mul": lambda L, x, y: x * y,
    "div": lambda L, x, y: x / (1.0 + y * y),
    "pow": lambda L, x, y: L.pow(1.0 + x * x, L.tanh(y)),
    "maximum": lambda L, x, y: L.maximum(x, y),
    "minimum": lambda L, x, y: L.minimum(x, y),
}
REDUCE = ("sum", "mean", "max", "logsumexp")
NONSMOOTH = {"abs", "relu", "maximum", "minimum", "max", "where"}


@dataclass
class Program:
    base: tuple[int, ...]
    shapes: list[tuple[int, ...]]
    steps: list[tuple] = field(default_factory=list)
    consts: list[np.ndarray] = field(default_factory=list)

    @property
    def smooth(self) -> bool:
        return not any(s[1] in NONSMOOTH for s in self.steps)

    def run(self, L: Any, *xs: Any) -> Any:
        """The program's final value, computed with library adapter `L`."""
        vals = list(xs)
        for step in self.steps:
            kind, name, ins = step[0], step[1], step[2]
            args = [vals[i] for i in ins]
            if kind == "u":
                vals.append(UNARY[name](L, *args))
            elif kind == "b":
                vals.append(BINARY[name](L, *args))
            elif kind == "r":
                vals.append(L.reduce(name, args[0], step[3]))
            elif kind == "where":
                vals.append(L.where(L.greater(args[0], 0.0), args[1], args[2]))
            elif kind == "matmul":
                vals.append(L.matmul(args[0], L.const(self.consts[step[3]])))
        return vals[-1]

    def loss(self, L: Any, w: np.ndarray) -> Callable:
        """A scalar function of the inputs: <program output, w>."""
        return lambda *xs: L.sum_all(self.run(L, *xs) * L.const(w))

    def inputs(self, seed: int, dtype: Any = np.float64) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.uniform(-2, 2, s).astype(dtype) for s in self.shapes]

    def __repr__(self) -> str:
        return f"Program(base={self.base}, shapes={self.shapes}, steps={self.steps})"


def _shape_of(prog: Program, shapes: list, ins: list[int]) -> tuple[int, ...]:
    return tuple(max(dims) for dims in zip(*[shapes[i] for i in ins], strict=True))


def generate(pick: Callable[[int, int], int], *, smooth: bool = False,
             max_steps: int = 8) -> Program:
    """A random program; `pick(lo, hi)` returns an int in [lo, hi] (hypothesis or a rng)."""
    rank = pick(0, 3)
    base = tuple(pick(1, 4) for _ in range(rank))
    n_in = pick(1, 3)
    shapes = [tuple(d if pick(0, 2) else 1 for d in base) for _ in range(n_in)]
    prog = Program(base, shapes)
    vals = list(shapes)
    unary = [n for n in UNARY if not (smooth and n in NONSMOOTH)]
    binary = [n for n in BINARY if not (smooth and n in NONSMOOTH)]
    reduce = [n for n in REDUCE if not (smooth and n in NONSMOOTH)]
    for _ in range(pick(1, max_steps)):
        kind = pick(0, 9)
        last = len(vals) - 1
        i = pick(0, last) if pick(0, 1) else last   # favour chains on the latest value
        if kind <= 3:
            prog.steps.append(("u", unary[pick(0, len(unary) - 1)], [i]))
            vals.append(vals[i])
        elif kind <= 6 and len(vals) > 1:
            j = pick(0, last - 1)
            j += j >= i                              # two distinct values: no ties by design
            prog.steps.append(("b", binary[pick(0, len(binary) - 1)], [i, j]))
            vals.append(_shape_of(prog, vals, [i, j]))
        elif kind == 7 and rank > 0:
            axis = pick(0, rank - 1)
            prog.steps.append(("r", reduce[pick(0, len(reduce) - 1)], [i], axis))
            vals.append(tuple(1 if a == axis else d for a, d in enumerate(vals[i])))
        elif kind == 8 and rank > 0 and vals[i][-1] == base[-1]:
            n = base[-1]
            rng = np.random.default_rng(pick(0, 1000))
            prog.consts.append(rng.uniform(-1, 1, (n, n)) / math.sqrt(n))
            prog.steps.append(("matmul", "matmul", [i], len(prog.consts) - 1))
            vals.append(vals[i])
        elif kind == 9 and len(vals) > 2 and not smooth:
            ins = [pick(0, last) for _ in range(3)]
            prog.steps.append(("where", "where", ins))
            vals.append(_shape_of(prog, vals, ins))
        else:
            prog.steps.append(("u", unary[pick(0, len(unary) - 1)], [i]))
            vals.append(vals[i])
    return prog


def rng_picker(seed: int) -> Callable[[int, int], int]:
    rng = np.random.default_rng(seed)
    return lambda lo, hi: int(rng.integers(lo, hi + 1))


def output_weights(prog: Program, seed: int) -> np.ndarray:
    out = prog.run(NUMPY, *[np.zeros(s) for s in prog.shapes])
    shape = np.shape(out)
    return np.random.default_rng(seed + 7).uniform(-1, 1, shape)


def _numpy_reduce(name: str, x: Any, axis: int) -> Any:
    if name == "logsumexp":
        m = np.max(x, axis=axis, keepdims=True)
        return m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return getattr(np, {"max": "amax"}.get(name, name))(x, axis=axis, keepdims=True)


def _erf(x: Any) -> Any:
    from scipy.special import erf
    return erf(x)


NUMPY = types.SimpleNamespace(
    sin=np.sin, cos=np.cos, tanh=np.tanh, sigmoid=lambda x: 1 / (1 + np.exp(-x)), erf=_erf,
    exp=np.exp, log=np.log, log1p=np.log1p, expm1=np.expm1, sqrt=np.sqrt, abs=np.abs,
    relu=lambda x: np.maximum(x, 0), pow=np.power, maximum=np.maximum, minimum=np.minimum,
    where=np.where, greater=np.greater, matmul=np.matmul, const=lambda a: a,
    reduce=_numpy_reduce, sum_all=np.sum)


def tracegrad_lib() -> Any:
    import tracegrad as tg

    def reduce(name: str, x: Any, axis: int) -> Any:
        return getattr(tg, name)(x, axis=axis, keepdims=True)
    return types.SimpleNamespace(
        sin=tg.sin, cos=tg.cos, tanh=tg.tanh, sigmoid=tg.sigmoid, erf=tg.erf, exp=tg.exp,
        log=tg.log, log1p=tg.log1p, expm1=tg.expm1, sqrt=tg.sqrt, abs=tg.abs, relu=tg.relu,
        pow=tg.pow, maximum=tg.maximum, minimum=tg.minimum, where=tg.where,
        greater=tg.greater, matmul=tg.matmul, const=lambda a: a, reduce=reduce,
        sum_all=tg.sum)


def jax_lib() -> Any:
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    def reduce(name: str, x: Any, axis: int) -> Any:
        if name == "logsumexp":
            return logsumexp(x, axis=axis, keepdims=True)
        return getattr(jnp, name)(x, axis=axis, keepdims=True)
    return types.SimpleNamespace(
        sin=jnp.sin, cos=jnp.cos, tanh=jnp.tanh, sigmoid=jax.nn.sigmoid,
        erf=jax.scipy.special.erf, exp=jnp.exp, log=jnp.log, log1p=jnp.log1p,
        expm1=jnp.expm1, sqrt=jnp.sqrt, abs=jnp.abs, relu=jax.nn.relu, pow=jnp.power,
        maximum=jnp.maximum, minimum=jnp.minimum, where=jnp.where, greater=jnp.greater,
        matmul=jnp.matmul, const=jnp.asarray, reduce=reduce, sum_all=jnp.sum)


def torch_lib() -> Any:
    import torch

    def reduce(name: str, x: Any, axis: int) -> Any:
        if name == "logsumexp":
            return torch.logsumexp(x, dim=axis, keepdim=True)
        fn = {"max": torch.amax, "sum": torch.sum, "mean": torch.mean}[name]
        return fn(x, dim=axis, keepdim=True)
    return types.SimpleNamespace(
        sin=torch.sin, cos=torch.cos, tanh=torch.tanh, sigmoid=torch.sigmoid, erf=torch.erf,
        exp=torch.exp, log=torch.log, log1p=torch.log1p, expm1=torch.expm1, sqrt=torch.sqrt,
        abs=torch.abs, relu=torch.relu, pow=torch.pow, maximum=torch.maximum,
        minimum=torch.minimum, where=torch.where, greater=torch.gt, matmul=torch.matmul,
        const=lambda a: torch.as_tensor(a, dtype=torch.float64), reduce=reduce,
        sum_all=torch.sum)

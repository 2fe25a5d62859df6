"""Common patterns outside BENCH.md's workloads, each one jitted function, tracegrad against
jax.jit on the same thread count: a survey for slow spots (a transposed read walked row by
row, `x ** 2` through pow, ...), not a target. Medians of 7 rounds, the two alternating.

Run: python bench/patterns.py [substring of a pattern's name ...]
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from common import optional, pin_threads

ROUNDS = 7


def cases(tg, jax) -> list[tuple]:
    """(name, tracegrad function, jax function, arguments)."""
    jnp = jax.numpy
    F = tg.nn.functional
    rng = np.random.default_rng(0)

    def a(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    def softmax(lib, x, axis):
        e = lib.exp(x - lib.max(x, axis=axis, keepdims=True))
        return e / lib.sum(e, axis=axis, keepdims=True)

    def layernorm(lib, x, g, b):
        m = lib.mean(x, axis=-1, keepdims=True)
        v = lib.mean((x - m) * (x - m), axis=-1, keepdims=True)
        return (x - m) / lib.sqrt(v + 1e-5) * g + b

    def attention(lib, swap, q, k, v):
        s = q @ swap(k, -1, -2) * 0.125
        return lib.sum(softmax(lib, s, -1) @ v)

    labels = rng.integers(0, 10000, 128)
    rows = rng.integers(0, 5000, 4096)

    def ce_jax(x):
        logp = jax.nn.log_softmax(x)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))

    def adam(lib, p, g, m, v):
        m2 = 0.9 * m + 0.1 * g
        v2 = 0.999 * v + 0.001 * g * g
        return p - 1e-3 * m2 / (lib.sqrt(v2) + 1e-8), m2, v2

    both = [   # (name, f(lib), arguments): the same code for both
        ("sum axis 0, 1024x1024", lambda lib: lambda x: lib.sum(x, axis=0), (a(1024, 1024),)),
        ("sum axis 1, 1024x1024", lambda lib: lambda x: lib.sum(x, axis=1), (a(1024, 1024),)),
        ("mean axes (0, 1), 64x128x256", lambda lib: lambda x: lib.mean(x, axis=(0, 1)),
         (a(64, 128, 256),)),
        ("softmax rows, 128x1000", lambda lib: lambda x: softmax(lib, x, -1), (a(128, 1000),)),
        ("softmax columns, 1000x128", lambda lib: lambda x: softmax(lib, x, 0), (a(1000, 128),)),
        ("layernorm, 128x512", lambda lib: lambda x, g, b: layernorm(lib, x, g, b),
         (a(128, 512), a(512), a(512))),
        ("variance by hand, (x - m) ** 2, 4096x256",
         lambda lib: lambda x: lib.mean((x - lib.mean(x, axis=0)) ** 2, axis=0), (a(4096, 256),)),
        ("x * column + 1, 1024x1024", lambda lib: lambda x, c: x * c + 1.0,
         (a(1024, 1024), a(1024, 1))),
        ("a.T + b, 1024x1024", lambda lib: lambda x, y: x.T + y, (a(1024, 1024), a(1024, 1024))),
        ("transpose (0, 2, 1) + b, 4x1024x1024",
         lambda lib: lambda x, y: lib.transpose(x, (0, 2, 1)) + y,
         (a(4, 1024, 1024), a(4, 1024, 1024))),
        ("sum(a.T * b, axis=0), 1024x1024", lambda lib: lambda x, y: lib.sum(x.T * y, axis=0),
         (a(1024, 1024), a(1024, 1024))),
        ("sum(a.T * b, axis=1), 1024x1024", lambda lib: lambda x, y: lib.sum(x.T * y, axis=1),
         (a(1024, 1024), a(1024, 1024))),
        ("sum(a.T), 2048x2048", lambda lib: lambda x: lib.sum(x.T * 2.0), (a(2048, 2048),)),
        ("outer product, 2048 x 2048", lambda lib: lambda x, y: x[:, None] * y[None, :],
         (a(2048), a(2048))),
        ("matmul 256^3", lambda lib: lambda x, y: x @ y, (a(256, 256), a(256, 256))),
        ("batched matmul 32x64x64", lambda lib: lambda x, y: x @ y,
         (a(32, 64, 64), a(32, 64, 64))),
        ("matmul 1024x64 @ 64x1024", lambda lib: lambda x, y: x @ y,
         (a(1024, 64), a(64, 1024))),
        ("gather rows, 4096 of 5000x128", lambda lib: lambda e: e[rows], (a(5000, 128),)),
        ("strided slice x[::2, 1::3], 2048^2", lambda lib: lambda x: x[::2, 1::3] * 2.0,
         (a(2048, 2048),)),
        ("Adam update, 1M", lambda lib: lambda p, g, m, v: adam(lib, p, g, m, v),
         (a(1 << 20), a(1 << 20), a(1 << 20), np.abs(a(1 << 20)))),
    ]
    out = [(name, f(tg), f(jnp), args) for name, f, args in both]
    out += [
        ("attention fwd+bwd, 8x4x128x64",
         lambda q, k, v: tg.grad(lambda *xs: attention(tg, tg.swapaxes, *xs),
                                 argnums=(0, 1, 2))(q, k, v),
         lambda q, k, v: jax.grad(lambda *xs: attention(jnp, jnp.swapaxes, *xs),
                                  argnums=(0, 1, 2))(q, k, v),
         (a(8, 4, 128, 64), a(8, 4, 128, 64), a(8, 4, 128, 64))),
        ("cross-entropy grad, 128x10000",
         lambda x: tg.grad(lambda x: F.cross_entropy(x, labels))(x), jax.grad(ce_jax),
         (a(128, 10000),)),
        ("scatter-add grad of a gather",
         lambda e: tg.grad(lambda e: tg.sum(e[rows] * e[rows]))(e),
         lambda e: jax.grad(lambda e: jnp.sum(e[rows] * e[rows]))(e), (a(5000, 128),)),
        ("layernorm grad, 128x512",
         lambda x, g, b: tg.grad(lambda x: tg.sum(layernorm(tg, x, g, b) ** 2))(x),
         lambda x, g, b: jax.grad(lambda x: jnp.sum(layernorm(jnp, x, g, b) ** 2))(x),
         (a(128, 512), a(512), a(512))),
    ]
    return out


def main() -> None:
    pin_threads()
    jax = optional("jax")
    if jax is None:
        print("patterns: jax is not installed (pip install -e '.[bench]')")
        return
    import tracegrad as tg
    wanted = sys.argv[1:]
    for name, ft, fj, args in cases(tg, jax):
        if wanted and not any(w in name for w in wanted):
            continue
        t, j = tg.jit(ft), jax.jit(fj)
        for _ in range(3):
            t(*args)
            jax.block_until_ready(j(*args))
        calls = max(1, int(0.02 / max(_once(t, args), 1e-6)))
        ours, theirs = [], []
        for _ in range(ROUNDS):
            ours.append(_time(lambda: t(*args), calls))
            theirs.append(_time(lambda: jax.block_until_ready(j(*args)), calls))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{name:42s} tracegrad {a * 1e6:9.1f} us   jax.jit {b * 1e6:9.1f} us   "
              f"{a / b:5.2f}x")


def _once(fn, args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _time(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


if __name__ == "__main__":
    main()

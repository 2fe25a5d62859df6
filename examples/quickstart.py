"""Quickstart: a gradient, a jitted value-and-grad, and the IR dumps behind them."""
import numpy as np

import tracegrad as tg


def loss(w, x, y):
    pred = tg.tanh(x @ w)
    return tg.mean((pred - y) ** 2)


rng = np.random.default_rng(0)
w = rng.standard_normal((3, 1)).astype(np.float32)
x = rng.standard_normal((8, 3)).astype(np.float32)
y = rng.standard_normal((8, 1)).astype(np.float32)

print("loss:", tg.jit(loss)(w, x, y))
print("d loss / d w:\n", tg.grad(loss)(w, x, y))

step = tg.jit(tg.value_and_grad(loss))
value, dw = step(w, x, y)
print("value_and_grad under jit:", value, dw.ravel())

print("\nIR of loss:")
print(tg.make_ir(loss)(w, x, y))
print("\nIR of grad(loss):")
print(tg.make_ir(tg.grad(loss))(w, x, y))

# second derivatives compose: d^2/dx^2 sin(x) * x at 1.0
print("\ngrad(grad(f))(1.0):", tg.grad(tg.grad(lambda t: tg.sin(t) * t))(1.0))

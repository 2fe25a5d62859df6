"""Review of the scan primitive, loop rolling and scan's VJP: minimal failing cases found by
differential testing (rolled vs unrolled), each failing before its fix."""
from __future__ import annotations

import numpy as np
from conftest import rolled_and_unrolled

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir import loops


def test_grad_of_a_loop_reading_a_per_step_value_twice():
    W, xs, h0 = np.eye(3) * 0.5, np.linspace(-1, 1, 18).reshape(6, 1, 3), np.ones((1, 3))

    def f(W, xs, h0):
        h = h0
        for t in range(6):
            x = xs[t] * 2.0
            h = tg.tanh(h @ W + x) + x * h
        return tg.sum(h)

    got, want = rolled_and_unrolled(lambda: tg.grad(f, argnums=(0, 1, 2))(W, xs, h0))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_rolled_graph_of_a_loop_sharing_a_per_step_value_verifies():
    W, xs, h0 = np.eye(3) * 0.5, np.linspace(-1, 1, 18).reshape(6, 1, 3), np.ones((1, 3))

    def f(W, xs, h0):
        h = h0
        for t in range(6):
            e = tg.exp(xs[t])
            h = tg.tanh((h + e) @ W) * tg.sin(e)
        return tg.sum(h)

    g = tg.make_ir(f)(W, xs, h0)
    r = loops.roll_loops(g)
    ir.verify(r)
    assert any(e.op == "scan" for e in r.eqns)
    np.testing.assert_allclose(ir.interpret(r, [W, xs, h0])[0], ir.interpret(g, [W, xs, h0])[0],
                               rtol=1e-12)


def test_bodies_are_not_reused_after_the_equation_key_table_is_cleared():
    W = np.random.default_rng(0).standard_normal((3, 3)) / 2
    h0 = np.ones((1, 3))

    def fa(W, h0):
        h = h0
        for _ in range(6):
            h = tg.tanh(h @ W + h)
        return h

    def fb(W, h0):
        h = h0
        for _ in range(6):
            h = tg.sin(h @ W - h)
        return h

    saved_keys, saved_bodies = dict(loops._EQN_KEYS), dict(loops._BODIES)
    try:
        loops._EQN_KEYS.clear()
        loops._BODIES.clear()
        loops.roll_loops(tg.make_ir(fa)(W, h0))
        # a long-running process: many more equation signatures seen since
        for k in range((1 << 16) + 1):
            loops._EQN_KEYS[("seen", k)] = len(loops._EQN_KEYS)
        gb = tg.make_ir(fb)(W, h0)
        rb = loops.roll_loops(gb)
        np.testing.assert_allclose(ir.interpret(rb, [W, h0])[0], ir.interpret(gb, [W, h0])[0])
    finally:
        loops._EQN_KEYS.clear()
        loops._EQN_KEYS.update(saved_keys)
        loops._BODIES.clear()
        loops._BODIES.update(saved_bodies)

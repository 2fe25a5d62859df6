"""Loop rolling (ir.roll_loops) and scan's reverse mode: a traced Python loop rolled into a
`scan` computes what the unrolled trace computed, and differentiates to the same gradients."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir import loops

from conftest import check_grads, rand


def _graph(f, *args):
    return tg.make_ir(f)(*args)


def _scans(graph):
    return [e for e in graph.eqns if e.op == "scan"]


def rnn(W, U, xs, T):
    h = tg.zeros((1, W.shape[0]), dtype=W.dtype)
    for t in range(T):
        h = tg.tanh(h @ W + xs[t] @ U)
    return tg.sum(h * h)


def _rnn_args(H=4, n=16, seed=0):
    return rand(H, H, seed=seed) / 2, rand(H, H, seed=seed + 1) / 2, rand(n, 1, H, seed=seed + 2)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 9, 15])
def test_rolled_rnn_computes_the_unrolled_values(T):
    W, U, xs = _rnn_args()
    g = _graph(lambda W, U, xs: rnn(W, U, xs, T), W, U, xs)
    r = ir.roll_loops(g)
    ir.verify(r)
    if T >= 5:
        (scan,) = _scans(r)
        assert scan.params["length"] >= T - 2
        assert len(r.eqns) < len(g.eqns)
    want = ir.interpret(g, [W, U, xs])
    got = ir.interpret(r, [W, U, xs])[0]    # xs[t] @ U as one matmul: equal up to rounding
    np.testing.assert_allclose(got, want[0], rtol=1e-13, atol=0)
    np.testing.assert_array_equal(ir.program(r)([W, U, xs])[0], got)


def test_every_length_shares_one_body():
    W, U, xs = _rnn_args()
    bodies = {id(_scans(ir.roll_loops(_graph(lambda W, U, xs: rnn(W, U, xs, T), W, U, xs)))[0]
                 .params["body"]) for T in (6, 9, 13)}
    assert len(bodies) == 1


def test_per_step_work_on_inputs_is_one_batched_op_before_the_loop():
    W, U, xs = _rnn_args()
    r = ir.roll_loops(_graph(lambda W, U, xs: rnn(W, U, xs, 10), W, U, xs))
    (scan,) = _scans(r)
    body_ops = [e.op for e in scan.params["body"].eqns]
    assert body_ops == ["matmul", "add", "tanh"]      # h @ W; xs[t] @ U is made before
    assert [e.op for e in r.eqns].count("matmul") == 1          # for every t at once
    assert [e.op for e in r.eqns].count("slice") == 1           # xs[t] for every t at once
    r13 = ir.roll_loops(_graph(lambda W, U, xs: rnn(W, U, xs, 13), W, U, xs))
    assert len(r13.eqns) == len(r.eqns)                         # O(1) in the length


@pytest.mark.parametrize("T", [4, 7, 12])
def test_rolled_rnn_gradients_match_the_unrolled_ones(T):
    W, U, xs = _rnn_args()
    g = _graph(lambda W, U, xs: rnn(W, U, xs, T), W, U, xs)
    r = ir.roll_loops(g)
    want = ir.interpret(ir.vjp_graph(g, [0, 1, 2]), [W, U, xs, np.array(1.0)])
    for vg in (ir.vjp_graph(r, [0, 1, 2]), ir.optimize(ir.vjp_graph(r, [0, 1, 2]))):
        ir.verify(vg)
        got = ir.interpret(vg, [W, U, xs, np.array(1.0)])
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
        for a, b in zip(ir.program(vg)([W, U, xs, np.array(1.0)]), got):
            np.testing.assert_array_equal(a, b)


def two_layer(W, U, xs, T):
    h1 = tg.zeros((1, W.shape[0]), dtype=W.dtype)
    h2 = tg.zeros((1, W.shape[0]), dtype=W.dtype)
    for t in range(T):
        h1 = tg.tanh(h1 @ W + xs[t] @ U)
        h2 = tg.tanh(h2 @ U + h1 @ W)     # (h1 @ W twice a step: equal matmuls)
    return tg.sum(h2 * h2)


@pytest.mark.parametrize("T", [5, 9])
def test_two_layer_rnn_rolls(T):
    """Sorted by depth, a two-layer step is three equal matmuls, two adds and two tanhs: the
    period is found past the next equal equation (the group's next), so it rolls, and its
    values and gradients are the unrolled ones."""
    W, U, xs = _rnn_args()
    g = _graph(lambda W, U, xs: two_layer(W, U, xs, T), W, U, xs)
    r = ir.roll_loops(g)
    ir.verify(r)
    (scan,) = _scans(r)
    assert scan.params["length"] >= T - 2
    np.testing.assert_allclose(ir.interpret(r, [W, U, xs])[0], ir.interpret(g, [W, U, xs])[0],
                               rtol=1e-13, atol=0)
    want = ir.interpret(ir.vjp_graph(g, [0, 1, 2]), [W, U, xs, np.array(1.0)])
    got = ir.interpret(ir.vjp_graph(r, [0, 1, 2]), [W, U, xs, np.array(1.0)])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_a_loop_that_rolls_as_found_is_not_rolled_past_the_next_equal_equation():
    """`h * 2.0` and `h * x` are equal in depth order: looking past the next equal equation
    would start the block at the first and carry both (review: +35% residuals); that look
    is only taken when nothing rolls without it."""
    U, xs = rand(3, 3, seed=0) / 2, rand(40, 1, 3, seed=1)

    def f(U, xs):
        h = xs[0] * 0.1
        hs = []
        for t in range(9):
            h = tg.sin(h * 2.0 + xs[t] @ U + h * xs[t])
            hs.append(h)
        return tg.sum(tg.stack(hs))
    (scan,) = _scans(ir.roll_loops(_graph(f, U, xs)))
    assert scan.params["n_carry"] == 1 and scan.params["length"] == 8


def test_grad_of_a_loop_against_finite_differences():
    W, U, xs = _rnn_args(H=3, n=8)
    check_grads(lambda W, U, xs: rnn(W, U, xs, 7), (W, U, xs), order=2, modes=("rev",))


def test_grad_api_rolls_and_agrees_with_unrolled(unrolled):
    W, U, xs = _rnn_args()
    want = tg.grad(rnn, argnums=(0, 1, 2))(W, U, xs, 10)
    tg.config.roll_loops = True
    got = tg.grad(rnn, argnums=(0, 1, 2))(W, U, xs, 10)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_jitted_value_and_grad_with_static_length(unrolled):
    W, U, xs = (a.astype(np.float32) for a in _rnn_args(H=8))
    step = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))
    want = {T: step(W, U, xs, T) for T in (5, 6, 11)}
    tg.config.roll_loops = True
    step = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))
    for T in (5, 6, 11, 5):
        (v, (gw, gu)), (v0, (gw0, gu0)) = step(W, U, xs, T), want[T]
        np.testing.assert_allclose(v, v0, rtol=1e-5)
        np.testing.assert_allclose(gw, gw0, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gu, gu0, rtol=1e-4, atol=1e-6)


def lstm_like(Wh, Wc, x):
    h = tg.zeros((1, Wh.shape[0]), dtype=Wh.dtype)
    c = tg.ones((1, Wh.shape[0]), dtype=Wh.dtype)
    outs = []
    for t in range(6):
        c = tg.sigmoid(h @ Wc) * c + tg.tanh(x[t] * h)
        h = tg.tanh(c) * tg.sin(h @ Wh)
        outs.append(h)
    return tg.sum(tg.stack(outs) ** 2) + tg.sum(c)


def test_two_carries_and_per_step_outputs():
    Wh, Wc, x = rand(3, 3, seed=1), rand(3, 3, seed=2), rand(6, 1, 3, seed=3)
    g = _graph(lstm_like, Wh, Wc, x)
    r = ir.roll_loops(g)
    (scan,) = _scans(r)
    assert scan.params["n_carry"] >= 2
    assert len(scan.outvars) > scan.params["n_carry"]       # the h_t read after the loop
    np.testing.assert_allclose(ir.interpret(r, [Wh, Wc, x])[0],
                               ir.interpret(g, [Wh, Wc, x])[0], rtol=1e-13)
    check_grads(lstm_like, (Wh, Wc, x), modes=("rev",))


def two_back(a, b):
    x, y = a, b
    for _ in range(8):
        x, y = y, tg.sin(x * y) + y    # reads the value made two steps before
    return tg.sum(y)


def test_values_from_two_steps_back():
    a, b = rand(5, seed=4), rand(5, seed=5)
    g = _graph(two_back, a, b)
    r = ir.roll_loops(g)
    ir.verify(r)
    np.testing.assert_allclose(ir.interpret(r, [a, b])[0], ir.interpret(g, [a, b])[0],
                               rtol=1e-13)
    check_grads(two_back, (a, b), modes=("rev",))


def steps_with_their_own_constant(y, b):
    for i in range(10):
        y = tg.sin(y * b + 0.1 * i)      # a different literal each step: not one body
    return tg.sum(y * y)


def test_steps_that_differ_are_not_rolled():
    y, b = rand(8, seed=6), rand(8, seed=7)
    g = _graph(steps_with_their_own_constant, y, b)
    assert not _scans(ir.roll_loops(g))
    check_grads(steps_with_their_own_constant, (y, b), modes=("rev",))


def shared_weight_twice(W, x):
    h = x
    for _ in range(6):
        h = tg.tanh(h @ W) + tg.tanh(h @ W.T) * 0.5     # W used twice: a sum of terms
    return tg.sum(h)


def test_a_constant_used_twice_in_the_body():
    W, x = rand(4, 4, seed=8) / 2, rand(2, 4, seed=9)
    g = _graph(shared_weight_twice, W, x)
    assert _scans(ir.roll_loops(g))
    check_grads(shared_weight_twice, (W, x), order=2, modes=("rev",))


def test_gradient_of_only_some_outputs_and_inputs():
    W, U, xs = _rnn_args(H=3, n=8)

    def f(W, U, xs):
        h = tg.zeros((1, 3), dtype=W.dtype)
        hs = []
        for t in range(8):
            h = tg.tanh(h @ W + xs[t] @ U)
            hs.append(h)
        return tg.sum(hs[3]) + tg.sum(hs[6] * 2.0)   # only two per-step outputs are read

    for argnums in (0, 1, 2, (0, 2)):
        got = tg.grad(f, argnums=argnums)(W, U, xs)
        old = tg.config.roll_loops
        tg.config.roll_loops = False
        try:
            want = tg.grad(f, argnums=argnums)(W, U, xs)
        finally:
            tg.config.roll_loops = old
        for a, b in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_random_loop_bodies_roll_to_the_same_values_and_gradients():
    ops = [lambda h, w: tg.tanh(h * w), lambda h, w: h @ w, lambda h, w: tg.sin(h) + w[0],
           lambda h, w: h * h * 0.5 + w[1], lambda h, w: tg.exp(-h * h) * w[2]]
    rng = np.random.default_rng(0)
    for trial in range(12):
        picks = rng.integers(0, len(ops), size=rng.integers(1, 4))
        T = int(rng.integers(3, 9))

        def f(h0, w, picks=picks, T=T):
            h = h0
            for _ in range(T):
                for k in picks:
                    h = ops[k](h, w)
            return tg.sum(h * h)

        h0, w = rand(3, 3, seed=trial) / 2, rand(3, 3, seed=trial + 50) / 2
        g = _graph(f, h0, w)
        r = ir.roll_loops(g)
        ir.verify(r)
        np.testing.assert_allclose(ir.interpret(r, [h0, w])[0], ir.interpret(g, [h0, w])[0],
                                   rtol=1e-12)
        want = ir.interpret(ir.vjp_graph(g), [h0, w, np.array(1.0)])
        got = ir.interpret(ir.optimize(ir.vjp_graph(r)), [h0, w, np.array(1.0)])
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_loop_invariant_work_of_the_backward_step_runs_once():
    W, U, xs = _rnn_args()
    r = ir.roll_loops(_graph(lambda W, U, xs: rnn(W, U, xs, 10), W, U, xs))
    vg = ir.optimize(ir.vjp_graph(r, [0, 1]))
    bwd = [e for e in vg.eqns if e.op == "scan" and
           not any(x.op == "tanh" for x in e.params["body"].eqns)]
    assert bwd, vg
    assert not any(x.op == "transpose" and x.inputs[0] in bwd[0].params["body"].invars[:1]
                   for x in bwd[0].params["body"].eqns)   # W.T is made before the loop


def test_roll_is_cheap_to_skip_for_small_graphs():
    a = rand(3)
    g = _graph(lambda a: tg.sum(tg.sin(a) * a), a)
    assert loops.roll_loops(g) is g


_UNARY = [tg.sin, tg.tanh, lambda x: x * x, lambda x: tg.exp(-x * x), lambda x: -x,
          lambda x: x * 0.5 + 1.0]
_BINARY = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, tg.maximum]


def _random_loop(seed):
    """A loop with 1-3 carried values updated by random ops, sometimes an inner loop (two
    chains of different periods), per-step inputs, a matmul, per-step outputs kept."""
    r = np.random.default_rng(seed)
    T, n_carry = int(r.integers(2, 9)), int(r.integers(1, 4))
    inner = int(r.integers(1, 3)) if r.random() < 0.3 else 0
    prog = [tuple(int(r.integers(0, m)) for m in (3, len(_UNARY), len(_BINARY), n_carry,
                                                  n_carry, 3))
            for _ in range(int(r.integers(1, 6)))]
    collect, use_x, use_mm = r.random() < 0.5, r.random() < 0.6, r.random() < 0.5

    def f(W, X, c0):
        cs = [c0 * (k + 1) for k in range(n_carry)]
        outs = []
        for t in range(T):
            for kind, u, bi, i, j, extra in prog:
                a, b = cs[i], cs[j]
                if kind == 0:
                    v = _UNARY[u](a)
                elif kind == 1:
                    v = _BINARY[bi](a, b)
                else:
                    v = _BINARY[bi](_UNARY[u](a), X[t] if use_x else W[0])
                if use_mm and extra == 0:
                    v = tg.tanh(v @ W)
                cs[i] = v
                for _ in range(inner):
                    cs[j] = tg.sin(cs[j]) * 0.9
            if collect:
                outs.append(cs[0])
        total = sum(tg.sum(c * c) for c in cs)
        return total + tg.sum(tg.stack(outs) * 0.3) if collect else total
    return f


@pytest.mark.parametrize("seed", [*range(0, 60, 3), 124, 225])  # 124, 225: two loops
def test_random_loops_roll_and_differentiate_like_unrolled(seed, unrolled):
    f = _random_loop(seed)
    rng = np.random.default_rng(seed)
    W, X, c0 = rng.standard_normal((3, 3)) / 3, rng.standard_normal((10, 2, 3)) / 2, \
        rng.standard_normal((2, 3)) / 2
    g = _graph(f, W, X, c0)
    r = ir.roll_loops(g)
    ir.verify(r)
    np.testing.assert_allclose(ir.interpret(r, [W, X, c0])[0], ir.interpret(g, [W, X, c0])[0],
                               rtol=1e-12, equal_nan=True)

    def hvp(W, X, c0):
        return tg.sum(tg.grad(f)(W, X, c0) ** 2)
    want = tg.grad(f, argnums=(0, 1, 2))(W, X, c0), tg.grad(hvp)(W, X, c0)
    tg.config.roll_loops = True
    got = tg.grad(f, argnums=(0, 1, 2))(W, X, c0), tg.grad(hvp)(W, X, c0)
    for a, b in zip(got[0] + (got[1],), want[0] + (want[1],)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11, equal_nan=True)

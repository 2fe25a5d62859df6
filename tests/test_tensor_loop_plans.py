"""Backward plans for recorded loops (tracer/autograd_loops): gradients of loops of several
lengths equal those of plans composed for each length, bit for bit, and graphs that only look
periodic are composed as before."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_exec, autograd_loops

H = 8


@pytest.fixture
def loops(monkeypatch):
    monkeypatch.setattr(autograd_loops, "ENABLED", True)
    autograd_loops._cache.clear()
    autograd_exec._grad_graphs.items.clear()
    made = []
    real = autograd_loops.instantiate

    def spy(*a):     # counts plans made for a length from a template that passed its check
        p = real(*a)
        made.append(p is not None and any(type(v) is autograd_loops.Template
                                          for v in autograd_loops._cache.values()))
        return p
    monkeypatch.setattr(autograd_loops, "instantiate", spy)
    yield made
    autograd_loops._cache.clear()
    autograd_exec._grad_graphs.items.clear()


def _data(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((H, H)) / 3).astype(dtype)
    u = (rng.standard_normal((H, H)) / 3).astype(dtype)
    xs = rng.standard_normal((20, 1, H)).astype(dtype)
    return w, u, xs


def rnn(T, W, U, xs, b=None):
    h = tg.zeros(1, H)
    for t in range(T):
        z = h @ W + xs[t] @ U
        h = tg.tanh(z if b is None else z + b)
    return (h * h).sum()


def rnn_outer(T, W, U, xs):      # the body reads a value made before the loop
    h0 = tg.tanh(xs[0] @ U)
    h = h0
    for t in range(T):
        h = tg.tanh(h @ W + h0 * xs[t])
    return (h * h).sum()


def rnn_stacked(T, W, U, xs):    # every step's output in the loss
    h, hs = tg.zeros(1, H), []
    for t in range(T):
        h = tg.tanh(h @ W + xs[t] @ U)
        hs.append(h)
    return (tg.stack(hs) ** 2).sum()


def two_loops(T, W, U, xs):
    h = tg.zeros(1, H)
    for t in range(T):
        h = tg.tanh(h @ W + xs[t] @ U)
    g = h
    for _ in range(4):
        g = tg.sigmoid(g @ U)
    return (g * h).sum()


def two_back(T, W, U, xs):       # a step reads the value of two steps back
    a = b = tg.zeros(1, H)
    for t in range(T):
        a, b = tg.tanh(a @ W + b @ U + xs[t]), a
    return (a * a).sum()


def odd_constant(T, W, U, xs):   # one step differs by a constant
    h = tg.zeros(1, H)
    for t in range(T):
        h = tg.tanh(h @ W * (2.0 if t == T // 2 else 1.0) + xs[t] @ U)
    return (h * h).sum()


def grads(fn, lengths, dtype=np.float32, bias=False):
    w, u, xs = _data(dtype)
    W = tg.tensor(w, requires_grad=True)
    U = tg.tensor(u, requires_grad=True)
    b = tg.tensor(np.full((1, H), 0.1, dtype), requires_grad=True) if bias else None
    X = [tg.tensor(x) for x in xs]
    out = []
    params = [W, U] + ([b] if bias else [])
    for T in lengths:
        loss = fn(T, W, U, X, b) if bias else fn(T, W, U, X)
        loss.backward()
        out.append((loss.item(), [p.grad.numpy().copy() for p in params]))
        for p in params:
            p.grad = None
    return out


def same(a, b):
    return all(x[0] == y[0] and all(np.array_equal(g, h) for g, h in zip(x[1], y[1]))
               for x, y in zip(a, b, strict=True))


LENGTHS = [6, 13, 9, 5, 16, 7, 11, 6]


def _reference(fn, lengths, **kw):
    autograd_exec._grad_graphs.items.clear()
    before = autograd_loops.ENABLED
    autograd_loops.ENABLED = False
    try:
        return grads(fn, lengths, **kw)
    finally:
        autograd_loops.ENABLED = before
        autograd_exec._grad_graphs.items.clear()


@pytest.mark.parametrize("fn", [rnn, two_loops])
def test_loops_instantiated_and_bit_identical(loops, fn):
    got = grads(fn, LENGTHS)
    assert any(loops), "no plan was instantiated from a template"
    assert same(got, _reference(fn, LENGTHS))


def test_loop_with_bias(loops):
    # (a bias's per-step gradients are summed after the loop by one add per step, which a
    # template does not express: composed for every length, as before)
    got = grads(rnn, LENGTHS, bias=True)
    assert same(got, _reference(rnn, LENGTHS, bias=True))


@pytest.mark.parametrize("fn", [rnn_outer, rnn_stacked, two_back, odd_constant])
def test_others_match(loops, fn):
    # (rnn_outer: the body reads a value made before the loop; it does not take the
    # one-graph backward's grad_walk today, so no loop plan is tried for it)
    assert same(grads(fn, LENGTHS), _reference(fn, LENGTHS))


def test_instantiated_plan_is_the_composed_one(loops):
    w, u, xs = _data()
    W, U = tg.tensor(w, requires_grad=True), tg.tensor(u, requires_grad=True)
    X = [tg.tensor(x) for x in xs]
    plans = {}
    real = autograd_exec._backward_graph

    def keep(w_, roots, key=None):
        entry = real(w_, roots, key)
        from tracegrad.tracer.autograd_compose import compose
        composed, _ = compose(w_.order, w_.in_vars, w_.in_gsrc, roots)
        plans[len(w_.order)] = (entry.plan, composed)
        return entry
    autograd_exec._backward_graph = keep
    try:
        for T in LENGTHS:
            rnn(T, W, U, X).backward()
    finally:
        autograd_exec._backward_graph = real
    assert any(loops)
    for made, composed in plans.values():
        assert autograd_loops.same_plan(made, composed)


def test_finite_differences_float64(loops):
    w, u, xs = _data(np.float64)
    W, U = tg.tensor(w, requires_grad=True), tg.tensor(u, requires_grad=True)
    X = [tg.tensor(x) for x in xs]
    for T in (6, 12, 9):
        rnn(T, W, U, X).backward()
        g = W.grad.numpy().copy()
        W.grad = U.grad = None
    assert loops and loops[-1]
    eps = 1e-6
    for i, j in [(0, 0), (3, 5), (7, 2)]:
        d = np.zeros_like(w)
        d[i, j] = eps
        with tg.no_grad():
            hi = rnn(9, tg.tensor(w + d), U, X).item()
            lo = rnn(9, tg.tensor(w - d), U, X).item()
        assert abs((hi - lo) / (2 * eps) - g[i, j]) < 1e-6


def test_loop_of_rejects_a_short_loop(loops):
    grads(rnn, [3, 4, 3])
    assert not any(loops)

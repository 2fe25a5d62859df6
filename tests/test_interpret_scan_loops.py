"""The fast interpreter's scan loops against the reference interpreter, bit for bit: matmuls
calling ndarray.dot only on contiguous operands (whatever the layout of the loop's consts,
initial carries and xs), and ys that are a carry before and after each step (scan_vjp's
residuals), collected once."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from conftest import graph_of
from test_scan_primitive import scan_graph

import tracegrad as tg
from tracegrad import ir

interp = importlib.import_module("tracegrad.ir.interpret")
F4, F8 = np.dtype("f4"), np.dtype("f8")
N, T = 4, 5


def residual_body(dtype=F4) -> ir.Graph:
    """(W, h, x) -> (h' = tanh(h @ W + x @ W), ys: h, 2 h', h'): the carry before and after."""
    def step(W, h, x):
        hn = tg.tanh(h @ W + x @ W)
        return hn, h, hn * 2, hn
    return graph_of(step, ir.Aval((N, N), dtype), ir.Aval((1, N), dtype), ir.Aval((1, N), dtype))


def two_carry_body() -> ir.Graph:
    """Two carries, a 0-d one among them, each a y before and after (the ys in another order)."""
    def step(W, h, s, x):
        hn = tg.sin(h @ W) + x
        sn = s * 0.5 + tg.sum(hn)
        return hn, sn, sn, h, s, hn
    return graph_of(step, ir.Aval((N, N), F4), ir.Aval((1, N), F4), ir.Aval((), F4),
                    ir.Aval((1, N), F4))


def _graph(body: ir.Graph, n_carry: int, reverse: bool) -> ir.Graph:
    g = scan_graph(body, T, 1, n_carry)
    if reverse:
        (e,) = g.eqns
        e.params = {**e.params, "reverse": True}
    return g


def _args(graph: ir.Graph, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [(0.5 * rng.standard_normal(a.shape)).astype(a.dtype) for a in graph.in_avals]


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        assert g.tobytes() == w.tobytes()       # (signed zeros too)


@pytest.fixture
def checked_dot(monkeypatch):
    """ndarray.dot in fresh scan loops, asserting that its operands are contiguous; counts."""
    calls = []

    def dot(a, b):
        assert a.flags.forc and b.flags.forc, (a.strides, b.strides)
        calls.append(1)
        return np.ndarray.dot(a, b)
    monkeypatch.setattr(interp, "_ndot", dot)
    monkeypatch.setattr(interp, "_LOOPS", {})
    return calls


def _layouts(args: list) -> dict:
    """The args as given, and with one of them laid out otherwise (values unchanged)."""
    W, *rest = args
    wide = np.zeros((W.shape[0], 2 * W.shape[1]), W.dtype)
    wide[:, ::2] = W
    return {"contiguous": args, "fortran_W": [np.asfortranarray(W), *rest],
            "strided_W": [wide[:, ::2], *rest]}


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [F4, F8])
def test_carry_before_and_after_ys_match_the_reference(reverse, dtype, checked_dot):
    g = _graph(residual_body(dtype), 1, reverse)
    args = _args(g)
    out = ir.program(g)(args)
    _same(out, ir.interpret(g, args))
    _, before, _, after = out
    assert before.flags.c_contiguous and after.flags.c_contiguous
    assert checked_dot      # both matmuls of every step, on ndarray.dot


@pytest.mark.parametrize("reverse", [False, True])
def test_two_carries_each_a_y_before_and_after(reverse, checked_dot):
    g = _graph(two_carry_body(), 2, reverse)
    args = _args(g, 1)
    _same(ir.program(g)(args), ir.interpret(g, args))


@pytest.mark.parametrize("layout", ["contiguous", "fortran_W", "strided_W"])
@pytest.mark.parametrize("reverse", [False, True])
def test_consts_of_any_layout_match_the_reference(layout, reverse, checked_dot):
    g = _graph(residual_body(), 1, reverse)
    args = _layouts(_args(g, 2))[layout]
    _same(ir.program(g)(args), ir.interpret(g, args))
    assert bool(checked_dot) == (layout != "strided_W")


@pytest.mark.parametrize("reverse", [False, True])
def test_a_strided_initial_carry_or_fortran_xs_take_the_checked_matmul(reverse, checked_dot):
    g = _graph(residual_body(), 1, reverse)
    W, h, xs = _args(g, 3)
    wide = np.zeros((1, 2 * N), h.dtype)
    wide[:, ::2] = h
    for args in ([W, wide[:, ::2], xs], [W, h, np.asfortranarray(xs)]):
        assert not args[1].flags.forc or not args[2].flags.c_contiguous
        _same(ir.program(g)(args), ir.interpret(g, args))
    assert not checked_dot


def test_the_rnn_gradients_scan_loops_match_the_reference(checked_dot):
    """jit(grad) of an RNN rolls into a forward scan whose ys are its carry before and after,
    and a reverse one reading them; both loops run ndarray.dot."""
    rng = np.random.default_rng(4)
    W, U = (rng.standard_normal((2, 8, 8)) / 3).astype(np.float32)
    xs = rng.standard_normal((7, 1, 8)).astype(np.float32)

    def loss(W, U, xs):
        h = tg.zeros((1, 8))
        for t in range(7):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)
    g = tg.make_ir(tg.value_and_grad(loss, argnums=(0, 1)))(W, U, xs)
    g = ir.optimize(g)
    if not any(e.op == "scan" for e in g.eqns):
        pytest.skip("loops are not rolled in this configuration")
    for args in ([W, U, xs], [np.asfortranarray(W), U.T.copy().T, np.asfortranarray(xs)]):
        _same(ir.program(g)(args), ir.interpret(g, args))
    assert checked_dot


def test_a_carry_whose_new_value_is_a_view_keeps_the_checked_matmul(checked_dot):
    """The new carry is a slice (a view the loop cannot vouch for): its matmul stays `_dot`,
    which checks its operands at every step."""
    def step(W, h, x):
        z = tg.tanh(tg.concatenate([h @ W, x], axis=1))
        return z[:, :N], z
    g = _graph(graph_of(step, ir.Aval((N, N), F4), ir.Aval((1, N), F4), ir.Aval((1, N), F4)),
               1, False)
    args = _args(g, 6)
    _same(ir.program(g)(args), ir.interpret(g, args))
    assert not checked_dot
    (e,) = g.eqns
    body = ir.program(e.params["body"])
    assert interp._loop_dots(body, 1, 1) == (set(), [])

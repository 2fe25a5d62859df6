"""Review of the stacked scan (lax.scan semantics), loop rolling's O(1) outer graph, loop fission,
scan's VJP over stacked residuals and the Program's scan loop: the failing cases found (fixed
since), and the cases checked that hold."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import graph_of

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir.fission import fission
from tracegrad.ir.scan import unroll_scans

F8, I8 = np.dtype("f8"), np.dtype("i8")


def _scan_graph(body, T, C, K, reverse=False):
    head = body.in_avals[:C + K]
    xs = [ir.Aval((T,) + a.shape, a.dtype) for a in body.in_avals[C + K:]]
    b = ir.Builder("outer")
    ins = [b.new_input(a) for a in head + xs]
    with b.active():
        outs = ir.bind("scan", *ins, body=body, length=T, n_consts=C, n_carry=K,
                       **({"reverse": True} if reverse else {}))
    return b.build(list(outs))


def _fissioned(g):
    eqns = []
    for e in g.eqns:
        eqns += (fission(e) or [e]) if e.op == "scan" else [e]
    return ir.Graph(g.invars, eqns, g.outvars, g.constvars, g.consts)


def _close(got, want, tol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# ---- bug: fission leaves a scan with no outputs, which the Program cannot run -----------------

def _carry_free_scan():
    """A scan with no carry whose one per-step output is carry-free work: fission moves it all
    out of the loop."""
    body = graph_of(lambda W, x: [tg.sin(x @ W)], ir.Aval((3, 3), F8), ir.Aval((1, 3), F8))
    return _scan_graph(body, 4, 1, 0)


def test_fission_of_a_carry_free_scan_keeps_its_values():
    g = _carry_free_scan()
    W, xs = np.eye(3) * 0.5, np.arange(12.0).reshape(4, 1, 3) / 10
    f = _fissioned(g)
    ir.verify(f)
    _close(ir.interpret(f, [W, xs]), ir.interpret(g, [W, xs]))


def test_program_of_a_fissioned_carry_free_scan():
    # (review: fission kept a scan with no outputs left; Program's _live read outvars[0])
    g = _carry_free_scan()
    W, xs = np.eye(3) * 0.5, np.arange(12.0).reshape(4, 1, 3) / 10
    f = _fissioned(g)
    assert all(e.outvars for e in f.eqns), "an equation with no outputs"
    _close(ir.program(f)([W, xs]), ir.interpret(g, [W, xs]))


def _int_carry_scan():
    """A scan whose only carry is an int counter; its float ys read the counter."""
    body = graph_of(lambda W, n, x: [n + 1, tg.sin(x @ W) * tg.astype(n, F8)],
                     ir.Aval((3, 3), F8), ir.Aval((), I8), ir.Aval((1, 3), F8))
    return _scan_graph(body, 4, 1, 1)


def test_program_of_the_vjp_of_a_scan_with_only_an_int_carry():
    # (review: the backward scan of a loop with only an int carry was left empty)
    g = _int_carry_scan()
    W, n, xs = np.eye(3) * 0.5, np.array(2, I8), np.arange(12.0).reshape(4, 1, 3) / 10
    vg = ir.vjp_graph(g, [0, 2])
    args = [W, n, xs, np.array(0, I8), np.ones((4, 1, 3))]
    want = ir.interpret(vg, args)
    _close(ir.interpret(unroll_scans(vg), args), want)
    assert not any(e.op == "scan" and not e.outvars for e in vg.eqns), \
        "an empty scan with no outputs left in the VJP graph"
    _close(ir.program(vg)(args), want)


def test_optimized_vjp_of_a_scan_with_only_an_int_carry():
    g = _int_carry_scan()
    W, n, xs = np.eye(3) * 0.5, np.array(2, I8), np.arange(12.0).reshape(4, 1, 3) / 10
    vg = ir.vjp_graph(g, [0, 2])
    args = [W, n, xs, np.array(0, I8), np.ones((4, 1, 3))]
    want = ir.interpret(ir.vjp_graph(unroll_scans(g), [0, 2]), args)
    _close(ir.program(ir.optimize(vg))(args), want, 1e-10)


# ---- bug: roll_loops with min_trips < 2 --------------------------------------------------------

def _rnn(T):
    def f(W, xs):
        h = xs[0]
        for t in range(T):
            h = tg.tanh(h @ W + xs[t]) * 1.1
        return tg.sum(h * h)
    return f


def test_roll_loops_with_min_trips_one_is_safe():
    # (review: a run of one block reached _rotate/_flow, which compare two)
    W, xs = np.eye(3) * 0.5, np.arange(24.0).reshape(8, 1, 3) / 10
    g = tg.make_ir(_rnn(4))(W, xs)
    r = ir.roll_loops(g, min_trips=1)
    _close(ir.interpret(r, [W, xs]), ir.interpret(g, [W, xs]))


# ---- O(1) in T: per-step outputs read after the loop -------------------------------------------

def _all_states(T):
    def f(W, xs):
        h = tg.zeros((1, 3), dtype=W.dtype)
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h)
        return tg.sum(tg.stack(hs) ** 2)
    return f


def test_all_states_read_after_the_loop_keep_values_and_gradients():
    W, xs = np.eye(3) * 0.4, np.linspace(-1, 1, 48).reshape(16, 1, 3)
    g = tg.make_ir(_all_states(8))(W, xs)
    r = ir.roll_loops(g)
    assert [e.op for e in r.eqns].count("scan") == 1
    _close(ir.interpret(r, [W, xs]), ir.interpret(g, [W, xs]))
    one = [np.array(1.0)]
    _close(ir.program(ir.optimize(ir.vjp_graph(r)))([W, xs] + one),
           ir.interpret(ir.vjp_graph(g), [W, xs] + one), 1e-10)


def test_all_states_read_after_the_loop_make_an_o1_graph():
    # (review: each step's value was taken out of the stacked ys with its own slice, and the
    # user's stack of them stayed: 2T+ equations, and the VJP padded each slice back)
    W, xs = np.eye(3) * 0.4, np.linspace(-1, 1, 96).reshape(32, 1, 3)
    sizes = []
    for T in (8, 16):
        r = ir.roll_loops(tg.make_ir(_all_states(T))(W, xs))
        sizes.append((len(ir.optimize(r).eqns),
                      len(ir.optimize(ir.vjp_graph(r)).eqns)))
    assert sizes[0] == sizes[1], sizes


# ---- -0.0 ------------------------------------------------------------------------------------

def _signed_zero_steps(zero_of):
    """An RNN adding exp(1 / z_t) per step: z_0 = -0.0 adds 0, z_t = +0.0 adds inf."""
    def f(W, xs):
        h = xs[0]
        for t in range(6):
            z = tg.full((1, 3), zero_of(-0.0 if t == 0 else 0.0), dtype=np.float64)
            h = tg.tanh(h @ W + xs[t]) + tg.exp(1.0 / z)
        return tg.sum(h)
    return f


def test_rolled_steps_with_python_float_signed_zeros_keep_their_signs():
    W, xs = np.eye(3) * 0.5, np.linspace(-1, 1, 24).reshape(8, 1, 3)
    g = tg.make_ir(_signed_zero_steps(float))(W, xs)
    r = ir.roll_loops(g)
    want, got = ir.interpret(g, [W, xs])[0], ir.interpret(r, [W, xs])[0]
    assert np.isnan(want) and np.isnan(got)


def test_rolled_steps_with_numpy_signed_zeros_keep_their_signs():
    # (review: the sign of a numpy float zero in `full` was lost in equation keys)
    W, xs = np.eye(3) * 0.5, np.linspace(-1, 1, 24).reshape(8, 1, 3)
    g = tg.make_ir(_signed_zero_steps(np.float64))(W, xs)
    r = ir.roll_loops(g)
    want, got = ir.interpret(g, [W, xs])[0], ir.interpret(r, [W, xs])[0]
    assert np.isnan(want)
    assert np.isnan(got), got


def test_jit_keeps_full_of_signed_zeros_apart():
    # (found in passing: ir.optimize's CSE keyed params by passes._freeze, where -0.0 == 0.0,
    # so full[value=0.0] was merged into full[value=-0.0] and tg.jit(f) gave x / +0.0 = -inf)
    def f(x):
        return x / tg.full((3,), -0.0, dtype=np.float64), x / tg.full((3,), 0.0, dtype=np.float64)
    x = np.ones(3)
    g = tg.make_ir(f)(x)
    want = ir.interpret(g, [x])
    assert np.all(want[0] == -np.inf) and np.all(want[1] == np.inf)
    got = ir.interpret(ir.optimize(g), [x])
    np.testing.assert_array_equal(got[1], want[1])


def _stacks(pick):
    """Per-step states read after the loop through `pick(hs)` (a list of them) and stacked."""
    def f(W, xs):
        h = tg.zeros((1, 3), dtype=W.dtype)
        hs = []
        for t in range(10):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h)
        return tg.sum(tg.stack(pick(hs)) ** 2) + tg.sum(h)
    return f


@pytest.mark.parametrize("name, pick, joined", [
    ("all", lambda hs: hs, True),
    ("a middle run", lambda hs: hs[2:8], True),
    ("reversed", lambda hs: hs[::-1], False),
    ("every other", lambda hs: hs[::2], True),       # a loop of two steps per body
    ("two runs", lambda hs: hs[1:5] + hs[6:9], True),
    ("a repeat", lambda hs: hs[3:6] + hs[5:8], False),   # (those steps are not rolled)
])
def test_stacked_states_read_after_the_loop(name, pick, joined):
    W, xs = np.eye(3) * 0.4, np.linspace(-1, 1, 36).reshape(12, 1, 3)
    g = tg.make_ir(_stacks(pick))(W, xs)
    r = ir.roll_loops(g)
    assert any(e.op == "scan" for e in r.eqns)
    widest = max(len(e.inputs) for e in r.eqns if e.op == "concatenate")
    assert (widest <= 3) == joined, (name, widest)     # else one input per step
    _close(ir.interpret(r, [W, xs]), ir.interpret(g, [W, xs]))
    vg, vr = ir.vjp_graph(g, [0, 1]), ir.vjp_graph(r, [0, 1])
    _close(ir.interpret(vr, [W, xs, np.array(1.0)]), ir.interpret(vg, [W, xs, np.array(1.0)]),
           1e-10)

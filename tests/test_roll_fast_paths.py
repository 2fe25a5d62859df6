"""The fast paths of loop rolling and of the Program: per-step slices at other strides and
orders, slices that break the pattern, values read after the loop, and step functions shared
by equations with equal params and never by others."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir.core import Aval, Eqn, Graph, Var

from conftest import rand


def _scans(graph):
    return [e for e in graph.eqns if e.op == "scan"]


def _check_rolls(f, *args, rolled=True):
    g = tg.make_ir(f)(*args)
    r = ir.roll_loops(g)
    ir.verify(r)
    assert bool(_scans(r)) == rolled
    want = ir.interpret(g, list(args))
    got = ir.interpret(r, list(args))
    for w, x in zip(want, got):
        np.testing.assert_allclose(x, w, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(ir.program(r)(list(args))[0], got[0])
    return r


def _rnn_at(steps):
    def f(W, U, xs):
        h = tg.zeros((1, W.shape[0]), dtype=W.dtype)
        for t in steps:
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)
    return f


@pytest.mark.parametrize("steps", [range(0, 16, 2), range(15, -1, -1), range(14, 1, -3),
                                   range(3, 11), [0, 1, 2, 3, 5, 6, 7, 8],
                                   [0, 1, 2, 3, 4, 5, 6, 6], [-16, -15, -14, -13, -12, -11]])
def test_per_step_slices_at_any_stride_order_or_broken_pattern(steps):
    H = 4
    W, U, xs = rand(H, H, seed=0) / 2, rand(H, H, seed=1) / 2, rand(16, 1, H, seed=2)
    _check_rolls(_rnn_at(list(steps)), W, U, xs)


def test_slices_along_a_later_axis_roll():
    H = 4
    W, U, xs = rand(H, H, seed=0) / 2, rand(H, H, seed=1) / 2, rand(1, 9, H, seed=2)

    def f(W, U, xs):
        h = tg.zeros((1, H), dtype=W.dtype)
        for t in range(9):
            h = tg.tanh(h @ W + xs[:, t, :] @ U)
        return tg.sum(h * h)
    _check_rolls(f, W, U, xs)


def test_values_of_several_steps_read_after_the_loop():
    H = 3
    W, xs = rand(H, H, seed=0) / 2, rand(12, 1, H, seed=2)

    def f(W, xs):
        h = tg.zeros((1, H), dtype=W.dtype)
        hs = []
        for t in range(12):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h)
        return tg.sum(hs[2] * hs[7]) + tg.sum(hs[-1]) + tg.sum(hs[-2] * 2.0)
    _check_rolls(f, W, xs)


def test_program_step_functions_keyed_by_params():
    x = Var(Aval((2, 3), np.dtype(np.float64)))
    outs = []
    eqns = []
    for params in ({"shape": (3, 2)}, {"shape": (3, 2)}):
        v = Var(Aval((3, 2), np.dtype(np.float64)))
        eqns.append(Eqn("reshape", [x], [v], params))
        outs.append(v)
    y = Var(Aval((2, 2), np.dtype(np.float64)))
    z = Var(Aval((2, 2), np.dtype(np.float64)))
    eqns.append(Eqn("slice", [x], [y],
                    {"index": ((0, 2, 1), (0, 2, 1))}))
    eqns.append(Eqn("slice", [x], [z], {"index": ((0, 2, 1), (1, 3, 1))}))
    g = Graph([x], eqns, outs + [y, z])
    a = np.arange(6.0).reshape(2, 3)
    got = ir.program(g)([a])
    want = ir.interpret(g, [a])
    for w, v in zip(want, got):
        np.testing.assert_array_equal(v, w)
    # slices of other indices never share a step function
    assert not np.array_equal(got[2], got[3])


def test_rolling_from_threads_gives_each_length_its_own_values():
    H = 4
    W, U, xs = rand(H, H, seed=0) / 2, rand(H, H, seed=1) / 2, rand(16, 1, H, seed=2)
    graphs = {T: tg.make_ir(_rnn_at(range(T)))(W, U, xs) for T in range(5, 16)}
    want = {T: ir.interpret(g, [W, U, xs])[0] for T, g in graphs.items()}
    errors = []

    def work():
        try:
            for _ in range(3):
                for T, g in graphs.items():
                    r = ir.roll_loops(g)
                    assert _scans(r)[0].params["length"] >= T - 2
                    np.testing.assert_allclose(ir.program(r)([W, U, xs])[0], want[T],
                                               rtol=1e-12)
        except Exception as exc:    # noqa: BLE001 - handed to the main thread
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_interned_avals_are_one_object_per_shape_and_dtype():
    from tracegrad.ir.fission import aval
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    a = aval((3, 4), f32)
    assert aval((3, 4), f32) is a and a == Aval((3, 4), f32)
    assert aval((3, 4), f64) is not a and aval((3, 4), f64).dtype == f64
    assert aval((4, 3), f32).shape == (4, 3)
    assert aval((), f32).shape == ()


def test_two_jitted_functions_sharing_a_body_keep_their_own_lengths():
    H = 4
    W, U = rand(H, H, seed=0) / 2, rand(H, H, seed=1) / 2
    xs = rand(16, 1, H, seed=2)

    def loss(W, U, xs, T):
        h = tg.zeros((1, H), dtype=W.dtype)
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)

    def loss2(W, U, xs, T):      # the same step, another reduction after it
        h = tg.zeros((1, H), dtype=W.dtype)
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h)

    f = tg.jit(tg.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
    g = tg.jit(tg.value_and_grad(loss2, argnums=(0, 1)), static_argnums=(3,))
    old = tg.config.roll_loops
    tg.config.roll_loops = False
    try:
        want_f = {T: tg.value_and_grad(loss, argnums=(0, 1))(W, U, xs, T) for T in (5, 9, 12)}
        want_g = {T: tg.value_and_grad(loss2, argnums=(0, 1))(W, U, xs, T) for T in (5, 9, 12)}
    finally:
        tg.config.roll_loops = old
    for T in (5, 12, 9, 12, 5, 9):
        for fn, want in ((f, want_f), (g, want_g)):
            v, (gW, gU) = fn(W, U, xs, T)
            np.testing.assert_allclose(v, want[T][0], rtol=1e-10)
            np.testing.assert_allclose(gW, want[T][1][0], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(gU, want[T][1][1], rtol=1e-9, atol=1e-12)

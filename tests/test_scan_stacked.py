"""Stacked scans: rolled loops read their per-step inputs as one array and write per-step
outputs as one, loop fission moves the carry-free work out as batched ops, the interpreter runs
a scan as a loop (its Program does not grow with the length), the native backend unrolls it,
and forward mode, reverse mode and grad-of-grad agree with the unrolled trace."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import check_grads, graph_of, numerical_jvp, rand, rolled_and_unrolled

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir.fission import fission
from tracegrad.ir.scan import unroll_scans

F8 = np.dtype("f8")


def _scans(graph):
    return [e for e in graph.eqns if e.op == "scan"]


def _ops(graph):
    return [e.op for e in graph.eqns]


def _close(got, want, rtol=1e-11, atol=1e-13):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ---- stacking the per-step inputs --------------------------------------------------------------

def _rnn_over(pick):
    """An RNN whose step t reads `pick(xs, t, T)`."""
    def f(W, U, xs, T):
        h = tg.zeros((1, W.shape[0]), dtype=W.dtype)
        for t in range(T):
            h = tg.tanh(h @ W + pick(xs, t, T) @ U)
        return tg.sum(h * h)
    return f


PICKS = {
    "forward": lambda xs, t, T: xs[t],
    "backward": lambda xs, t, T: xs[T - 1 - t],
    "strided": lambda xs, t, T: xs[2 * t + 1],
    "offset": lambda xs, t, T: xs[t + 3],
    "axis1": lambda xs, t, T: tg.reshape(xs[:, t], (1, -1)),
    "computed": lambda xs, t, T: tg.sin(xs[t]) * (t % 2 + 1),   # not one slice
}


@pytest.mark.parametrize("name", list(PICKS))
def test_per_step_inputs_are_stacked_and_the_graph_is_o1(name):
    W, U = rand(4, 4, seed=1) / 2, rand(4, 4, seed=2) / 2
    xs = rand(16, 1, 4, seed=3) if name != "axis1" else rand(1, 16, 4, seed=3)
    f = _rnn_over(PICKS[name])
    sizes = []
    for T in (5, 7):
        g = tg.make_ir(f, static_argnums=(3,))(W, U, xs, T)
        r = ir.roll_loops(g)
        ir.verify(r)
        (scan,) = _scans(r)
        assert scan.params["length"] >= T - 2
        np.testing.assert_allclose(ir.interpret(r, [W, U, xs])[0],
                                   ir.interpret(g, [W, U, xs])[0], rtol=1e-13)
        sizes.append(len(r.eqns))
        if name != "computed":
            assert _ops(r).count("slice") == 1 and "concatenate" not in _ops(r)
    if name != "computed":
        assert sizes[0] == sizes[1]
    got, want = rolled_and_unrolled(lambda: tg.grad(f, argnums=(0, 1, 2))(W, U, xs, 7))
    _close(got, want)


def test_values_read_after_the_loop_are_taken_from_the_stacked_output():
    W, xs = rand(3, 3, seed=4) / 2, rand(8, 1, 3, seed=5)

    def f(W, xs):
        h = xs[0]
        hs = []
        for t in range(8):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h)
        return tg.sum(hs[2] * hs[5]) + tg.sum(h)

    g = tg.make_ir(f)(W, xs)
    r = ir.roll_loops(g)
    (scan,) = _scans(r)
    assert any(len(v.aval.shape) == 3 and v.aval.shape[0] == scan.params["length"]
               for v in scan.outvars)
    np.testing.assert_allclose(ir.interpret(r, [W, xs])[0], ir.interpret(g, [W, xs])[0],
                               rtol=1e-13)
    got, want = rolled_and_unrolled(lambda: tg.grad(f, argnums=(0, 1))(W, xs))
    _close(got, want)


# ---- loop fission ------------------------------------------------------------------------------

def _scan_graph(body, T, C, K):
    head = body.in_avals[:C + K]
    xs = [ir.Aval((T,) + a.shape, a.dtype) for a in body.in_avals[C + K:]]
    b = ir.Builder("outer")
    ins = [b.new_input(a) for a in head + xs]
    with b.active():
        outs = ir.bind("scan", *ins, body=body, length=T, n_consts=C, n_carry=K)
    return b.build(outs)


def _fissioned(g):
    eqns = []
    for e in g.eqns:
        eqns += (fission(e) or [e]) if e.op == "scan" else [e]
    return ir.Graph(g.invars, eqns, g.outvars, g.constvars, g.consts)


def _args(g, seed=0):
    rng = np.random.default_rng(seed)
    return [(0.6 * rng.standard_normal(a.shape)).astype(a.dtype) for a in g.in_avals]


def test_fission_moves_input_and_output_work_out_of_the_loop():
    def step(W, U, c, h, x):      # consts W U c, carry h, x; ys: residual, x-only value
        p = tg.reshape(x, (1, 4)) @ U + c * 2.0       # x and constants only: before
        wt = W.T                                       # constants only: once
        hn = tg.tanh(h @ wt + p)
        return hn, 1.0 - hn * hn, tg.exp(p)            # ys no carry needs: after
    avals = [ir.Aval((4, 4), F8), ir.Aval((4, 4), F8), ir.Aval((1, 4), F8),
             ir.Aval((1, 4), F8), ir.Aval((2, 2), F8)]
    body = graph_of(step, *avals)
    g = _scan_graph(body, 6, 3, 1)
    f = _fissioned(g)
    ir.verify(f)
    (scan,) = _scans(f)
    assert _ops(scan.params["body"]) == ["matmul", "add", "tanh"]
    outer = _ops(f)
    assert outer.count("matmul") == 1 and outer.count("transpose") == 1 and "exp" in outer
    args = _args(g)
    _close(ir.interpret(f, args), ir.interpret(g, args), rtol=1e-13, atol=1e-15)
    _close(ir.program(f)(args), ir.interpret(f, args), rtol=0, atol=0)
    assert fission(scan) is None                      # nothing more to move
    f2 = _fissioned(_scan_graph(body, 9, 3, 1))       # one body for every length
    assert _scans(f2)[0].params["body"] is scan.params["body"]


_UN = [tg.sin, tg.tanh, lambda a: a * a, lambda a: -a, lambda a: tg.reshape(a, (3, 2)).T,
       lambda a: a.T.T, lambda a: tg.sum(a, axis=1, keepdims=True) + a]
_BIN = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a @ b.T @ a,
        lambda a, b: tg.maximum(a, b), lambda a, b: a.T @ b]


def _random_body(seed, post=False):
    """A body over consts (2,3) x2, a (2,3) carry, two (2,3) xs: random ops on random pools,
    outputs: the carry, and a few ys (`post`: more, made from the carry)."""
    r = np.random.default_rng(seed)

    def step(c0, c1, h, x0, x1):
        vals = [c0, c1, h, x0, x1]
        for _ in range(int(r.integers(3, 9))):
            a = vals[int(r.integers(0, len(vals)))]
            if r.random() < 0.4:
                v = _UN[int(r.integers(0, len(_UN)))](a)
            else:
                b = vals[int(r.integers(0, len(vals)))]
                v = _BIN[int(r.integers(0, len(_BIN)))](a, b)
            if v.shape != (2, 3):
                v = tg.reshape(v, (2, 3)) if v.size == 6 else tg.sum(v) + c0
            vals.append(v)
        carry = tg.tanh(vals[-1] * 0.5 + h * 0.5)
        ys = [vals[int(r.integers(0, len(vals)))] for _ in range(int(r.integers(0, 3)))]
        if post:       # per-step outputs made from the carry, which no carry needs
            for _ in range(int(r.integers(1, 4))):
                a = [carry, h, vals[-1], x0][int(r.integers(0, 4))]
                b = vals[int(r.integers(0, len(vals)))]
                v = _BIN[int(r.integers(0, len(_BIN)))](_UN[int(r.integers(0, 4))](a), b)
                ys.append(tg.reshape(v, (2, 3)) if v.size == 6 else tg.sum(v) * c1)
        return (carry, *ys)
    a = ir.Aval((2, 3), F8)
    return graph_of(step, a, a, a, a, a)


@pytest.mark.parametrize("seed", range(40))
def test_fission_of_random_bodies_keeps_values_and_gradients(seed):
    body = _random_body(seed, post=seed % 2 == 1)
    g = _scan_graph(body, 4, 2, 1)
    f = _fissioned(g)
    ir.verify(f)
    args = _args(g, seed)
    want = ir.interpret(g, args)
    _close(ir.interpret(f, args), want, rtol=1e-12, atol=1e-13)
    _close(ir.program(f)(args), want, rtol=1e-12, atol=1e-13)
    vg = ir.vjp_graph(g, list(range(len(g.invars))))
    vf = ir.vjp_graph(f, list(range(len(f.invars))))
    cts = _args(ir.Graph([ir.Var(a) for a in g.out_avals], [], []), seed + 100)
    _close(ir.interpret(vf, args + cts), ir.interpret(vg, args + cts), rtol=1e-10, atol=1e-12)
    ug = ir.vjp_graph(unroll_scans(g), list(range(len(g.invars))))
    _close(ir.interpret(vg, args + cts), ir.interpret(ug, args + cts), rtol=1e-10, atol=1e-12)


# ---- the interpreter runs a scan as a loop -----------------------------------------------------

def test_program_of_a_scan_does_not_grow_with_its_length():
    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, hn * 2
    a = ir.Aval((3, 3), F8), ir.Aval((1, 3), F8), ir.Aval((1, 3), F8)
    body = graph_of(step, *a)
    sizes = []
    for T in (3, 40):
        for rev in (False, True):
            b = ir.Builder("o")
            ins = [b.new_input(v) for v in (a[0], a[1], ir.Aval((T, 1, 3), F8))]
            with b.active():
                outs = ir.bind("scan", *ins, body=body, length=T, n_consts=1, n_carry=1,
                               **({"reverse": True} if rev else {}))
            g = b.build(outs)
            args = _args(g, T)
            prog = ir.program(g)
            got = prog(args)
            _close(got, ir.interpret(g, args), rtol=0, atol=0)
            _close(got, ir.interpret(unroll_scans(g), args), rtol=0, atol=0)
            sizes.append(len(prog.steps))
    assert len(set(sizes)) == 1


# ---- native code -------------------------------------------------------------------------------

def test_jit_compiles_a_rolled_fissioned_loop_natively(no_disk_cache):
    old = tg.config.tiering
    tg.config.tiering = False
    try:
        W, U, xs = (a.astype(np.float32) for a in (rand(8, 8, seed=1) / 3,
                                                  rand(8, 8, seed=2) / 3, rand(12, 1, 8, seed=3)))

        def loss(W, U, xs, T):
            h = tg.zeros((1, 8))
            for t in range(T):
                h = tg.tanh(h @ W + xs[T - 1 - t] @ U)
            return tg.sum(h * h)
        step = tg.jit(tg.value_and_grad(loss, argnums=(0, 1)), static_argnums=(3,))
        lowered = step.lower(W, U, xs, 7)
        assert "scan" in _ops(lowered.ir) and "tg_entry" in lowered.llvm_ir
        v, (gw, gu) = step(W, U, xs, 7)
        want = ir.interpret(tg.make_ir(tg.value_and_grad(loss, argnums=(0, 1)),
                                       static_argnums=(3,))(W, U, xs, 7), [W, U, xs])
        _close([v, gw, gu], want, rtol=2e-5, atol=2e-6)
    finally:
        tg.config.tiering = old


def test_native_code_of_a_reverse_scan(no_disk_cache):
    from tracegrad.runtime import compile_graph

    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, tg.sin(hn)
    a = ir.Aval((3, 3), np.dtype("f4")), ir.Aval((1, 3), np.dtype("f4"))
    body = graph_of(step, a[0], a[1], a[1])
    b = ir.Builder("o")
    ins = [b.new_input(v) for v in (a[0], a[1], ir.Aval((5, 1, 3), np.dtype("f4")))]
    with b.active():
        outs = ir.bind("scan", *ins, body=body, length=5, n_consts=1, n_carry=1, reverse=True)
    g = b.build(outs)
    args = _args(g)
    _close(compile_graph(g)(args), ir.interpret(g, args), rtol=2e-5, atol=2e-6)


# ---- forward mode, reverse mode, grad of grad --------------------------------------------------

def _rnn(W, U, xs):
    h = tg.zeros((1, W.shape[0]), dtype=W.dtype)
    for t in range(9):
        h = tg.tanh(h @ W + xs[8 - t] @ U) * 0.9 + h * 0.1
    return tg.sum(h * h)


def test_jvp_of_a_rolled_loop_against_finite_differences():
    W, U, xs = rand(3, 3, seed=7) / 2, rand(3, 3, seed=8) / 2, rand(9, 1, 3, seed=9)
    r = ir.roll_loops(tg.make_ir(_rnn)(W, U, xs))
    assert _scans(r)
    jg = ir.jvp_graph(r)
    tans = [rand(*a.shape, seed=20 + i) for i, a in enumerate((W, U, xs))]
    got = ir.interpret(jg, [W, U, xs] + tans)[1]
    fd = numerical_jvp(lambda *a: ir.interpret(r, list(a))[0], [W, U, xs], tans)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    want = ir.interpret(ir.jvp_graph(tg.make_ir(_rnn)(W, U, xs)), [W, U, xs] + tans)[1]
    np.testing.assert_allclose(got, want, rtol=1e-11)


def test_jvp_of_a_reverse_scan_against_finite_differences():
    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, hn * x
    a = ir.Aval((3, 3), F8), ir.Aval((1, 3), F8)
    body = graph_of(step, a[0], a[1], a[1])
    b = ir.Builder("o")
    ins = [b.new_input(v) for v in (a[0], a[1], ir.Aval((4, 1, 3), F8))]
    with b.active():
        outs = ir.bind("scan", *ins, body=body, length=4, n_consts=1, n_carry=1, reverse=True)
    g = b.build(outs)
    args, tans = _args(g, 1), _args(g, 2)
    got = ir.interpret(ir.jvp_graph(g), args + tans)[2:]
    for i in range(2):
        fd = numerical_jvp(lambda *xs: ir.interpret(g, list(xs))[i], args, tans)
        np.testing.assert_allclose(got[i], fd, rtol=1e-6, atol=1e-8)
    # and reverse mode through it (its VJP is a forward scan)
    cts = [rand(1, 3, seed=3), rand(4, 1, 3, seed=4)]
    vg = ir.vjp_graph(g, [0, 1, 2])
    ug = ir.vjp_graph(unroll_scans(g), [0, 1, 2])
    _close(ir.interpret(vg, args + cts), ir.interpret(ug, args + cts), rtol=1e-11)


def test_grad_of_grad_through_a_stacked_scan():
    W, U, xs = rand(3, 3, seed=7) / 2, rand(3, 3, seed=8) / 2, rand(9, 1, 3, seed=9)
    check_grads(_rnn, (W, U, xs), order=2, modes=("rev",))

    def hvp(W, U, xs):
        return tg.sum(tg.grad(_rnn, argnums=(0, 1))(W, U, xs)[0] ** 2)
    got, want = rolled_and_unrolled(lambda: tg.grad(hvp, argnums=(0, 1, 2))(W, U, xs))
    _close(got, want, rtol=1e-9, atol=1e-11)


def test_backward_graph_is_o1_in_the_length_and_weight_grads_are_one_matmul_each():
    W, U, xs = rand(4, 4, seed=1) / 2, rand(4, 4, seed=2) / 2, rand(16, 1, 4, seed=3)
    f = _rnn_over(PICKS["forward"])
    sizes = []
    for T in (6, 11):
        g = tg.make_ir(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3,))(W, U, xs, T)
        ir.verify(g)
        sizes.append(len(g.eqns))
        assert "concatenate" not in _ops(g)
        assert _ops(g).count("matmul") == 3        # xs @ U, and one for each weight gradient
        assert len(_scans(g)) == 2
    assert sizes[0] == sizes[1]


def test_a_step_input_also_read_after_the_loop_keeps_its_slice():
    W, xs = rand(3, 3, seed=11) / 2, rand(7, 1, 3, seed=12)

    def f(W, xs):
        h = xs[0] * 0.0
        for t in range(7):
            x = xs[t]
            h = tg.tanh(h @ W + x) * x + tg.sin(x)     # x read three times per step
        return tg.sum(h) + tg.sum(xs[4] * 3.0)         # and xs[4] again after the loop
    g = tg.make_ir(f)(W, xs)
    r = ir.roll_loops(g)
    ir.verify(r)
    assert _scans(r)
    np.testing.assert_allclose(ir.interpret(r, [W, xs])[0], ir.interpret(g, [W, xs])[0],
                               rtol=1e-13)
    got, want = rolled_and_unrolled(lambda: tg.grad(f, argnums=(0, 1))(W, xs))
    _close(got, want)

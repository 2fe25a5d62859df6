"""ir.unroll.unroll_scans, what the native backend sees of a scan: stacked values kept as
their steps' values while their readers work step by step, so the unrolled VJP of a rolled
loop is the per-step chain a Python loop traces (one fused kernel), not slices and
concatenates. Values: against the reference interpreter of the rolled graph, exactly."""
from __future__ import annotations

import numpy as np
import pytest
from test_scan_stacked import _args, _fissioned, _random_body, _scan_graph

import tracegrad as tg
from tracegrad import ir
from tracegrad.codegen.plan import plan_graph
from tracegrad.ir.unroll import unroll_scans

F8 = np.dtype("f8")


def _ops(graph):
    return [e.op for e in graph.eqns]


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def _chain(x, c=1.0123):
    for _ in range(12):
        x = tg.sin(x) * c + 0.1 * tg.tanh(x)
    return tg.sum(x)


def test_the_vjp_of_a_rolled_elementwise_loop_unrolls_to_one_chain():
    x = np.linspace(-1, 1, 50)
    g = ir.optimize(tg.make_ir(tg.value_and_grad(_chain))(x))
    assert [e.op for e in g.eqns].count("scan") == 2      # forward and reverse loops
    flat = unroll_scans(g)
    ops = _ops(flat)
    assert "scan" not in ops and "concatenate" not in ops and "slice" not in ops
    _equal(ir.interpret(flat, [x]), ir.interpret(g, [x]))
    assert len(plan_graph(g).groups) == 1                  # fuses into one kernel


def test_a_reader_of_the_whole_array_gets_the_steps_concatenated_once():
    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, hn
    a = ir.Aval((1, 3), F8)
    b = ir.Builder("body")
    ins = [b.new_input(ir.Aval((3, 3), F8)), b.new_input(a), b.new_input(a)]
    with b.active():
        body = b.build(list(step(*ins)))
    o = ir.Builder("outer")
    W, h, xs = (o.new_input(ir.Aval((3, 3), F8)), o.new_input(a),
                o.new_input(ir.Aval((5, 1, 3), F8)))
    with o.active():
        hT, ys = ir.bind("scan", W, h, xs, body=body, length=5, n_consts=1, n_carry=1)
        sq = ys * ys                                    # per step
        flat2 = tg.reshape(sq, (5, 3))                  # needs the array: one concatenate
        both = flat2.T @ tg.reshape(ys, (5, 3))         # ys itself: a second concatenate
        back = ir.bind("scan", W, hT, sq, body=body, length=5, n_consts=1, n_carry=1,
                       reverse=True)                    # reads sq's steps directly
    g = o.build([both, back[0], back[1], ys + 1.0])
    flat = unroll_scans(g)
    # sq and ys for the matmul, the reverse loop's ys and ys + 1 (run per step) as outputs
    assert _ops(flat).count("concatenate") == 4
    assert _ops(flat).count("slice") == 5               # the first loop's xs only
    args = _args(g, 3)
    _equal(ir.interpret(flat, args), ir.interpret(g, args))


@pytest.mark.parametrize("seed", range(16))
def test_random_fissioned_loops_unroll_to_the_same_values(seed):
    body = _random_body(seed, post=seed % 2 == 1)
    g = _fissioned(_scan_graph(body, 4, 2, 1))
    vg = ir.vjp_graph(g, list(range(len(g.invars))))
    args = _args(g, seed)
    cts = _args(ir.Graph([ir.Var(a) for a in g.out_avals], [], []), seed + 100)
    for graph, vals in ((g, args), (vg, args + cts), (ir.optimize(vg), args + cts)):
        flat = unroll_scans(graph)
        ir.verify(flat)
        assert "scan" not in _ops(flat)
        _equal(ir.interpret(flat, vals), ir.interpret(graph, vals))


def test_literal_steps_and_nested_scans():
    a = ir.Aval((2,), F8)
    b = ir.Builder("inner")
    h, x = b.new_input(a), b.new_input(a)
    with b.active():
        inner = b.build([h * x + 1.0, ir.Lit(2.0, F8)])   # a literal per-step output
    b = ir.Builder("outer-body")
    h, x = b.new_input(a), b.new_input(ir.Aval((3, 2), F8))
    with b.active():
        hn, lits = ir.bind("scan", h, x, body=inner, length=3, n_consts=0, n_carry=1)
        outer_body = b.build([hn, lits * hn[0]])
    o = ir.Builder("outer")
    h0, xs = o.new_input(a), o.new_input(ir.Aval((4, 3, 2), F8))
    with o.active():
        hT, ys = ir.bind("scan", h0, xs, body=outer_body, length=4, n_consts=0, n_carry=1)
        out = tg.exp(ys)
    g = o.build([hT, out])
    flat = unroll_scans(g)
    assert "scan" not in _ops(flat)
    args = _args(g, 7)
    _equal(ir.interpret(flat, args), ir.interpret(g, args))


def test_native_code_of_a_rolled_loop_matches_the_interpreter(no_disk_cache, monkeypatch):
    x = np.linspace(0.1, 1, 64).astype(np.float32)
    step = tg.jit(tg.value_and_grad(_chain))      # a first signature compiles natively
    v, gx = step(x)
    assert "define" in step.lower(x).llvm_ir
    monkeypatch.setattr(tg.config, "disable_jit", True)
    v0, g0 = tg.value_and_grad(_chain)(x)
    np.testing.assert_allclose(v, v0, rtol=2e-5)
    np.testing.assert_allclose(gx, g0, rtol=2e-5, atol=1e-6)


def _mlp_step(params, x):
    """Equal hidden layers, each with its own weights: the roll stacks the weights as the
    loop's per-step inputs, fission hoists each W.T as one batched transpose."""
    def loss(params, x):
        h = x
        for W, b in params:
            h = tg.tanh(h @ W + b)
        return tg.sum(h * h)
    value, grads = tg.value_and_grad(loss)(params, x)
    return value, [(W - 0.1 * gW, b - 0.1 * gb) for (W, b), (gW, gb) in zip(params, grads)]


def test_stacked_layer_weights_stay_per_layer_values_in_native_code():
    rng = np.random.default_rng(0)
    params = [(rng.standard_normal((6, 6)) / 3, rng.standard_normal(6) / 3) for _ in range(5)]
    x = rng.standard_normal((4, 6))
    g = ir.optimize(tg.make_ir(_mlp_step)(params, x))
    ops = _ops(g)
    assert "scan" in ops and "concatenate" in ops        # the weights stacked for the loop
    flat = unroll_scans(g)
    # each layer reads its own W, W.T per layer, its gradient read per layer: no stacking
    assert "concatenate" not in _ops(flat) and "scan" not in _ops(flat)
    args = [a for W, b in params for a in (W, b)] + [x]
    _equal(ir.interpret(flat, args), ir.interpret(g, args))


def test_native_code_of_rolled_layers_matches_the_interpreter(no_disk_cache, monkeypatch):
    rng = np.random.default_rng(1)
    params = [(rng.standard_normal((8, 8)).astype(np.float32) / 3,
               rng.standard_normal(8).astype(np.float32) / 3) for _ in range(4)]
    x = rng.standard_normal((5, 8)).astype(np.float32)
    v, new = tg.jit(_mlp_step)(params, x)
    monkeypatch.setattr(tg.config, "disable_jit", True)
    v0, new0 = _mlp_step(params, x)
    np.testing.assert_allclose(v, v0, rtol=2e-5)
    for (W, b), (W0, b0) in zip(new, new0):
        np.testing.assert_allclose(W, W0, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(b, b0, rtol=2e-5, atol=1e-6)

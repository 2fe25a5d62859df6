"""Scans as native loops (codegen.module `lower_scan`): the body's kernels run once per step,
its slots pointed at step t's rows. Values against the reference interpreter; the code (and
so the compile) the same size for every length."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import graph_of
from test_scan_primitive import CASES, IDS, args_for, case_graph, close, rnn_body, scan, \
    scan_graph
from test_scan_stacked import _random_body

import tracegrad as tg
from tracegrad import ir
from tracegrad.codegen import plan as plan_mod
from tracegrad.codegen.plan import plan_graph

F4, F8 = np.dtype("f4"), np.dtype("f8")


@pytest.fixture
def loops(monkeypatch):
    """Every scan without constants of its own runs as a loop, elementwise bodies too."""
    monkeypatch.setattr(plan_mod, "UNROLL_MAX_EQNS", -1)


def native(g: ir.Graph):
    from tracegrad.runtime import compile_graph
    return compile_graph(g)


def _kinds(g: ir.Graph) -> list[str]:
    return [grp.kind for grp in plan_graph(g).groups]


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "body_consts"],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] != "body_consts"])
@pytest.mark.parametrize("dtype", [F4, F8])
def test_scan_cases_as_loops_match_the_interpreter(case, dtype, loops, no_disk_cache):
    g = case_graph(case, dtype)
    body = g.eqns[0].params["body"]
    assert ("scan" in _kinds(g)) == (not body.constvars)   # (constants: unrolled)
    args = args_for(g)
    tol = (2e-5, 2e-6) if dtype == F4 else (1e-12, 1e-13)
    close(native(g)(args), ir.interpret(g, args), *tol)


@pytest.mark.parametrize("seed", range(12))
def test_random_bodies_as_loops_match_the_interpreter(seed, loops, no_disk_cache):
    body = _random_body(seed, post=seed % 2 == 0)
    g = scan_graph(body, 5, 2, 1)
    args = args_for(g, seed)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)


@pytest.mark.parametrize("length", [1, 2, 5])
def test_reverse_loops_and_every_length_parity(length, no_disk_cache):
    g = scan_graph(rnn_body(F8), length, 1, 1, reverse=True)
    assert "scan" in _kinds(g)                 # a matmul body: a loop at any length
    args = args_for(g, length)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)
    f = scan_graph(rnn_body(F8), length, 1, 1)
    close(native(f)(args), ir.interpret(f, args), 1e-12, 1e-13)


def test_swapped_carries_literal_inputs_and_repeated_outputs(loops, no_disk_cache):
    """Carries that swap (outputs that are inputs), a y that is a carry's new value and
    another that repeats it, a literal y, and literal scan inputs (a constant and an initial
    carry)."""
    def step(c, s, a, b, x):
        n = a * c + x * s
        return s * 0.5 + c, b, a, n, n, np.asarray(2.0), a
    v = ir.Aval((3,), F8)
    body = graph_of(step, ir.Aval((), F8), ir.Aval((), F8), v, v, v)
    o = ir.Builder("outer")
    a0, b0, xs = o.new_input(v), o.new_input(v), o.new_input(ir.Aval((5, 3), F8))
    with o.active():
        outs = ir.bind("scan", ir.Lit(0.5, F8), ir.Lit(1.5, F8), a0, b0, xs,
                       body=body, length=5, n_consts=1, n_carry=3)
    g = o.build(outs)
    assert "scan" in _kinds(g)
    args = args_for(g, 3)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)


def test_a_loop_inside_a_loop(loops, no_disk_cache):
    g = case_graph(CASES[1], F8)        # "nested": each step runs a scan of two steps
    assert _kinds(g).count("scan") == 1
    args = args_for(g, 5)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)


def test_an_update_after_the_loop_writes_its_output_in_place(no_disk_cache):
    """The final carry feeds an update that may write into its buffer; the ys feed a
    reduction; the initial carry is read again after the loop."""
    body = rnn_body(F8, 4)
    o = ir.Builder("outer")
    W, h, xs = (o.new_input(ir.Aval((4, 4), F8)), o.new_input(ir.Aval((1, 4), F8)),
                o.new_input(ir.Aval((6, 1, 4), F8)))
    with o.active():
        hT, ys = scan(body, 6, [W], [h * 2.0], [xs])
        out = ir.bind("update_slice", hT, h[:, :2], index=((0, 1, 1), (1, 3, 1)))
        total = tg.sum(ys, axis=0) + h + hT * 3.0
    g = o.build([out, total])
    assert plan_graph(g).in_place
    args = args_for(g, 2)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)


@pytest.mark.parametrize("n", [40, 256])
def test_bodies_with_parallel_kernels_and_blas(n, no_disk_cache):
    """Big enough that the body's matmul calls BLAS; at 256 its GEMM and epilogue run as two
    pool tasks from inside the loop."""
    from tracegrad.codegen.module import lower_graph

    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, tg.sum(hn * hn, axis=1)
    body = graph_of(step, ir.Aval((n, n), F4), ir.Aval((64, n), F4), ir.Aval((64, n), F4))
    g = scan_graph(body, 3, 1, 1)
    layout = lower_graph(g, use_blas=True, threads=2).layout
    assert layout.blas and (layout.n_parallel > 0) == (n == 256)
    args = args_for(g, n)
    args[0] = args[0] / np.float32(n)
    close(native(g)(args), ir.interpret(g, args), 2e-4, 2e-5)


def _rnn_loss(T):
    def loss(W, h, xs):
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h[0])
        return tg.sum(tg.stack(hs) ** 2)
    return loss


def test_a_rolled_rnn_gradient_compiles_to_the_same_code_for_every_length(no_disk_cache,
                                                                         monkeypatch):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((8, 8)) / 3
    h = rng.standard_normal((1, 8))
    sizes, got = [], []
    for T in (6, 40):
        xs = rng.standard_normal((T, 1, 8))
        f = tg.jit(tg.value_and_grad(_rnn_loss(T), argnums=(0, 2)))
        lowered = f.lower(W, h, xs)
        assert [e.op for e in lowered.ir.eqns].count("scan") == 2     # forward, reverse
        # the length is a constant of the loops; nothing else depends on it
        sizes.append(len(lowered.llvm_ir.splitlines()))
        got.append((T, xs, f(W, h, xs)))
    assert sizes[0] == sizes[1]
    monkeypatch.setattr(tg.config, "disable_jit", True)
    for T, xs, (v, (gW, gx)) in got:
        v0, (gW0, gx0) = tg.value_and_grad(_rnn_loss(T), argnums=(0, 2))(W, h, xs)
        np.testing.assert_allclose(v, v0, rtol=1e-12)
        np.testing.assert_allclose(gW, gW0, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(gx, gx0, rtol=1e-11, atol=1e-13)


def test_short_elementwise_loops_still_unroll_and_fuse():
    def chain(x):
        for _ in range(12):
            x = tg.sin(x) * 1.0123 + 0.1 * tg.tanh(x)
        return tg.sum(x)
    g = ir.optimize(tg.make_ir(tg.value_and_grad(chain))(np.linspace(-1, 1, 50)))
    assert [e.op for e in g.eqns].count("scan") == 2
    assert _kinds(g) == ["loop"]           # one kernel, as before native loops


def test_long_elementwise_loops_run_as_loops(monkeypatch):
    monkeypatch.setattr(plan_mod, "UNROLL_MAX_EQNS", 100)
    def chain(x):
        for _ in range(60):
            x = tg.sin(x) * 1.0123 + 0.1 * tg.tanh(x)
        return tg.sum(x)
    g = ir.optimize(tg.make_ir(tg.value_and_grad(chain))(np.linspace(-1, 1, 50)))
    assert _kinds(g).count("scan") == 2


def test_stacked_layer_weights_unroll_rather_than_copy_into_a_loop():
    """A rolled stack of layers reads each layer's weights as a scan input stacked from
    per-layer values: unrolled, each layer reads its own (a loop would copy them all into
    one array every call, and its gradients out of one)."""
    from test_unroll_native import _mlp_step
    rng = np.random.default_rng(0)
    params = [(rng.standard_normal((6, 6)) / 3, rng.standard_normal(6) / 3) for _ in range(5)]
    g = ir.optimize(tg.make_ir(_mlp_step)(params, rng.standard_normal((4, 6))))
    assert "scan" in [e.op for e in g.eqns]
    plan = plan_graph(g)
    assert "scan" not in [grp.kind for grp in plan.groups]
    assert "concatenate" not in [e.op for e in plan.graph.eqns]


def test_the_compile_estimate_counts_a_loop_body_once():
    """Tiering waits to compile until interpreting has cost what compiling should: for a
    rolled RNN that no longer grows with the length."""
    from tracegrad.codegen.plan import compiled_size
    from tracegrad.ir.loops import unrolled_size
    from tracegrad.tracer import executor
    rng = np.random.default_rng(0)
    W, h = rng.standard_normal((8, 8)), rng.standard_normal((1, 8))
    graphs = [ir.optimize(tg.make_ir(tg.value_and_grad(_rnn_loss(T), argnums=(0, 2)))(
        W, h, rng.standard_normal((T, 1, 8)))) for T in (6, 40)]
    assert compiled_size(graphs[0]) == compiled_size(graphs[1]) < unrolled_size(graphs[0])
    assert unrolled_size(graphs[0]) < unrolled_size(graphs[1])
    assert executor.compile_estimate(graphs[1]) == \
        executor._cost["per_eqn"] * compiled_size(graphs[1])


def _outer(body: ir.Graph, length: int = 3) -> ir.Graph:
    o = ir.Builder("outer")
    W, h, xs = (o.new_input(ir.Aval((3, 3), F8)), o.new_input(ir.Aval((1, 3), F8)),
                o.new_input(ir.Aval((length, 1, 3), F8)))
    with o.active():
        outs = ir.bind("scan", W, h, xs, body=body, length=length, n_consts=1, n_carry=1)
    return o.build(list(outs))


def _looped_bodies() -> dict:
    """Bodies (W, h, x) -> (h', y) whose outputs become an input or a repeat only once
    custom_vjp outputs are aliased or an inner scan is unrolled (found by review)."""
    v, m = ir.Aval((1, 3), F8), ir.Aval((3, 3), F8)
    ident = tg.custom_vjp(lambda x: x)
    ident.defvjp(lambda x: (x, None), lambda _, g: g)
    passes = graph_of(lambda c, x: (c, x * 2.0), v, v)          # its carry passes through
    ib = ir.Builder("inner")
    a, _, x = (ib.new_input(v) for _ in range(3))
    with ib.active():
        s = a + x
    twice = ib.build([s, s])                                     # both carries one value
    return {
        "custom_vjp_input": graph_of(lambda W, h, x: (ident(x), h @ W), m, v, v),
        "custom_vjp_repeat": graph_of(lambda W, h, x: (lambda a: (ident(a), a))(h @ W),
                                      m, v, v),
        "inner_passthrough": graph_of(lambda W, h, x: (tg.tanh(h @ W + x), ir.bind(
            "scan", h, tg.stack([x, x]), body=passes, length=2, n_consts=0, n_carry=1)[0]),
            m, v, v),
        "inner_repeat": graph_of(lambda W, h, x: tuple(ir.bind(
            "scan", h @ W, h, tg.stack([x, x]), body=twice, length=2, n_consts=0,
            n_carry=2)), m, v, v),
    }


@pytest.mark.parametrize("name", list(_looped_bodies()))
def test_outputs_that_become_inputs_or_repeats_after_flattening(name, no_disk_cache):
    g = _outer(_looped_bodies()[name])
    assert "scan" in _kinds(g)
    args = args_for(g, 4)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)


def test_a_stacked_constant_does_not_unroll_a_loop():
    """Only stacked step inputs (xs) known by steps unroll a loop: a constant stacked from
    values is concatenated once either way."""
    m, v = ir.Aval((3, 3), F8), ir.Aval((1, 3), F8)
    body = graph_of(lambda Ws, h, x: (lambda n: (n, n))(tg.tanh(h @ Ws[0] + h @ Ws[1] + x)),
                    ir.Aval((2, 3, 3), F8), v, v)
    o = ir.Builder("outer")
    W1, W2, h, xs = o.new_input(m), o.new_input(m), o.new_input(v), \
        o.new_input(ir.Aval((300, 1, 3), F8))
    with o.active():
        outs = ir.bind("scan", tg.stack([W1, W2]), h, xs, body=body, length=300, n_consts=1,
                       n_carry=1)
    g = o.build(list(outs))
    assert "scan" in _kinds(g)
    args = args_for(g, 6)
    close(native(g)(args), ir.interpret(g, args), 1e-12, 1e-13)

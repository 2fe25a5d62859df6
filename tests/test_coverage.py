"""Adding a primitive touches one entry per layer: these tests fail when an op in OPS lacks
its reference, shape rule, VJP or JVP rule, or its native lowering."""
from __future__ import annotations

import numpy as np
import pytest

from tracegrad import ir
from tracegrad.ir import JVP, OPS, VJP
from tracegrad.ir.rules import NO_GRAD


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_definition(name):
    op = OPS[name]
    assert op.name == name
    assert callable(op.rule) and callable(op.ref)
    assert op.kind in {"unary", "binary", "select", "compare", "reduce", "index", "shape",
                       "matmul", "create", "misc"}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_has_vjp_and_jvp_rule(name):
    assert name in VJP, f"primitive {name!r} has no VJP rule in tracegrad/ir/rules.py"
    assert name in JVP, f"primitive {name!r} has no JVP rule in tracegrad/ir/rules.py"
    assert callable(VJP[name]) and callable(JVP[name])


def test_rule_tables_name_only_known_ops():
    assert set(VJP) <= set(OPS), set(VJP) - set(OPS)
    assert set(JVP) <= set(OPS), set(JVP) - set(OPS)
    assert NO_GRAD <= set(OPS)


def test_non_differentiable_ops_give_no_gradient():
    b = ir.Builder("t")
    x = b.new_input(ir.Aval((3,), np.dtype(np.float32)))
    with b.active():
        for name in ("lt", "eq", "sign", "stop_gradient"):
            ins = (x, x) if OPS[name].kind == "compare" else (x,)
            out = ir.bind(name, *ins)
            assert VJP[name](x, *ins, out=out) == (None,) * len(ins)
            assert JVP[name](*([x] * len(ins)), *ins, out=out) is None


def _native_graphs():
    """One small graph per primitive: the cases of test_ops, plus random and custom_vjp."""
    import tracegrad as tg
    from test_ops import CASES
    for case in CASES:
        if case.emits:
            yield case.op, tg.make_ir(case.fn)(*case.args), case.args
    seed = np.array(5, np.int64)
    yield "random", tg.make_ir(lambda s: ir.emit.random((3, 4), s, "normal", np.float32))(
        seed), [seed]

    @tg.custom_vjp
    def twice(x):
        return 2 * x
    twice.defvjp(lambda x: (2 * x, None), lambda _, g: (2 * g,))
    x = np.arange(3, dtype=np.float32)
    yield "custom_vjp_call", tg.make_ir(lambda x: tg.grad(lambda y: tg.sum(twice(y)))(x)
                                        + twice(x))(x), [x]

    def rnn(W, xs):          # its gradient rolls the loop into scans
        h = xs[0]
        for t in range(1, 7):
            h = tg.tanh(h @ W + xs[t])
        return tg.sum(h * h)
    W = (np.arange(9, dtype=np.float32).reshape(3, 3) - 4) / 10
    xs = np.linspace(-1, 1, 7 * 2 * 3, dtype=np.float32).reshape(7, 2, 3)
    yield "scan", tg.make_ir(tg.grad(rnn))(W, xs), [W, xs]


def test_every_op_lowers_to_native_code():
    """Every primitive compiles natively (not just dispatches by kind) and agrees with the
    reference interpreter."""
    from tracegrad.runtime import compile_graph
    lowered = set()
    for op, graph, args in _native_graphs():
        if op in lowered or op not in {e.op for e in graph.eqns}:
            continue
        want = ir.interpret(graph, args)
        got = compile_graph(graph)(list(args))
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, op
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=op)
        lowered.add(op)
    assert set(OPS) - lowered == set(), "primitives without a tested lowering"

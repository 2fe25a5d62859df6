"""The IR: golden dumps in the DESIGN.md format, the verifier, the passes (DCE, CSE, constant
folding, simplify) and the structural hash."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir import Aval, Builder, Eqn, Graph, IRError, Lit, Var, bind
from tracegrad.ir import emit as E

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def f32(*shape):
    return np.ones(shape, np.float32)


def golden(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


# ---- golden dumps ------------------------------------------------------------------------------

def test_dump_design_example():
    graph = tg.make_ir(lambda a, b, c: tg.sum(a @ b + c))(f32(5), f32(5, 3), f32(3))
    assert str(graph) == golden("""
        { lambda a:f32[5] b:f32[5,3] c:f32[3] .
            d:f32[3] = matmul a b
            e:f32[3] = add d c
            f:f32[] = reduce_sum[axes=(0,)] e
          in (f) }
    """)


def test_dump_constants_params_literals_and_several_outputs():
    W = np.ones((2, 3), np.float32)

    def f(x):
        h = tg.tanh(x @ W)
        return tg.sum(h * 2.0, axis=1), tg.argmax(h, axis=0)
    assert str(tg.make_ir(f)(f32(4, 2))) == golden("""
        { lambda a:f32[2,3] ; b:f32[4,2] .
            c:f32[4,3] = matmul b a
            d:f32[4,3] = tanh c
            e:f32[4,3] = mul d 2.0:f32[]
            f:f32[4] = reduce_sum[axes=(1,)] e
            g:i64[3] = argmax[axis=0] d
          in (f g) }
    """)


def test_dump_indexing_and_select():
    f = lambda x, y: (x[1:, None] * y.T, tg.where(x > 0, x, 0.0))
    assert str(tg.make_ir(f)(f32(3, 2), f32(1, 2))) == golden("""
        { lambda a:f32[3,2] b:f32[1,2] .
            c:f32[2,2] = slice[index=((1,3,1),(0,2,1))] a
            d:f32[2,1,2] = reshape[shape=(2,1,2)] c
            e:f32[2,1] = transpose[perm=(1,0)] b
            f:f32[2,2,2] = mul d e
            g:bool[3,2] = gt a 0.0:f32[]
            h:f32[3,2] = select g a 0.0:f32[]
          in (f h) }
    """)


def test_dump_of_a_gradient():
    f = lambda x: tg.sum(tg.sin(x) * x)
    text = str(tg.make_ir(tg.grad(f))(f32(3)))
    assert text == golden("""
        { lambda a:f32[3] .
            b:f32[3] = sin a
            c:f32[3] = cos a
            d:f32[3] = mul a c
            e:f32[3] = add b d
          in (e) }
    """)
    # the dump is what the graph computes
    graph = tg.make_ir(tg.grad(f))(f32(3))
    x = np.array([0.1, 0.5, -2.0], np.float32)
    np.testing.assert_allclose(ir.interpret(graph, [x])[0], np.cos(x) * x + np.sin(x),
                               rtol=1e-6)


def test_dump_dtypes_0d_and_source_lines():
    graph = tg.make_ir(lambda x, n: tg.astype(x, tg.int32) + n)(np.float64(1.0), np.int32(2))
    assert str(graph) == golden("""
        { lambda a:f64[] b:i32[] .
            c:i32[] = convert[dtype=i32] a
            d:i32[] = add c b
          in (d) }
    """)
    line = test_dump_dtypes_0d_and_source_lines.__code__.co_firstlineno + 1
    assert f"# test_ir.py:{line}" in graph.pretty(source=True)


def test_dump_names_past_z_and_dot():
    def f(x):
        for _ in range(30):
            x = tg.sin(x)
        return x
    text = str(tg.make_ir(f)(f32(2)))
    assert "z:f32[2] = sin y" in text and "aa:f32[2] = sin z" in text
    assert text.endswith("in (ae) }")
    dot = tg.make_ir(tg.grad(lambda x: tg.sum(tg.exp(x))))(f32(2)).to_dot()
    assert dot.startswith("digraph G {") and "exp" in dot and "backward" not in dot.split(
        "\n")[0]


# ---- verifier ----------------------------------------------------------------------------------

def _graph():
    """{ a:f32[3] b:f32[3] . c = add a b ; d = exp c ; e = reduce_sum d }"""
    a, b = Var(Aval((3,), F32)), Var(Aval((3,), F32))
    c, d, e = Var(Aval((3,), F32)), Var(Aval((3,), F32)), Var(Aval((), F32))
    eqns = [Eqn("add", [a, b], [c]), Eqn("exp", [c], [d]),
            Eqn("reduce_sum", [d], [e], {"axes": (0,)})]
    return Graph([a, b], eqns, [e])


def test_verifier_accepts_well_formed_graphs():
    ir.verify(_graph())
    for f in [lambda x: tg.sum(tg.logsumexp(x, axis=0) * x[0]),
              lambda x: tg.sum(tg.take(x, np.array([1, 0]), axis=0) @ x.T)]:
        x = np.random.default_rng(0).standard_normal((2, 2))
        ir.verify(tg.make_ir(f)(x))
        ir.verify(tg.make_ir(tg.grad(f))(x))
        ir.verify(tg.make_ir(tg.hessian(f))(x))
        ir.verify(ir.vjp_graph(tg.make_ir(f)(x)))
        ir.verify(ir.jvp_graph(tg.make_ir(f)(x)))


def _broken(kind):
    g = _graph()
    a, b = g.invars
    c = g.eqns[0].out
    if kind == "undefined":
        g.eqns[1].inputs = [Var(Aval((3,), F32))]
    elif kind == "order":
        g.eqns[0], g.eqns[1] = g.eqns[1], g.eqns[0]
    elif kind == "twice":
        g.eqns[1].outvars = [c]
    elif kind == "out_type":
        g.eqns[1].outvars = [Var(Aval((3,), F64))]
    elif kind == "in_shape":
        g.eqns[0].inputs = [a, Var(Aval((4,), F32))]
        g.invars.append(g.eqns[0].inputs[1])
    elif kind == "in_dtype":
        g.eqns[0].inputs = [a, Lit(1, np.int32)]
    elif kind == "unknown_op":
        g.eqns[1].op = "frobnicate"
    elif kind == "params":
        g.eqns[2].params = {"axes": (1,)}
    elif kind == "n_outputs":
        g.eqns[1].outvars = [g.eqns[1].out, Var(Aval((3,), F32))]
    elif kind == "output":
        g.outvars = [Var(Aval((), F32))]
    elif kind == "const":
        g.constvars, g.consts = [Var(Aval((2,), F32))], [np.zeros(3, np.float32)]
    return g


@pytest.mark.parametrize("kind,where,says", [
    ("undefined", "equation 1 (exp)", "not defined"),
    ("order", "equation 0 (exp)", "not defined"),
    ("twice", "equation 1 (exp)", "defined twice"),
    ("out_type", "equation 1 (exp)", "f64[3]"),
    ("in_shape", "equation 0 (add)", "(3,) (4,)"),
    ("in_dtype", "equation 0 (add)", "int32"),
    ("unknown_op", "equation 1 (frobnicate)", "unknown op"),
    ("params", "equation 2 (reduce_sum)", "out of range"),
    ("n_outputs", "equation 1 (exp)", "outputs"),
    ("output", "output", "not defined"),
    ("const", "constant", "f32[2]"),
])
def test_verifier_rejects_malformed_graphs(kind, where, says):
    with pytest.raises(IRError) as e:
        ir.verify(_broken(kind))
    assert where in str(e.value) and says in str(e.value), str(e.value)


# ---- passes ------------------------------------------------------------------------------------

def _build(fn, *avals):
    b = Builder("t")
    ins = [b.new_input(a) for a in avals]
    with b.active():
        outs = fn(*ins)
    return b.build(list(outs) if isinstance(outs, (tuple, list)) else [outs])


def _same_results(g1: Graph, g2: Graph, args) -> None:
    ir.verify(g2)
    for x, y in zip(ir.interpret(g1, args), ir.interpret(g2, args), strict=True):
        np.testing.assert_array_equal(x, y)


def _ops(g: Graph) -> list[str]:
    return [e.op for e in g.eqns]


def test_dce_removes_dead_equations_and_constants():
    unused = np.arange(3.0, dtype=np.float32)

    def fn(x):
        dead = E.cos(x) * E.add(x, unused)
        live = E.exp(x)
        E.sin(dead)
        return live
    g = _build(fn, Aval((3,), F32))
    assert _ops(g) == ["cos", "add", "mul", "exp", "sin"] and len(g.consts) == 1
    d = ir.dce(g)
    assert _ops(d) == ["exp"] and d.consts == [] and d.constvars == []
    _same_results(g, d, [np.ones(3, np.float32)])
    assert len(g.eqns) == 5   # the input graph is left alone


def test_cse_merges_identical_equations_only():
    def fn(x, y):
        a, b = E.sin(x), E.sin(x)
        c = E.add(a, 2.0) * E.add(b, 2.0)
        d = E.add(a, 3.0)                          # a different literal: kept
        e = E.reduce_sum(x, (0,)) + E.reduce_sum(x, (1,))   # different params: kept
        return c + d + E.sin(y), e
    g = _build(fn, Aval((3, 3), F32), Aval((3, 3), F32))
    c = ir.cse(g)
    assert _ops(c).count("sin") == 2 and _ops(c).count("reduce_sum") == 2
    assert _ops(c).count("add") == len([o for o in _ops(g) if o == "add"]) - 1
    x = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    _same_results(g, c, [x, x + 1])


def test_cse_does_not_merge_random_draws_with_different_seeds():
    g = _build(lambda s: E.random((3,), s, "uniform", F32) - E.random((3,), s + 1, "uniform", F32),
               Aval((), np.dtype(np.int64)))
    assert _ops(ir.optimize(g)).count("random") == 2


def test_fold_constants_evaluates_literal_scalars():
    def fn(x):
        k = E.mul(E.add(np.float32(2.0), np.float32(3.0)), np.float32(4.0))   # 20
        return E.mul(x, E.exp(E.sub(k, np.float32(20.0))))                       # x * 1
    g = _build(fn, Aval((2,), F32))
    assert _ops(g) == ["add", "mul", "sub", "exp", "mul"]
    fold = ir.fold_constants(g)
    assert _ops(fold) == ["mul"]
    lit = fold.eqns[0].inputs[1]
    assert isinstance(lit, Lit) and lit.value == 1.0 and lit.dtype == F32
    _same_results(g, fold, [np.array([1.5, -2.0], np.float32)])
    assert _ops(ir.optimize(g)) == []


def test_fold_constants_keeps_dtypes():
    g = _build(lambda x: x + E.floor_divide(np.int32(7), np.int32(2)),
               Aval((2,), np.dtype(np.int32)))
    fold = ir.fold_constants(g)
    assert _ops(fold) == ["add"] and fold.eqns[0].inputs[1].value == 3
    assert fold.eqns[0].inputs[1].dtype == np.int32
    _same_results(g, fold, [np.array([1, 2], np.int32)])


def test_simplify_removes_trivial_algebra():
    def fn(x, y):
        a = E.add(E.mul(x, 1.0), 0.0)
        b = E.div(E.sub(a, 0.0), 1.0)
        c = E.neg(E.neg(E.pow(b, 1.0)))
        d = E.reshape(E.reshape(c, (6,)), (3, 2))
        e = E.bind("reshape", c, shape=(6,))       # a real reshape: kept
        return d + y, E.reduce_sum(e, (0,)), E.mul(x, 2.0), E.add(y, 1.0)
    g = _build(fn, Aval((2, 3), F32), Aval((3, 2), F32))
    s = ir.simplify(g)
    ops = _ops(ir.dce(s))   # simplify rewires uses; what it bypassed is left for DCE
    for gone in ("div", "sub", "neg", "pow"):
        assert gone not in ops
    assert ops.count("mul") == 1 and ops.count("add") == 2    # x*2 and y+1, d+y kept
    assert ops.count("reshape") == 2          # reshape of reshape reads the original
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    _same_results(g, s, [x, x.reshape(3, 2)])


def test_simplify_keeps_ops_that_change_the_type():
    # x * 1 where 1 broadcasts x up is not the identity
    g = _build(lambda x: E.mul(x, np.ones((2, 2), np.float32)) + E.convert(x, F64).sum(),
               Aval((2,), F32))
    s = ir.optimize(g)
    x = np.array([1.0, 2.0], np.float32)
    _same_results(g, s, [x])
    assert ir.interpret(s, [x])[0].shape == (2, 2)


def test_optimize_keeps_results_on_a_gradient_graph():
    f = lambda x, w: tg.sum(tg.tanh(x @ w) * 1.0 + 0.0) + tg.sum(tg.tanh(x @ w))
    x = np.random.default_rng(3).standard_normal((4, 3))
    w = np.random.default_rng(4).standard_normal((3, 2))
    g = ir.vjp_graph(tg.make_ir(f)(x, w))
    o = ir.optimize(g)
    assert len(o.eqns) < len(g.eqns)
    assert _ops(o).count("tanh") == 1 and _ops(o).count("matmul") == 3
    _same_results(g, o, [x, w, np.float64(1.0)])
    # grad runs the optimised graph: nothing left to remove
    once = tg.make_ir(tg.grad(f, argnums=(0, 1)))(x, w)
    assert len(ir.optimize(once).eqns) == len(once.eqns)


# ---- structural hash ---------------------------------------------------------------------------

def _trace(f, *args):
    return tg.make_ir(f)(*args)


def test_hash_equal_up_to_renaming():
    f = lambda x, y: tg.sum(tg.exp(x) * y, axis=0)
    g1, g2 = _trace(f, f32(2, 3), f32(3)), _trace(f, f32(2, 3), f32(3))
    assert {v.id for v in g1.invars}.isdisjoint(v.id for v in g2.invars)
    assert ir.structural_hash(g1) == ir.structural_hash(g2) == g1.structural_hash()
    # names of the Python variables do not matter either
    h = lambda a, b: tg.sum(tg.exp(a) * b, axis=0)
    assert ir.structural_hash(_trace(h, f32(2, 3), f32(3))) == ir.structural_hash(g1)


@pytest.mark.parametrize("other", [
    lambda x, y: tg.sum(tg.exp(x) + y, axis=0),       # another op
    lambda x, y: tg.sum(tg.exp(x) * y, axis=1),       # other params (and shape)
    lambda x, y: tg.sum(tg.exp(x) * y * 2.0, axis=0),  # an extra literal
    lambda x, y: tg.sum(tg.exp(y) * x, axis=0),       # swapped wiring
    lambda x, y: tg.sum(tg.exp(x) * x, axis=0),       # y unused
], ids=["op", "params", "literal", "wiring", "unused_input"])
def test_hash_differs_for_different_graphs(other):
    f = lambda x, y: tg.sum(tg.exp(x) * y, axis=0)
    args = (np.ones((3, 3), np.float32), np.ones(3, np.float32))
    assert ir.structural_hash(_trace(f, *args)) != ir.structural_hash(_trace(other, *args))


def test_hash_sees_shapes_dtypes_literals_and_constants():
    f = lambda x: tg.exp(x) * 2.0
    base = ir.structural_hash(_trace(f, f32(3)))
    assert base != ir.structural_hash(_trace(f, f32(4)))
    assert base != ir.structural_hash(_trace(f, np.ones(3)))
    assert base != ir.structural_hash(_trace(lambda x: tg.exp(x) * 3.0, f32(3)))
    c1, c2 = np.arange(3.0, dtype=np.float32), np.arange(3.0, dtype=np.float32) + 1
    assert (ir.structural_hash(_trace(lambda x: x * c1, f32(3)))
            != ir.structural_hash(_trace(lambda x: x * c2, f32(3))))
    assert (ir.structural_hash(_trace(lambda x: x * c1, f32(3)))
            == ir.structural_hash(_trace(lambda x: x * c1.copy(), f32(3))))
    # output order matters
    assert (ir.structural_hash(_trace(lambda x: (tg.sin(x), tg.cos(x)), f32(3)))
            != ir.structural_hash(_trace(lambda x: (tg.cos(x), tg.sin(x)), f32(3))))


def test_bind_evaluates_eagerly_without_a_builder():
    out = bind("add", np.ones(2, np.float32), np.ones(2, np.float32))
    assert isinstance(out, np.ndarray) and out.tolist() == [2.0, 2.0]


def test_simplify_folds_unit_seeds_and_literal_selects():
    def fn(x):
        one = E.broadcast_to(1.0, (3,))
        return E.add(E.mul(one, x), E.where(True, x, 0.0))
    g = _build(fn, Aval((3,), np.dtype(np.float32)))
    simple = ir.dce(ir.simplify(g))
    assert _ops(simple) == ["add"]
    _same_results(g, simple, [np.array([1.0, -2.0, 3.0], np.float32)])

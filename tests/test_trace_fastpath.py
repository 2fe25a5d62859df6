"""The tracer's fast paths (ops of known types written directly, shared literals, x[t] and
`@` without wrapper layers) record what the general path records."""
import os
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir.builder import Builder, bind

HERE = os.path.basename(__file__)
f32 = np.dtype(np.float32)


def _graph(f, *args, **kw):
    return tg.make_ir(f, **kw)(*args)


def _lines(graph):
    return [(e.op, e.source) for e in graph.eqns]


def test_every_fast_op_carries_the_users_line():
    W = np.ones((4, 4), np.float32)
    xs = np.ones((5, 1, 4), np.float32)
    line = sys._getframe().f_lineno

    def f(W, xs):
        h = tg.zeros((1, 4))
        for t in range(3):                                  # line + 4
            a = h @ W                                       # line + 5
            b = xs[t] @ W                                   # line + 6
            h = tg.tanh(a + b)                              # line + 7
            h = 2.0 * h - h / 3 + tg.sum(h, axis=1, keepdims=True)   # line + 8
        return tg.sum(h * h)                                # line + 9

    for _ in range(2):     # the second trace finds every type known
        g = _graph(f, W, xs)
        by_line = {}
        for op, src in _lines(g):
            assert src is not None and src.startswith(f"{HERE}:"), (op, src)
            by_line.setdefault(int(src.split(":")[1]) - line, []).append(op)
        assert by_line[5] == ["matmul"] * 3
        assert by_line[6] == ["slice", "reshape", "matmul"] * 3
        assert by_line[7] == ["add", "tanh"] * 3
        assert sorted(set(by_line[8])) == ["add", "div", "mul", "reduce_sum", "reshape", "sub"]
        assert by_line[9] == ["mul", "reduce_sum"]


def test_ops_alternating_between_user_functions_carry_each_ones_line():
    # user_source starts from the user's code it found last: a call from another function,
    # or from a helper of the user's called in between, still names its own line
    line = sys._getframe().f_lineno

    def helper(x):
        return tg.exp(x)                                    # line + 3

    def f(x):
        for _ in range(2):
            x = tg.tanh(x)                                  # line + 7
            x = helper(x)                                   # line + 8
            x = x * 2.0                                     # line + 9
        return tg.sum(x)                                    # line + 10

    g = _graph(f, np.ones(3, np.float32))
    assert [(op, int(src.split(":")[1]) - line) for op, src in _lines(g)] == \
        [("tanh", 7), ("exp", 3), ("mul", 9)] * 2 + [("reduce_sum", 10)]


def test_xs_t_is_a_slice_and_a_reshape():
    xs = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    g = _graph(lambda xs: (xs[1], xs[-1], xs[0][0]), xs)
    assert [e.op for e in g.eqns] == ["slice", "reshape"] * 2 + ["slice", "reshape",
                                                                 "reshape"]
    assert g.eqns[0].params["index"] == ((1, 2, 1), (0, 1, 1), (0, 4, 1))
    assert g.eqns[2].params["index"] == ((2, 3, 1), (0, 1, 1), (0, 4, 1))
    out = tg.jit(lambda xs: (xs[1], xs[-1], xs[0][0]))(xs)
    for got, want in zip(out, (xs[1], xs[-1], xs[0][0])):
        np.testing.assert_array_equal(got, want)
    for _ in range(2):
        with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
            _graph(lambda xs: xs[3], xs)
        with pytest.raises(IndexError, match="index -4 is out of bounds"):
            _graph(lambda xs: xs[-4], xs)


def test_params_named_by_a_token_find_the_rule_bind_finds():
    # bind_traced's `token` (x[t]'s params) keys the rule table in place of the params: the
    # first equation under a token, the one after the table is emptied, and the later ones
    # all have the types bind gives
    from tracegrad.ir import builder
    from tracegrad.ir.builder import bind_traced, params_token
    params, token = {"shape": (2, 3)}, params_token()
    for emptied in (False, True, False):
        if emptied:
            builder._RULES_BY_ID.clear()
            builder._RULES.clear()
        b = Builder()
        with b:
            x = b.new_input(tg.ir.Aval((6,), f32))
            outs = [bind_traced("reshape", x, params=params, token=token) for _ in range(2)]
            want = bind("reshape", x, **params)
        assert [o.aval for o in outs] == [want.aval] * 2
        assert b.eqns[1].params is params and b.eqns[0].params == params
    with Builder() as b:     # a shape the rule rejects says so, token or not
        x = b.new_input(tg.ir.Aval((5,), f32))
        with pytest.raises(tg.ir.ShapeError, match="reshape"):
            bind_traced("reshape", x, params=params, token=token)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_python_numbers_promote_as_before(dtype, scalar):
    x = np.ones(3, dtype)
    for f in (lambda x: x * scalar, lambda x: scalar * x, lambda x: x + scalar,
              lambda x: x - scalar, lambda x: scalar / x, lambda x: x / scalar,
              lambda x: x < scalar):
        try:
            want = f(x)
        except TypeError:        # numpy refuses bool subtraction
            continue
        got = tg.jit(f)(x)
        assert got.dtype == _graph(f, x).outvars[0].aval.dtype
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64),
                                   rtol=1e-6)
    # a Python float never promotes a float array; an int keeps an int array's dtype
    if np.dtype(dtype).kind == "f":
        assert _graph(lambda x: x * 2.5, x).outvars[0].aval.dtype == dtype
        assert _graph(lambda x: 2 - x, x).outvars[0].aval.dtype == dtype
    if np.dtype(dtype).kind == "i":
        assert _graph(lambda x: x * 2, x).outvars[0].aval.dtype == dtype
        assert _graph(lambda x: x * 2.5, x).outvars[0].aval.dtype == f32
        assert _graph(lambda x: x / 2, x).outvars[0].aval.dtype == f32


def test_weak_scalar_arguments_stay_weak():
    x = np.ones(3, np.float32)
    g = _graph(lambda x, n: x * n + n, x, 3)
    assert g.outvars[0].aval.dtype == f32
    g = _graph(lambda x, s: x * s, x, 0.5)
    assert g.outvars[0].aval.dtype == f32
    np.testing.assert_allclose(tg.jit(lambda x, s: x * s)(x, 0.5), x * 0.5)


def test_shared_literals_keep_their_bits():
    x = np.ones(2, np.float32)
    g = _graph(lambda x: (x * 0.0, x * -0.0, x + np.nan, x * 0.1, x * 0.1), x)
    lits = [e.inputs[1] for e in g.eqns]
    assert [np.signbit(lit.value) for lit in lits[:2]] == [False, True]
    assert np.isnan(lits[2].value)
    assert lits[3].value == np.float32(0.1) and lits[3].aval.dtype == f32
    out = tg.jit(lambda x: (x * 0.0, x * -0.0))(x)
    assert list(np.signbit(out[1])) == [True, True] and not np.signbit(out[0]).any()


def test_a_0d_array_operand_is_copied_into_the_literal():
    c = np.array(2.0, np.float32)
    x = np.ones(2, np.float32)
    g1 = _graph(lambda x: x * c, x)
    c[...] = 3.0
    g2 = _graph(lambda x: x * c, x)
    assert g1.eqns[0].inputs[1].value == 2.0 and g2.eqns[0].inputs[1].value == 3.0


def test_fast_path_errors_name_op_shapes_and_line():
    a = np.ones((2, 3), np.float32)
    line = sys._getframe().f_lineno
    for _ in range(2):
        with pytest.raises(ValueError) as e:
            _graph(lambda a: a @ a, a)
        assert "matmul" in str(e.value) and f"{HERE}:{line + 3}" in str(e.value)
        with pytest.raises(ValueError) as e:
            _graph(lambda a: a + a.T, a)
        assert "add" in str(e.value) and f"{HERE}:{line + 6}" in str(e.value)


def test_ops_on_an_escaped_traced_value_raise():
    kept = []

    def f(x):
        kept.append(x)
        return x * 2.0
    x = np.ones(2, np.float32)
    _graph(f, x)
    for op in (lambda t: t * 2.0, lambda t: t + t, tg.tanh, lambda t: t[0]):
        with pytest.raises(tg.TracingError, match="escaped"):
            op(kept[0])


def test_values_of_an_outer_trace_are_captured():
    x = np.arange(3, dtype=np.float32)

    def outer(x):
        def inner(y):
            return tg.sum(tg.tanh(x * y + x) * x[0])
        return tg.grad(inner)(x)
    got = tg.jit(outer)(x)
    want = tg.grad(lambda y: tg.sum(tg.tanh(x * y + x) * x[0]))(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_builders_nest_as_context_managers():
    a, b = Builder("a"), Builder("b")
    va = a.new_input(tg.ir.Aval((2,), f32))
    with a.active():
        with b.active() as inner:
            assert inner is b and tg.ir.current_builder() is b
            y = bind("neg", va)           # lifted into b
        assert tg.ir.current_builder() is a
    assert tg.ir.current_builder() is None
    assert y.builder is b and b.captured == [va]


def test_tg_ops_on_traced_values_and_arrays_agree():
    x = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    for f in (tg.tanh, tg.exp, tg.sigmoid, tg.abs, tg.neg, lambda v: tg.add(v, v),
              lambda v: tg.maximum(v, 0.0), lambda v: tg.matmul(v, v.T),
              lambda v: tg.sum(v, axis=0), lambda v: tg.mean(v), lambda v: tg.max(v, 1)):
        np.testing.assert_allclose(tg.jit(f)(x), f(x), rtol=1e-6, atol=1e-7)


def test_operator_fast_paths_fall_back_where_the_common_case_ends():
    """`a @ b` of two traced values goes straight to the primitive only for 1-2 d operands of
    one dtype; `x[i]` only for an int on a value with axes. The rest takes the general path
    (promotion, batch broadcasting, the index checks) and gives numpy's answer."""
    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((3, 4)).astype(np.float32)
    b64 = rng.standard_normal((4, 2))
    batch = rng.standard_normal((5, 3, 4)).astype(np.float32)
    b32 = rng.standard_normal((4, 2)).astype(np.float32)
    got = tg.jit(lambda a, b, c, d: (a @ b, c @ d, a[-1] @ d, a[1][2]))(a32, b64, batch, b32)
    want = (a32 @ b64, batch @ b32, a32[-1] @ b32, a32[1][2])
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)
    with pytest.raises(IndexError, match="out of bounds"):
        tg.jit(lambda a: a[3])(a32)
    with pytest.raises(Exception, match="0-d|scalar|index"):
        tg.jit(lambda a: tg.sum(a)[0])(a32)

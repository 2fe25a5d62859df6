"""The functional transforms: grad/value_and_grad (argnums, has_aux), vjp, jvp, jacrev,
jacfwd, hessian, pytree arguments, jit caching and static_argnums, and composition in any
order."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from conftest import anchors, numerical_jvp, rand

import tracegrad as tg

_, jax = anchors()

X = rand(3, seed=1)
Y = rand(3, seed=2)
M = rand(3, 4, seed=3)


def fd_jacobian(f, x, eps=1e-6):
    """d f / d x by central differences, shaped out.shape + x.shape."""
    cols = []
    for k in range(x.size):
        e = np.zeros(x.size)
        e[k] = 1
        cols.append(numerical_jvp(f, [x], [e.reshape(x.shape)], eps))
    out = np.stack(cols, -1)
    return out.reshape(np.shape(f(x)) + x.shape)


# ---- grad / value_and_grad ---------------------------------------------------------------------

def test_grad_and_value_and_grad():
    f = lambda x, y: tg.sum(tg.sin(x) * y)
    np.testing.assert_allclose(tg.grad(f)(X, Y), np.cos(X) * Y)
    v, g = tg.value_and_grad(f)(X, Y)
    np.testing.assert_allclose(v, np.sum(np.sin(X) * Y))
    np.testing.assert_allclose(g, np.cos(X) * Y)
    assert isinstance(g, np.ndarray) and g.dtype == np.float64


@pytest.mark.parametrize("argnums", [0, 1, -1, (0,), (1, 0), (0, 1)])
def test_grad_argnums(argnums):
    f = lambda x, y: tg.sum(tg.exp(x) * y * y)
    want = {0: np.exp(X) * Y * Y, 1: 2 * np.exp(X) * Y}
    got = tg.grad(f, argnums=argnums)(X, Y)
    if isinstance(argnums, int):
        np.testing.assert_allclose(got, want[argnums % 2])
    else:
        assert isinstance(got, tuple) and len(got) == len(argnums)
        for g, n in zip(got, argnums, strict=True):
            np.testing.assert_allclose(g, want[n])


def test_has_aux():
    f = lambda x: (tg.sum(x * x), {"double": x * 2.0, "n": 3})
    g, aux = tg.grad(f, has_aux=True)(X)
    np.testing.assert_allclose(g, 2 * X)
    np.testing.assert_allclose(aux["double"], 2 * X)
    assert int(aux["n"]) == 3
    (v, aux2), g2 = tg.value_and_grad(f, has_aux=True)(X)
    np.testing.assert_allclose(v, np.sum(X * X))
    np.testing.assert_allclose(g2, g)
    np.testing.assert_allclose(aux2["double"], 2 * X)
    (gx, gy), aux = tg.grad(lambda x, y: (tg.sum(x * y), x + y), argnums=(0, 1),
                            has_aux=True)(X, Y)
    np.testing.assert_allclose(gx, Y)
    np.testing.assert_allclose(gy, X)
    np.testing.assert_allclose(aux, X + Y)


def test_grad_python_scalar_and_0d():
    assert tg.grad(lambda x: x * x * x)(2.0) == pytest.approx(12.0)
    g = tg.grad(lambda x: x * x)(np.float64(3.0))
    assert g.dtype == np.float64 and g == 6.0
    g32 = tg.grad(lambda x: tg.sum(x * x))(X.astype(np.float32))
    assert g32.dtype == np.float32


def test_grad_unused_input_is_zero():
    gx, gy = tg.grad(lambda x, y: tg.sum(x), argnums=(0, 1))(X, M)
    np.testing.assert_array_equal(gx, np.ones(3))
    np.testing.assert_array_equal(gy, np.zeros((3, 4)))
    assert tg.grad(lambda x: 2.0)(np.float64(1.0)) == 0.0


def test_python_control_flow_on_static_values_is_unrolled():
    def f(x, n):
        total = 0.0
        for i in range(n):
            total = total + tg.sum(x ** (i + 1)) if x.shape[0] > 1 else total
        return total
    np.testing.assert_allclose(tg.grad(lambda x: f(x, 3))(X), 1 + 2 * X + 3 * X * X)
    graph = tg.make_ir(f, static_argnums=1)(X, 3)
    assert sum(e.op == "pow" for e in graph.eqns) == 3


# ---- pytrees -----------------------------------------------------------------------------------

def test_pytree_arguments_and_gradients():
    def loss(params, batch):
        w, b = params["w"], params["b"]
        x, y = batch
        return tg.mean((x @ w + b[0] - y) ** 2) + 0.0 * tg.sum(b[1])
    params = {"w": rand(4, 2, seed=5), "b": [rand(2, seed=6), rand(1, seed=7)]}
    batch = (rand(5, 4, seed=8), rand(5, 2, seed=9))
    g = tg.grad(loss)(params, batch)
    assert set(g) == {"w", "b"} and isinstance(g["b"], list) and len(g["b"]) == 2
    for k, leaf in [("w", params["w"]), ("b0", params["b"][0])]:
        got = g["w"] if k == "w" else g["b"][0]
        fd = fd_jacobian(lambda v: loss({**params, "w": v} if k == "w" else
                                        {"w": params["w"], "b": [v, params["b"][1]]}, batch),
                         leaf)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(g["b"][1], 0.0)


def test_none_and_namedtuple_leaves():
    P = namedtuple("P", "a b")
    f = lambda p, nothing: tg.sum(p.a * p.b) if nothing is None else 0.0
    g = tg.grad(f)(P(X, Y), None)
    assert isinstance(g, P)
    np.testing.assert_allclose(g.a, Y)
    np.testing.assert_allclose(g.b, X)
    assert tg.grad(lambda t: tg.sum(t[0]))((X, None))[1] is None


def test_pytree_outputs_through_vjp_and_jvp():
    f = lambda d: {"s": tg.sum(d["x"] * d["y"]), "p": (d["x"] * 2.0,)}
    d = {"x": X, "y": Y}
    out, fn = tg.vjp(f, d)
    np.testing.assert_allclose(out["s"], np.sum(X * Y))
    (g,) = fn({"s": 1.0, "p": (np.ones(3),)})
    np.testing.assert_allclose(g["x"], Y + 2)
    np.testing.assert_allclose(g["y"], X)
    out, t = tg.jvp(f, (d,), ({"x": np.ones(3), "y": np.zeros(3)},))
    np.testing.assert_allclose(t["s"], np.sum(Y))
    np.testing.assert_allclose(t["p"][0], 2 * np.ones(3))


# ---- vjp / jvp ---------------------------------------------------------------------------------

def test_vjp_returns_one_gradient_per_primal():
    f = lambda x, w: tg.tanh(x @ w)
    out, fn = tg.vjp(f, X, M)
    np.testing.assert_allclose(out, np.tanh(X @ M))
    ct = rand(4, seed=10)
    gx, gw = fn(ct)
    dt = ct * (1 - np.tanh(X @ M) ** 2)
    np.testing.assert_allclose(gx, M @ dt)
    np.testing.assert_allclose(gw, np.outer(X, dt))
    # vjp_fn can be called again with another cotangent
    np.testing.assert_allclose(fn(2 * ct)[0], 2 * M @ dt)


def test_vjp_has_aux_and_python_scalar_cotangent():
    out, fn, aux = tg.vjp(lambda x: (tg.sum(x * x), x + 1.0), X, has_aux=True)
    np.testing.assert_allclose(aux, X + 1)
    np.testing.assert_allclose(fn(1.0)[0], 2 * X)
    out, fn = tg.vjp(lambda x: (x * 2.0, tg.sum(x)), X)
    np.testing.assert_allclose(fn((np.ones(3), 1.0))[0], np.full(3, 3.0))


def test_jvp_matches_finite_differences():
    f = lambda x, w: tg.sin(x @ w) * tg.sum(x)
    v, u = rand(3, seed=11), rand(3, 4, seed=12)
    out, t = tg.jvp(f, (X, M), (v, u))
    np.testing.assert_allclose(out, np.sin(X @ M) * X.sum())
    np.testing.assert_allclose(t, numerical_jvp(f, [X, M], [v, u]), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("jac", ["jacrev", "jacfwd"])
def test_jacobians(jac):
    J = getattr(tg, jac)
    f = lambda x: tg.tanh(x[:, None] * x[None, :2]) + tg.sum(x)
    np.testing.assert_allclose(J(f)(X), fd_jacobian(f, X), rtol=1e-7, atol=1e-9)
    g = lambda a, b: a @ b
    np.testing.assert_allclose(J(g, argnums=1)(X, M), fd_jacobian(lambda b: X @ b, M),
                               rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(J(lambda x: tg.sum(x * x))(X), 2 * X)   # scalar output
    assert J(lambda m: m * 2.0)(M).shape == (3, 4, 3, 4)


def test_hessian():
    f = lambda x: tg.sum(tg.exp(x[0] * x) * x)
    H = tg.hessian(f)(X)
    fd = fd_jacobian(lambda x: tg.grad(f)(x), X)
    np.testing.assert_allclose(H, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(H, H.T, atol=1e-12)


# ---- jit ---------------------------------------------------------------------------------------

class Counter:
    """Wraps a function and counts how many times Python runs it (i.e. traces)."""

    def __init__(self, f):
        self.f, self.calls = f, 0

    def __call__(self, *args):
        self.calls += 1
        return self.f(*args)


def test_jit_cache_hit_does_not_retrace():
    c = Counter(lambda x, y: tg.sum(tg.exp(x) * y))
    f = tg.jit(c)
    x32, y32 = X.astype(np.float32), Y.astype(np.float32)
    want = np.sum(np.exp(x32) * y32)
    for _ in range(3):
        np.testing.assert_allclose(f(x32, y32), want, rtol=1e-6)
    assert c.calls == 1
    np.testing.assert_allclose(f(x32 + 1, y32), np.sum(np.exp(x32 + 1) * y32), rtol=1e-6)
    assert c.calls == 1                              # new values, same signature
    f(X, Y)                                          # new dtype
    assert c.calls == 2
    f(rand(5), rand(5))                              # new shape
    assert c.calls == 3
    f(X, Y)
    assert c.calls == 3


def test_jit_cache_keys_on_pytree_structure_and_scalar_kind():
    c = Counter(lambda t: t[0] * t[1])
    f = tg.jit(c)
    f((X, Y))
    f([X, Y])
    assert c.calls == 2
    f([X, Y])
    assert c.calls == 2
    g = Counter(lambda a, b: a * b)
    h = tg.jit(g)
    assert h(2.0, 3).dtype == np.float32
    assert h(np.float64(2.0), 3).dtype == np.float64   # not the Python-float entry
    assert h(2.5, 4) == 10.0 and g.calls == 2
    assert h(True, 3) == 3 and g.calls == 3


def test_jit_static_argnums():
    c = Counter(lambda x, n, mode: x ** n if mode == "pow" else x * n)
    f = tg.jit(c, static_argnums=(1, 2))
    np.testing.assert_allclose(f(X, 3, "pow"), X ** 3)
    np.testing.assert_allclose(f(X, 3, "pow"), X ** 3)
    assert c.calls == 1
    np.testing.assert_allclose(f(X, 2, "pow"), X ** 2)
    np.testing.assert_allclose(f(X, 2, "mul"), X * 2)
    assert c.calls == 3
    g = tg.jit(static_argnums=1)(lambda x, n: x * n)   # decorator form
    np.testing.assert_allclose(g(X, 4), 4 * X)


def test_jit_fast_path_keys_static_values_in_their_places():
    """The cached calls' key holds the static values where they stand among the arrays' types:
    a static array is refused as unhashable (not taken for a traced argument), static lists
    and tuples are values, and static positions in the middle and first are kept apart."""
    c = Counter(lambda n, x, k, y: x * n + y * k[0])
    f = tg.jit(c, static_argnums=(0, 2))
    x32, y32 = X.astype(np.float32), Y.astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(f(2.0, x32, (3.0,), y32), x32 * 2 + y32 * 3, rtol=1e-6)
    assert c.calls == 1
    np.testing.assert_allclose(f(2.0, x32, (4.0,), y32), x32 * 2 + y32 * 4, rtol=1e-6)
    np.testing.assert_allclose(f(3.0, x32, (3.0,), y32), x32 * 3 + y32 * 3, rtol=1e-6)
    np.testing.assert_allclose(f(2.0, y32, (3.0,), x32), y32 * 2 + x32 * 3, rtol=1e-6)
    assert c.calls == 3     # (the last: new values, same types)
    with pytest.raises(TypeError, match="static arguments must be hashable"):
        f(x32, x32, (3.0,), y32)
    with pytest.raises(TypeError, match="static arguments must be hashable"):
        f(2.0, x32, [3.0], y32)
    g = tg.jit(lambda xs, n: xs[0] * n + xs[1], static_argnums=1)
    np.testing.assert_allclose(g([x32, y32], 2), x32 * 2 + y32, rtol=1e-6)
    np.testing.assert_allclose(g((y32, x32), 2), y32 * 2 + x32, rtol=1e-6)
    np.testing.assert_allclose(g([x32, y32], 5), x32 * 5 + y32, rtol=1e-6)


def test_jit_decorator_and_outputs():
    @tg.jit
    def f(x):
        return {"a": x + 1.0, "b": (x, None), "c": [tg.sum(x)]}
    out = f(X)
    np.testing.assert_allclose(out["a"], X + 1)
    assert out["b"][1] is None and isinstance(out["c"], list)
    assert f.__name__ == "f"


def test_jit_lower():
    lowered = tg.jit(lambda x: tg.sum(x * 2.0)).lower(X.astype(np.float32))
    assert isinstance(lowered.ir, tg.ir.Graph)
    assert "reduce_sum" in str(lowered.ir)
    assert isinstance(lowered.llvm_ir, str) and isinstance(lowered.asm, str)


def test_jit_without_arguments():
    np.testing.assert_array_equal(tg.jit(lambda: tg.arange_traced(3) * 2)(), [0, 2, 4])


# ---- composition in any order ------------------------------------------------------------------

def _f(x):
    return tg.sum(tg.sin(x) * x * x)


def _d1(x):
    return np.cos(x) * x * x + 2 * x * np.sin(x)


def _d2(x):
    return -np.sin(x) * x * x + 4 * x * np.cos(x) + 2 * np.sin(x)


def test_compose_jit_grad_grad():
    g2 = lambda x: tg.sum(tg.grad(_f)(x))   # sum of first derivatives
    np.testing.assert_allclose(tg.jit(tg.grad(g2))(X), _d2(X))
    np.testing.assert_allclose(tg.grad(tg.jit(g2))(X), _d2(X))
    d2 = tg.jit(tg.grad(tg.jit(tg.grad(lambda x: tg.sin(x) * x * x))))
    assert d2(0.3).dtype == np.float32
    np.testing.assert_allclose(d2(0.3), _d2(0.3), rtol=1e-5)
    np.testing.assert_allclose(d2(np.float64(0.3)), _d2(0.3), rtol=1e-12)


def test_compose_grad_of_jit_and_jit_of_grad():
    np.testing.assert_allclose(tg.grad(tg.jit(_f))(X), _d1(X))
    np.testing.assert_allclose(tg.jit(tg.grad(_f))(X), _d1(X))
    np.testing.assert_allclose(tg.jit(tg.value_and_grad(_f))(X)[1], _d1(X))


def test_compose_jit_vjp_and_jvp():
    def f(x, ct):
        out, fn = tg.vjp(lambda y: tg.sin(y) * y, x)
        return out, fn(ct)[0]
    out, g = tg.jit(f)(X, Y)
    np.testing.assert_allclose(out, np.sin(X) * X)
    np.testing.assert_allclose(g, Y * (np.cos(X) * X + np.sin(X)))
    t = tg.jit(lambda x, v: tg.jvp(tg.sin, (x,), (v,))[1])(X, Y)
    np.testing.assert_allclose(t, np.cos(X) * Y)


def test_compose_forward_and_reverse():
    np.testing.assert_allclose(tg.jacfwd(tg.grad(_f))(X), np.diag(_d2(X)), atol=1e-12)
    np.testing.assert_allclose(tg.jacrev(tg.grad(_f))(X), np.diag(_d2(X)), atol=1e-12)
    np.testing.assert_allclose(tg.jit(tg.hessian(_f))(X), np.diag(_d2(X)), atol=1e-12)
    jvp_of_grad = tg.jvp(tg.grad(_f), (X,), (np.ones(3),))[1]
    np.testing.assert_allclose(jvp_of_grad, _d2(X))
    grad_of_jvp = tg.grad(lambda x: tg.sum(tg.jvp(_f, (x,), (np.ones(3),))[1]))(X)
    np.testing.assert_allclose(grad_of_jvp, _d2(X))


def test_jit_inside_grad_caches_nothing_but_traces_through():
    c = Counter(lambda x: tg.sum(x ** 3))
    f = tg.jit(c)
    np.testing.assert_allclose(tg.grad(f)(X), 3 * X ** 2)
    np.testing.assert_allclose(tg.grad(f)(X), 3 * X ** 2)
    assert c.calls == 2          # un-jitted transforms re-trace on every call
    f(X)
    f(X)
    assert c.calls == 3


def test_python_scalar_arguments_stay_weakly_typed():
    # a Python scalar never promotes a float32 array to float64, also when it is an argument
    x32, i32 = X.astype(np.float32), np.arange(3, dtype=np.int32)
    assert tg.jit(lambda x, n: x * n)(x32, 3).dtype == np.float32
    assert tg.jit(lambda x, s: x + s)(x32, 2.5).dtype == np.float32
    assert tg.jit(lambda x, n: x * n)(i32, 3).dtype == np.int32
    assert tg.jit(lambda a, b: a * b)(2.0, 3).dtype == np.float32
    v, g = tg.value_and_grad(lambda x, n: tg.sum(x * n))(x32, 3)
    assert v.dtype == g.dtype == np.float32 and np.all(g == 3)
    # numpy scalars and arrays are strongly typed
    assert tg.jit(lambda x, n: x * n)(x32, np.float64(3)).dtype == np.float64
    assert tg.jit(lambda x, n: x * n)(x32, np.array(3, np.int64)).dtype == np.float64


def test_keyword_arguments_are_traced_not_differentiated():
    def f(x, scale=1.0):
        return tg.sum(x * x) * scale
    x = np.ones(3, np.float32)
    jf = tg.jit(f)
    assert jf(x, scale=3.0) == 9.0 and jf(x, scale=5.0) == 15.0 and jf(x) == 3.0
    np.testing.assert_allclose(tg.grad(f)(x, scale=3.0), 6 * x)
    value, g = tg.value_and_grad(f, argnums=-1)(x, scale=2.0)
    assert value == 6.0
    np.testing.assert_allclose(g, 4 * x)
    np.testing.assert_allclose(tg.jit(tg.grad(f))(x, scale=0.5), x)


def test_jacobians_and_make_ir_take_keyword_arguments():
    # as JAX: traced like positional arguments after the others, never differentiated
    def f(x, y, scale=1.0):
        return tg.sin(x) * y * scale
    expected = {0: np.diag(np.cos(X) * Y * 3), 1: np.diag(np.sin(X) * 3)}
    for jac in (tg.jacrev, tg.jacfwd):
        np.testing.assert_allclose(jac(f)(X, Y, scale=3.0), expected[0])
        np.testing.assert_allclose(jac(f, argnums=-1)(X, Y, scale=3.0), expected[1])
        for got, want in zip(jac(f, argnums=(0, 1))(X, Y, scale=3.0), expected.values(),
                             strict=True):
            np.testing.assert_allclose(got, want)
        np.testing.assert_allclose(tg.jit(jac(f))(X, Y, scale=3.0), expected[0])
    h = tg.hessian(lambda x, scale=1.0: tg.sum(x * x * x) * scale)(X, scale=2.0)
    np.testing.assert_allclose(h, np.diag(12 * X))
    graph = tg.make_ir(f)(X, Y, scale=2.0)
    assert len(graph.invars) == 3 and "sin" in str(graph)


def test_jit_rebuilds_output_trees_of_every_kind():
    from tracegrad.tracer.pytree import tree_flatten, unflattener
    for tree in [(1, (2, 3)), [1, None, {"a": 2, "b": (3,)}], {"x": [1, 2]}, 5, (), [],
                 None, ((1,),), {(1, 2): 3}]:
        leaves, td = tree_flatten(tree)
        assert unflattener(td)(leaves) == tree
    f = tg.jit(lambda x: {"s": tg.sum(x), "parts": [x * 2, None, (x + 1,)]})
    x = np.arange(3.0, dtype=np.float32)
    for _ in range(2):   # the second call takes the cached fast path
        out = f(x)
        assert out["s"] == 3.0 and out["parts"][1] is None
        np.testing.assert_array_equal(out["parts"][2][0], x + 1)


# ---- fuzzer findings (against JAX) -------------------------------------------------------------

def test_arguments_not_differentiated_are_python_values_under_grad():
    # as under jax.grad: a float or a string not in argnums is the Python value (a float
    # was traced, so `if k > 0.3` raised; a string was rejected as a leaf), and so under
    # jit's static_argnums around grad
    def f(x, k):
        return tg.sum(x * x) * k if k > 0.3 else tg.sum(x)

    def g(x, mode, shape):
        return tg.sum(x * x) if mode == "sq" else tg.sum(x * tg.ones(shape))

    np.testing.assert_allclose(tg.grad(f)(X, 0.5), X)
    np.testing.assert_allclose(tg.grad(f)(X, 0.1), np.ones(3))
    np.testing.assert_allclose(tg.jit(tg.grad(f), static_argnums=1)(X, 0.5), X)
    np.testing.assert_allclose(tg.grad(g)(X, "sq", (3,)), 2 * X)
    np.testing.assert_allclose(tg.jit(tg.grad(g), static_argnums=(1, 2))(X, "id", (3,)),
                               np.ones(3))
    # an array, or a float differentiated, is still traced
    np.testing.assert_allclose(tg.grad(lambda x, k: tg.sum(x) * k)(X, np.float64(2.0)), 2.0)
    assert tg.grad(lambda x, k: x * k, argnums=1)(2.0, 3.0) == 2.0


def test_custom_vjp_gradient_may_hold_none_for_a_zero_part():
    @tg.custom_vjp
    def g(d):
        return d["u"] * d["v"]
    g.defvjp(lambda d: (g(d), d), lambda d, ct: ({"u": ct * d["v"], "v": None},))
    got = tg.grad(lambda d: tg.sum(g(d)))({"u": X, "v": Y})
    np.testing.assert_allclose(got["u"], Y)     # was zeros: the whole argument was dropped
    np.testing.assert_array_equal(got["v"], 0)

    g.defvjp(lambda d: (g(d), d), lambda d, ct: ({"u": ct * d["v"], "w": None},))
    with pytest.raises(TypeError, match="gradient of argument 0 must have the argument's"):
        tg.grad(lambda d: tg.sum(g(d)))({"u": X, "v": Y})


def test_jacobians_and_hessian_of_several_arguments():
    # a tuple argnums used only its first entry
    f = lambda a, b: a * b     # noqa: E731
    ja, jb = tg.jacrev(f, argnums=(0, 1))(X, Y)
    np.testing.assert_allclose(ja, np.diag(Y))
    np.testing.assert_allclose(jb, np.diag(X))
    jb, ja = tg.jacfwd(f, argnums=(1, 0))(X, Y)
    np.testing.assert_allclose(ja, np.diag(Y))
    np.testing.assert_allclose(jb, np.diag(X))
    (h_aa, h_ab), (h_ba, h_bb) = tg.hessian(lambda a, b: tg.sum(a * a * b), argnums=(0, 1))(X, Y)
    np.testing.assert_allclose(h_aa, np.diag(2 * Y))
    np.testing.assert_allclose(h_ab, np.diag(2 * X))
    np.testing.assert_allclose(h_ba, np.diag(2 * X))
    np.testing.assert_array_equal(h_bb, 0)
    (only,) = tg.jacrev(f, argnums=(1,))(X, Y)
    np.testing.assert_allclose(only, np.diag(X))


def _pytree_jacobian_case():
    rng = np.random.default_rng(3)
    p = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((4, 3))

    def f(p, x, np_=tg):
        h = np_.tanh(x @ p["w"] + p["b"])
        return {"h": h, "s": (np_.sum(h * h), h[0] * 2.0)}
    return f, p, x


@pytest.mark.parametrize("jac", ["jacrev", "jacfwd"])
def test_jacobians_of_pytree_arguments_and_outputs(jac):
    """As JAX nests them: the output's structure, each leaf replaced by the argument's
    structure (by a tuple of those for a tuple argnums), blocks of shape out + arg; checked
    against central differences. (Only one array in and one out were taken.)"""
    f, p, x = _pytree_jacobian_case()
    J = getattr(tg, jac)
    out_leaves, _ = tg.tree_flatten(f(p, x))
    got = tg.tree_flatten(J(f, argnums=(0, 1))(p, x))[0]   # per output leaf: b, w, x

    def output(j, p, x):
        return np.asarray(tg.tree_flatten(f(p, x))[0][j])
    for j, o in enumerate(out_leaves):
        for k, name in enumerate(("b", "w")):
            want = fd_jacobian(lambda v, j=j, name=name: output(j, p | {name: v}, x), p[name])
            assert got[3 * j + k].shape == np.shape(o) + p[name].shape
            np.testing.assert_allclose(got[3 * j + k], want, rtol=1e-6, atol=1e-8)
        want = fd_jacobian(lambda v, j=j: output(j, p, v), x)
        np.testing.assert_allclose(got[3 * j + 2], want, rtol=1e-6, atol=1e-8)
    assert tg.tree_flatten(J(f)(p, x))[1] == tg.tree_flatten(
        {"h": {"b": 0, "w": 0}, "s": ({"b": 0, "w": 0}, {"b": 0, "w": 0})})[1]


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("jac", ["jacrev", "jacfwd", "hessian"])
def test_jacobians_of_pytrees_match_jax(jac):
    f, p, x = _pytree_jacobian_case()
    jnp = jax.numpy
    if jac == "hessian":
        ours = tg.hessian(lambda p, x: f(p, x)["s"][0], argnums=(0, 1))(p, x)
        theirs = jax.hessian(lambda p, x: f(p, x, jnp)["s"][0], argnums=(0, 1))(p, x)
    else:
        ours = getattr(tg, jac)(f, argnums=(0, 1))(p, x)
        theirs = getattr(jax, jac)(lambda p, x: f(p, x, jnp), argnums=(0, 1))(p, x)
    a, ta = jax.tree_util.tree_flatten(ours)
    b, tb = jax.tree_util.tree_flatten(theirs)
    assert ta == tb
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, np.asarray(v), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("jac", ["jacrev", "jacfwd", "hessian"])
def test_jacobians_with_aux(jac):
    """has_aux, as in JAX: f returns (out, aux); the result is (the Jacobian of out, aux),
    aux as f made it (an integer leaf too: only out must be float for jacrev)."""
    f, p, x = _pytree_jacobian_case()

    def g(p, x):
        out = f(p, x)
        scalar = out["s"][0]
        aux = {"h": out["h"], "n": (tg.argmax(x), x.shape[0])}
        return (scalar if jac == "hessian" else out), aux
    J = getattr(tg, jac)
    got, aux = J(g, argnums=(0, 1), has_aux=True)(p, x)
    want = J(lambda p, x: g(p, x)[0], argnums=(0, 1))(p, x)
    a, ta = tg.tree_flatten(got)
    b, tb = tg.tree_flatten(want)
    assert ta == tb
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=0)
    np.testing.assert_allclose(aux["h"], f(p, x)["h"], rtol=1e-12)
    assert int(aux["n"][0]) == int(np.argmax(x)) and int(aux["n"][1]) == x.shape[0]
    # under jit as well
    got2, aux2 = tg.jit(J(g, argnums=(0, 1), has_aux=True))(p, x)
    for u, v in zip(tg.tree_flatten(got2)[0], a, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(aux2["h"], aux["h"], rtol=1e-12)
    with pytest.raises(TypeError, match=f"{jac.replace('hessian', 'jacrev')} with has_aux=True "
                       "needs f to return a pair"):
        J(lambda p, x: f(p, x)["s"][0], has_aux=True)(p, x)


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("jac", ["jacrev", "jacfwd", "hessian"])
def test_jacobians_with_aux_match_jax(jac):
    f, p, x = _pytree_jacobian_case()

    def g(p, x, np_=tg):
        out = f(p, x, np_)
        return (out["s"][0] if jac == "hessian" else out), {"h2": out["h"] * 2.0}
    ours = getattr(tg, jac)(g, argnums=(0, 1), has_aux=True)(p, x)
    theirs = getattr(jax, jac)(lambda p, x: g(p, x, jax.numpy), argnums=(0, 1),
                               has_aux=True)(p, x)
    a, ta = jax.tree_util.tree_flatten(ours)
    b, tb = jax.tree_util.tree_flatten(theirs)
    assert ta == tb
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, np.asarray(v), rtol=1e-10, atol=1e-12)


def test_jacobians_of_integer_outputs_and_by_integer_arguments():
    with pytest.raises(TypeError, match="jacrev requires real-valued floating point outputs"):
        tg.jacrev(lambda x: tg.argmax(x))(X)
    zero, two = tg.jacfwd(lambda x: (tg.argmax(x), x * 2.0))(X)    # (as jax.jacfwd)
    assert zero.dtype == np.int64 and zero.shape == (3,) and not zero.any()
    np.testing.assert_array_equal(two, 2 * np.eye(3))
    # a leaf of a pytree argument is named by its argument, not its flat position
    with pytest.raises(TypeError, match="but argument 1 has dtype int64"):
        tg.jacrev(lambda p, i: p["a"] * 2.0, argnums=(0, 1))({"a": X, "b": X}, np.array([1]))
    with pytest.raises(TypeError, match=r"but argument 0 \(its leaf 1\) has dtype int64"):
        tg.grad(lambda p: tg.sum(p["a"]))({"a": X, "b": np.ones(2, np.int64)})


def test_jvp_wants_its_primals_in_a_tuple():
    # tuple(array) split the array into its rows, one argument each
    with pytest.raises(TypeError, match="primals must be a tuple or list"):
        tg.jvp(lambda *a: tg.stack(a) * 2.0, X, X)
    with pytest.raises(TypeError, match="tangents must be a tuple or list"):
        tg.jvp(lambda a: a * 2.0, (X,), X)
    np.testing.assert_allclose(tg.jvp(lambda a: a * 2.0, [X], [Y])[1], 2 * Y)

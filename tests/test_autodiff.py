"""Derivatives of every differentiable primitive and tg.* function: vjp against finite
differences in float64, jvp/vjp consistency, second derivatives, PyTorch's conventions at
non-differentiable points, stop_gradient, custom_vjp and nested closures."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import check_grads, rand

import tracegrad as tg
from tracegrad.ir import emit as E

X = rand(3, 4, seed=1)
POS = rand(3, 4, seed=2, low=0.5, high=2.0)
AWAY = np.where(X >= 0, X + 0.2, X - 0.2)   # away from the kinks at 0
ROW = rand(4, seed=3)
COL = rand(3, 1, seed=4)

UNARY = {
    "exp": (tg.exp, X), "log": (tg.log, POS), "log1p": (tg.log1p, X * 0.9),
    "expm1": (tg.expm1, X), "sin": (tg.sin, X), "cos": (tg.cos, X), "tan": (tg.tan, X),
    "tanh": (tg.tanh, X), "sigmoid": (tg.sigmoid, 3 * X), "sqrt": (tg.sqrt, POS),
    "erf": (tg.erf, X), "abs": (tg.abs, AWAY), "neg": (tg.neg, X), "square": (tg.square, X),
    "reciprocal": (tg.reciprocal, POS), "relu": (tg.relu, AWAY),
    "sign": (lambda x: tg.sign(x) * x, AWAY),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    f, x = UNARY[name]
    check_grads(f, [x])


@pytest.mark.parametrize("name", ["exp", "sin", "tanh", "sigmoid", "log", "sqrt", "erf"])
def test_unary_second_order(name):
    f, x = UNARY[name]
    check_grads(f, [x], order=2)


BINARY = {
    "add": tg.add, "sub": tg.sub, "mul": tg.mul, "div": tg.div, "maximum": tg.maximum,
    "minimum": tg.minimum, "pow": tg.pow,
}
SHAPE_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((), (3, 4)),
               ((2, 3, 4), (3, 1))]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
def test_binary_broadcasting(name, shapes):
    sx, sy = shapes
    x, y = rand(*sx, seed=5), rand(*sy, seed=6)
    if name in ("div", "pow"):
        x, y = np.abs(x) + 0.5, np.abs(y) + 0.5
    check_grads(BINARY[name], [x, y])


def test_binary_second_order():
    check_grads(lambda x, y: x * y / (x + 2.0) - x ** y, [POS, POS[::-1]], order=2)


def test_pow_scalar_exponents():
    check_grads(lambda x: x ** 3, [X])
    check_grads(lambda x: x ** 0.5, [POS])
    check_grads(lambda x: 2.0 ** x, [X])
    check_grads(lambda x: tg.pow(x, 2), [X], order=2)


def test_python_scalars_and_reflected_operators():
    check_grads(lambda x: 2.0 * x - 1.0 / (x + 3.0) + (1.5 - x) ** 2, [X])
    check_grads(lambda x: -x + abs(x + 3.0), [X])


def test_where_and_clip():
    mask = X > 0
    check_grads(lambda x, y: tg.where(mask, x, y), [X, ROW])
    check_grads(lambda x: tg.where(x > 0, x * x, -x), [AWAY])
    check_grads(lambda x: tg.clip(x, -0.5, 0.5), [X + 0.01])
    check_grads(lambda x: tg.clip(x, a_min=0.0), [AWAY])


REDUCTIONS = {
    "sum": tg.sum, "mean": tg.mean, "max": tg.max, "min": tg.min, "prod": tg.prod,
    "logsumexp": tg.logsumexp,
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), (-1, False),
                                           ((0, 2), False), ((0, 2), True)])
def test_reductions(name, axis, keepdims):
    x = rand(2, 3, 4, seed=7)
    check_grads(lambda x: REDUCTIONS[name](x, axis=axis, keepdims=keepdims), [x])


@pytest.mark.parametrize("name", ["prod", "max", "logsumexp"])
def test_reductions_second_order(name):
    check_grads(lambda x: REDUCTIONS[name](x, axis=1), [X], order=2)


def test_prod_with_zeros_is_exact():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    g = tg.grad(lambda x: tg.sum(tg.prod(x, axis=1)))(x)
    np.testing.assert_allclose(g, [[0, 6, 0], [0, 0, 0], [8, 4, 2]])
    check_grads(lambda x: tg.prod(x, axis=1), [x])


SHAPE_FNS = {
    "reshape": lambda x: tg.reshape(x, (4, 3)),
    "reshape_-1": lambda x: tg.reshape(x, -1),
    "transpose": lambda x: tg.transpose(x),
    "transpose_perm": lambda x: tg.transpose(tg.reshape(x, (3, 2, 2)), (2, 0, 1)),
    "T": lambda x: tg.sin(x).T,
    "broadcast_to": lambda x: tg.broadcast_to(x, (2, 3, 4)),
    "expand_dims": lambda x: tg.expand_dims(x, 1) * 2.0,
    "squeeze": lambda x: tg.squeeze(tg.reshape(x, (1, 3, 1, 4)), (0, 2)),
    "concatenate": lambda x: tg.concatenate([x, x * 2.0, x[:, :1]], axis=1),
    "stack": lambda x: tg.stack([x, tg.exp(x)], axis=-1),
    "take": lambda x: tg.take(x, np.array([[2, 0], [0, 0]]), axis=1),
    "take_flat": lambda x: tg.take(x, np.array([11, 0, 5, 5])),
    "slice": lambda x: x[1:, ::2],
    "slice_neg_step": lambda x: x[::-1, 3:0:-2],
    "index_int_none": lambda x: x[1, None, :, None],
    "index_array": lambda x: x[np.array([2, 0, 2])],
    "index_array_axis1": lambda x: x[:, [3, 1]],
    "ellipsis": lambda x: x[..., -1],
}


@pytest.mark.parametrize("name", sorted(SHAPE_FNS))
def test_shape_ops(name):
    check_grads(SHAPE_FNS[name], [X])


def test_pad_slice_and_scatter_add():
    index = ((1, 3, 1), (0, 4, 2))
    check_grads(lambda g: E.pad_slice(g, (3, 4), index), [rand(2, 2)])
    check_grads(lambda x, g: E.update_slice(x, g, index), [rand(3, 4), rand(2, 2)],
                order=2)
    check_grads(lambda x, g: E.update_slice(E.tanh(x), g * g, ((2, -1, -1), (1, 2, 1))),
                [rand(3, 4), rand(3, 1)])
    idx = np.array([0, 2, 2, 1])
    check_grads(lambda g: E.scatter_add(g, idx, 1, 5), [rand(3, 4)])
    check_grads(lambda g: E.scatter_add(g, idx.reshape(2, 2), 0, 3), [rand(2, 2, 3)])


@pytest.mark.parametrize("mode", ["set", "mul", "min", "max"])
def test_scatter(mode):
    """x with x[idx] combined with v in order; repeated and negative indices."""
    idx = np.array([2, -1, 0, 2])
    check_grads(lambda x, v: E.scatter(x, v, idx, 1, mode), [rand(3, 5), rand(3, 4, seed=1)],
                order=2)
    idx2 = np.array([[1, 1], [0, 1]])
    check_grads(lambda x, v: E.scatter(E.sin(x), v * v, idx2, 0, mode),
                [rand(3, 2, seed=2), rand(2, 2, 2, seed=3)])


def test_scatter_derivatives_at_ties_and_zeros():
    """min/max split an entry's derivative evenly between x and the updates equal to the
    result (as reduce_max); mul's are exact where updates are zero; set's reach only the
    update each index keeps."""
    def grads(mode, x, v, idx):
        f = lambda x, v: tg.sum(E.scatter(x, v, idx, 0, mode) * np.array([1.0, 10.0]))  # noqa
        return tg.grad(f, argnums=(0, 1))(np.array(x), np.array(v))
    dx, dv = grads("max", [1.0, 5.0], [5.0, 5.0, 2.0], np.array([1, 1, 0]))
    np.testing.assert_allclose(dx, [0.0, 10 / 3])
    np.testing.assert_allclose(dv, [10 / 3, 10 / 3, 1.0])
    dx, dv = grads("min", [1.0, 5.0], [1.0, 7.0, 3.0], np.array([0, 1, 0]))
    np.testing.assert_allclose(dx, [0.5, 10.0])
    np.testing.assert_allclose(dv, [0.5, 0.0, 0.0])
    dx, dv = grads("mul", [2.0, 3.0], [0.0, 4.0, 5.0], np.array([0, 0, 1]))
    np.testing.assert_allclose(dx, [0.0, 50.0])
    np.testing.assert_allclose(dv, [8.0, 0.0, 30.0])
    dx, dv = grads("mul", [2.0, 3.0], [0.0, 0.0, 5.0], np.array([0, 0, 1]))
    np.testing.assert_allclose(dv, [0.0, 0.0, 30.0])
    dx, dv = grads("set", [2.0, 3.0], [7.0, 8.0, 9.0], np.array([1, 1, -1]))
    np.testing.assert_allclose(dx, [1.0, 0.0])
    np.testing.assert_allclose(dv, [0.0, 0.0, 10.0])
    # forward mode agrees with reverse at the ties
    t = tg.jvp(lambda v: E.scatter(np.array([1.0, 5.0]), v, np.array([1, 1, 0]), 0, "max"),
               (np.array([5.0, 5.0, 2.0]),), (np.array([3.0, 0.0, 1.0]),))[1]
    np.testing.assert_allclose(t, [1.0, 1.0])


MATMUL_SHAPES = [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)),
                 ((2, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes):
    a, b = rand(*shapes[0], seed=8), rand(*shapes[1], seed=9)
    check_grads(tg.matmul, [a, b])
    check_grads(lambda a, b: a @ b, [a, b], modes=("rev",))


def test_dot_and_matmul_second_order():
    check_grads(tg.dot, [X, ROW])
    check_grads(lambda a, b: tg.sum(tg.tanh(a @ b) ** 2), [X, rand(4, 2)], order=2)


def test_convert_between_floats():
    check_grads(lambda x: tg.astype(tg.astype(x, tg.float32), tg.float64) * 1.0, [X],
                rtol=1e-4, atol=1e-4, eps=1e-3)


def test_composite_second_derivatives():
    def f(x):
        return tg.sum(tg.tanh(x) * tg.exp(-x * x) + tg.logsumexp(x, axis=0))
    x = rand(3, 2, seed=11)
    check_grads(f, [x], order=2)
    h = tg.hessian(f)(x)
    assert h.shape == (3, 2, 3, 2)
    np.testing.assert_allclose(h, h.transpose(2, 3, 0, 1), atol=1e-10)   # symmetric
    np.testing.assert_allclose(tg.jacfwd(tg.jacrev(f))(x), h, atol=1e-10)
    np.testing.assert_allclose(tg.jacrev(tg.jacrev(f))(x), h, atol=1e-10)
    np.testing.assert_allclose(tg.jacrev(tg.jacfwd(f))(x), h, atol=1e-10)


def test_grad_of_grad_scalar():
    f = lambda x: tg.sin(x) * x ** 3
    x = np.float64(0.7)
    d2 = tg.grad(tg.grad(f))(x)
    want = -np.sin(x) * x**3 + 6 * np.cos(x) * x**2 + 6 * x * np.sin(x)
    np.testing.assert_allclose(d2, want, rtol=1e-12)
    d3 = tg.grad(tg.grad(tg.grad(f)))(x)
    h = 1e-5
    fd = (tg.grad(tg.grad(f))(x + h) - tg.grad(tg.grad(f))(x - h)) / (2 * h)
    np.testing.assert_allclose(d3, fd, rtol=1e-6)


def test_square_by_self_multiplication_differentiates_to_one_product():
    # d(s * s) is g*s + s*g, the same bits twice: made once and added to itself, in the graph
    # as traced (what the interpreter runs before optimisation) and in a Tensor's backward
    from tracegrad.tracer.trace import trace

    def f(x):
        s = tg.sin(x)
        return tg.sum(s * s)
    tf, _ = trace(tg.grad(f), (X,), optimized_later=True)
    assert [e.op for e in tf.graph.eqns].count("mul") == 3    # s*s, g*s, g*cos(x)
    want = 2 * np.sin(X) * np.cos(X)
    np.testing.assert_allclose(tg.grad(f)(X), want, rtol=1e-12)
    x = tg.tensor(X, requires_grad=True)
    (tg.sin(x) * tg.sin(x)).sum().backward()     # two values: one product each
    y = tg.tensor(X, requires_grad=True)
    s = tg.sin(y)
    (s * s).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), x.grad.numpy())
    np.testing.assert_allclose(y.grad.numpy(), want, rtol=1e-12)


def test_input_used_many_times_accumulates():
    f = lambda x: tg.sum(x * x + x * 3.0 + tg.sin(x) * x)
    g = tg.grad(f)(X)
    np.testing.assert_allclose(g, 2 * X + 3 + np.cos(X) * X + np.sin(X), rtol=1e-12)


# ---- PyTorch's conventions at non-differentiable points ----------------------------------------

def test_relu_and_abs_at_zero():
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(tg.relu(x)))(x), [0, 0, 1])
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(tg.abs(x)))(x), [-1, 0, 1])
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(tg.nn.functional.relu(x)))(x),
                                  [0, 0, 1])
    np.testing.assert_array_equal(tg.jvp(tg.relu, (x,), (np.ones(3),))[1], [0, 0, 1])
    np.testing.assert_array_equal(tg.jvp(tg.abs, (x,), (np.ones(3),))[1], [-1, 0, 1])


def test_full_max_min_ties_split_evenly():
    x = np.array([[3.0, 1.0, 3.0], [3.0, 0.0, 2.0]])
    np.testing.assert_allclose(tg.grad(lambda x: tg.max(x))(x),
                               [[1 / 3, 0, 1 / 3], [1 / 3, 0, 0]])
    np.testing.assert_allclose(tg.grad(lambda x: tg.min(x))(-x),
                               [[1 / 3, 0, 1 / 3], [1 / 3, 0, 0]])
    np.testing.assert_allclose(tg.grad(lambda x: tg.sum(tg.max(x, axis=1)))(x),
                               [[0.5, 0, 0.5], [1, 0, 0]])
    _, t = tg.jvp(tg.max, (x,), (np.arange(6.0).reshape(2, 3),))
    np.testing.assert_allclose(t, (0 + 2 + 3) / 3)


def test_maximum_minimum_ties_split_evenly():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 0.0])
    gx, gy = tg.grad(lambda x, y: tg.sum(tg.maximum(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, [0.5, 0, 1])
    np.testing.assert_array_equal(gy, [0.5, 1, 0])
    gx, gy = tg.grad(lambda x, y: tg.sum(tg.minimum(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, [0.5, 1, 0])
    np.testing.assert_array_equal(gy, [0.5, 0, 1])
    _, t = tg.jvp(tg.maximum, (x, y), (np.ones(3), np.full(3, 3.0)))
    np.testing.assert_array_equal(t, [2, 3, 1])


def test_pow_at_zero():
    x = np.array([0.0, 0.0, 2.0])
    # x**0 is constant (PyTorch: gradient 0, not 0 * 0**-1 = nan); 0**2 has gradient 0
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(x ** 0.0))(x), [0, 0, 0])
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(x ** 2.0))(x), [0, 0, 4])
    np.testing.assert_array_equal(tg.jvp(lambda x: x ** 0.0, (x,), (np.ones(3),))[1], 0)
    y = np.array([0.0, 2.0, 3.0])
    gx, gy = tg.grad(lambda x, y: tg.sum(x ** y), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gx, [0, 0, 12])
    np.testing.assert_allclose(gy, [0, 0, 8 * np.log(2)])


def test_clip_passes_gradient_at_the_bounds():
    x = np.array([-2.0, 0.0, 0.5, 1.0, 3.0])
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(tg.clip(x, 0.0, 1.0)))(x),
                                  [0, 1, 1, 1, 0])


def test_comparisons_argmax_and_integers_carry_no_gradient():
    def f(x):
        c = tg.astype(x > 0, tg.float64)
        i = tg.astype(tg.argmax(x, axis=1), tg.float64)
        k = tg.astype(tg.astype(x * 10.0, tg.int64), tg.float64)
        s = tg.astype(tg.sign(x), tg.float64)
        return tg.sum(c * 2.0 + k) + tg.sum(i) + tg.sum(s) + tg.sum(x)
    np.testing.assert_array_equal(tg.grad(f)(X), np.ones_like(X))
    _, t = tg.jvp(lambda x: tg.astype(x > 0, tg.float64) + tg.floor_divide(x, 1.0) * 0.0,
                  (X,), (np.ones_like(X),))
    np.testing.assert_array_equal(t, np.zeros_like(X))


def test_stop_gradient():
    f = lambda x: tg.sum(x * tg.stop_gradient(x) + tg.stop_gradient(tg.exp(x)))
    np.testing.assert_allclose(tg.grad(f)(X), X, rtol=1e-12)
    _, t = tg.jvp(lambda x: x * tg.stop_gradient(x), (X,), (np.ones_like(X),))
    np.testing.assert_allclose(t, X)
    # second order: d/dx of (x * sg(x))' = d/dx sg(x) = 0
    np.testing.assert_allclose(tg.grad(lambda x: tg.grad(f)(x).sum())(X), 0.0)
    # on a plain array it is the identity
    np.testing.assert_array_equal(tg.stop_gradient(X), X)


def test_stop_gradient_of_a_pytree():
    """Mapped leaf by leaf, as jax.lax.stop_gradient (a list of arrays was stacked into one
    array, a dict raised)."""
    p = {"w": X, "b": [X[0], X[1]]}
    out = tg.stop_gradient(p)
    assert type(out) is dict and type(out["b"]) is list and len(out["b"]) == 2
    np.testing.assert_array_equal(out["b"][1], X[1])

    def f(p):
        q = tg.stop_gradient(p)
        return tg.sum(p["w"] * q["w"]) + tg.sum(p["b"][0] * q["b"][1] ** 2)
    g = tg.grad(f)(p)
    np.testing.assert_allclose(g["w"], X, rtol=1e-12)
    np.testing.assert_allclose(g["b"][0], X[1] ** 2, rtol=1e-12)
    np.testing.assert_array_equal(g["b"][1], 0.0)
    assert tg.stop_gradient(None) is None


def test_integer_argument_gets_zero_cotangent_in_vjp():
    out, fn = tg.vjp(lambda x, n: x * tg.astype(n, tg.float64), X, np.arange(4))
    gx, gn = fn(np.ones_like(X))
    np.testing.assert_allclose(gx, np.broadcast_to(np.arange(4.0), X.shape))
    assert np.all(gn == 0) and gn.shape == (4,)


# ---- custom_vjp --------------------------------------------------------------------------------

def _clip_gradient():
    @tg.custom_vjp
    def f(x, y):
        return tg.sin(x) * y

    def fwd(x, y):
        return f(x, y), (x, y)

    def bwd(res, g):
        x, y = res
        return (tg.clip(g * tg.cos(x) * y, -0.1, 0.1), g * tg.sin(x))
    f.defvjp(fwd, bwd)
    return f


def test_custom_vjp_uses_the_user_backward():
    f = _clip_gradient()
    x, y = np.array([0.1, 1.0, 2.0]), np.array([5.0, 0.01, -3.0])
    np.testing.assert_allclose(f(x, y), np.sin(x) * y)
    gx, gy = tg.grad(lambda x, y: tg.sum(f(x, y)), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx, np.clip(np.cos(x) * y, -0.1, 0.1))
    np.testing.assert_allclose(gy, np.sin(x))
    out, fn = tg.vjp(f, x, y)
    np.testing.assert_allclose(fn(np.full(3, 2.0))[1], 2 * np.sin(x))
    # jitted, and nested inside another function
    np.testing.assert_allclose(tg.jit(tg.grad(lambda x: tg.sum(f(x * 2.0, y))))(x),
                               2 * np.clip(np.cos(2 * x) * y, -0.1, 0.1))


def test_custom_vjp_second_order_and_jvp():
    @tg.custom_vjp
    def cube(x):
        return x * x * x

    def fwd(x):
        return cube(x), x

    def bwd(x, g):
        return (3.0 * g * x * x,)
    cube.defvjp(fwd, bwd)
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(tg.grad(lambda x: tg.sum(cube(x)))(x), 3 * x**2)
    np.testing.assert_allclose(tg.grad(lambda x: tg.sum(tg.grad(
        lambda z: tg.sum(cube(z)))(x)))(x), 6 * x)
    _, t = tg.jvp(cube, (x,), (np.ones(3),))
    np.testing.assert_allclose(t, 3 * x**2)


def test_custom_vjp_stable_log1pexp():
    @tg.custom_vjp
    def softplus(x):
        return tg.log1p(tg.exp(-tg.abs(x))) + tg.maximum(x, 0.0)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * tg.sigmoid(x),))
    x = np.array([-1e4, 0.0, 1e4, 3.0])
    g = tg.grad(lambda x: tg.sum(softplus(x)))(x)
    np.testing.assert_allclose(g, [0.0, 0.5, 1.0, 1 / (1 + np.exp(-3.0))])


# ---- closures over outer traced values ---------------------------------------------------------

def test_nested_grad_closes_over_outer_value():
    def outer(x):
        inner = lambda y: tg.sum(tg.sin(x * y))     # x is the outer traced value
        return tg.sum(tg.grad(inner)(x * 0.0 + 1.0))
    x = np.array([0.3, -0.7, 1.1])
    # outer(x) = sum(x * cos(x)) ; d/dx = cos(x) - x sin(x)
    np.testing.assert_allclose(outer(x), np.sum(x * np.cos(x)))
    np.testing.assert_allclose(tg.grad(outer)(x), np.cos(x) - x * np.sin(x), rtol=1e-12)


def test_nested_vjp_and_jvp_close_over_outer_value():
    def outer(x):
        _, fn = tg.vjp(lambda y: y * x, x)
        (g,) = fn(tg.exp(x))
        _, t = tg.jvp(lambda y: tg.sin(y * x), (x,), (x,))
        return tg.sum(g + t)
    check_grads(outer, [np.array([0.3, -0.7, 1.1])])


def test_perturbation_confusion():
    # d/dx [ x * d/dy (x + y) ] = d/dx [x * 1] = 1 (Siskind & Pearlmutter)
    f = lambda x: x * tg.grad(lambda y: x + y)(np.float64(2.0))
    np.testing.assert_allclose(tg.grad(f)(np.float64(3.0)), 1.0)
    g = lambda x: tg.grad(lambda y: x * y)(x)    # = x, so g' = 1
    np.testing.assert_allclose(tg.grad(g)(np.float64(3.0)), 1.0)


# ---- VJP rule templates ------------------------------------------------------------------------

def _rnn_like(x, w):
    h = x
    for _ in range(4):
        h = tg.tanh(h @ w + h * h + 1.5)
    return tg.sum(h * x)


@pytest.mark.parametrize("f", [
    _rnn_like,
    lambda x, w: tg.sum(x * x * w[0]),                  # an input used twice in one equation
    lambda x, w: tg.sum(tg.maximum(x, 0.5) ** 2.0 + tg.where(x > 0, w[:1], 2.0)),
    lambda x, w: tg.sum(tg.log1p(x * x) @ w) + tg.sum(x[1]),
], ids=["rnn", "aliased", "literals", "mixed"])
def test_replayed_vjp_rules_emit_what_the_rules_emit(f, monkeypatch):
    """Copying a rule's recorded equations gives the same graph as running the rule."""
    from tracegrad import ir
    from tracegrad.ir import autodiff
    x, w = rand(4, 4, seed=7), rand(4, 4, seed=8)
    fwd = tg.make_ir(f)(x, w)
    replayed = ir.vjp_graph(fwd, [0, 1])
    replayed_again = ir.vjp_graph(fwd, [0, 1])      # templates now cached
    monkeypatch.setattr(autodiff, "_vjp", lambda b, e, gs, ins, outs, need:
                        autodiff._rule(e, gs, ins, outs, need))
    direct = ir.vjp_graph(fwd, [0, 1])
    want = ir.structural_hash(direct)
    assert ir.structural_hash(replayed) == want
    assert ir.structural_hash(replayed_again) == want
    args = [x, w, np.float64(1.0)]
    for got, ref in zip(ir.interpret(replayed, args), ir.interpret(direct, args)):
        np.testing.assert_array_equal(got, ref)


def _rnn(w, u, xs):
    h = tg.zeros((2, 4), dtype=w.dtype)
    for t in range(xs.shape[0]):
        h = tg.tanh(h @ w + xs[t] @ u)
    return tg.sum(h * h)


def test_loop_weight_gradients_are_summed_as_one_matmul(monkeypatch):
    """A weight used at every step gets one concatenated GEMM for its gradient, not T
    products and T-1 additions; same values as summing them one by one."""
    from tracegrad import ir
    from tracegrad.ir import autodiff
    w, u = rand(4, 4, seed=1) / 2, rand(3, 4, seed=2) / 2
    xs = rand(6, 2, 3, seed=3)
    graph = ir.optimize(ir.vjp_graph(tg.make_ir(_rnn)(w, u, xs), [0, 1]))
    ops = [e.op for e in graph.eqns]
    # h^T and x^T, and the g_t (shared by both gradients after CSE)
    assert ops.count("concatenate") == 3
    # h@w and x@u per step, g@w^T for steps 1..5 (h_0 is a constant), one GEMM per weight
    assert ops.count("matmul") == 2 * 6 + 5 + 2
    check_grads(_rnn, (w, u, xs), modes=("rev",))
    merged = tg.grad(_rnn, argnums=(0, 1))(w, u, xs)
    monkeypatch.setattr(autodiff._Sums, "_merge", lambda self, terms: terms)
    one_by_one = tg.grad(_rnn, argnums=(0, 1))(w, u, xs)
    for a, b in zip(merged, one_by_one):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_gradient_used_twice_is_not_merged_away():
    """A matmul's gradient read by two sums keeps its equation (the merge only takes
    contributions nobody else reads)."""
    w = rand(3, 3, seed=5)

    def f(w):
        h = tg.ones((1, 3), dtype=w.dtype)
        outs = []
        for _ in range(4):
            h = h @ w
            outs.append(h + 0.0 * h)
        return tg.sum(tg.concatenate(outs, axis=0) ** 2)
    check_grads(f, (w,), modes=("rev",), order=2)


def test_merged_matmul_gradient_still_read_elsewhere_is_kept():
    """A custom_vjp backward that reads its own matmul product twice: the product is both a
    contribution to a merged sum and an input of another gradient."""
    @tg.custom_vjp
    def f(x, w):
        return x @ w

    def bwd(res, g):
        x, w = res
        m = tg.transpose(x) @ g
        return g @ tg.transpose(w) + m, m
    f.defvjp(lambda x, w: (x @ w, (x, w)), bwd)
    x, w = rand(3, 3, seed=11), rand(3, 3, seed=12)
    loss = lambda x, w: tg.sum(f(f(f(x, w), w), w))
    got = tg.grad(loss, argnums=(0, 1))(x, w)
    jitted = tg.jit(tg.grad(loss, argnums=(0, 1)))(x, w)
    xt, wt, ct = x.T, w.T, np.ones((3, 3))
    # by hand: y1 = x w, y2 = y1 w, y3 = y2 w; each backward gives (g w^T + x^T g, x^T g)
    y1 = x @ w
    y2 = y1 @ w
    gx3, gw3 = ct @ wt + y2.T @ ct, y2.T @ ct
    gx2, gw2 = gx3 @ wt + y1.T @ gx3, y1.T @ gx3
    gx1, gw1 = gx2 @ wt + xt @ gx2, xt @ gx2
    for g in (got, jitted):
        np.testing.assert_allclose(g[0], gx1, rtol=1e-10)
        np.testing.assert_allclose(g[1], gw1 + gw2 + gw3, rtol=1e-10)


def test_an_argument_named_twice_in_argnums_gets_its_gradient_twice():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    for fn in (tg.grad, lambda f, argnums: tg.jit(tg.grad(f, argnums=argnums))):
        a, b = fn(lambda a: tg.sum(a * a), argnums=(0, 0))(x)
        np.testing.assert_array_equal(a, 2 * x)
        np.testing.assert_array_equal(b, 2 * x)


def test_negative_zero_literals_keep_their_sign_in_replayed_rules():
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(tg.grad(lambda x: tg.sum(x / 0.0))(x), [np.inf, np.inf])
    for f in (tg.grad, lambda f: tg.jit(tg.grad(f))):
        np.testing.assert_array_equal(f(lambda x: tg.sum(x / -0.0))(x), [-np.inf, -np.inf])

"""Differential tests: the same functions in PyTorch and JAX, values and derivatives compared
in float64. Each test skips when its framework is not installed."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import anchors, rand

import tracegrad as tg

torch, jax = anchors()
jnp = jax.numpy if jax is not None else None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed")

F = tg.nn.functional


def torch_value_and_grads(f, *args):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args]
    out = f(*ts)
    out.backward()
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
                                  for t in ts]


def compare_with_torch(ours, theirs, *args, rtol=1e-10, atol=1e-12):
    """Values and gradients of the scalar `sum(f(args))` agree."""
    n = tuple(range(len(args)))
    v, g = tg.value_and_grad(lambda *a: tg.sum(ours(*a)), argnums=n)(*args)
    tv, tgr = torch_value_and_grads(lambda *a: theirs(*a).sum(), *args)
    np.testing.assert_allclose(v, tv, rtol=rtol, atol=atol)
    for mine, want in zip(g, tgr, strict=True):
        np.testing.assert_allclose(mine, want, rtol=rtol, atol=atol)


X = rand(3, 4, seed=1, low=-2, high=2)
Y = rand(3, 4, seed=2, low=-2, high=2)
POS = rand(3, 4, seed=3, low=0.2, high=2)

UNARY = {
    "exp": (tg.exp, "exp", X), "log": (tg.log, "log", POS), "log1p": (tg.log1p, "log1p", POS),
    "expm1": (tg.expm1, "expm1", X), "sin": (tg.sin, "sin", X), "cos": (tg.cos, "cos", X),
    "tan": (tg.tan, "tan", X * 0.5), "tanh": (tg.tanh, "tanh", X),
    "sigmoid": (tg.sigmoid, "sigmoid", X), "sqrt": (tg.sqrt, "sqrt", POS),
    "erf": (tg.erf, "erf", X), "abs": (tg.abs, "abs", X), "relu": (tg.relu, "relu", X),
    "square": (tg.square, "square", X), "reciprocal": (tg.reciprocal, "reciprocal", POS),
    "neg": (tg.neg, "neg", X), "sign": (tg.sign, "sign", X),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_vs_torch(name):
    ours, attr, x = UNARY[name]
    compare_with_torch(lambda a: ours(a) * a, lambda a: getattr(torch, attr)(a) * a, x)


BINARY = {
    "add": (tg.add, torch.add if torch else None), "sub": (tg.sub, torch.sub if torch else None),
    "mul": (tg.mul, torch.mul if torch else None), "div": (tg.div, torch.div if torch else None),
    "maximum": (tg.maximum, torch.maximum if torch else None),
    "minimum": (tg.minimum, torch.minimum if torch else None),
    "pow": (tg.pow, torch.pow if torch else None),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sy", [(3, 4), (4,), (3, 1)], ids=str)
def test_binary_vs_torch(name, sy):
    ours, theirs = BINARY[name]
    x = POS if name == "pow" else X
    y = rand(*sy, seed=4, low=0.5, high=2) if name in ("pow", "div") else rand(*sy, seed=4)
    compare_with_torch(lambda a, b: ours(a, b) * a, lambda a, b: theirs(a, b) * a, x, y)


@needs_torch
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "logsumexp"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_reductions_vs_torch(name, axis):
    ours = getattr(tg, name)
    x = rand(3, 4, seed=5)

    def theirs(a):
        if name == "logsumexp":
            return torch.logsumexp(a, dim=(0, 1) if axis is None else axis)
        fn = {"max": torch.amax, "min": torch.amin}.get(name, getattr(torch, name))
        if axis is None:
            return fn(a) if name not in ("max", "min") else fn(a, dim=(0, 1))
        return fn(a, dim=axis)
    compare_with_torch(lambda a: ours(a, axis=axis) * 1.5, lambda a: theirs(a) * 1.5, x)


@needs_torch
def test_non_differentiable_points_match_torch():
    x = np.array([-1.0, 0.0, 0.0, 2.0, 2.0])
    y = np.array([0.0, 0.0, 1.0, 2.0, 3.0])
    compare_with_torch(tg.relu, torch.relu, x)
    compare_with_torch(tg.abs, torch.abs, x)
    compare_with_torch(tg.max, torch.max, x)           # full reduction: ties split evenly
    compare_with_torch(tg.min, torch.min, x)
    compare_with_torch(lambda a: tg.max(a, axis=0), lambda a: torch.amax(a, dim=0), x)
    compare_with_torch(tg.maximum, torch.maximum, x, y)   # elementwise ties split evenly
    compare_with_torch(tg.minimum, torch.minimum, x, y)
    compare_with_torch(lambda a: tg.clip(a, 0.0, 2.0), lambda a: torch.clamp(a, 0.0, 2.0), x)
    compare_with_torch(lambda a: tg.sqrt(a + 1.0), lambda a: torch.sqrt(a + 1.0), x)
    compare_with_torch(lambda a: tg.prod(a), torch.prod, x)           # zeros in the product
    compare_with_torch(lambda a: tg.prod(a), torch.prod, np.array([1.0, 0.0, 3.0]))
    compare_with_torch(lambda a: a ** 0.0, lambda a: a ** 0.0, x)
    compare_with_torch(lambda a, b: tg.pow(a, b), torch.pow, np.abs(x), y)


@needs_torch
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)),
                                   ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                   ((2, 1, 3, 4), (5, 4, 2))], ids=str)
def test_matmul_vs_torch(sa, sb):
    compare_with_torch(tg.matmul, torch.matmul, rand(*sa, seed=6), rand(*sb, seed=7))


@needs_torch
def test_shape_ops_vs_torch():
    x = rand(2, 3, 4, seed=8)
    idx = np.array([2, 0, 2])
    cases = [
        (lambda a: a[1:, ::2, None, -1], lambda a: a[1:, ::2, None, -1]),
        (lambda a: tg.transpose(a, (2, 0, 1)), lambda a: a.permute(2, 0, 1)),
        (lambda a: tg.reshape(a, (4, 6)), lambda a: a.reshape(4, 6)),
        (lambda a: tg.concatenate([a, a * 2.0], axis=1), lambda a: torch.cat([a, a * 2.0], 1)),
        (lambda a: tg.stack([a, a], axis=-1), lambda a: torch.stack([a, a], -1)),
        (lambda a: tg.take(a, idx, axis=1), lambda a: a[:, torch.tensor(idx)]),
        (lambda a: tg.broadcast_to(a[:, :1], (2, 3, 4)), lambda a: a[:, :1].expand(2, 3, 4)),
        (lambda a: tg.where(a > 0, a * a, -a), lambda a: torch.where(a > 0, a * a, -a)),
    ]
    for ours, theirs in cases:
        compare_with_torch(lambda a, o=ours: tg.sin(o(a)), lambda a, t=theirs: torch.sin(t(a)),
                           x)


@needs_torch
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "cross_entropy", "bce", "mse",
                                  "gelu", "gelu_tanh", "softmax_dim0"])
@pytest.mark.parametrize("scale", [1.0, 1e4], ids=["normal", "extreme"])
def test_functional_vs_torch(name, scale):
    tf = torch.nn.functional if torch else None
    logits = rand(4, 5, seed=9, low=-3, high=3) * scale
    labels = np.array([0, 4, 2, 2])
    target = rand(4, 5, seed=10, low=0, high=1)
    w = rand(4, 5, seed=11)   # weights the outputs so every element's gradient is checked
    ours, theirs = {
        "softmax": (lambda z: F.softmax(z) * w, lambda z: tf.softmax(z, -1) * torch.tensor(w)),
        "softmax_dim0": (lambda z: F.softmax(z, dim=0) * w,
                         lambda z: tf.softmax(z, 0) * torch.tensor(w)),
        "log_softmax": (lambda z: F.log_softmax(z) * w,
                        lambda z: tf.log_softmax(z, -1) * torch.tensor(w)),
        "cross_entropy": (lambda z: F.cross_entropy(z, labels),
                          lambda z: tf.cross_entropy(z, torch.tensor(labels))),
        "bce": (lambda z: F.binary_cross_entropy_with_logits(z, target),
                lambda z: tf.binary_cross_entropy_with_logits(z, torch.tensor(target))),
        "mse": (lambda z: F.mse_loss(z, target), lambda z: tf.mse_loss(z, torch.tensor(target))),
        "gelu": (lambda z: F.gelu(z) * w, lambda z: tf.gelu(z) * torch.tensor(w)),
        "gelu_tanh": (lambda z: F.gelu(z, approximate="tanh") * w,
                      lambda z: tf.gelu(z, approximate="tanh") * torch.tensor(w)),
    }[name]
    compare_with_torch(ours, theirs, logits, rtol=1e-9, atol=1e-10 * scale)


@needs_torch
def test_float32_cross_entropy_at_extreme_logits_vs_torch():
    z = np.array([[1e4, 0.0, -1e4], [-1e4, -1e4, -1e4], [3.0, 1.0, 2.0]], np.float32)
    labels = np.array([2, 1, 0])
    v, g = tg.value_and_grad(lambda z: F.cross_entropy(z, labels))(z)
    t = torch.tensor(z, requires_grad=True)
    tv = torch.nn.functional.cross_entropy(t, torch.tensor(labels))
    tv.backward()
    assert v.dtype == np.float32 and g.dtype == np.float32
    np.testing.assert_allclose(v, tv.item(), rtol=1e-6)
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-5, atol=1e-7)


@needs_torch
def test_hessian_vs_torch():
    def f_ours(x):
        return tg.sum(tg.tanh(x) * tg.exp(-x * x)) + tg.logsumexp(x)

    def f_torch(x):
        return (torch.tanh(x) * torch.exp(-x * x)).sum() + torch.logsumexp(x, 0)
    x = rand(5, seed=12)
    want = torch.autograd.functional.hessian(f_torch, torch.tensor(x)).numpy()
    np.testing.assert_allclose(tg.hessian(f_ours)(x), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tg.jacrev(tg.grad(f_ours))(x), want, rtol=1e-10, atol=1e-12)


# ---- JAX ---------------------------------------------------------------------------------------

def _mlp_ours(params, x):
    w1, b1, w2 = params
    h = tg.tanh(x @ w1 + b1)
    return tg.sum(tg.logsumexp(h @ w2, axis=1)) / 3.0


def _mlp_jax(params, x):
    w1, b1, w2 = params
    h = jnp.tanh(x @ w1 + b1)
    return jnp.sum(jax.scipy.special.logsumexp(h @ w2, axis=1)) / 3.0


PARAMS = (rand(4, 5, seed=13), rand(5, seed=14), rand(5, 2, seed=15))
XB = rand(3, 4, seed=16)


@needs_jax
def test_grad_of_pytree_vs_jax():
    ours = tg.grad(_mlp_ours)(PARAMS, XB)
    want = jax.grad(_mlp_jax)(PARAMS, XB)
    for a, b in zip(ours, want, strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-10, atol=1e-12)


@needs_jax
def test_vjp_and_jvp_vs_jax():
    f_ours = lambda x, w: tg.sin(x @ w) * tg.sum(x)
    f_jax = lambda x, w: jnp.sin(x @ w) * jnp.sum(x)
    x, w = rand(3, seed=17), rand(3, 4, seed=18)
    v = (rand(3, seed=19), rand(3, 4, seed=20))
    out, t = tg.jvp(f_ours, (x, w), v)
    jout, jt = jax.jvp(f_jax, (x, w), v)
    np.testing.assert_allclose(out, jout, rtol=1e-12)
    np.testing.assert_allclose(t, jt, rtol=1e-10, atol=1e-12)
    ct = rand(4, seed=21)
    _, fn = tg.vjp(f_ours, x, w)
    _, jfn = jax.vjp(f_jax, x, w)
    for a, b in zip(fn(ct), jfn(ct), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@needs_jax
@pytest.mark.parametrize("name", ["jacrev", "jacfwd", "hessian"])
def test_jacobians_vs_jax(name):
    if name == "hessian":
        ours, theirs = tg.hessian(lambda x: _mlp_ours(PARAMS, x)), jax.hessian(
            lambda x: _mlp_jax(PARAMS, x))
    else:
        f_ours = lambda x: tg.tanh(x @ PARAMS[0]) * x[0, 0]
        f_jax = lambda x: jnp.tanh(x @ PARAMS[0]) * x[0, 0]
        ours, theirs = getattr(tg, name)(f_ours), getattr(jax, name)(f_jax)
    np.testing.assert_allclose(ours(XB), theirs(XB), rtol=1e-10, atol=1e-12)


@needs_jax
def test_higher_order_and_nested_closures_vs_jax():
    def make(np_):
        def f(x):
            inner = lambda y: np_.sum(np_.sin(x * y) * y)
            return np_.sum(np_.cos(x) * tg_or_jax_grad(np_)(inner)(x))
        return f

    def tg_or_jax_grad(np_):
        return tg.grad if np_ is tg else jax.grad
    x = rand(4, seed=22)
    np.testing.assert_allclose(make(tg)(x), make(jnp)(x), rtol=1e-12)
    np.testing.assert_allclose(tg.grad(make(tg))(x), jax.grad(make(jnp))(x), rtol=1e-10)
    g3 = tg.grad(tg.grad(tg.grad(lambda s: tg.sin(s) * s ** 4)))(np.float64(0.7))
    j3 = jax.grad(jax.grad(jax.grad(lambda s: jnp.sin(s) * s ** 4)))(0.7)
    np.testing.assert_allclose(g3, j3, rtol=1e-12)


@needs_jax
def test_dtype_promotion_vs_jax():
    x32 = np.ones(3, np.float32)
    for y in (2, 2.5, True):
        assert tg.add(x32, y).dtype == jnp.add(x32, y).dtype
        assert tg.jit(lambda a, b: a * b)(x32, y).dtype == jax.jit(lambda a, b: a * b)(x32, y).dtype
    assert tg.add(np.ones(3, np.int32), 2).dtype == jnp.add(np.ones(3, np.int32), 2).dtype

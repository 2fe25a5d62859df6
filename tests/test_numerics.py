"""Numerical stability at extreme inputs (logits of +-1e4, +-1e30): logsumexp, softmax,
log_softmax, cross-entropy, sigmoid, BCE-with-logits, log1p/expm1 — values and gradients,
compiled and on the interpreter, float32 and float64, all finite and right."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

F = tg.nn.functional
BIG = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4 + 1.0, -1e4], [1e30, 3.0, -1e30]])


@pytest.fixture(params=["compiled", "interpreted"])
def mode(request, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")
    monkeypatch.setattr(tg.config, "tiering", False)
    monkeypatch.setattr(tg.config, "disable_jit", request.param == "interpreted")
    return request.param


def _run(f, *args):
    """f's value and gradient wrt the first argument, through jit."""
    w = _w(tg.jit(f)(*args))
    return tg.jit(tg.value_and_grad(lambda *a: tg.sum(f(*a) * w)))(*args)


def _w(out):
    return np.linspace(0.5, 1.5, np.size(out)).reshape(np.shape(out)).astype(np.asarray(out).dtype)


def _softmax_ref(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _lse_ref(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_at_extreme_logits(mode, dtype):
    x = BIG.astype(dtype)
    if dtype == np.float32:
        x = x[:2]   # 1e30 overflows float32's exp range checks only in float64
    value, g = _run(lambda a: tg.logsumexp(a, axis=-1), x)
    want = _lse_ref(x)
    assert np.isfinite(value) and np.all(np.isfinite(g))
    np.testing.assert_allclose(value, np.sum(want * _w(want)), rtol=1e-6)
    # d/dx logsumexp = softmax
    np.testing.assert_allclose(g, _softmax_ref(x) * _w(want)[:, None], atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_log_softmax_at_extreme_logits(mode, dtype):
    x = BIG[:2].astype(dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    p = tg.jit(lambda a: F.softmax(a, axis=-1))(x)
    np.testing.assert_allclose(p, _softmax_ref(x), atol=tol)
    lp = tg.jit(lambda a: F.log_softmax(a, axis=-1))(x)
    want = np.asarray(x, np.float64) - _lse_ref(x)[:, None]
    np.testing.assert_allclose(lp, want, rtol=tol, atol=tol)
    for f in (lambda a: F.softmax(a, axis=-1), lambda a: F.log_softmax(a, axis=-1)):
        value, g = _run(f, x)
        assert np.isfinite(value) and np.all(np.isfinite(g))
    # gradient of sum(w * log_softmax): w - softmax * sum(w)
    w = _w(want)
    _, g = _run(lambda a: F.log_softmax(a, axis=-1), x)
    np.testing.assert_allclose(g, w - _softmax_ref(x) * w.sum(-1, keepdims=True), atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_at_extreme_logits(mode, dtype):
    x = BIG[:2].astype(dtype)
    labels = np.array([1, 0])
    f = tg.jit(tg.value_and_grad(lambda a: F.cross_entropy(a, labels)))
    loss, g = f(x)
    logp = np.asarray(x, np.float64) - _lse_ref(x)[:, None]
    want = -np.mean(logp[np.arange(2), labels])
    np.testing.assert_allclose(loss, want, rtol=1e-6)   # 1e4 / 2 + log terms, finite
    onehot = np.eye(3)[labels]
    np.testing.assert_allclose(g, (_softmax_ref(x) - onehot) / 2, atol=1e-6)
    # a confident right answer: loss exactly 0 and zero gradient, no NaN from 0 * inf
    loss, g = f(np.array([[-1e4, 1e4, -1e4], [1e4, -1e4, 0.0]], dtype))
    assert loss == 0.0 and np.all(g == 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_and_bce_at_extreme_inputs(mode, dtype):
    x = np.array([-1e4, -100.0, -30.0, 0.0, 30.0, 100.0, 1e4], dtype)
    s, g = tg.jit(tg.value_and_grad(lambda a: tg.sum(tg.sigmoid(a))))(x)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    subnormal = 1e-40 if dtype == np.float32 else 0   # float32 keeps few bits below 1e-38
    np.testing.assert_allclose(tg.jit(tg.sigmoid)(x), ref, rtol=1e-6, atol=subnormal)
    # float32: s * (1 - s) is 0 once s rounds to 1 (x >= 17), as in PyTorch
    np.testing.assert_allclose(g, ref * (1 - ref), rtol=1e-5,
                               atol=1e-12 if dtype == np.float32 else 1e-300)
    assert np.all(np.isfinite(g))
    y = (x > 0).astype(dtype)
    loss, gz = tg.jit(tg.value_and_grad(
        lambda z: F.binary_cross_entropy_with_logits(z, y, reduction="sum")))(x)
    want = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x.astype(np.float64))))
    np.testing.assert_allclose(loss, want.sum(), rtol=1e-6)
    np.testing.assert_allclose(gz, ref - y, atol=1e-6)
    loss, _ = tg.jit(tg.value_and_grad(   # wrong and confident: loss ~ |z|, finite
        lambda z: F.binary_cross_entropy_with_logits(z, 1 - y, reduction="sum")))(x)
    assert np.isfinite(loss) and loss > 2e4


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log1p_and_expm1_at_tiny_and_huge_inputs(mode, dtype):
    tiny = np.array([1e-30, -1e-20, 1e-10, -1e-7, 3e-5], dtype)
    for name, ref, dref in (("log1p", np.log1p, lambda a: 1 / (1 + a)),
                            ("expm1", np.expm1, np.exp)):
        fn = getattr(tg, name)
        out, g = tg.jit(tg.value_and_grad(lambda a, fn=fn: tg.sum(fn(a))))(tiny)
        np.testing.assert_allclose(tg.jit(fn)(tiny), ref(tiny.astype(np.float64)), rtol=1e-6)
        np.testing.assert_allclose(g, dref(tiny.astype(np.float64)), rtol=1e-6)
    huge = np.array([1e4, 1e30, -0.999999], dtype)
    np.testing.assert_allclose(tg.jit(tg.log1p)(huge), np.log1p(huge.astype(np.float64)),
                               rtol=1e-5)
    out = tg.jit(tg.expm1)(np.array([-1e4, -50.0, 1e4], dtype))
    np.testing.assert_allclose(out[:2], -1.0)
    assert out[2] == np.inf   # as numpy: overflow is inf, not NaN


def test_int_floor_divide_by_zero_is_numpys_zero():
    """x // 0 of integers is 0, as numpy's (it gave x: a guard divided by one instead)."""
    for dt in (np.int32, np.int64):
        a = np.array([7, -7, 0, 5, np.iinfo(dt).min, 9], dt)
        b = np.array([0, 0, 0, 2, -1, -4], dt)
        with np.errstate(all="ignore"):
            want = np.floor_divide(a, b)
        for got in (tg.floor_divide(a, b), tg.jit(lambda a, b: a // b)(a, b),
                    (tg.tensor(a) // tg.tensor(b)).numpy()):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal((tg.tensor(a) // 0).numpy(), np.zeros_like(a))
        np.testing.assert_array_equal(tg.jit(lambda a: a // 0)(a), np.zeros_like(a))


def test_float_floor_divide_floors():
    """tg.floor_divide and // of floats divided without flooring (7.0 // 2.0 gave 3.5)."""
    vals = [7.0, -7.0, 5.5, -0.5, 3.0, -3.0, 1.0, 0.0, -0.0, 2.0, np.inf, -np.inf, np.nan]
    a = np.array([x for x in vals for _ in vals])
    b = np.array([y for _ in vals for y in vals])
    with np.errstate(all="ignore"):
        want = np.floor_divide(a, b)
    for got in (tg.floor_divide(a, b), tg.jit(lambda a, b: a // b)(a, b),
                (tg.tensor(a) // tg.tensor(b)).numpy(),
                tg.jit(lambda a, b: a // b)(a.astype(np.float32), b.astype(np.float32))):
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    np.testing.assert_array_equal(tg.jit(lambda x: 7 // x)(np.array([2.0, -2.0])), [3.0, -4.0])
    assert tg.grad(lambda x: tg.sum(x // 2.0 + x))(np.array([1.5, -3.0])).tolist() == [1.0, 1.0]


def test_dot_of_more_than_two_axes_is_numpys():
    """tg.dot of an operand with more than 2 axes was matmul (batched): (2,3)·(5,3,4) gave
    (5,2,4); numpy's dot pairs every row with every matrix: (2,5,4)."""
    from conftest import check_grads
    rng = np.random.default_rng(0)
    for sa, sb in [((2, 3), (5, 3, 4)), ((2, 4, 3), (3, 2)), ((2, 2, 3), (4, 3, 5)),
                   ((3,), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 4), (4, 5))]:
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        np.testing.assert_allclose(tg.dot(a, b), np.dot(a, b), rtol=1e-12)
        np.testing.assert_allclose(tg.jit(tg.dot)(a, b), np.dot(a, b), rtol=1e-12)
        check_grads(lambda a, b: tg.sin(tg.dot(a, b)), [a, b])
    with pytest.raises(ValueError, match=r"dot: shapes \(2, 3\) and \(4, 2, 5\) not aligned"):
        tg.dot(np.ones((2, 3)), np.ones((4, 2, 5)))

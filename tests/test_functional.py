"""tg.nn.functional: values against numpy, gradients against finite differences, and
stability at extreme inputs (logits of 1e4) in the forward and the backward pass."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import anchors, check_grads, rand

import tracegrad as tg

F = tg.nn.functional
torch, _ = anchors()

LOGITS = rand(4, 5, seed=1, low=-3, high=3)
LABELS = np.array([0, 4, 2, 2])
EXTREME = np.array([[1e4, 0.0, -1e4], [1.0, 2.0, 3.0], [-1e4, -1e4, -1e4]], np.float32)
EXTREME_LABELS = np.array([2, 0, 1])


def np_log_softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def np_erf(x):
    return np.vectorize(math.erf)(x)


def finite(*arrays):
    return all(np.all(np.isfinite(a)) for a in arrays)


# ---- values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax_values(axis):
    np.testing.assert_allclose(F.log_softmax(LOGITS, axis=axis), np_log_softmax(LOGITS, axis),
                               rtol=1e-12)
    np.testing.assert_allclose(F.softmax(LOGITS, axis=axis),
                               np.exp(np_log_softmax(LOGITS, axis)), rtol=1e-12)
    np.testing.assert_allclose(F.softmax(LOGITS, dim=axis), F.softmax(LOGITS, axis=axis))
    np.testing.assert_allclose(np.sum(F.softmax(LOGITS, axis=axis), axis=axis), 1.0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_values(reduction):
    per = -np_log_softmax(LOGITS)[np.arange(4), LABELS]
    want = {"mean": per.mean(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(F.cross_entropy(LOGITS, LABELS, reduction=reduction), want,
                               rtol=1e-12)


def test_cross_entropy_class_axis_and_batch_dims():
    # class axis last by default; axis= moves it
    x = rand(2, 3, 4, seed=2)
    lab = np.array([[0, 3, 1], [2, 2, 0]])
    per = -np_log_softmax(x)[np.arange(2)[:, None], np.arange(3)[None, :], lab]
    np.testing.assert_allclose(F.cross_entropy(x, lab), per.mean(), rtol=1e-12)
    np.testing.assert_allclose(F.cross_entropy(LOGITS.T, LABELS, axis=0),
                               F.cross_entropy(LOGITS, LABELS), rtol=1e-12)
    np.testing.assert_allclose(F.cross_entropy(LOGITS, LABELS.astype(np.int32)),
                               F.cross_entropy(LOGITS, LABELS))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_and_mse_values(reduction):
    z, y = rand(6, seed=3, low=-4, high=4), rand(6, seed=4, low=0, high=1)
    per = -(y * np.log(1 / (1 + np.exp(-z))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-z))))
    red = {"mean": np.mean, "sum": np.sum, "none": lambda a: a}[reduction]
    np.testing.assert_allclose(F.binary_cross_entropy_with_logits(z, y, reduction=reduction),
                               red(per), rtol=1e-10)
    np.testing.assert_allclose(F.mse_loss(z, y, reduction=reduction), red((z - y) ** 2),
                               rtol=1e-12)


def test_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(LOGITS, LOGITS, reduction="avg")


def test_gelu_values():
    x = np.linspace(-5, 5, 41)
    np.testing.assert_allclose(F.gelu(x), 0.5 * x * (1 + np_erf(x / np.sqrt(2))), rtol=1e-12,
                               atol=1e-15)
    tanh_form = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(F.gelu(x, approximate="tanh"), tanh_form, rtol=1e-12,
                               atol=1e-15)
    assert np.max(np.abs(F.gelu(x) - F.gelu(x, approximate="tanh"))) < 1e-3


def test_logsumexp_values():
    np.testing.assert_allclose(F.logsumexp(LOGITS, axis=1), np.log(np.exp(LOGITS).sum(1)),
                               rtol=1e-12)
    np.testing.assert_allclose(tg.logsumexp(LOGITS, axis=0, keepdims=True),
                               np.log(np.exp(LOGITS).sum(0, keepdims=True)), rtol=1e-12)
    np.testing.assert_allclose(tg.logsumexp(LOGITS), np.log(np.exp(LOGITS).sum()), rtol=1e-12)


def test_relu_sigmoid_tanh_reexports():
    np.testing.assert_array_equal(F.relu(LOGITS), np.maximum(LOGITS, 0))
    np.testing.assert_allclose(F.sigmoid(LOGITS), 1 / (1 + np.exp(-LOGITS)), rtol=1e-12)
    np.testing.assert_allclose(F.tanh(LOGITS), np.tanh(LOGITS), rtol=1e-12)


# ---- dropout -----------------------------------------------------------------------------------

def test_dropout():
    x = np.ones((200, 50), np.float32)
    y = F.dropout(x, 0.3, True)
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(F.dropout(x, 0.3, False), x)      # eval: identity
    np.testing.assert_array_equal(F.dropout(x, 0.0, True), x)
    np.testing.assert_array_equal(F.dropout(x, 1.0, True), 0 * x)
    assert not np.array_equal(F.dropout(x, 0.5, True), F.dropout(x, 0.5, True))
    np.testing.assert_array_equal(F.dropout(x, 0.5, True, seed=3), F.dropout(x, 0.5, True,
                                                                              seed=3))
    with pytest.raises(ValueError, match="probability"):
        F.dropout(x, 1.5, True)


def test_dropout_gradient_is_the_mask():
    x = rand(30, seed=5)
    y = F.dropout(x, 0.4, True, seed=11)
    g = tg.grad(lambda x: tg.sum(F.dropout(x, 0.4, True, seed=11)))(x)
    np.testing.assert_allclose(g, np.where(y != 0, 1 / 0.6, 0.0))
    check_grads(lambda x: F.dropout(x, 0.4, True, seed=11), [x])


def test_dropout_under_jit_needs_a_traced_seed():
    # a seed drawn at trace time would be baked into the cached graph (one mask forever)
    with pytest.raises(ValueError, match="needs seed="):
        tg.jit(lambda x: F.dropout(x, 0.5, True))(np.ones(4, np.float32))
    f = tg.jit(lambda x, s: F.dropout(x, 0.5, True, seed=s))
    x = np.ones(64, np.float32)
    assert not np.array_equal(f(x, np.int64(1)), f(x, np.int64(2)))
    np.testing.assert_array_equal(f(x, np.int64(1)), f(x, np.int64(1)))


# ---- gradients ---------------------------------------------------------------------------------

GRAD_CASES = {
    "softmax": (lambda x: F.softmax(x, axis=1), [LOGITS]),
    "softmax_axis0": (lambda x: F.softmax(x, axis=0), [LOGITS]),
    "log_softmax": (lambda x: F.log_softmax(x), [LOGITS]),
    "cross_entropy": (lambda x: F.cross_entropy(x, LABELS), [LOGITS]),
    "cross_entropy_none": (lambda x: F.cross_entropy(x, LABELS, reduction="none"), [LOGITS]),
    "bce": (lambda z, y: F.binary_cross_entropy_with_logits(z, y, reduction="none"),
            [rand(5, seed=6, low=-3, high=3), rand(5, seed=7, low=0, high=1)]),
    "mse": (lambda x, y: F.mse_loss(x, y), [rand(3, 2, seed=8), rand(3, 2, seed=9)]),
    "gelu": (lambda x: F.gelu(x), [LOGITS]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [LOGITS]),
    "logsumexp": (lambda x: F.logsumexp(x, axis=1), [LOGITS]),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradients(name):
    f, args = GRAD_CASES[name]
    check_grads(f, args)


@pytest.mark.parametrize("name", ["softmax", "cross_entropy", "gelu", "logsumexp"])
def test_second_order(name):
    f, args = GRAD_CASES[name]
    check_grads(f, args, order=2)


def _np_cross_entropy(x, labels, reduction, weight, ignore, smoothing):
    """torch's cross_entropy, written out in numpy (class axis last)."""
    logp, c = np_log_softmax(x), x.shape[-1]
    w = np.ones(c) if weight is None else weight
    kept = labels != ignore
    safe = np.where(kept, labels, 0)
    picked = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    row_w = np.where(kept, w[safe], 0.0)
    loss = (1 - smoothing) * -picked * row_w + smoothing / c * np.where(
        kept, -(logp * w).sum(-1), 0.0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / row_w.sum()}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{"ignore_index": 4}, {"weight": "w"},
                                     {"label_smoothing": 0.2}, {"ignore_index": -1,
                                     "weight": "w", "label_smoothing": 0.1}])
def test_cross_entropy_weight_ignore_index_and_label_smoothing(reduction, options):
    """torch's keywords (were a TypeError); the -100 labels are ignored by default."""
    w = rand(5, seed=3, low=0.2, high=2.0)
    kw = {k: w if v == "w" else v for k, v in options.items()}
    labels = np.array([0, 4, -100, 2]) if "ignore_index" not in kw else \
        np.array([0, kw["ignore_index"], 2, kw["ignore_index"]])
    want = _np_cross_entropy(LOGITS, labels, reduction, kw.get("weight"),
                             kw.get("ignore_index", -100), kw.get("label_smoothing", 0.0))
    np.testing.assert_allclose(F.cross_entropy(LOGITS, labels, reduction=reduction, **kw),
                               want, rtol=1e-12)
    np.testing.assert_allclose(tg.nn.CrossEntropyLoss(reduction=reduction, **kw)(
        tg.tensor(LOGITS), tg.tensor(labels)).detach().numpy(), want, rtol=1e-12)
    check_grads(lambda x: F.cross_entropy(x, labels, reduction=reduction, **kw), [LOGITS],
                order=2)
    if torch is not None:
        xt = torch.tensor(LOGITS, requires_grad=True)
        tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in kw.items()}
        torch.nn.functional.cross_entropy(xt, torch.tensor(labels), reduction=reduction,
                                          **tkw).sum().backward()
        x = tg.tensor(LOGITS, requires_grad=True)
        F.cross_entropy(x, tg.tensor(labels), reduction=reduction, **kw).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_cross_entropy_labels_out_of_range_raise_as_torch():
    """Labels in a Tensor (a recorded input) were not checked: 4 of 4 classes, or -1, gave a
    loss; a concrete array's were."""
    x = tg.tensor(LOGITS[:, :4], requires_grad=True)
    for labels in [np.array([0, 1, 4, 0]), np.array([0, 1, -1, 0])]:
        for lab in (labels, tg.tensor(labels)):
            with pytest.raises(IndexError, match="Target -?[0-9]+ is out of bounds"):
                F.cross_entropy(x, lab)
    assert F.cross_entropy(x, tg.tensor(np.array([0, 1, 4, 0])), ignore_index=4).item() > 0
    with pytest.raises(ValueError, match="label_smoothing must be between"):
        F.cross_entropy(LOGITS, LABELS, label_smoothing=1.5)


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    g = tg.grad(lambda x: F.cross_entropy(x, LABELS))(LOGITS)
    onehot = np.eye(5)[LABELS]
    np.testing.assert_allclose(g, (np.exp(np_log_softmax(LOGITS)) - onehot) / 4, rtol=1e-12)


# ---- stability at extreme inputs ---------------------------------------------------------------

def test_softmax_family_is_stable_forward():
    sm, lsm = F.softmax(EXTREME), F.log_softmax(EXTREME)
    assert finite(sm, lsm)
    np.testing.assert_allclose(sm[0], [1, 0, 0])
    np.testing.assert_allclose(sm[2], [1 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose(lsm[0], [0, -1e4, -2e4], rtol=1e-6)
    ce = F.cross_entropy(EXTREME, EXTREME_LABELS, reduction="none")
    np.testing.assert_allclose(ce, [2e4, -np_log_softmax(EXTREME[1:2].astype(np.float64))[0, 0],
                                    np.log(3)], rtol=1e-5)
    np.testing.assert_allclose(tg.logsumexp(EXTREME, axis=1),
                               [1e4, np.log(np.exp([1.0, 2.0, 3.0]).sum()), -1e4 + np.log(3)],
                               rtol=1e-6)


def test_softmax_family_is_stable_backward():
    g_ce = tg.grad(lambda x: F.cross_entropy(x, EXTREME_LABELS))(EXTREME)
    g_lsm = tg.grad(lambda x: tg.sum(F.log_softmax(x)))(EXTREME)
    g_sm = tg.grad(lambda x: tg.sum(F.softmax(x)[:, 0]))(EXTREME)
    g_lse = tg.grad(lambda x: tg.sum(tg.logsumexp(x, axis=1)))(EXTREME)
    assert finite(g_ce, g_lsm, g_sm, g_lse)
    np.testing.assert_allclose(g_ce[0], [1 / 3, 0, -1 / 3], atol=1e-7)
    np.testing.assert_allclose(g_lse[0], [1, 0, 0], atol=1e-7)
    np.testing.assert_allclose(g_lse[2], [1 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose(g_sm[0], [0, 0, 0], atol=1e-7)
    np.testing.assert_allclose(g_lsm[0], [1 - 3, 1, 1], atol=1e-6)   # 1 - n*softmax


def test_bce_with_logits_is_stable():
    z = np.array([1e4, -1e4, 1e4, -1e4, 0.0], np.float32)
    y = np.array([1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
    loss = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    np.testing.assert_allclose(loss, [0, 0, 1e4, 1e4, np.log(2)], rtol=1e-6, atol=1e-6)
    g = tg.grad(lambda z: F.binary_cross_entropy_with_logits(z, y, reduction="sum"))(z)
    np.testing.assert_allclose(g, [0, 0, 1, -1, -0.5], atol=1e-6)


def test_sigmoid_tanh_gelu_are_stable_at_extremes():
    z = np.array([-1e4, -100.0, 0.0, 100.0, 1e4], np.float32)
    for f in (tg.sigmoid, tg.tanh, F.gelu, lambda x: F.gelu(x, approximate="tanh")):
        y = f(z)
        g = tg.grad(lambda x, f=f: tg.sum(f(x)))(z)
        assert finite(y, g), (y, g)
    np.testing.assert_allclose(tg.grad(lambda x: tg.sum(tg.sigmoid(x)))(z),
                               [0, 0, 0.25, 0, 0], atol=1e-30)
    np.testing.assert_allclose(F.gelu(z), [0, 0, 0, 100, 1e4], atol=1e-6)


def test_jit_and_transforms_compose_with_functional():
    def loss(w, x, labels):
        return F.cross_entropy(F.gelu(x @ w), labels)
    w, x = rand(3, 5, seed=12), rand(4, 3, seed=13)
    g = tg.grad(loss)(w, x, LABELS)
    np.testing.assert_allclose(tg.jit(tg.grad(loss))(w, x, LABELS), g, rtol=1e-12)
    check_grads(lambda w: loss(w, x, LABELS), [w])


def test_relu_propagates_nan_and_has_zero_gradient_at_zero():
    x = np.array([np.nan, 0.0, 1.0, -1.0], np.float32)
    for fn in (tg.relu, tg.jit(tg.relu)):
        out = fn(x)
        assert np.isnan(out[0]) and list(out[1:]) == [0.0, 1.0, 0.0]
    g = tg.grad(lambda v: tg.sum(tg.relu(v)))(np.array([0.0, 2.0, -2.0], np.float32))
    assert list(g) == [0.0, 1.0, 0.0]


def test_cross_entropy_accepts_dim():
    logits = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    labels = np.array([0, 2, 1, 2], np.int64)
    want = tg.nn.functional.cross_entropy(logits.T, labels, axis=-1)
    np.testing.assert_allclose(tg.nn.functional.cross_entropy(logits, labels, dim=0), want,
                               rtol=1e-6)


def test_a_jit_compile_pauses_the_collector_and_restores_it():
    import gc
    seen = []

    @tg.jit
    def f(x):
        seen.append(gc.isenabled())     # (during the trace)
        return x * 2.0

    f(np.ones(3, np.float32))
    assert seen == [False] and gc.isenabled()
    f(np.ones(3, np.float32))           # cached: no trace
    assert seen == [False]
    gc.disable()
    try:
        f(np.ones(4, np.float32))       # a user's collector already off stays off
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()

    @tg.jit
    def bad(x):
        raise ValueError("while tracing")
    with pytest.raises(ValueError, match="while tracing"):
        bad(np.ones(3, np.float32))
    assert gc.isenabled()

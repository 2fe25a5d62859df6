"""Differential tests: the same Tensor programs in tracegrad and PyTorch give the same values,
gradients, requires_grad, is_leaf and grad_fn names. Skipped when torch is not installed."""
import numpy as np
import pytest

import tracegrad as tg

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(7)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((4, 2)).astype(np.float32)
V = (RNG.random(4) + 0.5).astype(np.float32)


def programs(lib, F):
    """name -> fn(a, b, v) written once for both libraries."""
    return {
        "add_mul": lambda a, b, v: (a * 2 + 1) * a,
        "matmul_tanh": lambda a, b, v: lib.tanh(a @ b),
        "sum_dim": lambda a, b, v: a.sum(dim=1),
        "mean_keepdim": lambda a, b, v: a.mean(dim=0, keepdim=True) * a,
        "max_all": lambda a, b, v: a.max() * a,
        "pow_sqrt": lambda a, b, v: v.pow(3).sqrt() + v ** 0.5,
        "exp_log": lambda a, b, v: v.exp().log() * v.log(),
        "div_rsub": lambda a, b, v: (1 - v) / v,
        "sigmoid_relu": lambda a, b, v: a.sigmoid() + a.relu(),
        "transpose_view": lambda a, b, v: a.t().reshape(2, 6).transpose(0, 1),
        "unsqueeze_squeeze": lambda a, b, v: (v.unsqueeze(0) * a).squeeze(),
        "index_slice": lambda a, b, v: a[1:, ::2] * a[0, 1],
        "where": lambda a, b, v: lib.where(a > 0, a, a * 0.1),
        "abs_clone": lambda a, b, v: a.abs().clone() * 3,
        "softmax": lambda a, b, v: F.softmax(a, dim=1),
        "log_softmax": lambda a, b, v: F.log_softmax(a, dim=-1),
        "mse": lambda a, b, v: F.mse_loss(a, a * 0.5),
        "matvec": lambda a, b, v: a @ v,
        "vecvec": lambda a, b, v: v @ v,
        "cat_stack": lambda a, b, v: lib.cat([a, a * 2]) * 1.5,
        "sin_cos": lambda a, b, v: a.sin() * a.cos(),
        "inplace_chain": lambda a, b, v: _inplace(a),
    }


def _inplace(a):
    y = a * 1.0
    y += a
    y *= 2.0
    return y


def run(lib, F, name):
    a = lib.tensor(A, requires_grad=True)
    b = lib.tensor(B, requires_grad=True)
    v = lib.tensor(V, requires_grad=True)
    out = programs(lib, F)[name](a, b, v)
    loss = (out * out).sum()
    loss.backward()
    grads = [None if t.grad is None else t.grad.numpy() for t in (a, b, v)]
    return out, loss, grads


@pytest.mark.parametrize("name", sorted(programs(np, None)))
def test_values_grads_and_graph_match_torch(name):
    out, loss, grads = run(tg, tg.nn.functional, name)
    tout, tloss, tgrads = run(torch, torch.nn.functional, name)
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4)
    for g, tgr in zip(grads, tgrads, strict=True):
        assert (g is None) == (tgr is None)
        if g is not None:
            np.testing.assert_allclose(g, tgr, rtol=1e-4, atol=1e-5)
    assert out.requires_grad == tout.requires_grad
    assert out.is_leaf == tout.is_leaf
    assert out.grad_fn.name() == tout.grad_fn.name()
    assert loss.grad_fn.name() == tloss.grad_fn.name()


def test_no_grad_detach_and_leaves_match_torch():
    for lib in (tg, torch):
        x = lib.ones(2, requires_grad=True)
        with lib.no_grad():
            y = x * 2
        d = (x * 3).detach()
        assert (y.requires_grad, y.is_leaf, y.grad_fn) == (False, True, None)
        assert (d.requires_grad, d.is_leaf) == (False, True)


def test_hooks_and_retain_grad_match_torch():
    results = []
    for lib in (tg, torch):
        x = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
        y = x.tanh()
        y.register_hook(lambda g: g * 3)
        y.retain_grad()
        z = (y * x).sum()
        z.backward()
        results.append((x.grad.numpy(), y.grad.numpy()))
    for a, b in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_double_backward_matches_torch():
    results = []
    for lib in (tg, torch):
        x = lib.tensor([0.5, 1.5], requires_grad=True)
        (g,) = lib.autograd.grad((x.sin() * x ** 2).sum(), x, create_graph=True)
        (h,) = lib.autograd.grad(g.sum(), x)
        results.append((g.detach().numpy(), h.numpy()))
    for a, b in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_rnn_step_loop_matches_torch():
    results = []
    for lib in (tg, torch):
        w = lib.tensor(A[:, :3].T @ A[:, :3] / 4, requires_grad=True)
        xs = [lib.tensor(A[i:i + 1, :3]) for i in range(3)]
        h = lib.zeros(1, 3)
        for x in xs:
            h = lib.tanh(h @ w + x)
        (h * h).sum().backward()
        results.append(w.grad.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)

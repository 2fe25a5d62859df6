"""tg.nn: module bookkeeping, the pure `apply` form, layers against PyTorch where installed."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Sequential:
    tg.manual_seed(seed)
    layers = [nn.Linear(4, 8), nn.Tanh()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(8, 3))


def data(n: int = 6, seed: int = 1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4)).astype(dtype), rng.integers(0, 3, n)


def as_numpy(x):
    return nn.parameter.to_numpy(x)


# ---- bookkeeping ---------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.norm = nn.BatchNorm1d(2)
        self.register_parameter("scale", np.ones(2, np.float32))

    def forward(self, x):
        return self.norm(self.fc(x)) * self.scale


def test_names_order_and_state_dict():
    m = nn.Sequential(Block(), nn.ReLU(), nn.Linear(2, 1))
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.scale", "0.fc.weight", "0.fc.bias", "0.norm.weight", "0.norm.bias",
                     "2.weight", "2.bias"]
    assert [n for n, _ in m.named_buffers()] == [
        "0.norm.running_mean", "0.norm.running_var", "0.norm.num_batches_tracked"]
    sd = m.state_dict()
    assert set(sd) == set(names) | {n for n, _ in m.named_buffers()}
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    assert set(m.param_dict()) == set(names)
    assert len(list(m.modules())) == 6 and len(list(m.children())) == 3
    assert isinstance(m[0].fc, nn.Linear) and len(m) == 3


def test_repr_like_pytorch():
    text = repr(nn.Sequential(nn.Linear(4, 2), nn.ReLU()))
    assert text == ("Sequential(\n  (0): Linear(in_features=4, out_features=2, bias=True)\n"
                    "  (1): ReLU()\n)")


def test_train_eval_propagate():
    m = nn.Sequential(Block(), nn.Dropout(0.5))
    assert all(x.training for x in m.modules())
    assert m.eval() is m and not any(x.training for x in m.modules())
    m.train()
    assert m[0].norm.training


def test_load_state_dict_round_trip_and_errors():
    a, b = mlp(0), mlp(1)
    b.load_state_dict(a.state_dict())
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=n)
    sd = a.state_dict()
    sd.pop("0.bias")
    sd["extra"] = np.zeros(1)
    with pytest.raises(RuntimeError, match='Missing key.*"0.bias".*\n.*Unexpected key.*"extra"'):
        b.load_state_dict(sd)
    keys = b.load_state_dict(sd, strict=False)
    assert keys.missing_keys == ["0.bias"] and keys.unexpected_keys == ["extra"]
    bad = a.state_dict()
    bad["0.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(RuntimeError, match=r"size mismatch for 0.weight.*\(2, 2\).*\(8, 4\)"):
        b.load_state_dict(bad)


def test_load_state_dict_copies_and_skips_absent_parameters():
    """Loading kept the caller's arrays (changing one later changed the model), and a
    Linear(bias=False) could not load its own state_dict (its None bias counted as
    missing)."""
    lin = tg.nn.Linear(3, 2, bias=False)
    assert list(lin.state_dict()) == ["weight"]
    w = np.ones((2, 3), np.float32)
    assert lin.load_state_dict({"weight": w}).missing_keys == []
    w[:] = 7.0
    assert as_numpy(lin.weight).tolist() == [[1.0] * 3] * 2
    with pytest.raises(RuntimeError, match='Unexpected key.*"bias"'):
        lin.load_state_dict({"weight": w, "bias": np.zeros(2, np.float32)})


def test_astype_double():
    m = mlp().double()
    assert all(p.dtype == np.float64 for p in m.parameters())
    x, _ = data(dtype=np.float64)
    assert as_numpy(m(x)).dtype == np.float64


def test_torch_style_apply_with_a_function():
    m = mlp()
    seen = []
    assert m.apply(lambda mod: seen.append(type(mod).__name__)) is m
    assert sorted(seen) == ["Linear", "Linear", "Sequential", "Tanh"]


# ---- the pure form -------------------------------------------------------------------------

def test_apply_is_pure_and_matches_the_eager_call():
    m = mlp()
    x, _ = data()
    before = m.state_dict()
    params = {k: v * 2 for k, v in m.param_dict().items()}
    out = m.apply(params, x)
    w1, b1, w2, b2 = (params[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
    want = np.tanh(x @ w1.T + b1) @ w2.T + b2
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])   # nothing mutated
    np.testing.assert_allclose(as_numpy(m(x)), m.apply(m.param_dict(), x), rtol=1e-6)
    with pytest.raises(KeyError, match="unknown variable"):
        m.apply({"nope": np.zeros(1)}, x)


def test_grad_of_apply_matches_finite_differences():
    m = mlp().double()
    x, y = data(dtype=np.float64)
    params = m.param_dict()

    def loss(p):
        return F.cross_entropy(m.apply(p, x), y)

    g = tg.grad(loss)(params)
    assert set(g) == set(params)
    rng = np.random.default_rng(0)
    d = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    eps = 1e-6
    plus = loss({k: v + eps * d[k] for k, v in params.items()})
    minus = loss({k: v - eps * d[k] for k, v in params.items()})
    fd = (plus - minus) / (2 * eps)
    assert abs(sum(np.sum(g[k] * d[k]) for k in g) - fd) < 1e-6


def test_jitted_training_step_reduces_the_loss():
    m = mlp()
    x, y = data(32)
    params, state = m.param_dict(), tg.optim.sgd_init(m.param_dict())

    @tg.jit
    def step(params, state, x, y):
        loss, g = tg.value_and_grad(lambda p: F.cross_entropy(m.apply(p, x), y))(params)
        params, state = tg.optim.sgd_update(params, g, state, lr=0.5, momentum=0.9)
        return params, state, loss

    losses = []
    for _ in range(30):
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]
    assert len(step.cache) == 1


# ---- dropout -------------------------------------------------------------------------------

def test_dropout_modes_and_seeds():
    m = nn.Dropout(0.5)
    x = np.ones((64, 64), np.float32)
    m.eval()
    assert m(x) is x
    m.train()
    y = as_numpy(m(x))
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.4 < np.mean(y == 0) < 0.6
    f = tg.jit(lambda x, s: m.apply({}, x, seed=s))
    a, b, c = f(x, np.int64(1)), f(x, np.int64(1)), f(x, np.int64(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    with pytest.raises(ValueError, match="needs a seed"):
        tg.jit(lambda x: m(x))(x)
    assert tg.jit(lambda x: m.apply({}, x, training=False))(x).sum() == x.size


def test_two_dropout_layers_draw_different_masks():
    m = nn.Sequential(nn.Dropout(0.5), nn.Identity(), nn.Dropout(0.5))
    x = np.ones((1, 256), np.float32)
    seq = nn.Sequential(nn.Dropout(0.5))
    first = seq.apply({}, x, seed=np.int64(3))
    both = m.apply({}, x, seed=np.int64(3))
    # the second layer's mask is not the first's (or the result would just be first * 2)
    assert not np.array_equal(both, first * 2 * (first > 0))


# ---- normalisation, embedding --------------------------------------------------------------

def test_batchnorm_train_updates_running_stats_and_eval_uses_them():
    bn = nn.BatchNorm1d(3)
    x = np.random.default_rng(0).normal(2.0, 3.0, (16, 3)).astype(np.float32)
    y = as_numpy(bn(x))
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(0), 1, atol=1e-3)
    np.testing.assert_allclose(as_numpy(bn.running_mean), 0.1 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(as_numpy(bn.running_var), 0.9 + 0.1 * x.var(0, ddof=1),
                               rtol=1e-5)
    assert int(as_numpy(bn.num_batches_tracked)) == 1
    bn.eval()
    rm, rv = as_numpy(bn.running_mean), as_numpy(bn.running_var)
    np.testing.assert_allclose(as_numpy(bn(x)), (x - rm) / np.sqrt(rv + 1e-5), rtol=1e-5)
    assert int(as_numpy(bn.num_batches_tracked)) == 1   # eval does not track


def test_batchnorm_pure_form_returns_buffer_updates():
    bn = nn.BatchNorm1d(3)
    x = np.random.default_rng(0).standard_normal((8, 3, 5)).astype(np.float32)
    before = bn.buffer_dict()

    @tg.jit
    def f(variables, x):
        return bn.apply(variables, x, training=True, mutable=True)

    out, updates = f(bn.state_dict(), x)
    assert set(updates) == {"running_mean", "running_var", "num_batches_tracked"}
    np.testing.assert_allclose(updates["running_mean"], 0.1 * x.mean((0, 2)), rtol=1e-5)
    for k, v in bn.buffer_dict().items():
        np.testing.assert_array_equal(v, before[k])   # the module itself is untouched
    with pytest.raises(RuntimeError, match="mutable=True"):
        tg.jit(lambda x: bn(x))(x)


def test_embedding_lookup_and_padding_row_gets_no_gradient():
    emb = nn.Embedding(5, 3, padding_idx=0)
    idx = np.array([[0, 2], [4, 0]])
    w = as_numpy(emb.weight)
    assert not w[0].any()
    np.testing.assert_array_equal(as_numpy(emb(idx)), w[idx])
    g = tg.grad(lambda p: tg.sum(emb.apply(p, idx) * 3.0))(emb.param_dict())["weight"]
    np.testing.assert_array_equal(g[0], 0)
    np.testing.assert_array_equal(g[2], 3)


def test_initialisers_have_the_right_scale():
    tg.manual_seed(0)
    w = nn.init.kaiming_normal((256, 512), nonlinearity="relu")
    assert abs(w.std() / math.sqrt(2 / 512) - 1) < 0.02
    u = nn.init.xavier_uniform((300, 200))
    bound = math.sqrt(6 / 500)
    assert u.min() >= -bound and u.max() <= bound and u.max() > 0.95 * bound
    lin = nn.Linear(100, 10)
    assert np.abs(as_numpy(lin.weight)).max() <= 0.1 and np.abs(as_numpy(lin.bias)).max() <= 0.1
    tg.manual_seed(7)
    a = nn.Linear(3, 3).state_dict()
    tg.manual_seed(7)
    b = nn.Linear(3, 3).state_dict()
    np.testing.assert_array_equal(a["weight"], b["weight"])


# ---- against PyTorch -----------------------------------------------------------------------

def _torch_linear(torch, lin: nn.Linear):
    t = torch.nn.Linear(lin.in_features, lin.out_features, dtype=torch.float64)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(as_numpy(lin.weight).astype(np.float64)))
        t.bias.copy_(torch.from_numpy(as_numpy(lin.bias).astype(np.float64)))
    return t


def test_layers_match_torch_values_and_gradients():
    torch = pytest.importorskip("torch")
    tg.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GELU(), nn.Linear(6, 5),
                          nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).double()
    ref = torch.nn.Sequential(_torch_linear(torch, model[0]), torch.nn.LayerNorm(6).double(),
                              torch.nn.GELU(), _torch_linear(torch, model[3]),
                              torch.nn.BatchNorm1d(5).double(), torch.nn.Tanh(),
                              _torch_linear(torch, model[6]))
    x, y = data(8, dtype=np.float64)
    params = model.param_dict()

    def loss(p):
        out, updates = model.apply(p, x, mutable=True)
        return F.cross_entropy(out, y), updates

    (value, updates), grads = tg.value_and_grad(loss, has_aux=True)(params)
    tl = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
    tl.backward()
    np.testing.assert_allclose(value, tl.item(), rtol=1e-10)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-8, atol=1e-10,
                                   err_msg=name)
    np.testing.assert_allclose(updates["4.running_mean"], ref[4].running_mean.numpy(),
                               rtol=1e-10)
    np.testing.assert_allclose(updates["4.running_var"], ref[4].running_var.numpy(),
                               rtol=1e-10)
    model.load_state_dict({**params, **updates}, strict=False)
    model.eval()
    ref.eval()
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(as_numpy(model(x)), want, rtol=1e-8, atol=1e-10)


def test_embedding_matches_torch():
    torch = pytest.importorskip("torch")
    emb = nn.Embedding(6, 2, padding_idx=1).double()
    ref = torch.nn.Embedding(6, 2, padding_idx=1).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(as_numpy(emb.weight)))
    idx = np.array([1, 3, 3, 5])
    (ref(torch.from_numpy(idx)) ** 2).sum().backward()
    g = tg.grad(lambda p: tg.sum(emb.apply(p, idx) ** 2))(emb.param_dict())["weight"]
    np.testing.assert_allclose(g, ref.weight.grad.numpy(), rtol=1e-12)


# ---- eager use with Tensors ----------------------------------------------------------------

def test_parameters_are_leaf_tensors_and_register_on_assignment():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(np.full(3, 2.0, np.float32))
            self.note = np.zeros(3)       # a plain attribute, not a parameter

        def forward(self, x):
            return x * self.s

    m = Scale()
    assert [n for n, _ in m.named_parameters()] == ["s"]
    assert isinstance(m.s, tg.Tensor) and m.s.is_leaf and m.s.requires_grad
    assert repr(m.s).startswith("Parameter containing:\ntensor(")
    x = tg.tensor(np.ones(3, np.float32))
    tg.sum(m(x)).backward()
    np.testing.assert_array_equal(m.s.grad.numpy(), 1.0)
    m.zero_grad()
    assert m.s.grad is None


def test_batchnorm_mode_is_orthogonal_to_no_grad():
    bn = nn.BatchNorm1d(2)
    x = tg.tensor(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))
    with tg.no_grad():                      # training mode: batch statistics, stats updated
        y = bn(x)
    np.testing.assert_allclose(y.numpy(), [[-1, -1], [1, 1]], atol=1e-4)
    assert y.grad_fn is None and int(bn.num_batches_tracked.numpy()) == 1
    bn.eval()                               # eval mode with grad: running statistics
    out = bn(x)
    tg.sum(out).backward()
    rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
    np.testing.assert_allclose(out.detach().numpy(), (x.numpy() - rm) / np.sqrt(rv + 1e-5),
                               rtol=1e-5)
    assert bn.weight.grad is not None and int(bn.num_batches_tracked.numpy()) == 1


def test_eager_training_matches_torch():
    torch = pytest.importorskip("torch")
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model.double()
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                              torch.nn.ReLU(), torch.nn.Linear(8, 3)).double()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    opt = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    x, y = data(16, dtype=np.float64)
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(model(tg.tensor(x)), tg.tensor(y)).backward()
        opt.step()
        topt.zero_grad()
        torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)),
                                          torch.from_numpy(y)).backward()
        topt.step()
    want = ref.state_dict()
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(v, want[k].numpy(), rtol=1e-7, atol=1e-10, err_msg=k)


def test_eager_dropout_masks_values_and_gradients():
    tg.manual_seed(0)
    drop = nn.Dropout(0.5)
    x = tg.tensor(np.ones((8, 32), np.float32), requires_grad=True)
    y = drop(x)
    tg.sum(y).backward()
    np.testing.assert_array_equal(x.grad.numpy(), y.detach().numpy())   # d(mask*x/0.5)/dx
    assert set(np.unique(y.detach().numpy())) == {0.0, 2.0}
    drop.eval()
    assert drop(x) is x

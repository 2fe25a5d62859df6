"""tg.optim: pure updates (eager and jitted) against PyTorch's optimizers, same init and
gradients -> same parameters; hyperparameter checks; state round trips."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import optim

CASES = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("sgd", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    ("sgd", dict(lr=0.05, momentum=0.5, maximize=True)),
    ("adam", dict(lr=0.01)),
    ("adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", dict(lr=0.01)),
    ("adamw", dict(lr=0.02, betas=(0.5, 0.9), weight_decay=0.3, maximize=True)),
]
PURE = {"sgd": (optim.sgd_init, optim.sgd_update), "adam": (optim.adam_init, optim.adam_update),
        "adamw": (optim.adam_init, optim.adamw_update)}


def problem(seed: int = 0):
    """A small least-squares problem with a pytree of parameters."""
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x, y = rng.standard_normal((10, 3)), rng.standard_normal((10, 2))

    def loss(p):
        return tg.mean((x @ p["w"] + p["b"] - y) ** 2)
    return params, loss, x, y


def run_pure(kind: str, hyper: dict, steps: int, jit: bool):
    init, update = PURE[kind]
    params, loss, _, _ = problem()
    state = init(params)

    def step(params, state):
        return update(params, tg.grad(loss)(params), state, **hyper)
    step = tg.jit(step) if jit else step
    for _ in range(steps):
        params, state = step(params, state)
    return params, state


def run_torch(torch, kind: str, hyper: dict, steps: int):
    params, _, x, y = problem()
    w = torch.tensor(params["w"], requires_grad=True)
    b = torch.tensor(params["b"], requires_grad=True)
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    opt = cls([w, b], **hyper)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        ((tx @ w + b - ty) ** 2).mean().backward()
        opt.step()
    return {"w": w.detach().numpy(), "b": b.detach().numpy()}


@pytest.mark.parametrize("kind,hyper", CASES)
def test_pure_updates_match_torch(kind, hyper):
    torch = pytest.importorskip("torch")
    want = run_torch(torch, kind, hyper, 6)
    got, state = run_pure(kind, hyper, 6, jit=True)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-9, err_msg=k)
    assert int(state["step"]) == 6


@pytest.mark.parametrize("kind,hyper", CASES[:2] + CASES[5:7])
def test_eager_and_jitted_updates_agree(kind, hyper):
    a, sa = run_pure(kind, hyper, 3, jit=False)
    b, sb = run_pure(kind, hyper, 3, jit=True)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, err_msg=k)
    assert tg.tree_flatten(sa)[1] == tg.tree_flatten(sb)[1]


def test_updates_mutate_nothing_and_keep_structure():
    params, loss, _, _ = problem()
    copy = {k: v.copy() for k, v in params.items()}
    state = optim.adam_init(params)
    new, new_state = optim.adam_update(params, tg.grad(loss)(params), state, lr=0.1)
    for k in params:
        np.testing.assert_array_equal(params[k], copy[k])
        assert new[k].shape == params[k].shape and new[k].dtype == params[k].dtype
    assert int(state["step"]) == 0 and int(new_state["step"]) == 1
    assert set(new_state) == {"step", "exp_avg", "exp_avg_sq"}


def test_a_traced_learning_rate_does_not_retrace():
    params, loss, _, _ = problem()
    params = {k: v.astype(np.float32) for k, v in params.items()}

    @tg.jit
    def step(params, state, lr):
        return optim.sgd_update(params, tg.grad(loss)(params), state, lr=lr, momentum=0.9)

    state = optim.sgd_init(params)
    for lr in (0.1, 0.05, 0.01):
        params, state = step(params, state, np.float32(lr))
    assert len(step.cache) == 1
    assert params["w"].dtype == np.float32


def test_float32_parameters_stay_float32():
    p = {"w": np.ones(3, np.float32)}
    g = {"w": np.full(3, 0.5, np.float32)}
    for init, update in PURE.values():
        new, state = update(p, g, init(p), lr=0.1)
        assert new["w"].dtype == np.float32
        assert all(leaf.dtype in (np.float32, np.int64) for leaf in tg.tree_flatten(state)[0])


def test_nesterov_needs_momentum():
    p = {"w": np.ones(2)}
    with pytest.raises(ValueError, match="Nesterov"):
        optim.sgd_update(p, p, optim.sgd_init(p), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([np.ones(2)], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid"):
        optim.Adam([np.ones(2)], lr=-1.0)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)


def test_optimizer_param_groups_and_state_dict_layout():
    a, b = np.ones(2, np.float32), np.ones(3, np.float32)
    opt = optim.Adam([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["betas"] == (0.9, 0.999)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == [0] and sd["param_groups"][1]["params"] == [1]
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})


# ---- the eager optimizers on Tensors -------------------------------------------------------

TORCH_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


@pytest.mark.parametrize("kind,hyper", CASES)
def test_eager_optimizers_match_torch(kind, hyper):
    torch = pytest.importorskip("torch")
    params, _, x, y = problem()
    w = tg.tensor(params["w"], requires_grad=True)
    b = tg.tensor(params["b"], requires_grad=True)
    opt = getattr(optim, TORCH_CLASSES[kind])([w, b], **hyper)
    for _ in range(6):
        opt.zero_grad()
        tg.mean((tg.tensor(x) @ w + b - tg.tensor(y)) ** 2).backward()
        opt.step()
    want = run_torch(torch, kind, hyper, 6)
    np.testing.assert_allclose(w.detach().numpy(), want["w"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.detach().numpy(), want["b"], rtol=1e-6, atol=1e-9)
    assert w.is_leaf and w.requires_grad and w.grad is not None


def test_zero_grad_step_skips_params_without_grad_and_closure():
    a = tg.tensor(np.ones(2, np.float32), requires_grad=True)
    b = tg.tensor(np.ones(2, np.float32), requires_grad=True)
    opt = optim.SGD([a, b], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = tg.sum(a * a)
        loss.backward()
        return loss
    loss = opt.step(closure)
    assert float(loss.item()) == 2.0
    np.testing.assert_allclose(a.detach().numpy(), [0.0, 0.0])       # 1 - 0.5 * 2
    np.testing.assert_allclose(b.detach().numpy(), [1.0, 1.0])       # no grad: untouched
    opt.zero_grad()
    assert a.grad is None


def test_changing_lr_does_not_recompile_the_step():
    a = tg.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.Adam([a], lr=0.1)
    for lr in (0.1, 0.01, 0.001):
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        tg.sum(a * a).backward()
        opt.step()
    assert len(opt._step_fn.cache) == 1


def test_optimizer_state_dict_round_trip_through_save(tmp_path):
    from tracegrad import nn
    tg.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=0.1)
    x = tg.tensor(np.ones((4, 3), np.float32))

    def train(opt, n):
        for _ in range(n):
            opt.zero_grad()
            tg.sum(model(x) ** 2).backward()
            opt.step()

    train(opt, 2)
    tg.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "c.npz")
    train(opt, 2)
    after_four = model.state_dict()

    ckpt = tg.load(tmp_path / "c.npz")
    model.load_state_dict(ckpt["model"])
    opt2 = optim.Adam(model.parameters(), lr=0.5)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 0.1 and opt2.param_groups[0]["betas"] == (0.9, 0.999)
    train(opt2, 2)
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(v, after_four[k], rtol=1e-6, err_msg=k)

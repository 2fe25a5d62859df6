"""tg.save / tg.load: round trips of state dicts, optimizer state and nested pytrees."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def test_state_dict_round_trip_into_a_fresh_model(tmp_path):
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
    model(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))  # stats move
    path = tmp_path / "model.npz"
    tg.save(model.state_dict(), path)
    assert path.exists()                                   # the path as given
    tg.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
    fresh.load_state_dict(tg.load(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(),
                              strict=True):
        np.testing.assert_array_equal(a, b, err_msg=k)
        assert a.dtype == b.dtype


def test_nested_structures_and_scalars_round_trip():
    obj = {
        "params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3)},
        "opt": {"state": {0: {"step": np.int64(4), "m": np.ones(2)}}, "groups": [
            {"lr": 0.1, "betas": (0.9, 0.999), "nesterov": False, "params": [0, 1]}]},
        "epoch": 7, "name": "mlp", "nothing": None, "flags": [True, 1.5, "x"],
        "empty": {}, "tuple": (np.array(3, np.int32),),
    }
    buf = io.BytesIO()
    tg.save(obj, buf)
    buf.seek(0)
    back = tg.load(buf)
    assert back.keys() == obj.keys()
    np.testing.assert_array_equal(back["params"]["w"], obj["params"]["w"])
    assert back["params"]["w"].dtype == np.float32 and back["params"]["b"].dtype == np.float64
    step = back["opt"]["state"][0]["step"]
    assert isinstance(step, np.int64) and step == 4          # int keys and numpy scalars
    assert back["opt"]["groups"][0]["betas"] == (0.9, 0.999)
    assert back["epoch"] == 7 and back["name"] == "mlp" and back["nothing"] is None
    assert back["flags"] == [True, 1.5, "x"] and back["empty"] == {}
    assert isinstance(back["tuple"], tuple) and back["tuple"][0].dtype == np.int32


def test_pure_optimizer_state_round_trip(tmp_path):
    params = {"w": np.ones((2, 2), np.float32)}
    state = tg.optim.adam_init(params)
    params, state = tg.optim.adam_update(params, {"w": params["w"]}, state, lr=0.1)
    tg.save({"params": params, "state": state}, tmp_path / "ckpt.npz")
    back = tg.load(tmp_path / "ckpt.npz")
    assert tg.tree_flatten(back)[1] == tg.tree_flatten({"params": params, "state": state})[1]
    np.testing.assert_array_equal(back["state"]["exp_avg_sq"]["w"], state["exp_avg_sq"]["w"])


def test_files_are_plain_npz_without_pickles(tmp_path):
    path = tmp_path / "x.npz"
    tg.save({"a": np.ones(2)}, path)
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["__tracegrad__.npy", "a0.npy"]
    np.load(path, allow_pickle=False)["a0"]                  # readable by numpy alone
    np.savez(tmp_path / "plain.npz", w=np.ones(3))
    assert list(tg.load(tmp_path / "plain.npz")) == ["w"]   # foreign .npz: a dict of arrays


def test_unsupported_values_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="cannot save a object"):
        tg.save({"f": object()}, tmp_path / "a.npz")
    with pytest.raises(TypeError, match="dict keys"):
        tg.save({(1, 2): np.ones(1)}, tmp_path / "b.npz")
    with pytest.raises(TypeError, match="object arrays"):
        tg.save(np.array([None]), tmp_path / "c.npz")


def test_tensors_come_back_as_tensors(tmp_path):
    w = tg.tensor(np.arange(3, dtype=np.float32), requires_grad=True)
    b = tg.tensor(np.ones(2, np.int64))
    tg.save({"w": w, "b": b}, tmp_path / "t.npz")
    back = tg.load(tmp_path / "t.npz")
    assert isinstance(back["w"], tg.Tensor) and back["w"].requires_grad and back["w"].is_leaf
    assert isinstance(back["b"], tg.Tensor) and not back["b"].requires_grad
    np.testing.assert_array_equal(back["w"].detach().numpy(), [0, 1, 2])
    assert back["b"].dtype == np.int64

"""The examples run (on a reduced number of steps) and learn."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_runs():
    res = subprocess.run([sys.executable, os.path.join(EXAMPLES, "quickstart.py")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def test_train_digits_mlp_learns(tmp_path):
    pytest.importorskip("sklearn")
    example = load_example("train_digits_mlp")
    plot, ckpt = tmp_path / "loss.png", tmp_path / "model.npz"
    result = example.main(["--steps", "60", "--plot", str(plot), "--save", str(ckpt),
                           "--quiet"])
    losses = result["losses"]
    assert result["steps"] == 60 and len(losses) == 60
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])
    assert result["accuracy"] > 0.75            # ~0.9 after 60 steps; >= 0.95 after a full run
    if importlib.util.find_spec("matplotlib"):
        assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = tg.load(ckpt)
    assert state["0.weight"].shape == (128, 64) and state["5.bias"].shape == (10,)


def test_train_digits_mlp_steps_from_the_environment(monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.setenv("TRACEGRAD_EXAMPLE_STEPS", "3")
    result = load_example("train_digits_mlp").main(["--plot", "", "--quiet"])
    assert result["steps"] == 3 and result["plot"] is None


def test_train_digits_eager_learns(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.syspath_prepend(EXAMPLES)       # it reuses train_digits_mlp's data and model
    result = load_example("train_digits_eager").main(
        ["--steps", "40", "--plot", "", "--save", str(tmp_path / "c.npz"), "--quiet"])
    losses = result["losses"]
    assert result["steps"] == 40
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:5])
    assert result["accuracy"] > 0.6
    state = tg.load(tmp_path / "c.npz")
    assert set(state) == {"model", "optimizer"}
    assert int(state["optimizer"]["state"][0]["step"]) == 40

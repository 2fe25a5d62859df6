"""Debugging tools: `tg.config.debug_nans` (op, phase and source line of the first NaN),
`tg.config.disable_jit`, and `tg.checkpoint` (same gradients, fewer stored activations)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import Graph, Var

HERE = os.path.basename(__file__)


def line_of(fn, text: str) -> int:
    """The line number of the line containing `text` in `fn`'s source."""
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if text in s)


@pytest.fixture
def debug_nans(monkeypatch):
    monkeypatch.setattr(tg.config, "debug_nans", True)


def log_of(x):
    y = tg.exp(x) - 1.0
    z = tg.log(y)             # NaN for x < 0
    return tg.sum(z * 2.0)


def sqrt_then_zero(x):
    y = tg.sqrt(x)            # fine forward at 0; backward divides 0 by 0
    return tg.sum(y * 0.0)


def test_forward_nan_names_op_phase_and_line(debug_nans):
    x = np.array([1.0, -1.0], np.float32)
    with pytest.raises(FloatingPointError) as err:
        tg.jit(log_of)(x)
    msg = str(err.value)
    assert "NaN produced by log in the forward pass" in msg
    assert f"{HERE}:{line_of(log_of, 'tg.log(y)')}" in msg


def test_backward_nan_names_the_rule_and_line(debug_nans):
    x = np.array([0.0, 1.0], np.float32)
    with pytest.raises(FloatingPointError) as err:
        tg.grad(sqrt_then_zero)(x)
    msg = str(err.value)
    assert "in the backward pass" in msg
    assert f"{HERE}:{line_of(sqrt_then_zero, 'tg.sqrt(x)')} (backward of sqrt)" in msg


def test_debug_nans_off_lets_nans_through():
    assert not tg.config.debug_nans
    out = tg.jit(log_of)(np.array([-1.0], np.float32))
    assert np.isnan(out)


def test_debug_nans_from_the_environment(tmp_path):
    script = tmp_path / "nan_script.py"
    script.write_text("import numpy as np, tracegrad as tg\n"
                      "f = tg.jit(lambda x: tg.log(x))\n"
                      "f(np.array([-1.0], np.float32))\n")
    env = dict(os.environ, TRACEGRAD_DEBUG_NANS="1")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0
    assert "FloatingPointError: NaN produced by log in the forward pass, from nan_script.py:2" \
        in res.stderr


def test_disable_jit_runs_on_the_interpreter(monkeypatch):
    mod = importlib.import_module("tracegrad.ir.interpret")   # tg.ir.interpret is the function
    seen = []
    monkeypatch.setattr(mod, "eqn_hook", lambda e, i, o: seen.append(e.op))
    monkeypatch.setattr(tg.config, "disable_jit", True)
    out = tg.jit(lambda x: tg.tanh(x) * 2.0)(np.ones(3, np.float32))
    np.testing.assert_allclose(out, 2 * np.tanh(1.0), rtol=1e-6)
    assert seen == ["tanh", "mul"]


# ---- checkpoint ----------------------------------------------------------------------------

def block(h, w):
    for _ in range(3):
        h = tg.tanh(h @ w)
    return h


def deep(checkpointed: bool):
    f = tg.checkpoint(block) if checkpointed else block

    def loss(x, w):
        h = x
        for _ in range(4):
            h = f(h, w)
        return tg.sum(h)
    return loss


def residual_elements(graph: Graph) -> int:
    """Elements of the values the forward pass computes and the backward pass reads: what
    must stay in memory between the two."""
    eqns = graph.eqns
    turn = next(i for i, e in enumerate(eqns) if e.source and "(backward" in e.source)
    defined = {v.id: v.aval.size for e in eqns[:turn] for v in e.outvars}
    used = {a.id for e in eqns[turn:] for a in e.inputs if isinstance(a, Var)}
    used |= {a.id for a in graph.outvars if isinstance(a, Var)}
    return sum(n for i, n in defined.items() if i in used)


@pytest.fixture
def xw():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((8, 16)).astype(np.float32),
            (0.3 * rng.standard_normal((16, 16))).astype(np.float32))


def test_checkpoint_gives_the_same_values_and_gradients(xw, monkeypatch):
    # all three natively (tiering would interpret the un-jitted ones: float32 differs by ulps)
    monkeypatch.setattr(tg.config, "tiering", False)
    x, w = xw
    np.testing.assert_array_equal(tg.checkpoint(block)(x, w), block(x, w))
    want = tg.grad(deep(False), argnums=(0, 1))(x, w)
    got = tg.grad(deep(True), argnums=(0, 1))(x, w)
    jitted = tg.jit(tg.grad(deep(True), argnums=(0, 1)))(x, w)
    for a, b, c in zip(want, got, jitted, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-6)


def test_checkpoint_stores_only_block_inputs(xw):
    x, w = xw
    plain = tg.jit(tg.grad(deep(False), argnums=(0, 1))).lower(x, w).ir
    ckpt = tg.jit(tg.grad(deep(True), argnums=(0, 1))).lower(x, w).ir
    act = 8 * 16
    assert residual_elements(plain) == 12 * act     # every tanh output of 4 blocks x 3
    assert residual_elements(ckpt) == 3 * act       # only the outputs of blocks 1..3
    assert len(ckpt.eqns) > len(plain.eqns)         # paid for with recomputation


def test_checkpoint_second_order_and_integer_arguments(xw):
    x, w = (a.astype(np.float64) for a in xw)

    def hvp_like(checkpointed):
        g = tg.grad(deep(checkpointed), argnums=1)
        return tg.grad(lambda w: tg.sum(g(x, w) ** 2))(w)
    np.testing.assert_allclose(hvp_like(True), hvp_like(False), rtol=1e-9)

    def pick(h, idx):
        return tg.take(tg.tanh(h), idx, axis=0)
    idx = np.array([0, 2])
    g = tg.grad(lambda h: tg.sum(tg.checkpoint(pick)(h, idx)))(x)
    want = tg.grad(lambda h: tg.sum(pick(h, idx)))(x)
    np.testing.assert_allclose(g, want, rtol=1e-6)


def tensor_program(a):
    y = tg.sqrt(a)            # the backward of sqrt divides by zero at 0
    return tg.sum(y * 0.0)


def test_debug_nans_with_tensors(debug_nans):
    a = tg.tensor(np.array([0.0, 1.0], np.float32), requires_grad=True)
    loss = tensor_program(a)
    with pytest.raises(FloatingPointError) as err:
        loss.backward()
    assert (f"in the backward pass, from {HERE}:{line_of(tensor_program, 'tg.sqrt(a)')} "
            "(backward of sqrt)") in str(err.value)


def test_checkpoint_on_tensors_gives_the_same_gradients(xw):
    x, w = xw
    tw = tg.tensor(w, requires_grad=True)
    tg.sum(tg.checkpoint(block)(tg.tensor(x), tw)).backward()
    np.testing.assert_allclose(tw.grad.numpy(), tg.grad(lambda w: tg.sum(block(x, w)))(w),
                               rtol=1e-5, atol=1e-6)

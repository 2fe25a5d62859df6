"""Review of the tracing and Tensor fast paths: each test is a bug found in review (each
failed before its fix)."""
from __future__ import annotations

import numpy as np

import tracegrad as tg
from tracegrad.tracer import autograd_exec


def test_jit_output_dict_keys_keep_their_type():
    x = np.ones(2, np.float32)
    assert list(tg.jit(lambda x: {1: x})(x)) == [1]
    out = tg.jit(lambda x: {True: x, "b": x * 2})(x)
    assert sorted(map(repr, out)) == ["'b'", 'True']
    out = tg.jit(lambda x: {1.0: x})(x)
    assert [type(k) for k in out] == [float]


def _ragged_weight_grad(make):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    xs = [rng.standard_normal((b, 3)).astype(np.float32) for b in (1, 5, 2, 3)]
    W = make(w0, True)
    loss = 0
    for x in xs:
        loss = loss + ((make(x, False) @ W).tanh() ** 2).sum()
    loss.backward()
    ref = np.zeros_like(w0, dtype=np.float64)
    for x in xs:
        h = np.tanh(x.astype(np.float64) @ w0)
        ref += x.T @ (2 * h * (1 - h * h))
    return W, ref


def test_merged_weight_gradient_of_ragged_batches_is_well_typed():
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    W, ref = _ragged_weight_grad(lambda a, rg: tg.tensor(a, requires_grad=rg))
    np.testing.assert_allclose(W.grad.numpy(), ref, rtol=1e-4, atol=1e-5)  # (the Plan is right)
    plans = [e.plan for e in autograd_exec._grad_graphs.values() if e.plan is not None]
    assert plans
    for plan in plans:
        tg.ir.verify(plan.graph())


def test_merged_weight_gradient_of_ragged_batches_compiled(monkeypatch):
    monkeypatch.setattr(tg.config, "tiering", False)
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    W, ref = _ragged_weight_grad(lambda a, rg: tg.tensor(a, requires_grad=rg))
    np.testing.assert_allclose(W.grad.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_negative_zero_scalar_is_not_replayed_as_zero():
    x = tg.tensor([1.0, -2.0])
    np.testing.assert_array_equal(np.signbit((x * 0.0).numpy()), [False, True])
    np.testing.assert_array_equal(np.signbit((x * -0.0).numpy()), [True, False])
    assert (1.0 / (x * -0.0)).numpy()[0] == -np.inf


def test_leaf_read_by_a_pending_no_grad_value_still_gets_its_gradient():
    x = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]
    b = tg.tensor(x, requires_grad=True)
    with tg.no_grad():
        c = b * 2           # pending (not realised) when the next op reads b
    (c * b).sum().backward()
    assert b.grad is not None
    np.testing.assert_allclose(b.grad.numpy(), 2 * np.asarray(x, np.float32))


def test_operand_not_needed_for_backward_may_change_in_place():
    x = tg.tensor(np.ones((2, 3), np.float32))
    w = tg.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    y = (x @ w).sum()
    with tg.no_grad():
        w.mul_(2)
    y.backward()        # PyTorch: fine (MmBackward keeps only x)
    np.testing.assert_allclose(w.grad.numpy(), np.full((3, 2), 2.0))
    c = tg.tensor([3.0, 4.0])
    v = tg.tensor([1.0, 2.0], requires_grad=True)
    z = (c * v).sum()
    with tg.no_grad():
        v.mul_(2)
    z.backward()        # PyTorch: fine (MulBackward keeps only c)
    np.testing.assert_allclose(v.grad.numpy(), [3.0, 4.0])


def test_user_file_named_like_the_package_keeps_its_source_lines():
    """A user file next to the package whose name starts with "tracegrad" is user code."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(tg.__file__)))
    path = os.path.join(root, f"tracegrad_probe_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write("import numpy as np, tracegrad as tg\n"
                "g = tg.make_ir(lambda x: tg.sin(x) * 2.0)(np.ones(3))\n"
                "print(g.pretty(source=True))\n")
    try:
        out = subprocess.run([sys.executable, path], capture_output=True, text=True,
                             timeout=120)
    finally:
        os.remove(path)
    assert f"{os.path.basename(path)}:2" in out.stdout, out.stdout + out.stderr

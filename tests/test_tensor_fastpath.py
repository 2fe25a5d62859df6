"""The Tensor API's fast paths — replayed op records, lazily made saved tensors, the in-place
epoch, the composed backward Plan — keep PyTorch's semantics."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_compose, autograd_exec, autograd_template


def rnn_grads(T, w0, u0, xs0, hook_at=None):
    W = tg.tensor(w0, requires_grad=True)
    U = tg.tensor(u0, requires_grad=True)
    h = tg.zeros(1, w0.shape[0])
    for t in range(T):
        h = tg.tanh(h @ W + tg.tensor(xs0[t]) @ U)
        if t == hook_at:
            h.register_hook(lambda g: g)    # forces the node-by-node engine
    loss = (h * h).sum()
    loss.backward()
    return float(loss.item()), W.grad.numpy(), U.grad.numpy()


def numpy_rnn_grads(T, w, u, xs):
    hs = [np.zeros((1, w.shape[0]))]
    for t in range(T):
        hs.append(np.tanh(hs[-1] @ w + xs[t] @ u))
    g = 2 * hs[-1]
    dw, du = np.zeros_like(w), np.zeros_like(u)
    for t in range(T, 0, -1):
        gz = g * (1 - hs[t] ** 2)
        dw += hs[t - 1].T @ gz
        du += xs[t - 1].T @ gz
        g = gz @ w.T
    return float((hs[-1] ** 2).sum()), dw, du


@pytest.mark.parametrize("T", [1, 2, 3, 7])
def test_plan_backward_of_an_rnn_matches_numpy_and_the_engine(T):
    rng = np.random.default_rng(T)
    w0 = (rng.standard_normal((6, 6)) / 3).astype(np.float32)
    u0 = (rng.standard_normal((6, 6)) / 3).astype(np.float32)
    xs0 = rng.standard_normal((T, 1, 6)).astype(np.float32)
    loss, dw, du = rnn_grads(T, w0, u0, xs0)
    ref = numpy_rnn_grads(T, w0.astype(np.float64), u0.astype(np.float64),
                          xs0.astype(np.float64))
    assert loss == pytest.approx(ref[0], rel=1e-5)
    np.testing.assert_allclose(dw, ref[1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(du, ref[2], rtol=1e-4, atol=1e-5)
    slow = rnn_grads(T, w0, u0, xs0, hook_at=0)
    np.testing.assert_allclose(dw, slow[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(du, slow[2], rtol=1e-5, atol=1e-6)


def test_plan_and_its_ir_graph_compute_the_same():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 5)).astype(np.float32)
    xs0 = rng.standard_normal((4, 1, 5)).astype(np.float32)
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()     # (composed, not written from a template)
    rnn_grads(4, w0, w0, xs0)
    (entry,) = autograd_exec._grad_graphs.values()
    assert isinstance(entry.plan, autograd_compose.Plan)
    W = tg.tensor(w0, requires_grad=True)
    U = tg.tensor(w0, requires_grad=True)
    h = tg.zeros(1, 5)
    for t in range(4):
        h = tg.tanh(h @ W + tg.tensor(xs0[t]) @ U)
    w = autograd_exec.grad_walk([(h * h).sum()._fn])
    args = w.in_vals + [np.ones((), np.float32)]
    by_plan = entry.plan(args)
    by_graph = tg.ir.interpret(entry.plan.graph(), args)
    assert len(by_plan) == len(by_graph) == 3
    for a, b in zip(by_plan, by_graph):
        np.testing.assert_array_equal(a, b)
    for e in entry.plan.graph().eqns:
        assert e.source is None or "test_tensor_fastpath.py" in e.source


def test_weight_gradient_products_merge_into_one_matmul():
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((4, 4)).astype(np.float32)
    rnn_grads(6, w0, w0, rng.standard_normal((6, 1, 4)).astype(np.float32))
    (entry,) = autograd_exec._grad_graphs.values()
    ops = [e.op for e in entry.plan.graph().eqns]
    # forward 6 x (2 matmuls); backward: 5 steps' h-gradients, one merged product per weight
    assert ops.count("matmul") == 12 + 5 + 2
    assert ops.count("concatenate") == 3      # [h], [x], [g] (g shared by both weights)


def test_saved_tensors_are_kept_at_their_version_when_recorded():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = a * 2
    c = b * b
    assert c.grad_fn._saved_self is b       # made on demand from the recorded fields
    with tg.no_grad():
        b.mul_(3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def test_saved_attributes_are_properties_not_a_node_getattr():
    """A class with __getattr__ has every attribute read take CPython's slow, unspecialised
    path, and the walks and the backward read nodes' attributes many times per node."""
    from tracegrad.tracer.autograd_graph import SAVED_NAMES, Node
    assert "__getattr__" not in vars(Node)
    for names in SAVED_NAMES.values():
        for what in names:
            assert isinstance(vars(Node).get(f"_saved_{what}"), property)
    m = tg.tensor([[1.0, 2.0]], requires_grad=True)
    w = tg.tensor([[3.0], [4.0]], requires_grad=True)
    node = (m @ w).grad_fn
    assert node._saved_self is m and node._saved_mat2 is w
    with pytest.raises(AttributeError, match="MmBackward0.*_saved_result"):
        _ = node._saved_result


def test_an_inplace_op_reading_the_value_it_replaces_is_no_later_change():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = a * 1
    b.mul_(b)          # saves b at the version it replaces, then bumps it
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 4.0])


def test_inplace_changes_elsewhere_leave_a_graph_valid():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (a * a).sum()
    other = tg.zeros(2)
    other.add_(1.0)      # a version bump of a tensor the graph does not save
    y.backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 4.0])


def test_backward_twice_needs_retain_graph():
    w = tg.ones(2, 2, requires_grad=True)
    loss = (tg.ones(1, 2) @ w).tanh().sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * (1 - np.tanh(2.0) ** 2) * np.ones((2, 2)),
                               rtol=1e-5)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_a_leaf_read_through_two_variables_gets_one_summed_gradient():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    a = w * 3
    with tg.no_grad():
        w.add_(1.0)      # w's value changes: later ops read it through a new variable
    b = w * 5
    (a + b).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [8.0, 8.0])


def test_gradients_accumulate_into_existing_grad():
    w = tg.tensor([[1.0, 2.0]], requires_grad=True)
    for _ in range(3):
        (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 3 * 2 * np.array([[1.0, 2.0]]))


def test_backward_of_a_non_scalar_without_gradient_raises():
    w = tg.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        (w * 2).backward()


def test_zeros_and_ones_accept_torch_spellings():
    assert tg.zeros(2, 3).shape == (2, 3)
    assert tg.zeros((2, 3)).shape == (2, 3)
    assert tg.ones([4]).shape == (4,)
    assert tg.zeros(()).shape == ()
    assert tg.ones(2, dtype=tg.float64).dtype == np.float64
    assert tg.zeros(2, requires_grad=True).requires_grad
    assert tg.zeros(np.int64(2), 2).shape == (2, 2)


def test_replayed_ops_record_the_callers_line():
    w = tg.ones(2, 2, requires_grad=True)
    x = tg.ones(1, 2)
    for _ in range(2):      # the second pass replays the recorded ops
        a = x @ w; b = tg.tanh(a); c = b.sum()  # noqa: E702
    for t in (a, b, c):
        assert t.grad_fn.eqns[0].source.startswith("test_tensor_fastpath.py:")


def test_one_argument_functions_take_every_kind_of_value_and_a_keyword():
    x0 = np.array([[0.5, -1.0]], np.float32)
    t = tg.tensor(x0, requires_grad=True)
    by_keyword = tg.tanh(x=t)
    assert by_keyword.grad_fn.name() == "TanhBackward0"
    assert tg.tanh(t).grad_fn.name() == "TanhBackward0"
    np.testing.assert_array_equal(tg.tanh(x0), np.tanh(x0))
    np.testing.assert_array_equal(tg.tanh(x=x0), np.tanh(x0))
    np.testing.assert_allclose(tg.jit(tg.tanh)(x0), np.tanh(x0), rtol=1e-6)   # (native)
    np.testing.assert_array_equal(tg.exp([0.0, 1.0]), np.exp(np.float32([0.0, 1.0])))
    with pytest.raises(TypeError):
        tg.tanh(t, t)
    by_keyword.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), 1 - np.tanh(x0) ** 2, rtol=1e-6)


def test_a_replayed_binary_op_takes_the_template_of_its_operands_types():
    # binary ops remember their last operand types by identity: a loop alternating shapes
    # and dtypes must still get the right template each time, forward and backward
    rng = np.random.default_rng(3)
    cases = [((2, 3), (3, 4), np.float32), ((2, 3), (3, 5), np.float32),
             ((2, 3), (3, 4), np.float64), ((1, 3), (3, 4), np.float32)]
    for _ in range(3):
        for sa, sb, dt in cases:
            a0, b0 = rng.standard_normal(sa).astype(dt), rng.standard_normal(sb).astype(dt)
            a = tg.tensor(a0, requires_grad=True)
            b = tg.tensor(b0, requires_grad=True)
            out = (a @ b) * (a @ b)
            assert out.shape == (sa[0], sb[1]) and out.dtype == dt
            np.testing.assert_allclose(out.detach().numpy(), (a0 @ b0) ** 2, rtol=1e-5)
            out.sum().backward()
            np.testing.assert_allclose(a.grad.numpy(), 2 * (a0 @ b0) @ b0.T, rtol=1e-4)
            np.testing.assert_allclose(b.grad.numpy(), a0.T @ (2 * (a0 @ b0)), rtol=1e-4)


def test_a_replayed_unary_op_takes_the_template_of_its_operands_type():
    rng = np.random.default_rng(4)
    for _ in range(3):
        for shape, dt in [((2, 3), np.float32), ((3,), np.float32), ((2, 3), np.float64)]:
            x0 = rng.standard_normal(shape).astype(dt)
            x = tg.tensor(x0, requires_grad=True)
            y = tg.tanh(x)
            z = x.tanh()
            assert y.shape == shape and y.dtype == dt and z.dtype == dt
            np.testing.assert_allclose(y.detach().numpy(), np.tanh(x0), rtol=1e-6)
            (y + z).sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), 2 * (1 - np.tanh(x0) ** 2), rtol=1e-5)


def test_sgd_updates_realised_together_are_each_one_output(monkeypatch):
    # `p -= lr * p.grad` under no_grad leaves each parameter's new value pending; the next
    # step's read realises them in one graph, whose outputs once named each updated value
    # twice (as asked for and as a leaf's pending value): a copy of every parameter per step
    made = []
    real = autograd_exec.CachedGraph

    def spy(graph=None, *a, **k):
        made.append(graph)
        return real(graph, *a, **k)
    monkeypatch.setattr(autograd_exec, "CachedGraph", spy)
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((5, 4)).astype(np.float32))
    ws = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3)]
    params = [tg.tensor(w, requires_grad=True) for w in ws]
    want = [w.copy() for w in ws]
    for _ in range(3):
        h = x
        for p in params:
            h = tg.tanh(h @ p)
        h.sum().backward()
        # the same step by hand, in numpy
        hs = [x.numpy()]
        for w in want:
            hs.append(np.tanh(hs[-1] @ w))
        g = np.ones_like(hs[-1])
        grads = []
        for i in range(len(want) - 1, -1, -1):
            g = g * (1 - hs[i + 1] ** 2)
            grads.append(hs[i].T @ g)
            g = g @ want[i].T
        grads.reverse()
        with tg.no_grad():
            for p in params:
                p -= 0.1 * p.grad
                p.grad = None
        want = [w - np.float32(0.1) * gw for w, gw in zip(want, grads)]
    values = [p.detach().numpy() for p in params]
    for v, w in zip(values, want):
        np.testing.assert_allclose(v, w, rtol=1e-4, atol=1e-5)
    realised = [g for g in made if g is not None and len(g.outvars) >= len(params)]
    assert realised, "the updates were never realised together"
    for g in realised:
        ids = [id(v) for v in g.outvars]
        assert len(ids) == len(set(ids)), g.outvars


def test_steps_after_sgd_updates_reuse_their_tape_plan(monkeypatch):
    # a training step's tape reads parameters whose in-place updates are pending: they are
    # computed first and the step's known plan runs (no walk of the graph per step), with
    # the gradients the node-by-node engine gives
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((6, 5)).astype(np.float32)
    w0 = [rng.standard_normal((5, 5)).astype(np.float32) for _ in range(2)]

    def train(steps, engine_only=False):
        x = tg.tensor(x0)
        params = [tg.tensor(w, requires_grad=True) for w in w0]
        losses = []
        for _ in range(steps):
            h = x
            for p in params:
                h = tg.tanh(h @ p)
            if engine_only:
                h.register_hook(lambda g: g)     # forces the node-by-node engine
            loss = (h * h).sum()
            loss.backward()
            losses.append(loss.item())
            with tg.no_grad():
                for p in params:
                    p -= 0.05 * p.grad
                    p.grad = None
        return losses, [p.detach().numpy() for p in params]

    train(3)        # the step's plan is made and filed
    walks = []
    real = autograd_exec.walk

    def counted(roots, grad, force=None):
        if grad:
            walks.append(len(roots))
        return real(roots, grad, force)
    monkeypatch.setattr(autograd_exec, "walk", counted)
    losses, params = train(4)
    monkeypatch.setattr(autograd_exec, "walk", real)
    assert walks == []      # (before: two walks per step once its parameters were pending)
    want_losses, want = train(4, engine_only=True)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for p, q in zip(params, want):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)

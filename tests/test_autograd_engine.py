"""backward(), tg.autograd.grad/backward, hooks, retain_graph, create_graph, Function and
saved-tensor hooks on lazy Tensors, plus the one-graph fast path and its caches."""
import gc

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_exec


def close(t, expected, tol=1e-5):
    np.testing.assert_allclose(t.detach().numpy(), expected, rtol=tol, atol=tol)


def test_tutorial_jacobian_product_accumulates_and_zeroes():
    inp = tg.eye(4, 5, requires_grad=True)
    out = (inp + 1).pow(2).t()
    expected = np.where(np.eye(4, 5) == 1, 4.0, 2.0)
    out.backward(tg.ones_like(out), retain_graph=True)
    close(inp.grad, expected)
    out.backward(tg.ones_like(out), retain_graph=True)
    close(inp.grad, 2 * expected)
    inp.grad.zero_()
    out.backward(tg.ones_like(out), retain_graph=True)
    close(inp.grad, expected)


def test_backward_errors():
    x = tg.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and "
                       "does not have a grad_fn"):
        tg.ones(3).sum().backward()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape "
                       r"of Size\(\[2\]\) and output\[0\] has a shape of Size\(\[3\]\)"):
        (x * 2).backward(tg.ones(2))


def test_second_backward_raises_only_when_values_were_saved():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second "
                       "time .* Specify retain_graph=True"):
        y.backward()
    z = (x + x).sum()      # saves nothing: can be backwarded again
    x.grad = None
    z.backward()
    z.backward()
    close(x.grad, [4, 4])


def test_retain_graph_allows_repeated_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    close(x.grad, [4, 8])


def test_failed_backward_leaves_the_graph_usable():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    h = y.register_hook(lambda g: tg.ones(3))
    with pytest.raises(RuntimeError, match="hook '<lambda>' has changed the size of value"):
        y.sum().backward()
    assert x.grad is None
    h.remove()
    y.sum().backward()
    close(x.grad, [2, 4])


def test_tensor_hooks_replace_gradients_and_retain_grad():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: g * 10)
    y.retain_grad()
    (y * y).sum().backward()
    close(y.grad, [40, 80, 120])
    close(x.grad, [80, 160, 240])
    assert y.retains_grad
    seen = []
    x.grad = None
    x.register_hook(lambda g: seen.append(g.tolist()))
    (x * 3).sum().backward()
    assert seen == [[3.0, 3.0, 3.0]]


def test_hook_handles_remove():
    x = tg.ones(2, requires_grad=True)
    y = x * 1
    h = y.register_hook(lambda g: g * 100)
    h.remove()
    y.sum().backward()
    close(x.grad, [1, 1])


def test_grad_fn_pre_and_post_hooks():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    calls = []
    y.grad_fn.register_prehook(lambda go: calls.append("pre") or (go[0] * 2,))
    y.grad_fn.register_hook(lambda gi, go: calls.append("post") or (gi[0] + 1,))
    y.sum().backward()
    assert calls == ["pre", "post"]
    close(x.grad, [5, 9])      # 2 * 2x + 1
    z = x * 3
    z.grad_fn.register_prehook(lambda go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="has returned an incorrect number of values"):
        z.sum().backward()


def test_accumulate_grad_post_hook_runs_after_accumulating():
    """A hook on a leaf's AccumulateGrad (reached by next_functions) runs once per backward,
    after .grad is written, with ((), (gradient,)) as in PyTorch; gone with its node."""
    W = tg.tensor(np.ones(3, np.float32), requires_grad=True)
    y = W * 2.0
    acc = y.grad_fn.next_functions[0][0]
    calls = []
    acc.register_hook(lambda gi, go: calls.append((gi, go[0].numpy().copy(),
                                                   W.grad.numpy().copy())))
    (W * 3.0 + y).sum().backward()
    assert len(calls) == 1 and calls[0][0] == ()
    np.testing.assert_allclose(calls[0][1], [5, 5, 5])
    np.testing.assert_allclose(calls[0][2], [5, 5, 5])
    del y, acc
    gc.collect()
    (W * 3.0).sum().backward()
    assert len(calls) == 1


def test_wrongly_shaped_leaf_hook_raises():
    w = tg.ones(3, requires_grad=True)
    w.register_hook(lambda g: tg.ones(2))
    with pytest.raises(RuntimeError, match="has changed the size of value"):
        (w * 2).sum().backward()


def test_create_graph_gives_differentiable_gradients():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    (g,) = tg.autograd.grad((a ** 3).sum(), a, create_graph=True)
    close(g, [3, 12])
    assert g.requires_grad and g.grad_fn is not None
    v = tg.tensor([1.0, -1.0])
    (hv,) = tg.autograd.grad((g * v).sum(), a)
    close(hv, [6, -12])       # Hessian-vector product: diag(6a) v
    a.grad = None
    (a ** 3).sum().backward(create_graph=True)
    g2 = a.grad
    a.grad = None
    g2.sum().backward()
    close(a.grad, [6, 12])


def test_autograd_grad_leaves_dot_grad_alone_and_checks_inputs():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = tg.tensor([3.0], requires_grad=True)
    z = (x * x).sum()
    gx, gy = tg.autograd.grad(z, (x, y), allow_unused=True, retain_graph=True)
    close(gx, [2, 4])
    assert gy is None and x.grad is None
    with pytest.raises(RuntimeError, match="The differentiated Tensor at index 1 appears to "
                       "not have been used in the graph"):
        tg.autograd.grad(z, [x, y], retain_graph=True)
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not "
                       "require grad"):
        tg.autograd.grad(z, [tg.ones(2)], retain_graph=True)
    mid = x * 3
    (gm,) = tg.autograd.grad((mid * mid).sum(), mid)
    close(gm, [6, 12])


def test_autograd_grad_of_leaves_takes_the_one_graph_backward(monkeypatch):
    """tg.autograd.grad of one scalar w.r.t. leaves runs as backward()'s one graph (it took
    the node-by-node engine every time), with the same gradients, .grad left alone, an
    unused input told apart, and the graph freed unless retained."""
    from tracegrad.tracer import autograd_engine
    W = tg.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)
    b = tg.tensor([0.1, -0.2], requires_grad=True)
    unused = tg.tensor([1.0], requires_grad=True)
    x = tg.tensor([[1.0, 2.0]])

    def loss():
        return (tg.tanh(x @ W + b) ** 2).sum()
    want = tg.autograd.grad(loss(), [W, b], grad_outputs=tg.tensor(1.0))   # (the engine)
    ran = []
    real = autograd_engine.Engine.run
    monkeypatch.setattr(autograd_engine.Engine, "run",
                        lambda self: ran.append(1) or real(self))
    for _ in range(2):      # (the second from the tape)
        got = tg.autograd.grad(loss(), [W, b, unused], allow_unused=True)
        for g, w in zip(got[:2], want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        assert got[2] is None
    assert ran == [] and W.grad is None and b.grad is None
    out = loss()
    tg.autograd.grad(out, [W])
    with pytest.raises(RuntimeError, match="second time"):
        tg.autograd.grad(out, [W])


def test_autograd_grad_leaves_alone_what_its_inputs_do_not_need():
    """The one graph runs and frees all the output reaches; autograd.grad, as torch, only
    what leads to its inputs (review): a branch to another leaf is neither freed nor checked,
    and an input listed twice gets one tensor."""
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = tg.tensor([0.5, 0.25], requires_grad=True)
    z = b.exp()
    y = (a * 2).sum() + z.sum()
    close(tg.autograd.grad(y, [a])[0], [2, 2])
    close(tg.autograd.grad(z.sum(), [b])[0], np.exp([0.5, 0.25]))      # not freed
    enc, head = (tg.tensor([1.0, 2.0], requires_grad=True) for _ in range(2))
    h = enc * enc
    tg.autograd.grad((h * head).sum(), [head])
    close(tg.autograd.grad((h * head * 2).sum(), [head])[0], [2, 8])   # h reused
    t = b + 0
    u = t * t
    y = (a * 3).sum() + u.sum()
    t.add_(1.0)     # changes what only b's gradient reads
    close(tg.autograd.grad(y, [a])[0], [3, 3])
    g = tg.autograd.grad((a * a).sum(), [a, a])
    assert g[0] is g[1]


def test_accumulate_grad_hook_errors_as_torch():
    W = tg.tensor(np.ones(3, np.float32), requires_grad=True)
    y = W * W
    y.grad_fn.next_functions[0][0].register_hook(lambda gi, go: go)
    with pytest.raises(RuntimeError, match="incorrect number of values"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):   # freed before the hook ran
        y.sum().backward()


def test_autograd_backward_multiple_roots():
    p = tg.tensor([1.0, 2.0], requires_grad=True)
    tg.autograd.backward([p.sum(), (p * p).sum()], [tg.tensor(1.0), tg.tensor(2.0)])
    close(p.grad, [5, 9])


def test_backward_inputs_restricts_accumulation():
    a = tg.ones(2, requires_grad=True)
    b = tg.ones(2, requires_grad=True)
    (a * b * 2).sum().backward(inputs=[a])
    close(a.grad, [2, 2])
    assert b.grad is None


class Exp(tg.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        result = i.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


class SplitScale(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        idx = x.argmax()
        ctx.mark_non_differentiable(idx)
        return x * k, idx

    @staticmethod
    def backward(ctx, g, g_idx):
        assert ctx.needs_input_grad == (True, False)
        return g * ctx.k, None


def test_autograd_function():
    b = tg.tensor([0.0, 1.0], requires_grad=True)
    o = Exp.apply(b)
    assert o.grad_fn.name() == "ExpBackward" and o.requires_grad
    o.sum().backward()
    close(b.grad, np.exp([0.0, 1.0]))
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second"):
        o.sum().backward()
    x = tg.tensor([1.0, 3.0], requires_grad=True)
    y, idx = SplitScale.apply(x, 5.0)
    assert not idx.requires_grad and idx.item() == 1
    y.sum().backward()
    close(x.grad, [5, 5])


def test_function_backward_errors():
    class Bad(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return tg.ones(3)

    x = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Function BadBackward returned an invalid gradient "
                       "at index 0"):
        Bad.apply(x).sum().backward()


def test_saved_tensors_hooks_pack_once_unpack_when_needed():
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t.detach().numpy() * 1.0   # e.g. offload to host memory

    def unpack(a):
        unpacked.append(a.shape)
        return tg.tensor(a)

    c = tg.tensor([1.0, 2.0], requires_grad=True)
    with tg.autograd.graph.saved_tensors_hooks(pack, unpack):
        d = (c * c).exp()
    assert len(packed) == 3 and not unpacked    # c twice for Mul, the result of Exp
    d.sum().backward()
    assert len(unpacked) == 3
    close(c.grad, 2 * np.array([1.0, 2.0]) * np.exp([1.0, 4.0]), 1e-4)


def test_fast_path_and_node_by_node_engine_agree():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 4)).astype(np.float32)

    def run(with_hook):
        w = tg.tensor(w0, requires_grad=True)
        h = tg.ones(1, 4)
        for _ in range(3):
            h = tg.tanh(h @ w)
        if with_hook:
            h.register_hook(lambda g: None)    # forces the node-by-node engine
        (h * h).sum().backward()
        return w.grad.numpy()
    np.testing.assert_allclose(run(False), run(True), rtol=1e-5, atol=1e-6)


def test_repeated_structure_reuses_one_cached_graph():
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    w = tg.ones(3, 3, requires_grad=True)
    for i in range(4):
        x = tg.tensor(np.full((1, 3), float(i), np.float32))
        loss = ((x @ w).tanh() * 2.0).sum()
        loss.backward()
        assert w.grad.shape == (3, 3)
        w.grad = None
    assert len(autograd_exec._grad_graphs.items) == 1
    entry = next(iter(autograd_exec._grad_graphs.values()))
    assert entry.fn is not None or entry.spent > 0


def test_dropout_seed_is_a_graph_input():
    x = tg.ones(1000, requires_grad=True)
    a = tg.nn.functional.dropout(x, 0.5)
    b = tg.nn.functional.dropout(x, 0.5)
    assert not np.array_equal(a.detach().numpy(), b.detach().numpy())
    assert a.grad_fn.name() == "MulBackward0"
    assert a.grad_fn.sig == b.grad_fn.sig     # same structure: graphs hash alike
    a.sum().backward()
    kept = a.detach().numpy() != 0
    close(x.grad, np.where(kept, 2.0, 0.0))


def _loop_grads(force_engine: bool) -> tuple:
    """Gradients of a small recurrence reusing two weights at every step (W on the right of
    its matmul, V on the left), through the one-graph backward or, with a hook on a step,
    the node-by-node engine."""
    rng = np.random.default_rng(1)
    w = tg.tensor(rng.standard_normal((4, 4)).astype(np.float32) / 2, requires_grad=True)
    v = tg.tensor(rng.standard_normal((4, 4)).astype(np.float32) / 2, requires_grad=True)
    xs = [tg.tensor(rng.standard_normal((1, 4)).astype(np.float32)) for _ in range(5)]
    h = tg.zeros(1, 4)
    for t, x in enumerate(xs):
        h = tg.tanh(h @ w + x)
        h = h + (v @ h.T).T * 0.5
        if force_engine and t == 2:
            h.register_hook(lambda g: g)
    (h * h).sum().backward()
    return w.grad.numpy(), v.grad.numpy()


def test_composed_backward_of_a_loop_matches_the_node_by_node_engine():
    calls = []
    compose = autograd_exec.compose
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()

    def spy(*args):
        calls.append(1)
        return compose(*args)
    autograd_exec.compose = spy
    try:
        fast = _loop_grads(False)
    finally:
        autograd_exec.compose = compose
    assert calls, "the one-graph backward should compose this graph"
    slow = _loop_grads(True)
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_graph_caches_drop_the_least_recently_used():
    cache = autograd_exec._LRU(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"        # a used again: b is now the oldest
    cache.put("d", "D")
    assert cache.get("b") is None
    assert [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    cache.put("e", "E")                 # a, c, d just used in that order: a goes
    assert cache.get("a") is None and sorted(cache.values()) == ["C", "D", "E"]


def test_a_leaf_read_only_by_a_comparison_gets_no_grad():
    """As torch: `w` reaches the loss only through `a @ w > 0`, which has no gradient, so its
    .grad stays None (a zero would make optimizers with momentum or weight decay move it) and
    autograd.grad gives None with allow_unused; `a`'s own gradient is unchanged. (The
    comparison's value is pending at backward, so the one-graph walk goes into it.)"""
    w = tg.tensor(np.ones((2, 2)), requires_grad=True)
    a = tg.tensor(np.array([[1.0, -3.0]]), requires_grad=True)
    tg.where((a @ w) > 0, a, a * 2).sum().backward()
    assert w.grad is None
    assert a.grad.numpy().tolist() == [[2.0, 2.0]]      # a @ w = [[-2, -2]]: the 2 * a side
    ga, gw = tg.autograd.grad(tg.where((a @ w) < 0, a, a * 2).sum(), [a, w],
                              allow_unused=True)
    assert gw is None and ga.numpy().tolist() == [[1.0, 1.0]]
    b = tg.tensor(np.ones((2, 2)), requires_grad=True)     # read both ways: a gradient
    (tg.where((a @ b) > 0, a, a * 2) * b[0]).sum().backward()
    assert b.grad.numpy().tolist() == [[2.0, -6.0], [0.0, 0.0]]

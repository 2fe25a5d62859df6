"""Gradients and hooks at the leaves, each program run in tracegrad and (where installed)
PyTorch against the same expected numbers: two leaves holding one variable (`a.data = b`, a
detached alias written through) get a gradient each; hooks on a leaf's AccumulateGrad
(`register_prehook`, `register_hook`) and `register_post_accumulate_grad_hook`; and a hook
on the AccumulateGrad of a graph the user dropped goes with that graph."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_engine


@pytest.fixture(params=["tracegrad", "torch"])
def lib(request):
    if request.param == "torch":
        return pytest.importorskip("torch")
    return tg


@pytest.fixture(params=["one graph", "engine"])
def path(request):
    return request.param


def leaf(lib, values):
    return lib.tensor(np.asarray(values, np.float32), requires_grad=True)


def grad_of(t):
    return None if t.grad is None else t.grad.detach().numpy().tolist()


def backward(y, path):
    """y.sum().backward() through the one-graph backward or, with a hook on y, the
    node-by-node engine (a hook changing nothing)."""
    if path == "engine":
        y.register_hook(lambda g: g)
    y.sum().backward()


def two_leaves(lib):
    """A and B: two leaves holding one variable (A's value is B's: [1, 2, 3])."""
    A = leaf(lib, [0, 0, 0])
    B = leaf(lib, [1, 2, 3])
    A.data = B
    return A, B


# ---- two leaves of one variable ----------------------------------------------------------------

def test_two_leaves_of_one_variable_get_their_own_gradients(lib, path):
    A, B = two_leaves(lib)
    backward(B * 3.0 + A * 2.0, path)
    assert (grad_of(A), grad_of(B)) == ([2, 2, 2], [3, 3, 3])
    A, B = two_leaves(lib)
    backward(A * 2.0 + B * 3.0, path)
    assert (grad_of(A), grad_of(B)) == ([2, 2, 2], [3, 3, 3])


def test_two_leaves_of_one_variable_in_one_op(lib, path):
    """One op reading both leaves: d(A*B*B)/dA = B*B, d/dB = 2*A*B (not one square)."""
    A, B = two_leaves(lib)
    backward(A * B * B, path)
    assert (grad_of(A), grad_of(B)) == ([1, 4, 9], [2, 8, 18])
    A, B = two_leaves(lib)
    backward(lib.stack([A, B * 2.0]), path)
    assert (grad_of(A), grad_of(B)) == ([1, 1, 1], [2, 2, 2])


@pytest.mark.parametrize("read", [False, True])
def test_a_detached_alias_written_through_gets_its_own_gradient(lib, path, read):
    """d = c.detach() made a leaf and written in place: c reads d's (pending, unless
    `read`) value, and each gets the gradient of its own uses."""
    c = leaf(lib, [1, 2, 3])
    d = c.detach()
    d.requires_grad_(True)
    with lib.no_grad():
        d.mul_(2.0)
    if read:
        assert d.tolist() == [2, 4, 6]
    backward(c * 3.0 + d * d, path)
    assert (grad_of(c), grad_of(d)) == ([3, 3, 3], [4, 8, 12])


def test_two_leaves_of_one_variable_with_a_retained_graph(lib):
    A, B = two_leaves(lib)
    y = (B * 3.0 + A * A).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert (grad_of(A), grad_of(B)) == ([4, 8, 12], [6, 6, 6])


def test_autograd_grad_of_two_leaves_of_one_variable(lib):
    for first_a in (True, False):
        A, B = two_leaves(lib)
        y = ((A * 2.0 + B * 3.0) if first_a else (B * 3.0 + A * 2.0)).sum()
        ga, = lib.autograd.grad(y, [A], retain_graph=True)
        gb, = lib.autograd.grad(y, [B], retain_graph=True)
        both = lib.autograd.grad(y, [A, B])
        assert ga.tolist() == [2, 2, 2] and gb.tolist() == [3, 3, 3]
        assert [g.tolist() for g in both] == [[2, 2, 2], [3, 3, 3]]
        assert A.grad is None and B.grad is None


# ---- hooks on a leaf's AccumulateGrad ------------------------------------------------------------

def test_accumulate_grad_prehook_sees_and_replaces_the_gradient(lib, path):
    """Order as torch: the leaf's tensor hooks, the AccumulateGrad's prehooks (a tuple in, a
    tuple or None out, chained), .grad written, its post hooks (with the gradient added)."""
    W = leaf(lib, [1, 1, 1])
    y = W * 2.0
    acc = y.grad_fn.next_functions[0][0]
    log = []
    W.register_hook(lambda g: g * 10)
    acc.register_prehook(lambda go: log.append(("pre", type(go), len(go), go[0].tolist()))
                         or (go[0] + 1,))
    acc.register_prehook(lambda go: log.append(("pre2", go[0].tolist())))
    acc.register_hook(lambda gi, go: log.append(("post", gi, go[0].tolist(), grad_of(W))))
    backward(W * 3.0 + y, path)
    assert log == [("pre", tuple, 1, [50, 50, 50]), ("pre2", [51, 51, 51]),
                   ("post", (), [51, 51, 51], [51, 51, 51])]
    assert grad_of(W) == [51, 51, 51]


def test_accumulate_grad_prehook_results(lib):
    def run(result):
        W = leaf(lib, [1, 1, 1])
        y = W * 2.0
        y.grad_fn.next_functions[0][0].register_prehook(lambda go: result(go))
        y.sum().backward()
        return grad_of(W)
    assert run(lambda go: None) == [2, 2, 2]
    assert run(lambda go: (go[0] * 3,)) == [6, 6, 6]
    assert run(lambda go: (None,)) is None      # the gradient is dropped
    with pytest.raises(TypeError, match="expected tuple, but hook returned 'list'"):
        run(lambda go: [go[0]])
    with pytest.raises(TypeError, match="expected tuple, but hook returned 'Tensor'"):
        run(lambda go: go[0])
    with pytest.raises(RuntimeError, match="has returned an incorrect number of values"):
        run(lambda go: (go[0], go[0]))
    with pytest.raises(RuntimeError, match="has changed the size of value"):
        run(lambda go: (go[0][:2],))


def test_accumulate_grad_prehook_handle_and_autograd_grad(lib):
    """autograd.grad accumulates nothing: the prehook is not called (as torch)."""
    W = leaf(lib, [1, 1, 1])
    y = W * 2.0
    acc = y.grad_fn.next_functions[0][0]
    calls = []
    h = acc.register_prehook(lambda go: calls.append(1) or (go[0] * 3,))
    g, = lib.autograd.grad(y.sum(), [W], retain_graph=True)
    assert g.tolist() == [2, 2, 2] and calls == []
    h.remove()
    y.sum().backward()
    assert grad_of(W) == [2, 2, 2] and calls == []


# ---- register_post_accumulate_grad_hook ----------------------------------------------------

def test_post_accumulate_grad_hook_runs_after_dot_grad_is_written(lib, path):
    W = leaf(lib, [1, 1, 1])
    log = []
    h = W.register_post_accumulate_grad_hook(
        lambda t: log.append(("hook", t is W, grad_of(t))))
    y = W * 2.0
    acc = y.grad_fn.next_functions[0][0]
    acc.register_hook(lambda gi, go: log.append(("acc post", go[0].tolist())))
    backward(W * 3.0 + y, path)
    assert log == [("hook", True, [5, 5, 5]), ("acc post", [5, 5, 5])]
    log.clear()
    del y, acc
    backward(W * 3.0, path)
    assert log == [("hook", True, [8, 8, 8])]
    log.clear()
    lib.autograd.grad((W * 3.0).sum(), [W])     # nothing accumulated: not called
    h.remove()
    backward(W * 3.0, path)
    assert log == [] and grad_of(W) == [11, 11, 11]


def test_post_accumulate_grad_hook_only_for_the_leaves_accumulated(lib):
    A, B = leaf(lib, [1, 2]), leaf(lib, [3, 4])
    log = []
    A.register_post_accumulate_grad_hook(lambda t: log.append("A"))
    B.register_post_accumulate_grad_hook(lambda t: log.append("B"))
    (A * B).sum().backward(inputs=[A])
    assert log == ["A"] and grad_of(A) == [3, 4] and B.grad is None


def test_post_accumulate_grad_hook_errors(lib):
    W = leaf(lib, [1, 2])
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered "
                       "on non-leaf tensors"):
        (W * 2).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't "
                       "require gradient"):
        lib.ones(2).register_post_accumulate_grad_hook(lambda t: None)
    W.register_post_accumulate_grad_hook(lambda t: t.grad)
    with pytest.raises(RuntimeError, match="post accumulate grad hooks should return None"):
        (W * 2).sum().backward()
    assert grad_of(W) == [2, 2]      # written before the hook ran
    V = leaf(lib, [1, 2])
    V.register_post_accumulate_grad_hook(lambda t: 1)
    z = V * V
    with pytest.raises(TypeError, match="returned 'int'"):
        z.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):     # freed before the hook ran
        z.sum().backward()


def _sgd_in_backward(lib, path):
    """Optimizer steps run by post-accumulate hooks, the RNN-like loop re-recorded each
    iteration (the one graph learns it, then reads it from the tape)."""
    W = leaf(lib, [[0.5, -0.25], [0.125, 0.75]])

    def step(t):
        with lib.no_grad():
            t -= 0.1 * t.grad
        t.grad = None
    W.register_post_accumulate_grad_hook(step)
    losses = []
    for _ in range(4):
        h = lib.tensor(np.array([[1.0, -2.0]], np.float32))
        for _ in range(3):
            h = lib.tanh(h @ W)
        loss = (h * h).sum()
        losses.append(float(loss.item()))
        backward(h * h, path)
    assert W.grad is None
    return W.detach().numpy(), losses


def test_post_accumulate_grad_hook_steps_an_optimizer(lib, path):
    w, losses = _sgd_in_backward(lib, path)
    expected = [0.208959, 0.139251, 0.093717, 0.064909]     # (numpy, float64)
    np.testing.assert_allclose(losses, expected, rtol=1e-4)
    np.testing.assert_allclose(w, [[0.459602, -0.227318], [0.161506, 0.497925]], rtol=1e-4)


def test_post_accumulate_grad_hook_keeps_the_one_graph_backward(monkeypatch):
    def no_engine(*args):
        raise AssertionError("took the node-by-node engine")
    monkeypatch.setattr(autograd_engine.Engine, "_walk", no_engine)
    _sgd_in_backward(tg, "one graph")


# ---- hooks of a dropped graph ------------------------------------------------------------

def _hooked_then_dropped(lib, log):
    """Registers AccumulateGrad hooks of W through a graph that is then dropped (its value
    read, as an evaluation with grad on would)."""
    W = leaf(lib, [1, 1, 1])

    def evaluate():
        y = W * 2.0
        acc = y.grad_fn.next_functions[0][0]
        acc.register_hook(lambda gi, go: log.append("post"))
        acc.register_prehook(lambda go: log.append("pre"))
        return float((y * y).sum().item())
    evaluate()
    return W


def test_hooks_on_a_dropped_graphs_accumulate_grad_go_with_it(lib, path):
    log = []
    W = _hooked_then_dropped(lib, log)
    backward(W * 3.0, path)
    assert log == [] and grad_of(W) == [3, 3, 3]
    W = leaf(lib, [1, 1, 1])
    y = W * 2.0
    y.grad_fn.next_functions[0][0].register_hook(lambda gi, go: log.append("post"))
    del y
    backward(W * 3.0 + W * W, path)
    assert log == [] and grad_of(W) == [5, 5, 5]


def test_hooks_on_a_kept_accumulate_grad_still_run(lib, path):
    """The AccumulateGrad held by the user (or a live graph) is the one new graphs use."""
    W = leaf(lib, [1, 1, 1])
    y = W * 2.0
    acc = y.grad_fn.next_functions[0][0]
    log = []
    acc.register_hook(lambda gi, go: log.append("post"))
    del y
    backward(W * 3.0, path)
    assert log == ["post"]
    z = W * 2.0
    z.grad_fn.next_functions[0][0].register_prehook(lambda go: log.append("pre"))
    backward(W * 3.0 + z, path)
    assert log == ["post", "pre", "post"]


# ---- review fixes --------------------------------------------------------------------------

def test_a_dropped_graph_reading_the_other_leaf_does_not_steer_the_tape_plan(lib):
    """The tape's plan reads each input from the first tape entry of its variable *and*
    leaf: a dropped graph reading A (B's alias) came first, so the plan learned to read B's
    gradient from A's entry — and kept doing so for later tapes of that key, aliased or not
    (review of 61887e2)."""
    A, B = two_leaves(lib)
    seen = []
    for _ in range(3):
        e = A * 5.0     # an evaluation, dropped without backward
        del e
        (B * 2.0).sum().backward()
        seen.append((grad_of(A), grad_of(B)))
        A.grad = B.grad = None
    assert seen == [(None, [2, 2, 2])] * 3
    P, Q = leaf(lib, [1, 1, 1]), leaf(lib, [5, 6, 7])     # no aliasing, the same structure
    for _ in range(2):
        e = P * 5.0
        del e
        (Q * 2.0).sum().backward()
        assert grad_of(P) is None and grad_of(Q) == [2, 2, 2]
        Q.grad = None


def test_data_set_to_a_result_in_a_graph_takes_its_value_not_its_variable(lib):
    """`A.data = y` for a non-leaf y: A holds y's value as a leaf of its own; its gradient
    went into y's graph (x.grad 14 instead of 6, A.grad 0)."""
    x, A = leaf(lib, [1, 2, 3]), leaf(lib, [0, 0, 0])
    for _ in range(3):
        y = x * 2.0
        A.data = y.detach() if lib is not tg else y
        ((y * 3.0).sum() + (A * 4.0).sum()).backward()
        assert grad_of(x) == [6, 6, 6] and grad_of(A) == [4, 4, 4]
        assert A.detach().numpy().tolist() == [2, 4, 6]
        x.grad = A.grad = None


def test_a_hooked_leaf_prunes_the_tape_once_per_tape(monkeypatch):
    """Reading a leaf whose AccumulateGrad has a hook prunes the tape (a dropped graph's
    AccumulateGrad must not be reused), but only the first time on a tape: every step of a
    long loop pruning the whole tape again made recording quadratic (T=2000: 53 -> 1302 ms)."""
    from tracegrad.tracer import tensor as tensor_mod
    calls = []
    real = tensor_mod.prune_tape
    monkeypatch.setattr(tensor_mod, "prune_tape", lambda st: (calls.append(1), real(st)))
    W = leaf(tg, np.ones((4, 4)))
    acc = (W * 1.0).grad_fn.next_functions[0][0]
    log = []
    acc.register_hook(lambda gi, go: log.append(1))
    for _ in range(2):
        calls.clear()
        h = tg.ones(4)
        for _ in range(50):
            h = (W @ h).tanh()
        h.sum().backward()
        assert len(calls) == 1 and len(log) == 1
        log.clear()


def test_a_value_an_inplace_op_replaced_stays_valid_after_later_inplace_ops(lib):
    """`C.mul_(A)` keeps the C it replaced (torch: a copy, original_self); a later `C.add_`
    does not invalidate it — tracegrad raised 'modified by an inplace operation' (review)."""
    A = leaf(lib, [0.5, -1.0, 2.0])
    C = A * 1.0
    C.mul_(A)
    node = C.grad_fn
    C.add_(1.0)
    assert node._saved_self.detach().numpy().tolist() == [0.5, -1.0, 2.0]
    C.sum().backward()
    assert grad_of(A) == [1.0, -2.0, 4.0]


@pytest.mark.parametrize("read", [False, True])
def test_a_detached_alias_written_through_with_a_gradient_keeps_its_history(lib, read):
    """d = c.detach(); d.add_(x): c's value is now pending on d's Add node, which is also in
    x's graph; reading a value released that node as a mere leaf update, and x got no
    gradient (review)."""
    c, x = leaf(lib, [1, 2, 3]), leaf(lib, [1, 1, 2])
    d = c.detach()
    d.add_(x)
    if read:
        d.tolist()
    (c * d).sum().backward()
    assert grad_of(c) == [2, 3, 5] and grad_of(x) == [2, 3, 5]


# ---- tensors sharing storage: detach(), .data, `.data =` --------------------------------

def test_a_write_reaches_aliases_taken_before_it(lib):
    """In-place changes of a tensor reach its detach() and .data aliases, whenever taken,
    and theirs reach it and each other (they once kept the value from before)."""
    a = lib.tensor(np.ones(3, np.float32))
    al, d, e = a.data, a.detach(), a.detach()
    a.add_(1.0)
    al.mul_(2.0)
    d.sub_(1.0)
    assert [t.tolist() for t in (a, al, d, e)] == [[3, 3, 3]] * 4


@pytest.mark.parametrize("step", ["optimizer", "data"])
def test_a_parameter_alias_kept_across_steps_sees_the_updates(lib, step):
    W = leaf(lib, [1, 2, 3])
    kept = W.data
    opt = lib.optim.SGD([W], lr=0.25)
    for _ in range(2):
        opt.zero_grad()
        (W * W).sum().backward()
        if step == "optimizer":
            opt.step()
        else:
            W.data.add_(-0.25 * W.grad)
    assert W.tolist() == kept.tolist() == [0.25, 0.5, 0.75]


def test_data_set_to_a_leaf_shares_its_storage_and_leaves_the_old_one(lib):
    A, B = two_leaves(lib)
    old = lib.tensor(np.zeros(3, np.float32))
    A2 = old.detach()
    A2.data = lib.tensor(np.ones(3, np.float32))
    with lib.no_grad():
        B.mul_(2.0)
        A2.add_(1.0)
    assert A.tolist() == B.tolist() == [2, 4, 6]
    assert old.tolist() == [0, 0, 0] and A2.tolist() == [2, 2, 2]

"""The tape (autograd_exec.tape_walk): a backward whose graph was recorded like one seen
before finds its plan from the nodes recorded since the last backward, without a walk. Each
test records a graph once to teach the tape its key, then again with something the key must
not hide (a hook added afterwards, an in-place change, another leaf...), and checks the
gradients against numpy or PyTorch's errors."""
import gc
import threading
import weakref

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_exec
from tracegrad.tracer.grad_mode import TAPE_ROOM, mode

W0 = np.array([[0.5, -0.25], [0.125, 0.75]], np.float32)
X0 = np.array([[1.0, -2.0]], np.float32)


@pytest.fixture
def walks(monkeypatch):
    """How many backward calls walked the graph (grad_walk) rather than reading the tape."""
    calls = []
    real = autograd_exec.grad_walk
    autograd_exec._tape_plans.items.clear()     # forget what earlier tests taught it
    mode.state.clear_tape()     # and drop what they recorded without a backward

    def counted(roots):
        calls.append(1)
        return real(roots)
    monkeypatch.setattr(autograd_exec, "grad_walk", counted)
    return calls


def _rnn(W, T=3):
    h = tg.tensor(X0)
    for _ in range(T):
        h = tg.tanh(h @ W)
    return h, (h * h).sum()


def _rnn_grad(T=3):
    hs = [X0.astype(np.float64)]
    for _ in range(T):
        hs.append(np.tanh(hs[-1] @ W0))
    g, gw = 2 * hs[-1], np.zeros_like(W0, np.float64)
    for t in range(T, 0, -1):
        g = g * (1 - hs[t] ** 2)
        gw += hs[t - 1].T @ g
        g = g @ W0.T
    return gw


def test_a_graph_recorded_again_reads_the_tape_and_gets_the_same_grads(walks):
    W = tg.tensor(W0, requires_grad=True)
    for _ in range(3):
        _rnn(W)[1].backward()
        np.testing.assert_allclose(W.grad.numpy(), _rnn_grad(), rtol=1e-5)
        W.grad = None
    assert len(walks) == 1
    assert len(mode.tape) == 0      # a backward empties it


def test_another_length_or_leaf_pattern_is_another_key(walks):
    W = tg.tensor(W0, requires_grad=True)
    U = tg.tensor(W0 * 2, requires_grad=True)
    for T in (2, 3, 2, 3):
        _rnn(W, T)[1].backward()
        np.testing.assert_allclose(W.grad.numpy(), _rnn_grad(T), rtol=1e-5)
        W.grad = None
    assert len(walks) == 2
    for a, b in ((W, U), (W, W), (W, U), (W, W)):
        (a * 2.0 + b * 3.0).sum().backward()
    np.testing.assert_array_equal(W.grad.numpy(), np.full((2, 2), 2 * 2 + 5 * 2))
    np.testing.assert_array_equal(U.grad.numpy(), np.full((2, 2), 3 * 2))
    assert len(walks) == 4


@pytest.mark.parametrize("extra", ["tensor_hook", "retain_grad", "node_hook", "leaf_hook"])
def test_hooks_added_after_recording_run(walks, extra):
    W = tg.tensor(W0, requires_grad=True)
    _rnn(W)[1].backward()
    W.grad = None
    seen = []
    h, loss = _rnn(W)
    if extra == "tensor_hook":
        h.register_hook(lambda g: seen.append(1) or g * 2)
    elif extra == "retain_grad":
        h.retain_grad()
    elif extra == "node_hook":
        h.grad_fn.register_hook(lambda gi, go: seen.append(1))
    else:
        W.register_hook(lambda g: seen.append(1) or g * 2)
    loss.backward()
    scale = 2 if extra in ("tensor_hook", "leaf_hook") else 1
    np.testing.assert_allclose(W.grad.numpy(), scale * _rnn_grad(), rtol=1e-5)
    if extra == "retain_grad":
        np.testing.assert_allclose(h.grad.numpy(), 2 * h.detach().numpy(), rtol=1e-6)
    else:
        assert seen == [1]


def test_saved_tensor_hooks_on_a_graph_recorded_again_unpack():
    W = tg.tensor(W0, requires_grad=True)
    _rnn(W)[1].backward()
    W.grad = None
    unpacked = []
    with tg.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(1) or t):
        loss = _rnn(W)[1]
    loss.backward()
    assert unpacked
    np.testing.assert_allclose(W.grad.numpy(), _rnn_grad(), rtol=1e-5)


def test_a_saved_value_changed_in_place_after_recording_raises():
    W = tg.tensor(W0, requires_grad=True)
    _rnn(W)[1].backward()
    h = tg.tensor(X0, requires_grad=True) * 1.0
    loss = (tg.tanh(h @ W) * h).sum()
    loss.backward()
    h = tg.tensor(X0, requires_grad=True) * 1.0
    loss = (tg.tanh(h @ W) * h).sum()
    h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_backward_twice_through_a_graph_seen_before_raises():
    W = tg.tensor(W0, requires_grad=True)
    _rnn(W)[1].backward()
    loss = _rnn(W)[1]
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(W.grad.numpy(), 3 * _rnn_grad(), rtol=1e-5)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_nodes_recorded_before_the_tape_began_are_walked(walks):
    W = tg.tensor(W0, requires_grad=True)
    for k in (2.0, 3.0, 2.0, 3.0):
        pre = W * k       # recorded before the backward below: not on the next tape
        (W * 1.0).sum().backward()
        W.grad = None
        (pre * pre).sum().backward()
        np.testing.assert_allclose(W.grad.numpy(), 2 * k * k * W0, rtol=1e-6)
        W.grad = None


def test_a_pending_leaf_value_is_read_as_it_is_now():
    W = tg.tensor(W0, requires_grad=True)
    w = W0.astype(np.float64)
    for _ in range(4):
        _rnn(W)[1].backward()
        hs = [X0.astype(np.float64)]
        for _ in range(3):
            hs.append(np.tanh(hs[-1] @ w))
        g = W.grad.numpy()
        with tg.no_grad():
            W -= 0.1 * W.grad     # pending until the next graph reads it
        W.grad = None
        w = w - 0.1 * g
    np.testing.assert_allclose(W.detach().numpy(), w, rtol=1e-5)


def test_a_no_grad_use_of_a_differentiable_value(walks):
    x = tg.tensor([[3.0, 1.0], [2.0, 5.0]], requires_grad=True)
    for _ in range(3):
        values, idx = (x * 1.0).max(dim=1)
        loss = (values * idx).sum() + (x * idx.reshape(2, 1)).sum()
        loss.backward()
        np.testing.assert_array_equal(x.grad.numpy(), [[0.0 + 0.0, 0.0], [1.0, 1.0 + 1.0]])
        x.grad = None


@pytest.mark.parametrize("toggle", [(False, True), (True, False)])
@pytest.mark.parametrize("first", [True, False])
def test_a_value_read_with_and_without_a_gradient(toggle, first):
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = tg.tensor([1.0, 1.0], requires_grad=True)
    for untrack in (False,) * 2 + toggle * 2:     # the same ops, one read of x untracked
        x.requires_grad_(not (untrack and first))
        a = y * x
        x.requires_grad_(not (untrack and not first))
        loss = (a * x).sum()
        x.requires_grad_(True)
        loss.backward()
        np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0] if untrack else [2.0, 4.0])
        x.grad = y.grad = None


def test_a_value_read_untracked_then_tracked():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = tg.tensor([1.0, 1.0], requires_grad=True)
    for tracked in (False, False, True, True):
        x.requires_grad_(False)
        a = y * x
        x.requires_grad_(tracked)
        loss = (a * x).sum()
        x.requires_grad_(True)
        loss.backward()
        np.testing.assert_allclose(y.grad.numpy(), [1.0, 4.0])
        if tracked:
            np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0])
        else:
            assert x.grad is None
        x.grad = y.grad = None


def test_a_saved_leaf_changed_in_place_without_grad_raises():
    W = tg.tensor(W0, requires_grad=True)
    x = tg.tensor(X0, requires_grad=True)
    (x @ W).sum().backward()
    loss = (x @ W).sum()
    with tg.no_grad():
        W.mul_(2.0)     # not recorded: the graph looks as before, but W was saved
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_graph_freed_by_another_thread_raises():
    W = tg.tensor(W0, requires_grad=True)
    _rnn(W)[1].backward()
    W.grad = None           # (adding to a grad counts as an in-place change)
    loss = _rnn(W)[1]       # on this thread's tape
    other = threading.Thread(target=loss.backward)
    other.start()
    other.join()
    np.testing.assert_allclose(W.grad.numpy(), _rnn_grad(), rtol=1e-5)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_a_graph_longer_than_the_tape_room_keeps_its_nodes(walks):
    W = tg.tensor(W0, requires_grad=True)
    for _ in range(3):
        h = W * 1.0
        for k in range(TAPE_ROOM * 2):
            h = h * 1.0 if k % 50 else (h * 0.5).sum() * 0.0 + h     # a few dropped too
        (h * h).sum().backward()
        np.testing.assert_allclose(W.grad.numpy(), 2 * W0, rtol=1e-5)
        W.grad = None
    assert len(walks) == 1


def test_a_graph_dropped_without_backward_is_freed():
    W = tg.tensor(W0, requires_grad=True)
    node = weakref.ref(tg.tanh(W * 2.0).grad_fn)    # recorded, then dropped
    kept = W * 3.0
    for _ in range(TAPE_ROOM + 1):
        W * 4.0
    assert node() is None
    assert kept.grad_fn in mode.tape


def test_an_op_recorded_without_a_fast_path_is_freed_without_the_collector():
    """Recording's argument walker called itself through its closure: a cycle that held the
    op's inputs (and their leaves' AccumulateGrads, with any hooks) until the garbage
    collector ran."""
    W = tg.tensor(W0, requires_grad=True)
    gc.disable()
    try:
        y = tg.stack([W, W * 2.0])      # (a list argument: recorded the general way)
        acc = weakref.ref(y.grad_fn.next_functions[0][0])
        y.sum().backward()
        del y
        assert acc() is None
    finally:
        gc.enable()


def test_threads_keep_their_own_tapes():
    W = tg.tensor(W0, requires_grad=True)
    errors = []

    def work(T):
        try:
            for _ in range(20):
                g = tg.autograd.grad(_rnn(W, T)[1], W)[0]
                np.testing.assert_allclose(g.numpy(), _rnn_grad(T), rtol=1e-5)
        except Exception as e:      # reported below: a thread's exception is otherwise lost
            errors.append(e)
    threads = [threading.Thread(target=work, args=(T,)) for T in (2, 3, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_two_leaves_of_one_variable_get_their_own_gradients_from_the_tape(walks):
    """`a.data = b` leaves two leaves holding one variable: each gets the gradient of its own
    uses (as torch; they got one sum, credited to the first one walked), and a slot of its
    own in the tape's key, so later iterations read the plan from the tape."""
    A = tg.tensor(np.zeros(3, np.float32), requires_grad=True)
    B = tg.tensor(np.ones(3, np.float32), requires_grad=True)
    A.data = B
    seen = []
    for i in range(4):
        A.grad = B.grad = None
        x = A * 2.0
        y = B * 3.0
        (y + x if i < 3 else x - y).sum().backward()
        seen.append((A.grad.tolist(), B.grad.tolist()))
    assert seen == [([2, 2, 2], [3, 3, 3])] * 3 + [([2, 2, 2], [-3, -3, -3])]
    # the first graph is walked (the tape may hold other tests' nodes), the second teaches
    # the tape at the latest, the last is new
    assert len(walks) <= 3


def test_graphs_dropped_between_values_read_are_freed():
    """An evaluation with grad on: each batch's graph is dropped after its loss is read. A
    value read prunes the tape, so a dropped batch is not held until the tape's room fills
    (review: 2000 batches of a 1 MiB input kept 86 MiB alive)."""
    W = tg.tensor(W0, requires_grad=True)
    inputs = []
    for _ in range(40):
        x = tg.tensor(np.ones((3, 2), np.float32))
        inputs.append(weakref.ref(x))
        float((tg.tanh(x @ W)).mean().item())
        del x
    alive = sum(r() is not None for r in inputs)
    assert alive <= autograd_exec.REALIZE_PRUNE // 3 + 1


def test_a_plan_evicted_by_another_thread_during_a_lookup_is_still_a_hit():
    """Between an LRU lookup's read and its move to the end, another thread's put can evict
    the key (review: KeyError)."""
    import collections

    class Evicting(collections.OrderedDict):
        def get(self, key, default=None):
            hit = super().get(key, default)
            self.pop(key, None)     # what a put on another thread can do in between
            return hit
    lru = autograd_exec._LRU(4)
    lru.items = Evicting()
    lru.put("k", 1)
    assert lru.get("k") == 1

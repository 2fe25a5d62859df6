"""The one-graph backward's walk (autograd_exec.grad_walk): graphs are told apart by their
structure and by the order their ops were recorded in (the plan's sums follow it)."""
import numpy as np

import tracegrad as tg
from tracegrad.tracer import autograd_exec


def test_one_structure_recorded_in_two_orders_gets_two_plans():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    a = x * 2.0
    b = x * 3.0
    (a + b).sum().backward()
    b = x * 3.0     # the same graph, its two products recorded the other way round
    a = x * 2.0
    (a + b).sum().backward()
    assert len(autograd_exec._grad_graphs.items) == 2
    np.testing.assert_array_equal(x.grad.numpy(), [10.0, 10.0, 10.0])


def test_a_root_given_twice_gets_both_cotangents():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x).sum()
    tg.autograd.backward([y, y], [tg.tensor(2.0), tg.tensor(3.0)])
    np.testing.assert_allclose(x.grad.numpy(), 5 * 2 * np.array([1.0, 2.0, 3.0]))


def test_two_roots_of_one_graph_share_their_nodes():
    x = tg.tensor([0.5, -1.0], requires_grad=True)
    h = tg.tanh(x * 3.0)
    tg.autograd.backward([(h * h).sum(), h.sum()])
    t = np.tanh(np.array([0.5, -1.0]) * 3.0)
    np.testing.assert_allclose(x.grad.numpy(), (2 * t + 1) * (1 - t * t) * 3.0, rtol=1e-5,
                               atol=1e-6)


def test_rnn_lengths_in_any_order_match_the_node_by_node_engine():
    rng = np.random.default_rng(3)
    w0 = (rng.standard_normal((4, 4)) / 2).astype(np.float32)
    xs = rng.standard_normal((6, 1, 4)).astype(np.float32)

    def grads(T, fast):
        W = tg.tensor(w0, requires_grad=True)
        h = tg.zeros(1, 4)
        for t in range(T):
            h = tg.tanh(h @ W + tg.tensor(xs[t]) @ W)
        loss = (h * h).sum()
        if not fast:
            h.register_hook(lambda g: g)    # a hook: the node-by-node engine runs
        loss.backward()
        return W.grad.numpy()
    for T in (3, 6, 1, 3, 5):
        np.testing.assert_allclose(grads(T, True), grads(T, False), rtol=1e-5, atol=1e-6)

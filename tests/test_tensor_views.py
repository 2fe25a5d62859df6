"""Views (reshape, transpose, indexing, expand...) read their base's in-place changes, as
torch's do: tracegrad's views are values, so the base remakes its live views when it changes
(tensor.add_view, refresh_views); a view with a history gets one into the base's new one.
Each program runs in tracegrad and, where installed, PyTorch against the same numbers."""
import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(params=["tracegrad", "torch"])
def lib(request):
    if request.param == "torch":
        return pytest.importorskip("torch")
    return tg


def arange(lib, n, requires_grad=False):
    return lib.tensor(np.arange(n, dtype=np.float32), requires_grad=requires_grad)


def test_views_taken_before_an_in_place_change_read_it(lib):
    a = arange(lib, 6)
    v, r, t = a[1:4], a.view(2, 3), a.view(2, 3).t()
    e, u = a[2].expand(2, 2), a.view(3, 2)[1]
    a.mul_(2.0)
    a[0] = -1.0
    assert v.tolist() == [2, 4, 6]
    assert r.tolist() == [[-1, 2, 4], [6, 8, 10]]
    assert t.tolist() == [[-1, 6], [2, 8], [4, 10]]
    assert e.tolist() == [[4, 4], [4, 4]] and u.tolist() == [4, 6]


def test_writes_through_an_alias_reach_the_bases_views(lib):
    a = arange(lib, 4)
    v, w = a[:2], a.detach()[1:]
    a.detach().add_(1.0)
    a.data.mul_(2.0)
    assert v.tolist() == [2, 4] and w.tolist() == [4, 6, 8]


def test_a_view_of_a_parameter_follows_optimizer_steps_and_its_gradient_the_parameter(lib):
    W = arange(lib, 6, requires_grad=True)
    flat = W.view(2, 3)
    opt = lib.optim.SGD([W], lr=0.5)
    (W * W).sum().backward()
    opt.step()
    assert flat.tolist() == [[0, 0, 0], [0, 0, 0]]
    opt.zero_grad()
    with lib.no_grad():
        W.add_(1.0)
    (flat * flat * 3.0).sum().backward()
    assert W.grad.tolist() == [6] * 6


def test_a_view_with_a_history_gets_the_in_place_ops_in_it(lib):
    x = arange(lib, 4, requires_grad=True)
    y = x * 1.0
    v = y[1:3]
    y.mul_(3.0)
    assert v.tolist() == [3, 6]
    v.sum().backward()
    assert x.grad.tolist() == [0, 3, 3, 0]


def test_data_replaced_leaves_the_views_on_the_old_value(lib):
    a = arange(lib, 3)
    v = a[1:]
    a.data = lib.tensor(np.zeros(3, np.float32))
    a.add_(5.0)
    assert v.tolist() == [1, 2] and a.tolist() == [5, 5, 5]


def test_views_dropped_are_not_remade():
    """A base remakes only the views still alive (the graph keeps a view it saved weakly:
    a loop writing row t+1 of a buffer from row t stays linear)."""
    from tracegrad.tracer.tensor import refresh_views
    W = tg.tensor(np.full((3, 3), 0.1, np.float32), requires_grad=True)
    h = tg.zeros(41, 3)
    calls = [0]

    def count(base):
        calls[0] += 1
        return refresh_views(base)
    import tracegrad.tracer.tensor_ops as ops
    saved, ops.refresh_views = ops.refresh_views, count
    try:
        for t in range(40):
            h[t + 1] = tg.tanh(h[t] @ W + 1.0)
    finally:
        ops.refresh_views = saved
    assert len([r for r, *_ in h._x["views"] if r() is not None]) == 0
    h.sum().backward()
    want = np.zeros((41, 3))
    for t in range(40):
        want[t + 1] = np.tanh(want[t] @ np.full((3, 3), 0.1) + 1.0)
    np.testing.assert_allclose(h.detach().numpy(), want, rtol=1e-5)
    assert W.grad is not None

"""Views (reshape, transpose, indexing, expand...) read their base's in-place changes, as
torch's do: tracegrad's views are values, so the base remakes its live views when it changes
(tensor.register_view, refresh_views); a view with a history gets one into the base's new one.
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


def test_copies_are_not_views(lib):
    """Index arrays, tensors and masks copy, as does reshaping a transposed tensor (torch's
    rules): they keep their values when the base changes, and can change in place."""
    x = lib.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    c = [x[[1, 0]], x[lib.tensor(np.array([1]))], x[x > 2.0], x.t().reshape(-1),
         x.t().flatten(), x.view(3, 2).t().reshape(6)]
    want = [t.tolist() for t in c]
    x.add_(100.0)
    assert [t.tolist() for t in c] == want
    c[0].mul_(2.0)
    assert c[0].tolist() == [[6, 8, 10], [0, 2, 4]]


RESHAPES = {   # what reshaping each view of x (3x4) gives: a view (True) or a copy, as torch
    "x[:, -1].reshape(3, 1)": True, "x[:, 0].flatten()": True, "x.t().reshape(4, 3)": True,
    "x.t().reshape(4, 3, 1)": True, "x.t().t().reshape(-1)": True,
    "x[::2].reshape(2, 2, 2)": True, "x[:1, 1:].reshape(3)": True,
    "x[0:1].t().reshape(4)": True, "x.unsqueeze(0).expand(2, 3, 4).reshape(2, 12)": True,
    "x[:, ::2].flatten()": True, "x.t().reshape(-1)": False, "x[:, 1:].reshape(-1)": False,
    "x[:, 1:3].flatten()": False,
    "x.permute(1, 0).unsqueeze(0).reshape(12)": False, "x.expand(2, 3, 4).reshape(-1)": False,
}


@pytest.mark.parametrize("expr", sorted(RESHAPES))
def test_reshapes_are_views_where_torchs_are(lib, expr):
    x = lib.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = eval(expr, {"x": x})
    before = y.tolist()
    x.add_(1.0)
    assert (y.tolist() != before) == RESHAPES[expr]


def test_contiguous_copies_a_view_laid_out_otherwise(lib):
    x = lib.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    y = x.t().contiguous()
    z = x[1:].contiguous()
    loss = (y * y).sum()
    with lib.no_grad():
        x.add_(1.0)
    loss.backward()                     # y is a copy: x's change is not y's
    assert x.grad.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert y.tolist() == [[0, 3], [1, 4], [2, 5]] and z.tolist() == [[4, 5, 6]]
    q = x.detach().t().contiguous()
    q.mul_(2.0)                         # a copy can change in place
    assert q.tolist() == [[2, 8], [4, 10], [6, 12]]


def test_a_saved_view_changed_through_its_base_fails_backward(lib):
    """Views share their base's version counter: a value saved for backward and changed
    in place since is an error, not a gradient of numbers no longer shown."""
    x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    v = y[1:]
    z = (v * v).sum()
    with lib.no_grad():
        y.mul_(10.0)
    assert v.tolist() == [20, 30]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_an_alias_of_a_view_is_a_view():
    """detach() and .data of a view read its base's changes and, as the view, cannot be
    written through (torch writes the base)."""
    base = tg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    v = base.T
    a, d = v.detach(), v.data
    base.add_(1.0)
    assert a.tolist() == d.tolist() == [[1, 4], [2, 5], [3, 6]]
    for t in (a, d):
        with pytest.raises(RuntimeError, match="in-place operation on a view"):
            t.mul_(2.0)


def test_views_stay_on_a_base_whose_data_was_replaced(lib):
    x = lib.zeros(2, 3)
    v = x.t()
    x.data = lib.ones(4, 5)
    u = v.unsqueeze(0)
    x.add_(1.0)
    assert tuple(u.shape) == (1, 3, 2) and float(u.sum()) == 0.0 and float(x.sum()) == 40.0


def test_rows_written_in_turn_leave_the_other_rows_views_alone():
    """x[t + 1] = f(x[t]) keeping every row: a write remakes only the views it reaches,
    so the loop stays linear; the values are numpy's."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4)) * 0.3).astype(np.float32)
    xs = rng.standard_normal((30, 4)).astype(np.float32)
    W, X = tg.tensor(w), tg.tensor(xs)
    H = tg.zeros(31, 4)
    col = H[:, 0]
    rows, made = [], []
    for t in range(30):
        H[t + 1] = tg.tanh(H[t] @ W + X[t])
        rows.append(H[t + 1])
        made.append(rows[-1]._var)
    assert all(r._var is v for r, v in zip(rows, made, strict=True))    # none remade
    want = np.zeros((31, 4), np.float32)
    for t in range(30):
        want[t + 1] = np.tanh(want[t] @ w + xs[t])
    np.testing.assert_allclose(np.stack([r.numpy() for r in rows]), want[1:], rtol=1e-5)
    np.testing.assert_allclose(col.numpy(), want[:, 0], rtol=1e-5)     # remade every time

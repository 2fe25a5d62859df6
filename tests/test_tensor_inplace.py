"""In-place ops on views: tracegrad's views are values. One made by basic indexing of a
tensor is written through (`x[0] += 1`, `x[0].zero_()`: `x[0] = new`, as PyTorch's write
its storage); any other must raise rather than silently leave the base unchanged."""
import numpy as np
import pytest

import tracegrad as tg


@pytest.mark.parametrize("make_view", [
    lambda x: x.view(6), lambda x: x.reshape(3, 2), lambda x: x.t(), lambda x: x.T,
    lambda x: x.unsqueeze(0), lambda x: x.expand(2, 2, 3), lambda x: x[0][1:],
    lambda x: x.t()[0],
])
def test_inplace_on_a_view_raises(make_view):
    x = tg.zeros(2, 3)
    with pytest.raises(RuntimeError, match="in-place operation on a view"):
        make_view(x).add_(1.0)
    assert x.sum().item() == 0.0


@pytest.mark.parametrize("name", ["tracegrad", "torch"])
def test_inplace_ops_on_an_indexed_view_write_through_to_the_base(name):
    """`y[0] += 1` (docs/api.md's way to write through the base) raised: Python runs += on
    the view y[0] before assigning it back. Now a view by basic indexing writes its base,
    as torch's do: values, the view itself, gradients and the version counter."""
    lib = _lib(name)
    x = lib.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x * 1.0
    y[0] += 1.0
    y[:, 1] *= 2.0
    v = y[1, 1:]
    v.mul_(3.0)
    y[0, ::2].zero_()
    assert y.tolist() == [[0.0, 4.0, 0.0], [3.0, 24.0, 15.0]]
    assert v.tolist() == [24.0, 15.0]
    (y * lib.tensor(np.arange(1.0, 7.0).reshape(2, 3))).sum().backward()
    assert x.grad.tolist() == [[0.0, 4.0, 0.0], [4.0, 30.0, 18.0]]
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x[0].add_(1.0)
    b = lib.zeros(3)
    b[1] += 5.0
    assert b.tolist() == [0.0, 5.0, 0.0]


def test_base_assignment_and_clones_still_work():
    x = tg.zeros(2, 3)
    x[0] = 5.0
    row = x[1].clone()
    row += 1.0
    assert x.tolist() == [[5.0] * 3, [0.0] * 3] and row.tolist() == [1.0] * 3
    a = tg.ones(3, requires_grad=True)
    b = a * 2
    c = b[1:].clone()
    c.mul_(3.0)
    (b.sum() + c.sum()).backward()
    assert a.grad.tolist() == [2.0, 8.0, 8.0]


def _lib(name):
    return tg if name == "tracegrad" else pytest.importorskip(name)


@pytest.mark.parametrize("name", ["tracegrad", "torch"])
def test_inplace_ops_keep_the_value_they_replaced_through_saved_tensor_hooks(name):
    """A pack hook returning the tensor it is given (t.cpu(), the identity here) saw the
    tensor an in-place op then changed: y.grad came out as the new c, [1, 3, 6] (review)."""
    import numpy as np
    lib = _lib(name)
    x = lib.tensor(np.array([0.5, 1.0, 1.5], np.float32), requires_grad=True)
    y = lib.tensor(np.array([2.0, 3.0, 4.0], np.float32), requires_grad=True)
    with lib.autograd.graph.saved_tensors_hooks(lambda t: t.cpu(), lambda t: t):
        c = x * 1
        c.mul_(y)
    c.sum().backward()
    assert y.grad.tolist() == [0.5, 1.0, 1.5] and x.grad.tolist() == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("name", ["tracegrad", "torch"])
def test_an_inplace_op_promoting_its_operand_keeps_the_value_it_replaced(name):
    """f32 c.mul_(f64 y): the product is cast back to c's dtype; the op's saved c (not the
    cast's) is the value replaced — backward raised 'modified by an inplace operation'."""
    import numpy as np
    lib = _lib(name)
    x = lib.tensor(np.array([0.5, 1.0], np.float32), requires_grad=True)
    y = lib.tensor(np.array([2.0, 4.0], np.float64), requires_grad=True)
    c = x * 1
    c.mul_(y)
    c.sum().backward()
    assert y.grad.tolist() == [0.5, 1.0] and x.grad.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("name", ["tracegrad", "torch"])
def test_data_has_a_version_counter_of_its_own(name):
    """`.data` (unlike detach()) does not share the version counter, as in torch: an in-place
    change through it writes through, raises nothing at backward, and leaves W's version.
    (The gradient is the recorded graph's: torch's backward would read the new value.)"""
    import numpy as np
    lib = _lib(name)
    W = lib.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    z = W * W
    d = W.data
    d.add_(1.0)
    assert W.detach().numpy().tolist() == [2.0, 3.0, 4.0]
    assert W._version == 0 if name == "torch" else W._vc[0] == 0
    z.sum().backward()      # no "modified by an inplace operation"
    assert W.grad is not None
    assert W.detach().clone().add_(1).tolist() == [3.0, 4.0, 5.0]


def _rows_into_a_buffer(W, h0, C, steps):
    """An RNN writing each state into a row of a preallocated buffer (and, every other step,
    a strided piece of the row before it), the loss reading the whole buffer."""
    buf = tg.zeros(steps + 1, 6, dtype=tg.float64)
    h = h0
    for t in range(steps):
        h = tg.tanh(h @ W)
        buf[t + 1] = h[0]
        if t % 2:
            buf[t, ::-2] = h[0, 1::2] * 0.5
    return (buf * C).sum()


def test_rows_written_into_a_buffer_differentiate_and_replay():
    """Slice assignment in a loop: each write is one update_slice (recorded once per index,
    so a second pass replays the cached plan); gradients against central differences."""
    import numpy as np
    rng = np.random.default_rng(3)
    W0, h0 = rng.normal(size=(6, 6)) * 0.5, rng.normal(size=(1, 6))
    C = rng.normal(size=(9, 6))

    def loss(w):
        return _rows_into_a_buffer(tg.tensor(w), tg.tensor(h0), tg.tensor(C), 8).item()

    eps = 1e-6
    fd = np.zeros_like(W0)
    for i in np.ndindex(*W0.shape):
        d = np.zeros_like(W0)
        d[i] = eps
        fd[i] = (loss(W0 + d) - loss(W0 - d)) / (2 * eps)
    for _ in range(2):
        W = tg.tensor(W0, requires_grad=True)
        out = _rows_into_a_buffer(W, tg.tensor(h0), tg.tensor(C), 8)
        out.backward()
        assert out.grad_fn.name() == "SumBackward0"
        np.testing.assert_allclose(out.item(), loss(W0), rtol=1e-13)
        np.testing.assert_allclose(W.grad.numpy(), fd, rtol=1e-6, atol=1e-8)

"""In-place ops on views: tracegrad's views are values, so writing through one must raise
rather than silently leave the base unchanged (PyTorch would write through)."""
import pytest

import tracegrad as tg


@pytest.mark.parametrize("make_view", [
    lambda x: x[0], lambda x: x.view(6), lambda x: x.reshape(3, 2), lambda x: x.t(),
    lambda x: x.T, lambda x: x.unsqueeze(0), lambda x: x.expand(2, 2, 3),
])
def test_inplace_on_a_view_raises(make_view):
    x = tg.zeros(2, 3)
    with pytest.raises(RuntimeError, match="in-place operation on a view"):
        make_view(x).add_(1.0)
    assert x.sum().item() == 0.0


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

"""examples/autograd_tutorial.py runs as written and prints PyTorch's numbers."""
import contextlib
import io
import os
import runpy

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "autograd_tutorial.py")


@pytest.fixture(scope="module")
def tutorial():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        env = runpy.run_path(EXAMPLE, run_name="__main__")
    return env, out.getvalue()


def test_tutorial_prints_what_pytorch_prints(tutorial):
    _, text = tutorial
    assert "Gradient function for z = <AddBackward0 object at" in text
    assert "Gradient function for loss = <BinaryCrossEntropyWithLogitsBackward0 object" in text
    assert "True\nFalse\nFalse\n" in text
    first = ("First call\ntensor([[4., 2., 2., 2., 2.],\n        [2., 4., 2., 2., 2.],\n"
             "        [2., 2., 4., 2., 2.],\n        [2., 2., 2., 4., 2.]])")
    second = ("Second call\ntensor([[8., 4., 4., 4., 4.],\n        [4., 8., 4., 4., 4.],\n"
              "        [4., 4., 8., 4., 4.],\n        [4., 4., 4., 8., 4.]])")
    assert first in text and second in text
    assert "Call after zeroing gradients\ntensor([[4., 2., 2., 2., 2.]," in text


def test_tutorial_gradients_match_torch(tutorial):
    torch = pytest.importorskip("torch")
    env, _ = tutorial
    w = torch.tensor(env["w"].detach().numpy(), requires_grad=True)
    b = torch.tensor(env["b"].detach().numpy(), requires_grad=True)
    z = torch.matmul(torch.ones(5), w) + b
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.zeros(3))
    loss.backward()
    np.testing.assert_allclose(env["w"].grad.numpy(), w.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(env["b"].grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(env["inp"].grad.numpy(),
                               np.where(np.eye(4, 5) == 1, 4.0, 2.0))

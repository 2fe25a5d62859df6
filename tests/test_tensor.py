"""tg.Tensor: creation, attributes, values, repr, operators, graph introspection, grad modes,
in-place ops and their errors (PyTorch's wording)."""
import os
import sys
import threading
import warnings

import numpy as np
import pytest

import tracegrad as tg


def close(t, expected, tol=1e-5):
    np.testing.assert_allclose(t.detach().numpy(), expected, rtol=tol, atol=tol)


# ---- creation and attributes ---------------------------------------------------------------------

def test_factories_shapes_dtypes_and_requires_grad():
    assert tg.ones(2, 3).shape == (2, 3) and tg.ones((2, 3)).shape == (2, 3)
    assert tg.zeros(4).dtype == np.float32
    assert tg.tensor([1, 2]).dtype == np.int64
    assert tg.tensor([1.0, 2.0]).dtype == np.float32
    assert tg.tensor([1.0], dtype=tg.float64).dtype == np.float64
    assert tg.full((2,), 7.0).tolist() == [7.0, 7.0]
    assert tg.arange(5).tolist() == [0, 1, 2, 3, 4]
    close(tg.linspace(0, 1, 5), [0, 0.25, 0.5, 0.75, 1])
    close(tg.eye(2, 3), np.eye(2, 3))
    x = tg.randn(3, 4, requires_grad=True)
    assert x.requires_grad and x.is_leaf and x.grad is None and x.grad_fn is None
    assert tg.ones_like(x).shape == (3, 4) and not tg.zeros_like(x).requires_grad
    assert tg.rand(100).numpy().min() >= 0
    assert x.ndim == 2 and x.size() == (3, 4) and x.size(1) == 4 and x.numel() == 12


def test_manual_seed_makes_randn_reproducible():
    tg.manual_seed(3)
    a = tg.randn(5).numpy()
    tg.manual_seed(3)
    np.testing.assert_array_equal(a, tg.randn(5).numpy())


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(RuntimeError, match="Only Tensors of floating point dtype can require"):
        tg.tensor([1, 2], requires_grad=True)
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype can require"):
        tg.ones(2, dtype=tg.int64).requires_grad_()


def test_values_item_tolist_bool():
    x = tg.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.sum().item() == 10.0
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert bool(x.sum() > 5) and float(x[0, 1]) == 2.0
    with pytest.raises(RuntimeError, match="a Tensor with 4 elements cannot be converted"):
        x.item()
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one"):
        bool(x)
    with pytest.raises(RuntimeError, match="Can't call numpy\\(\\) on Tensor that requires"):
        tg.ones(2, requires_grad=True).numpy()


def test_python_control_flow_on_values():
    x = tg.tensor(3.0, requires_grad=True)
    y = x * 2 if (x > 0) else x * -1
    y.backward()
    assert x.grad.item() == 2.0


# ---- repr ----------------------------------------------------------------------------------------

def test_repr_like_pytorch():
    assert repr(tg.tensor([1.0, 2.0], requires_grad=True)) == \
        "tensor([1., 2.], requires_grad=True)"
    x = tg.tensor(1.5, requires_grad=True)
    assert repr(x * 2) == "tensor(3., grad_fn=<MulBackward0>)"
    assert repr(tg.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(tg.tensor([0.12345678, 2.0])) == "tensor([0.1235, 2.0000])"
    assert repr(tg.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"
    assert repr(tg.eye(2, dtype=tg.float64)) == \
        "tensor([[1., 0.],\n        [0., 1.]], dtype=tg.float64)"
    assert repr(tg.tensor([])) == "tensor([])"
    assert "..." in repr(tg.zeros(2000))
    assert f"{tg.tensor(2.5):.2f}" == "2.50"


# ---- operators -----------------------------------------------------------------------------------

def test_operators_and_reflected_operators_with_numpy_and_scalars():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a = np.ones((2, 3), np.float32)
    close(a @ x, [6.0, 6.0])
    close(2.0 * x, [2, 4, 6])
    close(1 - x, [0, -1, -2])
    close(2 ** x, [2, 4, 8])
    close(6 / x, [6, 3, 2])
    close(-x + abs(x), [0, 0, 0])
    assert (x > 1).tolist() == [False, True, True]
    assert (x == 2).tolist() == [False, True, False]
    y = (a @ x).sum()
    y.backward()
    close(x.grad, [2, 2, 2])


def test_methods_with_dim_and_keepdim_aliases():
    m = tg.tensor([[1.0, 5.0], [3.0, 2.0]], requires_grad=True)
    assert m.sum(dim=1, keepdim=True).shape == (2, 1)
    close(m.mean(dim=0), [2.0, 3.5])
    values, indices = m.max(dim=1)
    close(values, [5, 3])
    assert indices.tolist() == [1, 0]
    assert m.max().item() == 5.0
    assert m.t().shape == (2, 2) and m.T.shape == (2, 2)
    assert m.reshape(4).shape == (4,) and m.view(-1, 1).shape == (4, 1)
    assert m.unsqueeze(0).shape == (1, 2, 2) and m.unsqueeze(0).squeeze().shape == (2, 2)
    assert m.transpose(0, 1)[0, 1].item() == 3.0
    close(m.pow(2).sqrt(), m.detach().numpy())
    close(m.exp().log(), m.detach().numpy(), 1e-4)
    close(m.tanh(), np.tanh(m.detach().numpy()))
    close(m.sigmoid(), 1 / (1 + np.exp(-m.detach().numpy())))
    close((m - 2).relu(), np.maximum(m.detach().numpy() - 2, 0))
    close(m.matmul(m), m.detach().numpy() @ m.detach().numpy())
    close(m.clone().abs(), m.detach().numpy())
    assert m.double().dtype == np.float64 and m.float() is m


def test_every_tg_op_accepts_tensors():
    x = tg.tensor([0.5, 1.5], requires_grad=True)
    for f in (tg.exp, tg.log, tg.sin, tg.cos, tg.tanh, tg.sigmoid, tg.sqrt, tg.relu,
              tg.square, tg.abs, tg.log1p, tg.expm1, tg.erf):
        y = f(x)
        assert isinstance(y, tg.Tensor) and y.requires_grad
    assert tg.maximum(x, 1.0).tolist() == [1.0, 1.5]
    assert tg.where(x > 1, x, 0.0).tolist() == [0.0, 1.5]
    assert tg.concatenate([x, x]).shape == (4,) and tg.stack([x, x]).shape == (2, 2)
    assert tg.logsumexp(x).requires_grad
    z = tg.nn.functional.softmax(x, axis=0)
    close(z.sum(), 1.0)


def test_indexing_and_slice_assignment():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = tg.zeros(3)
    b[1:] = x[1:] * 2
    assert b.tolist() == [0.0, 4.0, 6.0]
    assert b.grad_fn.name() == "CopySlices" and not b.is_leaf
    b.sum().backward()
    close(x.grad, [0, 2, 2])
    m = tg.zeros(2, 3)
    m[0, 1] = 5.0
    m[1] = tg.tensor([1.0, 2.0, 3.0])
    assert m.tolist() == [[0, 5, 0], [1, 2, 3]]
    assert x[x > 1].tolist() == [2.0, 3.0]


def test_slice_assignment_broadcasts_as_numpy():
    """None in the index, and a value with leading 1s beyond the target's rank (numpy and
    torch drop them), through the gradient too."""
    v = tg.tensor(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), requires_grad=True)
    w = tg.tensor(np.array([2.0], np.float32), requires_grad=True)
    x = tg.zeros(3, 4) * 1.0
    want = np.zeros((3, 4), np.float32)
    x[0] = v * 2.0
    want[0] = np.array([[2.0, 4.0, 6.0, 8.0]])
    x[None, 1:, None, 2] = w
    want[None, 1:, None, 2] = 2.0
    x[1:, None] = x[1:, None] + 1.0
    want[1:, None] = want[1:, None] + 1.0
    x[1, None, 1:3] = 7.0
    want[1, None, 1:3] = 7.0
    np.testing.assert_array_equal(x.detach().numpy(), want)
    (x * x).sum().backward()
    assert v.grad.shape == (1, 4) and w.grad.shape == (1,)
    np.testing.assert_allclose(v.grad.numpy(), [[8, 16, 24, 32]])    # 2 * 2 * 2v
    np.testing.assert_allclose(w.grad.numpy(), [2 * (2 + 1)])        # row 2's; row 1's is 7


# ---- graph introspection -------------------------------------------------------------------------

def test_grad_fn_names_next_functions_and_is_leaf():
    x = tg.ones(2, requires_grad=True)
    c = tg.ones(2)
    y = x * c
    assert y.grad_fn.name() == "MulBackward0"
    (acc, idx), (none, _) = y.grad_fn.next_functions
    assert acc.name() == "AccumulateGrad" and acc.variable is x and idx == 0 and none is None
    z = (y + 1).sum()
    assert z.grad_fn.name() == "SumBackward0"
    assert z.grad_fn.next_functions[0][0].name() == "AddBackward0"
    assert not z.is_leaf and x.is_leaf and c.is_leaf and not c.requires_grad
    assert (c * 2).grad_fn is None and not (c * 2).requires_grad
    assert "<MulBackward0 object at" in repr(y.grad_fn)


def test_saved_tensors_are_visible_and_freed_after_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.pow(2)
    assert y.grad_fn._saved_self is x and y.grad_fn._saved_exponent == 2
    e = x.exp()
    r = e.grad_fn._saved_result
    assert r is not e and r.equal(e)
    w = x * x
    w.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second"):
        _ = w.grad_fn._saved_self
    with pytest.raises(AttributeError):
        _ = x.sum().grad_fn._saved_self


# ---- grad modes ----------------------------------------------------------------------------------

def test_no_grad_enable_grad_set_grad_enabled_nest():
    x = tg.ones(2, requires_grad=True)
    with tg.no_grad():
        assert not (x * 2).requires_grad and (x * 2).grad_fn is None
        with tg.enable_grad():
            assert (x * 2).requires_grad
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()
    with tg.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    tg.set_grad_enabled(False)
    assert not tg.is_grad_enabled()
    tg.set_grad_enabled(True)
    assert (x * 2).requires_grad


def test_grad_modes_as_decorators():
    x = tg.ones(2, requires_grad=True)

    @tg.no_grad()
    def f():
        return x * 2

    @tg.no_grad
    def g():
        return x * 2

    @tg.inference_mode()
    def h():
        return x * 2
    assert not f().requires_grad and not g().requires_grad
    assert h().is_inference() and not h().requires_grad
    assert tg.is_grad_enabled()


def test_grad_mode_is_thread_local():
    seen = []
    with tg.no_grad():
        t = threading.Thread(target=lambda: seen.append(tg.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_inference_mode_tensors():
    with tg.inference_mode():
        t = tg.ones(2)
        assert (t * 2).is_inference()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside"):
        t.add_(1)
    w = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        w * t


# ---- detach and requires_grad_ -------------------------------------------------------------------

def test_detach_and_requires_grad_():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.is_leaf and d.tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        y.requires_grad_(False)
    y.detach_()
    assert y.is_leaf and not y.requires_grad
    c = tg.ones(2)
    assert c.requires_grad_().requires_grad
    c.requires_grad = False
    assert not c.requires_grad


# ---- in-place ------------------------------------------------------------------------------------

def test_inplace_on_leaf_requiring_grad_raises_but_works_under_no_grad():
    w = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used"):
        w.add_(1)
    with tg.no_grad():
        w -= 0.5 * tg.ones(2)
        w.mul_(2)
    assert w.tolist() == [1.0, 1.0] and w.is_leaf and w.requires_grad


def test_version_counter_and_modified_saved_tensor_error():
    x = tg.ones(3, requires_grad=True)
    e = x.exp()
    assert e._vc[0] == 0
    e.add_(1)
    assert e._vc[0] == 1
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient "
                       "computation has been modified by an inplace operation: "
                       r"\[tg.FloatTensor \[3\]\], which is output 0 of Exp, is at version 1; "
                       "expected version 0 instead"):
        e.sum().backward()
    a = x.clone()
    b = a * a
    a.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


def test_inplace_on_non_leaf_records_history():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    y += x
    y *= 3
    assert y.grad_fn.name() == "MulBackward0"
    y.sum().backward()
    close(x.grad, [6, 6])
    b = tg.zeros(2)
    b += x
    assert b.grad_fn.name() == "AddBackward0"


def test_inplace_through_detach_and_data_reaches_the_original():
    w = tg.ones(2, requires_grad=True)
    w.data.mul_(3)
    assert w.tolist() == [3.0, 3.0] and w.requires_grad
    d = w.detach()
    d.zero_()
    assert w.tolist() == [0.0, 0.0]


def test_optimizer_update_loop_under_no_grad():
    tg.manual_seed(0)
    w = tg.randn(3, 3, requires_grad=True)
    x = tg.ones(3)
    losses = []
    for _ in range(40):
        loss = (w @ x).pow(2).sum()
        loss.backward()
        with tg.no_grad():
            w -= 0.02 * w.grad
        w.grad.zero_()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.1
    assert w.is_leaf and w.grad.tolist() == [[0.0] * 3] * 3


def test_non_leaf_grad_warns_unless_retained():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    (y * y).sum().backward()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        assert y.grad is None
    assert "is not a leaf Tensor is being accessed" in str(ws[0].message)


def test_replayed_ops_carry_their_own_source_line():
    x = tg.ones(3, requires_grad=True)
    line = sys._getframe().f_lineno
    a = x * 2.0
    b = a * 2.0     # same signature: recorded from the cached template
    c = tg.tanh(b)
    here = f"{os.path.basename(__file__)}:"
    assert a.grad_fn.eqns[0].source == f"{here}{line + 1}"
    assert b.grad_fn.eqns[0].source == f"{here}{line + 2}"
    assert c.grad_fn.eqns[0].source == f"{here}{line + 3}"
    for _ in range(2):      # one call site, recorded twice
        d = x * 2.0
        assert d.grad_fn.eqns[0].source == f"{here}{line + 9}"


@pytest.mark.parametrize("transform", ["jit", "grad"])
def test_a_tensor_on_either_side_of_a_traced_value_is_a_constant_of_the_trace(transform):
    """`a * W` with a traced a and a Tensor W requiring grad raised "Can't call numpy() on
    Tensor that requires grad" (the traced value's operator asked W for an array); `W * a`
    worked. Both now read W's value as a constant of the trace (review)."""
    W = tg.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    a = np.array([0.5, -1.0, 2.0], np.float32)
    forms = {"a * W": lambda a: a * W, "W * a": lambda a: W * a,
             "a - W.sum(0)": lambda a: a - W.sum(0), "a / W": lambda a: a / W,
             "a < W": lambda a: tg.where(a < W, a, 0.0)}
    for name, f in forms.items():
        fn = (tg.jit if transform == "jit" else tg.grad)(lambda a, f=f: tg.sum(f(a) * a))
        got = np.asarray(fn(a))
        w, x = np.array([1.0, 2.0, 3.0], np.float32), a
        want = {"jit": {"a * W": (x * w * x).sum(), "W * a": (w * x * x).sum(),
                        "a - W.sum(0)": ((x - w.sum()) * x).sum(), "a / W": (x / w * x).sum(),
                        "a < W": (np.where(x < w, x, 0) * x).sum()},
                "grad": {"a * W": 2 * x * w, "W * a": 2 * w * x,
                         "a - W.sum(0)": 2 * x - w.sum(), "a / W": 2 * x / w,
                         "a < W": np.where(x < w, 2 * x, 0)}}[transform][name]
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
    assert W.grad is None


def test_torch_keyword_spellings_of_cat_stack_and_clamp():
    """torch's `dim=` for cat/stack and `min=`/`max=` for clamp were TypeErrors."""
    a = np.arange(6.0).reshape(2, 3) - 2
    x = tg.tensor(a, requires_grad=True)
    assert tg.cat([x, x], dim=1).shape == (2, 6) and tg.stack([x, x], dim=-1).shape == (2, 3, 2)
    y = x.clamp(min=-1.0) + x.clamp(max=1.0) + tg.clamp(x, min=0.0, max=2.0)
    np.testing.assert_array_equal(y.detach().numpy(),
                                  np.maximum(a, -1) + np.minimum(a, 1) + np.clip(a, 0, 2))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), (a >= -1) * 1.0 + (a <= 1) + (a >= 0) * (a <= 2))
    z = x.detach().clone()
    z.clamp_(min=0.0)
    assert z.tolist() == np.maximum(a, 0).tolist()
    with pytest.raises(TypeError, match="unexpected keyword argument 'low'"):
        x.clamp(low=0.0)

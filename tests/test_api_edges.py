"""Edge cases of the numpy and Tensor APIs found by fuzzing against numpy and torch: each
gave a wrong result, a wrong error or an unclear one. torch/jax comparisons skip when they
are not installed; every test also checks its expected values directly."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg

try:
    import torch
except ImportError:     # (the bench extra)
    torch = None


def test_tensor_squeeze_of_a_dim_not_of_size_one_keeps_it():
    """torch's squeeze(dim) leaves a dim of another size alone (numpy's raises, and so does
    tg.squeeze); the view still carries gradients to its base."""
    x = tg.tensor(np.arange(6.0).reshape(2, 1, 3), requires_grad=True)
    assert x.squeeze(0).shape == (2, 1, 3)
    assert x.squeeze(1).shape == x.squeeze(-2).shape == x.squeeze((0, 1)).shape == (2, 3)
    assert x.squeeze(dim=1).shape == x.squeeze().shape == (2, 3)
    assert tg.tensor(3.0).squeeze(0).shape == ()
    (x.squeeze(0) * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 1, 3), 2.0))
    with pytest.raises(IndexError, match="squeeze: axis 3"):
        x.squeeze(3)
    with pytest.raises(tg.ShapeError, match="size not equal to one"):
        tg.squeeze(np.ones((2, 3)), 0)
    if torch is not None:
        t = torch.arange(6.0).reshape(2, 1, 3)
        for d in (0, 1, -2, (0, 1)):
            assert x.squeeze(d).shape == tuple(t.squeeze(d).shape)


@pytest.mark.parametrize("fn", ["all", "any"])
def test_all_and_any(fn):
    a = np.array([[1, 0, 2], [3, 4, 5]])
    cases = [a, a > 1, np.array([[np.nan, 0.0], [0.0, 0.0]]), np.zeros((2, 0)),
             np.array(2.5)]
    for x in cases:
        for axis in (None, 0, -1, (0, 1)) if x.ndim == 2 else (None,):
            want = getattr(np, fn)(x, axis=axis)
            for got in (getattr(tg, fn)(x, axis=axis),
                        tg.jit(lambda v: getattr(tg, fn)(v, axis=axis))(x),
                        getattr(tg.tensor(x), fn)(*(() if axis is None else (axis,))).numpy()):
                got = np.asarray(got)
                assert got.dtype == np.bool_ and np.array_equal(got, want), (x, axis, got)
        kept = getattr(tg, fn)(x, axis=-1 if x.ndim else None, keepdims=True)
        assert np.array_equal(kept, getattr(np, fn)(x, axis=-1 if x.ndim else None,
                                                  keepdims=True))
    assert getattr(tg.tensor(a), fn)(dim=1, keepdim=True).shape == (2, 1)
    if torch is not None:
        t = torch.from_numpy(a)
        assert np.array_equal(getattr(tg.tensor(a), fn)(1).numpy(),
                              getattr(t, fn)(1).numpy())


def test_softmax_and_logsumexp_over_an_empty_axis():
    """As torch: softmax over a zero-length dim is empty, logsumexp over one is -inf."""
    x = np.ones((2, 0))
    F = tg.nn.functional
    assert F.softmax(tg.tensor(x), dim=1).shape == (2, 0)
    assert F.log_softmax(x, axis=-1).shape == (2, 0)
    np.testing.assert_array_equal(tg.logsumexp(x, axis=1), [-np.inf, -np.inf])
    np.testing.assert_array_equal(tg.logsumexp(x, axis=1, keepdims=True), [[-np.inf]] * 2)
    assert tg.logsumexp(x, axis=0).shape == (0,)
    np.testing.assert_array_equal(tg.jit(lambda v: tg.logsumexp(v, axis=1))(x), [-np.inf] * 2)
    if torch is not None:
        np.testing.assert_array_equal(torch.logsumexp(torch.ones(2, 0), 1).numpy(),
                                      tg.logsumexp(x, axis=1))


def test_reductions_of_a_0d_tensor_take_dim_0():
    """torch lets a 0-d tensor reduce over dim 0 or -1 (itself); it raised out of range."""
    t = tg.tensor(3.0, requires_grad=True)
    for got in (t.sum(dim=0), t.sum(-1), t.mean(0), t.logsumexp(0), t.max(0).values,
                tg.sum(np.array(3.0), axis=0)):
        assert got.shape == () and float(got) == 3.0
    assert int(t.argmax(0)) == 0 and int(tg.argmax(np.array(3.0), axis=-1)) == 0
    assert tg.tensor(3.0).transpose(0, -1).shape == ()
    t.sum(dim=0).backward()
    assert float(t.grad) == 1.0
    with pytest.raises(tg.AxisError, match="axis 1 is out of bounds"):
        t.sum(1)


def test_axis_arguments_are_checked_by_name():
    """A float axis, an axis tuple for argmax and a repeated axis each raise a clear error
    (they raised a bare TypeError, passed, or called the axis out of range)."""
    a = np.ones((2, 3))
    with pytest.raises(TypeError, match="axis must be an int or a tuple of ints, got 1.0"):
        tg.sum(a, axis=1.0)
    with pytest.raises(TypeError, match=r"argmax: axis must be an int or None, got \(0,\)"):
        tg.argmax(a, axis=(0,))
    with pytest.raises(tg.AxisError, match=r"duplicate value in axis \(0, 0\)"):
        tg.sum(a, axis=(0, 0))
    with pytest.raises(tg.AxisError, match="duplicate"):
        tg.max(a, axis=(1, -1))
    np.testing.assert_array_equal(tg.sum(a, axis=np.int64(1)), [3.0, 3.0])


def test_concatenate_axis_none_and_broadcast_to_an_int():
    """numpy's spellings: axis=None concatenates the flattened arrays; a shape may be an
    int."""
    a, b = np.arange(4.0).reshape(2, 2), np.arange(3.0)
    want = np.concatenate([a, b], axis=None)
    np.testing.assert_array_equal(tg.concatenate([a, b], axis=None), want)
    np.testing.assert_array_equal(tg.jit(lambda u, v: tg.concatenate([u, v], axis=None))(a, b),
                                  want)
    g = tg.grad(lambda u: tg.sum(tg.concatenate([u, u], axis=None) * np.arange(8.0)))(a)
    np.testing.assert_array_equal(g, np.arange(4.0).reshape(2, 2) * 2 + 4)
    np.testing.assert_array_equal(tg.broadcast_to(np.array([2.0]), 3), [2.0, 2.0, 2.0])
    assert tg.broadcast_to(np.ones(1), np.int64(4)).shape == (4,)


def test_bce_with_logits_needs_target_of_the_input_size():
    F = tg.nn.functional
    with pytest.raises(ValueError, match=r"target size \(4,\) must be the same as input size "
                                         r"\(3,\)"):
        F.binary_cross_entropy_with_logits(tg.tensor(np.ones(3)), tg.tensor(np.ones(4)))
    z, y = np.array([0.5, -2.0, 3.0]), np.array([1.0, 0.0, 1.0])
    want = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
    np.testing.assert_allclose(float(F.binary_cross_entropy_with_logits(z, y)), want)


MASK_INDEXES = [
    lambda x: (slice(None), np.array([True, False, True])),
    lambda x: np.array([True, False]),
    lambda x: [True, False],
    lambda x: (x[..., 0] > 5,),
    lambda x: (x[..., 0] > 5, 1),
    lambda x: (0, np.array([True, False, True]), slice(1, 3)),
    lambda x: (Ellipsis, np.array([True, False, True, True])),
    lambda x: ([True, False], [0, 2]),
    lambda x: (np.zeros((2, 3), bool),),
    lambda x: (None, x[..., 0] > 5),
]


@pytest.mark.parametrize("k", range(len(MASK_INDEXES)))
def test_concrete_boolean_masks_index_as_numpy_and_torch(k):
    """A concrete mask (a numpy bool array, a list of bools) indexes by its True entries:
    under jit as numpy's (its length is known when tracing, as JAX takes it), on Tensors as
    torch's (ints selecting first), with gradients; it raised "data-dependent shape"."""
    x = np.arange(24.0).reshape(2, 3, 4)
    index = MASK_INDEXES[k](x)
    want = x[index]
    got = tg.jit(lambda a: a[index])(x)
    assert got.shape == want.shape and np.array_equal(got, want)
    g = tg.grad(lambda a: tg.sum(a[index] * a[index]))(x)
    mask = np.zeros_like(x)
    np.add.at(mask, index, 1.0)
    np.testing.assert_array_equal(g, 2 * x * (mask > 0))
    t = tg.tensor(x, requires_grad=True)
    r = t[index]
    r.sum().backward()
    if torch is not None:
        tt = torch.tensor(x, requires_grad=True)
        tr = tt[index]
        tr.sum().backward()
        assert r.shape == tuple(tr.shape) and np.array_equal(r.detach().numpy(), tr.detach())
        np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())
    if not any(type(i) is int for i in (index if type(index) is tuple else (index,))):
        assert np.array_equal(r.detach().numpy(), want)     # (no int: numpy's order too)


def test_boolean_mask_shape_and_updates():
    x = np.arange(12.0).reshape(3, 4)
    m = np.array([True, False, True])
    with pytest.raises(IndexError, match="boolean index did not match indexed array along "
                                         "axis 0; size of axis is 3 but size of "
                                         "corresponding boolean axis is 2"):
        tg.jit(lambda a: a[np.array([True, False])])(x)
    want = x.copy()
    want[m] = -1.0
    np.testing.assert_array_equal(tg.jit(lambda a: a.at[m].set(-1.0))(x), want)
    t = tg.tensor(x.copy())
    t[m] = -1.0
    np.testing.assert_array_equal(t.numpy(), want)
    t = tg.tensor(x.copy())
    t[0, [True, False, True, True]] = 5.0
    np.testing.assert_array_equal(t.numpy()[0], [5.0, 1.0, 5.0, 5.0])
    with pytest.raises(IndexError, match="boolean scalar"):
        tg.jit(lambda a: a[True])(x)



def test_boolean_tensor_masks_inside_a_tuple_index():
    """A bool Tensor beside ints, slices or '...' masks as torch's (it raised "data-dependent
    shape" unless it was the whole index), reading and writing."""
    x = np.arange(24.0).reshape(2, 3, 4)
    m3, m4, m1 = np.array([True, False, True]), np.array([True, False, True, True]), \
        np.array([True, False])
    cases = [(lambda M: (0, M(m3)), x[0][m3]), (lambda M: (0, slice(None), M(m4)), x[0][:, m4]),
             (lambda M: (M(m1), slice(None), 1), x[m1][:, :, 1]),
             (lambda M: (Ellipsis, M(m4)), x[..., m4])]
    for index, want in cases:
        t = tg.tensor(x, requires_grad=True)
        r = t[index(tg.tensor)]
        (r * r).sum().backward()
        np.testing.assert_array_equal(r.detach().numpy(), want)
        assert np.array_equal(t.grad.numpy() != 0, np.isin(x, want) & (x != 0))
        if torch is not None:
            tt = torch.tensor(x, requires_grad=True)
            (tt[index(torch.from_numpy)] ** 2).sum().backward()
            np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())
    t = tg.tensor(x.copy())
    t[1, tg.tensor(m3)] = 5.0
    want = x.copy()
    want[1][m3] = 5.0
    np.testing.assert_array_equal(t.numpy(), want)


def test_traced_values_have_all_any_and_checked_squeeze_dims():
    x = np.array([[1.0, -2.0], [0.0, 3.0]])
    assert tg.jit(lambda a: (a > 0).any())(x) == np.True_
    np.testing.assert_array_equal(tg.jit(lambda a: a.all(axis=1))(x), [True, False])
    assert tg.nn.functional.softmax(np.ones((2, 0)), axis=np.int64(1)).shape == (2, 0)
    with pytest.raises(tg.AxisError, match="out of bounds for an array of dimension 0"):
        tg.tensor(3.0).squeeze(1)
    with pytest.raises(IndexError, match=r"squeeze: dim \(1, -2\) repeats a dim"):
        tg.tensor(np.ones((2, 1, 1))).squeeze((1, -2))


ELLIPSIS_GAPS = [   # a '...' of no axes between two advanced items, on shape (5, 3, 4)
    (slice(0, 2), [0, 1, 2], Ellipsis, [1, 2, 3]),
    (slice(None), 0, Ellipsis, [1, 2]),
    (slice(None), np.array([True, False, True]), Ellipsis, [1, 2]),
    ([[0], [1]], Ellipsis, [1, 2], slice(1, 3)),
    (Ellipsis, [0, 1], [1, 2]),     # (no gap: '...' is first)
]


@pytest.mark.parametrize("k", range(len(ELLIPSIS_GAPS)))
def test_an_ellipsis_of_no_axes_parts_index_arrays_as_numpy(k):
    """numpy takes index arrays with a '...' between them as apart even where the '...'
    stands for no axes, and lays their axes first; torch takes them as adjacent. jit and
    the numpy API follow numpy (reading, `.at` updates, gradients), Tensors torch."""
    index = ELLIPSIS_GAPS[k]
    x = np.random.default_rng(k).standard_normal((5, 3, 4))
    want = x[index]
    got = tg.jit(lambda x: x[index])(x)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    v = np.random.default_rng(9).standard_normal(want.shape)
    y = x.copy()
    y[index] = v
    np.testing.assert_array_equal(tg.jit(lambda x, v: x.at[index].set(v))(x, v), y)
    g = np.zeros_like(x)
    np.add.at(g, index, v)
    np.testing.assert_allclose(tg.grad(lambda x: tg.sum(x[index] * v))(x), g)
    if torch is not None:
        tindex = tuple(torch.as_tensor(i) if isinstance(i, (list, np.ndarray)) else i
                       for i in index)
        want_t = torch.from_numpy(x)[tindex]
        t = tg.tensor(x, requires_grad=True)
        got_t = t[tuple(np.asarray(i) if isinstance(i, list) else i for i in index)]
        assert got_t.shape == tuple(want_t.shape)
        np.testing.assert_array_equal(got_t.detach().numpy(), want_t.numpy())


def test_index_arrays_that_do_not_broadcast_raise_index_error():
    x = np.ones((5, 3))
    for f in (lambda x: x[[0, 1], [0, 1, 2]], lambda x: x.at[[0, 1], [0, 1, 2]].set(1.0)):
        with pytest.raises(IndexError, match=r"shape mismatch: .* \(2,\) \(3,\).*test_api_edges"):
            tg.jit(f)(x)
    with pytest.raises(IndexError, match="shape mismatch"):
        tg.tensor(x)[np.array([0, 1]), np.array([0, 1, 2])]
    with np.testing.assert_raises(IndexError):      # numpy's own class
        x[[0, 1], [0, 1, 2]]


def test_jvp_tangents_must_have_their_primals_dtype():
    """As JAX: an array tangent of another dtype is a TypeError (it had been cast without a
    word); a Python number takes its primal's dtype."""
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match="tangent 0 has dtype float64 but its primal has "
                                        "dtype float32"):
        tg.jvp(tg.tanh, (x,), (np.ones(3),))
    out, t = tg.jvp(tg.tanh, (np.float32(2.0),), (1.0,))
    assert t.dtype == np.float32
    np.testing.assert_allclose(t, 1 - np.tanh(np.float32(2.0)) ** 2, rtol=1e-6)


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_as_numpy_and_torch(name):
    """tg.var/tg.std and traced x.var() are numpy's (ddof 0 unless given); Tensor.var/std
    are torch's (Bessel's correction unless unbiased=False or another correction)."""
    x = np.random.default_rng(0).standard_normal((4, 5))
    ref = getattr(np, name)
    for kw in ({}, {"axis": 0}, {"axis": 1, "ddof": 1, "keepdims": True},
               {"axis": (0, 1), "ddof": 3}):
        want = ref(x, **kw)
        np.testing.assert_allclose(getattr(tg, name)(x, **kw), want)
        np.testing.assert_allclose(tg.jit(lambda x: getattr(x, name)(**kw))(x), want)
    g = tg.grad(lambda x: tg.sum(getattr(tg, name)(x, axis=0, ddof=1)))(x)
    eps = 1e-6
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        fd[i] = (ref(x + d, axis=0, ddof=1).sum() - ref(x - d, axis=0, ddof=1).sum()) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)
    assert np.isnan(getattr(tg, name)(np.array([1.0]), ddof=1))     # no degrees of freedom
    for kw, ddof in (({}, 1), ({"dim": 0}, 1), ({"dim": 1, "keepdim": True}, 1),
                     ({"unbiased": False}, 0), ({"correction": 2, "dim": (0, 1)}, 2)):
        t = tg.tensor(x, requires_grad=True)
        y = getattr(t, name)(**kw)
        axis = kw.get("dim")
        want = ref(x, axis=axis, ddof=ddof, keepdims=kw.get("keepdim", False))
        np.testing.assert_allclose(y.detach().numpy(), want)
        y.sum().backward()
        if torch is not None:
            tt = torch.tensor(x, requires_grad=True)
            getattr(tt, name)(**kw).sum().backward()
            np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy())
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        getattr(tg.tensor(np.arange(4)), name)()


def test_tensor_mean_of_integers_raises_as_torch():
    t = tg.tensor(np.arange(4))
    with pytest.raises(RuntimeError, match="mean\\(\\): could not infer output dtype.*Long"):
        t.mean()
    y = t.mean(dtype=tg.float64)
    assert y.dtype == np.float64 and y.item() == 1.5
    assert tg.mean(np.arange(4)) == 1.5     # the numpy API takes them

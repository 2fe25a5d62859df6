"""Functional updates of an indexed part, JAX's `x.at[index].set(v)` (and add, multiply, ...)
on traced values, and the Tensor API's `x[index] = v`: values against numpy, derivatives
against central differences in float64 and against jax where installed, and the errors."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import anchors, check_grads, rand

import tracegrad as tg

torch, jax = anchors()

X = rand(4, 5, seed=1, low=-2, high=2)
V = rand(1, 5, seed=2, low=0.5, high=2)

# name -> (update of traced x by v, the same on a numpy copy y)
UPDATES = {
    "set_row": (lambda x, v: x.at[1].set(v[0]), lambda y, v: y.__setitem__(1, v[0])),
    "set_strided": (lambda x, v: x.at[::-2, 1:4].set(v[:, :3]),
                    lambda y, v: y.__setitem__((slice(None, None, -2), slice(1, 4)), v[:, :3])),
    "set_broadcast": (lambda x, v: x.at[:, None, 2].set(v[0, :4, None]),
                      lambda y, v: y.__setitem__((slice(None), None, 2), v[0, :4, None])),
    "add_column": (lambda x, v: x.at[..., -1].add(v[0, :4]),
                   lambda y, v: y.__setitem__((Ellipsis, -1), y[..., -1] + v[0, :4])),
    "subtract": (lambda x, v: x.at[2:].subtract(v), lambda y, v: y.__setitem__(
        slice(2, None), y[2:] - v)),
    "multiply": (lambda x, v: x.at[1:3, ::2].multiply(v[:, :3]),
                 lambda y, v: y.__setitem__((slice(1, 3), slice(None, None, 2)),
                                            y[1:3, ::2] * v[:, :3])),
    "divide": (lambda x, v: x.at[0].divide(v[0]), lambda y, v: y.__setitem__(0, y[0] / v[0])),
    "power": (lambda x, v: x.at[3].power(v[0]),     # (of |x|: see _ours)
              lambda y, v: (np.abs(y, out=y), y.__setitem__(3, y[3] ** v[0]))),
    "add_indices": (lambda x, v: x.at[np.array([0, 3, 0])].add(v),
                    lambda y, v: np.add.at(y, [0, 3, 0], v)),
    "add_indices_axis1": (lambda x, v: x.at[:, [4, 4, 1]].add(v[0, :3]),
                          lambda y, v: np.add.at(y, (slice(None), [4, 4, 1]), v[0, :3])),
    # the other updates by an index array: repeated indices apply in order (numpy's ufunc.at;
    # set: the last one wins)
    "set_indices": (lambda x, v: x.at[np.array([3, 0, 3])].set(v * ROWS),
                    lambda y, v: [y.__setitem__(i, r) for i, r in zip([3, 0, 3], v * ROWS)]),
    "set_indices_unique": (lambda x, v: x.at[np.array([2, 0])].set(v[0] * ROWS[:2]),
                           lambda y, v: y.__setitem__([2, 0], v[0] * ROWS[:2])),
    "set_indices_axis1": (lambda x, v: x.at[:, [4, 1]].set(v[0, :4, None]),
                          lambda y, v: y.__setitem__((slice(None), [4, 1]), v[0, :4, None])),
    "multiply_indices": (lambda x, v: x.at[[1, 2, 1]].multiply(v * ROWS),
                         lambda y, v: np.multiply.at(y, [1, 2, 1], v * ROWS)),
    "divide_indices": (lambda x, v: x.at[[0, 0]].divide(v),
                       lambda y, v: np.divide.at(y, [0, 0], v)),
    "min_indices": (lambda x, v: x.at[:, [0, 2, 0]].min(v[0, :3]),
                    lambda y, v: np.minimum.at(y, (slice(None), [0, 2, 0]), v[0, :3])),
    "max_indices_2d": (lambda x, v: x.at[np.array([[2], [0]])].max(v - 1.0),
                       lambda y, v: np.maximum.at(y, np.array([[2], [0]]), v - 1.0)),
}
ROWS = np.array([[1.0], [-2.0], [3.0]])


def _ours(name):
    fn = UPDATES[name][0]
    if name == "power":     # (a positive base)
        return lambda x, v: fn(tg.abs(x), v) * 1.0
    return fn


def _numpy(name, x, v):
    y = np.array(x)
    UPDATES[name][1](y, v)
    return y


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_updates_match_numpy_traced_and_jitted(name):
    want = _numpy(name, X, V)
    f = lambda x, v: _ours(name)(x, v) * 1.0    # noqa: E731
    jf = tg.jit(f)
    np.testing.assert_allclose(jf(X, V), want, rtol=1e-14)
    np.testing.assert_allclose(jf(X, V), want, rtol=1e-14)     # (the cached call)
    g = tg.make_ir(f)(X, V)
    np.testing.assert_allclose(tg.ir.interpret(g, [X, V])[0], want, rtol=1e-14)
    np.testing.assert_allclose(X, rand(4, 5, seed=1, low=-2, high=2))   # x itself unchanged


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_update_derivatives_against_finite_differences(name):
    # (jitted: check_grads also calls it on numpy arrays, which have no .at, as in jax)
    check_grads(tg.jit(lambda x, v: tg.sin(_ours(name)(x, v))), [X, V])


def test_get_is_indexing():
    f = lambda x: x.at[1:, ::2].get() * 2.0    # noqa: E731
    np.testing.assert_array_equal(tg.jit(f)(X), X[1:, ::2] * 2.0)


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("name", ["set_row", "set_strided", "add_column", "multiply",
                                  "add_indices", "add_indices_axis1", "set_indices_unique",
                                  "set_indices_axis1", "min_indices", "max_indices_2d"])
def test_updates_and_gradients_match_jax(name):
    jnp = jax.numpy     # (in float64: conftest.anchors turns x64 on)
    ours = lambda x, v: tg.sum(tg.sin(_ours(name)(x, v)))   # noqa: E731
    theirs = lambda x, v: jnp.sum(jnp.sin(_ours(name)(x, v)))   # noqa: E731
    v, g = tg.value_and_grad(ours, argnums=(0, 1))(X, V)
    jv, jg = jax.value_and_grad(theirs, argnums=(0, 1))(jnp.asarray(X), jnp.asarray(V))
    np.testing.assert_allclose(v, float(jv), rtol=1e-12)
    for a, b in zip(g, jg, strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-10, atol=1e-12)


def test_a_jitted_loop_filling_a_buffer():
    """`buf = buf.at[t].set(h)` in a loop: one update_slice per step, differentiated through
    every write (the later steps read what the earlier wrote)."""
    def loss(w, h):
        buf = tg.zeros((6, 3), dtype=np.float64)
        for t in range(6):
            h = tg.tanh(h @ w + buf[max(t - 2, 0)])
            buf = buf.at[t].set(h)
        return tg.sum(buf * buf)
    w, h = rand(3, 3, seed=5), rand(3, seed=6)
    check_grads(tg.jit(loss), [w, h])
    g = tg.jit(tg.grad(loss))
    for _ in range(2):
        np.testing.assert_allclose(g(w, h), tg.grad(loss)(w, h), rtol=1e-12)


def test_update_errors_name_the_update_and_the_axis():
    with pytest.raises(IndexError, match=r"at\[\]\.set: index 4 is out of bounds for axis 0 "
                                         r"with size 4"):
        tg.jit(lambda x: x.at[4].set(0.0))(X)
    with pytest.raises(IndexError, match=r"at\[\]\.add: index 7 is out of bounds for axis 0"):
        tg.jit(lambda x: x.at[np.array([1, 7])].add(1.0))(X)
    with pytest.raises(IndexError, match=r"at\[\]\.add: index -9 is out of bounds for axis 1 "
                                         r"with size 5"):
        tg.jit(lambda x: x.at[:, [2, -9]].add(1.0))(X)
    with pytest.raises(IndexError, match=r"at\[\]\.subtract: index 7 is out of bounds"):
        tg.jit(lambda x: x.at[np.array([1, 7])].subtract(1.0))(X)
    with pytest.raises(NotImplementedError, match=r"at\[\]\.set: only ints, slices"):
        tg.jit(lambda x: x.at[1, 2.5].set(0.0))(X)
    with pytest.raises(IndexError, match=r"at\[\]\.multiply: index 4 is out of bounds"):
        tg.jit(lambda x: x.at[[0, 4]].multiply(2.0))(X)


def test_updates_by_index_array_keep_the_dtype_as_basic_ones_do():
    xi = np.arange(6, dtype=np.int32) + 3
    got = tg.jit(lambda x: x.at[[1, 1, 4]].divide(2))(xi)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, tg.jit(lambda x: x.at[4].divide(2).at[1].divide(2)
                                             .at[1].divide(2))(xi))
    # a small negative index type into a long axis (it overflowed adding the length)
    got = tg.jit(lambda x: x.at[np.array([-100], np.int8)].set(0.0))(np.ones(300))
    assert got[200] == 0.0 and got.sum() == 299


def test_set_by_index_array_writes_each_index_once():
    """Only the last entry of a repeated index counts: one scatter, however many repeats."""
    idx = np.array([3, 1, 3] * 50)
    g = tg.make_ir(lambda x, v: x.at[idx].set(v))(X, rand(150, 5, seed=4))
    assert [e.op for e in g.eqns].count("scatter") == 1
    v = rand(150, 5, seed=4)
    want = np.array(X)
    want[1], want[3] = v[148], v[149]
    np.testing.assert_array_equal(tg.jit(lambda x, v: x.at[idx].set(v))(X, v), want)


def test_set_by_index_array_copies_values_exactly():
    """-0.0, NaN and inf land as they are (the rounds copy, never add)."""
    got = tg.jit(lambda x: x.at[[2, 0, 2]].set(np.array([np.nan, -np.inf, -0.0])))(np.ones(3))
    assert np.isneginf(got[0]) and got[1] == 1.0 and got[2] == 0.0 and np.signbit(got[2])
    np.testing.assert_array_equal(tg.jit(lambda x: x.at[np.array([], np.int64)].set(5.0))(
        np.ones(3)), np.ones(3))


# update name -> (the update by a traced index array i, the same on a numpy copy y)
BY_TRACED = {
    "set": (lambda x, v, i: x.at[i].set(v),
            lambda y, v, i: [y.__setitem__(k, r) for k, r in zip(i, v)]),
    "multiply": (lambda x, v, i: x.at[i].multiply(v), lambda y, v, i: np.multiply.at(y, i, v)),
    "min": (lambda x, v, i: x.at[i].min(v), lambda y, v, i: np.minimum.at(y, i, v)),
    "max": (lambda x, v, i: x.at[i].max(v), lambda y, v, i: np.maximum.at(y, i, v)),
    # (as JAX: x divided by, or raised to, the product of each row's updates)
    "divide": (lambda x, v, i: x.at[i].divide(v),
               lambda y, v, i: np.divide.at(y, i, _row_products(y, v, i))),
    "power": (lambda x, v, i: tg.abs(x).at[i].power(v), lambda y, v, i: (
        np.abs(y, out=y), np.power.at(y, i, _row_products(y, v, i)))),
}
IDX = np.array([3, 0, 3, -1])     # a repeat, and -1 the row 3 again
VI = rand(4, 5, seed=7, low=0.5, high=2)


def _row_products(y, v, i):
    """Per entry of i: the product of all the updates to its row, once per row."""
    prod = np.ones_like(y)
    np.multiply.at(prod, i, v)
    rows = np.unique(np.asarray(i) % len(y))
    return prod[rows], rows


@pytest.mark.parametrize("name", sorted(BY_TRACED))
def test_updates_by_a_traced_index_array(name):
    """The index array an argument of the jitted function: values against numpy's ufunc.at
    (natively and on the interpreter), derivatives against central differences."""
    ours, ref = BY_TRACED[name]
    want = np.array(X)
    if name in ("divide", "power"):
        prods, rows = _row_products(want, VI, IDX)
        if name == "power":
            want = np.abs(want)
        want[rows] = want[rows] / prods if name == "divide" else want[rows] ** prods
    else:
        ref(want, VI, IDX)
    jf = tg.jit(ours)
    np.testing.assert_allclose(jf(X, VI, IDX), want, rtol=1e-13)
    np.testing.assert_allclose(jf(X, VI, IDX.astype(np.int32)), want, rtol=1e-13)
    g = tg.make_ir(ours)(X, VI, IDX)
    assert "scatter" in {e.op for e in g.eqns}
    np.testing.assert_allclose(tg.ir.interpret(g, [X, VI, IDX])[0], want, rtol=1e-13)
    check_grads(lambda x, v: tg.sin(jf(x, v, IDX)), [X, VI])


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("name", sorted(BY_TRACED))
def test_updates_by_a_traced_index_array_match_jax(name):
    jnp = jax.numpy
    ours, _ = BY_TRACED[name]
    # jax differentiates its scatter_mul (multiply, divide, power) by repeated indices only
    # with unique_indices=True
    idx = np.array([3, 0, 1, -2]) if name in ("multiply", "divide", "power") else IDX
    v = VI.copy()
    v[2, 1] = X[3, 1] if name in ("min", "max") else v[2, 1]    # (a tie)
    if name in ("multiply", "divide", "power"):
        at = (lambda x, i: x.at[i]) if name != "power" else (lambda x, i: abs(x).at[i])
        ours = lambda x, v, i: getattr(at(x, i), name)(v, unique_indices=True)  # noqa: E731
    f = lambda x, v, i: tg.sum(tg.sin(ours(x, v, i)))    # noqa: E731
    jfn = lambda x, v, i: jnp.sum(jnp.sin(ours(x, v, i)))   # noqa: E731
    val, grads = tg.jit(tg.value_and_grad(f, argnums=(0, 1)))(X, v, idx)
    jval, jgrads = jax.jit(jax.value_and_grad(jfn, argnums=(0, 1)))(X, v, idx)
    np.testing.assert_allclose(val, float(jval), rtol=1e-12)
    for a, b in zip(grads, jgrads, strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-10, atol=1e-12)


def test_updates_by_a_traced_index_array_carry_nan_and_drop_or_clip():
    """As JAX: a traced index out of bounds drops its update (mode "clip": clamped); min and
    max carry a NaN, and its derivative is 0 where the result is NaN, x's alone where no
    update lands."""
    def f(x, v, i, mode=None):
        return x.at[i].max(v, mode=mode), x.at[i].min(v, mode=mode), x.at[i].set(v, mode=mode)
    x, v = np.array([1.0, np.nan, 3.0]), np.array([np.nan, 2.0, 9.0])
    hi, lo, put = tg.jit(f)(x, v, np.array([0, 1, 7]))
    np.testing.assert_array_equal(hi, [np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(lo, [np.nan, np.nan, 3.0])
    np.testing.assert_array_equal(put, [np.nan, 2.0, 3.0])
    hi, lo, put = tg.jit(f, static_argnums=(3,))(x, v, np.array([0, 1, 7]), "clip")
    np.testing.assert_array_equal(hi, [np.nan, np.nan, 9.0])
    np.testing.assert_array_equal(put, [np.nan, 2.0, 9.0])
    # several arrays: an entry out of bounds on any axis is dropped; add too
    got = tg.jit(lambda x, i, j: x.at[i, j].add(1.0))(X, np.array([0, 9, 1]), np.array([-6, 0, 1]))
    want = np.array(X)
    want[1, 1] += 1.0
    np.testing.assert_array_equal(got, want)
    # a concrete index out of bounds raises, or is clamped with mode="clip"
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        tg.jit(lambda x: x.at[np.array([7])].set(0.0))(x)
    np.testing.assert_array_equal(tg.jit(lambda x: x.at[np.array([7])].set(0.0, mode="clip"))(x),
                                  [1.0, np.nan, 0.0])
    # an int of a basic index too (JAX's "clip" clamps both)
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        tg.jit(lambda x: x.at[7].set(0.0))(x)
    np.testing.assert_array_equal(tg.jit(lambda x: x.at[7].set(0.0, mode="clip"))(x),
                                  [1.0, np.nan, 0.0])
    want = np.array(X)
    want[0, 1:] += 1.0
    np.testing.assert_array_equal(tg.jit(lambda y: y.at[-5, 1:].add(1.0, mode="clip"))(X), want)
    with pytest.raises(ValueError, match=r"at\[\]\.set: mode must be one of"):
        tg.jit(lambda x: x.at[np.array([1])].set(0.0, mode="wrap"))(x)
    gx, gv = tg.grad(lambda x, v: tg.sum(x.at[np.array([0, 1, 2])].max(v) * np.array(
        [1.0, 2.0, 3.0])), argnums=(0, 1))(x, np.array([np.nan, 3.0, 3.0]))
    np.testing.assert_array_equal(gx, [0.0, 0.0, 1.5])
    np.testing.assert_array_equal(gv, [0.0, 0.0, 1.5])
    d = tg.grad(lambda x: tg.sum(x.at[np.array([2])].max(np.array([1.0]))))(x)
    np.testing.assert_array_equal(d, [1.0, 1.0, 1.0])


X3 = rand(3, 4, 5, seed=8)
# several index arrays (and ints among them) as numpy reads them: (x, index, where the result's
# broadcast axes go)
MERGED = {
    "rows_cols": (X, lambda i, j: (i, j)),                  # x[rows, cols]
    "int_and_array": (X3, lambda i, j: (1, slice(None), j)),      # apart: axes go first
    "arrays_apart": (X3, lambda i, j: (i, slice(None), j)),
    "arrays_together": (X3, lambda i, j: (slice(1, 3), i[:, None], j)),   # broadcast 2-d
    "reversed_slice": (X3, lambda i, j: (i, slice(None, None, -2), 0)),
    # a new axis (None) parts the indexed axes as a slice does: their axes go first
    "arrays_new_axis_between": (X, lambda i, j: (i, None, j)),
    "int_new_axis_array": (X3, lambda i, j: (1, None, i)),    # (was laid out (1, 4, 5))
    "new_axis_first": (X, lambda i, j: (None, i, j, None)),
}
I_ROWS, J_COLS = np.array([2, 0, 2, -1]), np.array([4, 1, 4, 0])   # (2, 4) repeats


@pytest.mark.parametrize("name", sorted(MERGED))
def test_indexing_by_several_arrays_matches_numpy(name):
    """x[rows, cols] and the like (were NotImplementedError): the indexed axes merged into one
    and taken from, traced indices too; gradients against central differences."""
    x, index = MERGED[name]
    want = x[index(I_ROWS, J_COLS)]
    np.testing.assert_array_equal(tg.jit(lambda x: x[index(I_ROWS, J_COLS)])(x), want)
    got = tg.jit(lambda x, i, j: x[index(i, j)])(x, I_ROWS, J_COLS.astype(np.int32))
    np.testing.assert_array_equal(got, want)
    check_grads(lambda x: tg.jit(lambda x, i, j: tg.sin(x[index(i, j)]))(x, I_ROWS, J_COLS),
                [x])


def test_traced_indices_read_from_several_axes_are_clamped_per_axis():
    got = tg.jit(lambda x, i, j: x[i, j])(X, np.array([5, -9, -1]), np.array([1, 7, -7]))
    np.testing.assert_array_equal(got, [X[3, 1], X[0, 4], X[3, 0]])


def _numpy_update(kind, y, index, v):
    """`kind` at y[index] by v, repeated entries in order (set: the last wins)."""
    if kind == "set":
        idx = tuple(np.broadcast_arrays(*[i for i in index if not isinstance(i, slice)]))
        assert all(not isinstance(i, slice) for i in index)
        vb = np.broadcast_to(v, idx[0].shape)
        for k in np.ndindex(idx[0].shape):
            y[tuple(i[k] for i in idx)] = vb[k]
        return
    {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}[kind].at(
        y, index, v)


@pytest.mark.parametrize("kind", ["set", "add", "multiply", "min", "max"])
@pytest.mark.parametrize("traced", [False, True])
def test_updates_by_several_arrays(kind, traced):
    """x.at[rows, cols].<kind>(v): one scatter (or scatter_add) on the merged axes;
    repeated pairs apply in order."""
    v = rand(4, seed=9, low=-2, high=2)
    want = np.array(X)
    _numpy_update(kind, want, (I_ROWS, J_COLS), v)

    def f(x, v, i, j):
        return getattr(x.at[i, j], kind)(v)
    if traced:
        jf = lambda x, v: tg.jit(f)(x, v, I_ROWS, J_COLS)     # noqa: E731
    else:
        jf = tg.jit(lambda x, v: f(x, v, I_ROWS, J_COLS))
    np.testing.assert_allclose(jf(X, v), want, rtol=1e-14)
    check_grads(lambda x, v: tg.sin(jf(x, v)), [X, v])


def test_updates_by_an_int_and_arrays_on_sliced_axes():
    """Ints beside an array, arrays a slice apart, non-full slices: as numpy lays x[index]
    out (v broadcasts to it)."""
    v = rand(2, 4, seed=10)
    for index in [(1, slice(None), [0, 4]), ([0, 2], slice(1, None, 2), [3, -1]),
                  (slice(1, 3), [1, 3], slice(None, 4))]:
        want = np.array(X3)
        want[index] = want[index] * 2.0 + 1.0
        got = tg.jit(lambda x: x.at[index].set(x[index] * 2.0 + 1.0))(X3)
        np.testing.assert_allclose(got, want, rtol=1e-14)
    want = np.array(X3)
    np.add.at(want, (0, slice(None), [1, 1]), v)     # (x[0, :, [1, 1]] is 2 x 4)
    np.testing.assert_allclose(tg.jit(lambda x, v: x.at[0, :, [1, 1]].add(v))(X3, v), want,
                               rtol=1e-14)


def test_updates_with_a_new_axis_beside_index_arrays():
    """x.at[i, None, j] (was NotImplementedError): x with a size-1 axis where the None is,
    updated as numpy would update that, and laid out as x again."""
    for index in [(I_ROWS, None, I_ROWS), (None, 1, slice(None), J_COLS[:3]),
                  (I_ROWS[:2], None, slice(1, 3), None, J_COLS[:2])]:
        want = np.array(X3)
        shape = iter(X3.shape)
        view = want.reshape([1 if i is None else next(shape) for i in index]
                            + list(X3.shape[len([i for i in index if i is not None]):]))
        np.add.at(view, tuple(slice(None) if i is None else i for i in index), 1.5)
        np.testing.assert_array_equal(tg.jit(lambda x: x.at[index].add(1.5))(X3), want)
        check_grads(lambda x: tg.sin(tg.jit(lambda x: x.at[index].multiply(x[index]))(x)),
                    [X3])


@pytest.mark.skipif(jax is None, reason="jax is not installed")
@pytest.mark.parametrize("kind", ["get", "set", "add", "min", "max"])
def test_several_arrays_match_jax(kind):
    jnp = jax.numpy
    i, j = np.array([2, 0, 2, 1]), np.array([4, 1, 4, 0])

    def f(x, v, i, j, np_=tg):
        y = x[i, :, j] if kind == "get" else getattr(x.at[i, :, j], kind)(v)
        return np_.sum(np_.sin(y))
    v = rand(4, 4, seed=11)
    v[2, 3] = X3[0, 3, 1]       # (a tie for min/max)
    val, grads = tg.jit(tg.value_and_grad(f, argnums=(0, 1)))(X3, v, i, j)
    jval, jgrads = jax.jit(jax.value_and_grad(lambda x, v, i, j: f(x, v, i, j, jnp),
                                              argnums=(0, 1)))(X3, v, i, j)
    np.testing.assert_allclose(val, float(jval), rtol=1e-12)
    for a, b in zip(grads, jgrads, strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("index", [(1, slice(None), [0, 2]), (1, None, [0, 2]),
                                   (Ellipsis, -1, [3, 0]), ([2, 0], 1, [1, 4])])
def test_tensor_ints_beside_index_arrays_select_first_as_torch(index):
    """A Tensor's t[1, :, idx] is t[1][:, idx], as torch (numpy lays idx's axis first: the
    functional API's x[1, :, idx] does), for reading and for assignment; gradients too."""
    arrays = tuple(np.array(i) if isinstance(i, list) else i for i in index)
    ints = tuple(i if type(i) is int else slice(None) for i in arrays if i is not None)
    rest = tuple(i for i in arrays if type(i) is not int)
    want = X3[ints][rest]
    w = tg.tensor(np.array(X3), requires_grad=True)
    y = w[arrays]
    np.testing.assert_array_equal(y.detach().numpy(), want)
    v = tg.tensor(rand(*want.shape, seed=12), requires_grad=True)
    u = w * 2.0
    u[arrays] = v * 3.0
    (u * u + y.sum()).sum().backward()
    expect = X3 * 2.0
    expect[ints][rest] = v.detach().numpy() * 3.0       # (expect[ints]: a view, written)
    np.testing.assert_allclose(u.detach().numpy(), expect, rtol=1e-15)
    if torch is not None:
        wt = torch.tensor(np.array(X3), requires_grad=True)
        vt = torch.tensor(v.detach().numpy(), requires_grad=True)
        ti = tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
        yt = wt[ti]
        ut = wt * 2.0
        ut[ti] = vt * 3.0
        (ut * ut + yt.sum()).sum().backward()
        np.testing.assert_allclose(u.detach().numpy(), ut.detach().numpy(), rtol=1e-15)
        np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-14)
        np.testing.assert_allclose(v.grad.numpy(), vt.grad.numpy(), rtol=1e-14)


def test_tensor_slice_assignment_out_of_bounds_raises_as_torch():
    """It wrapped around before (t[5] = 1 on 3 elements wrote t[2])."""
    t = tg.zeros(3)
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 3"):
        t[5] = 1.0
    t[-3] = 2.0
    assert t.tolist() == [2.0, 0.0, 0.0]


@pytest.mark.parametrize("index", ["rows_cols", "tensors", "list"])
def test_tensor_assignment_by_index_arrays(index):
    """t[rows, cols] = v (torch's index_put_; was NotImplementedError): values and
    gradients against torch where installed, else against numpy and by hand."""
    idx = {"rows_cols": (np.array([0, 3]), np.array([1, -2])),
           "tensors": (tg.tensor(np.array([0, 3])), tg.tensor(np.array([1, -2]))),
           "list": [1, 3]}[index]
    w = tg.tensor(np.array(X), requires_grad=True)
    v = tg.tensor(np.array(0.5), requires_grad=True)
    u = w * 2.0
    u[idx] = v * 3.0
    (u * u).sum().backward()
    np_idx = tuple(np.asarray(i.numpy() if isinstance(i, tg.Tensor) else i) for i in idx) \
        if isinstance(idx, tuple) else idx
    want = X * 2.0
    want[np_idx] = 1.5
    np.testing.assert_allclose(u.detach().numpy(), want, rtol=1e-15)
    written = np.zeros(X.shape, bool)
    written[np_idx] = True
    np.testing.assert_allclose(w.grad.numpy(), np.where(written, 0.0, 8.0 * X), rtol=1e-14)
    np.testing.assert_allclose(v.grad.numpy(), 2 * 1.5 * 3.0 * written.sum(), rtol=1e-14)
    if torch is not None:
        wt = torch.tensor(np.array(X), requires_grad=True)
        vt = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
        ut = wt * 2.0
        ut[tuple(torch.as_tensor(i) for i in np_idx) if isinstance(idx, tuple) else
           torch.as_tensor(idx)] = vt * 3.0
        (ut * ut).sum().backward()
        np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-14)
        np.testing.assert_allclose(v.grad.numpy(), vt.grad.numpy(), rtol=1e-14)


def test_tensor_assignment_by_a_repeated_index_differentiates_the_value_written():
    """Of a repeated index the last value is written, and only it gets a gradient (torch's
    index_put_ counts every repeat in the gradient, though each but the last is
    overwritten; a repeated index is undefined behaviour there)."""
    w = tg.tensor(np.array(X), requires_grad=True)
    v = tg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    u = w * 1.0
    u[np.array([2, 0, 2]), 1] = v
    assert u[2, 1].item() == 3.0 and u[0, 1].item() == 2.0
    u.sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), [0.0, 1.0, 1.0])


def test_updates_by_an_index_array_of_an_empty_array():
    """x with a size-0 axis beside the indexed one (the references reshaped by -1)."""
    x, i = np.zeros((3, 0)), np.array([1, -1])
    for kind in ("set", "add", "min", "multiply"):
        f = lambda x, i, kind=kind: getattr(x.at[i], kind)(1.0)     # noqa: E731
        assert tg.ir.interpret(tg.make_ir(f)(x, i), [x, i])[0].shape == (3, 0)
        assert tg.jit(f)(x, i).shape == (3, 0)


def test_tensor_assignment_by_an_index_array_out_of_bounds_raises_as_torch():
    t = tg.zeros(4, 2)
    for index in [tg.tensor(np.array([7])), np.array([0, -5]), (slice(None), [1, 2])]:
        with pytest.raises(IndexError, match="slice assignment: index -?[0-9]+ is out of bounds"):
            t[index] = 1.0
    assert not t.numpy().any()


def test_tensor_indexing_by_a_tensor_out_of_bounds_raises_as_torch():
    """A tensor index is recorded as an input, a traced one: out of bounds it was clamped
    silently (t[tensor([0, 5])] of 3 rows read rows 0 and 2)."""
    t = tg.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    for index in [tg.tensor(np.array([0, 5])), (slice(None), tg.tensor(np.array([-9]))),
                  (tg.tensor(np.array([1])), tg.tensor(np.array([4])))]:
        with pytest.raises(IndexError, match="indexing: index -?[0-9]+ is out of bounds"):
            t[index]
    rows = t[tg.tensor(np.array([2, -3]))]
    np.testing.assert_array_equal(rows.detach().numpy(), [[8, 9, 10, 11], [0, 1, 2, 3]])


def test_tensor_assignment_by_a_boolean_mask_tensor_still_fills():
    """t[mask] = v with a bool tensor is masked_fill (the index-array bounds check, which
    runs before recording an update by index arrays, once refused it)."""
    t = tg.zeros(4)
    t[tg.tensor(np.array([True, False, True, False]))] = 1.0
    assert t.tolist() == [1.0, 0.0, 1.0, 0.0]



@pytest.mark.parametrize("mask_of", ["tensor", "array"])
def test_tensor_assignment_by_a_mask_takes_values_and_masks_of_leading_axes(mask_of):
    """torch's t[mask] = v with one value per masked entry (a ShapeError before), and a mask
    of the leading axes, with a scalar (it broadcast against the trailing axes) or values;
    a numpy bool array as a bool tensor. Gradients against torch where installed."""
    def run(lib, mask_fn):
        x = lib.tensor(np.arange(-3.0, 3.0).reshape(2, 3), requires_grad=True)
        y = x * 1.0
        y[mask_fn(np.array([[False, True, True], [True, False, False]]))] = \
            x[mask_fn(np.array([[True, False, True], [False, False, True]]))] * 5.0
        y[mask_fn(np.array([False, True]))] = 0.5
        z = y * 1.0
        z[mask_fn(np.array([True, False]))] = lib.tensor(np.array([[1.0, 2.0, 3.0]])) * x[1]
        (y * y + z).sum().backward()
        return y.detach().numpy(), z.detach().numpy(), x.grad.numpy()
    wrap = (lambda m: tg.tensor(m)) if mask_of == "tensor" else (lambda m: m)
    y, z, g = run(tg, wrap)
    np.testing.assert_array_equal(y, [[-3.0, -15.0, -5.0], [0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(z, [[0.0, 2.0, 6.0], [0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(g, [[-156.0, 0.0, -50.0], [1.0, 2.0, 3.0]])
    if torch is not None:
        for got, want in zip((y, z, g), run(torch, lambda m: torch.tensor(m)), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_traced_float_index_array_is_refused_by_updates_as_by_reading():
    """x.at[i].set(v) with a traced float i wrote row int(i) silently (JAX: TypeError)."""
    i = np.array([1.7], np.float32)
    for f in (lambda x, i: x.at[i].set(5.0), lambda x, i: x[i], lambda x, i: x.at[i, 0].add(1.0)):
        with pytest.raises(IndexError, match="index arrays must be integers, got float32"):
            tg.jit(f)(X, i)

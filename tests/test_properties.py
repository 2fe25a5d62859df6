"""Property tests (hypothesis): indexing against numpy with its gradient, and broadcasting
binary ops and reductions against numpy and finite differences, over generated shapes."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import check_grads

import tracegrad as tg

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
SETTINGS = hypothesis.settings(max_examples=60, deadline=None, derandomize=True,
                               suppress_health_check=list(hypothesis.HealthCheck))


def _slices(n: int):
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
    return st.builds(slice, bound, bound, step)


@st.composite
def _indexed(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    items: list = []
    for n in shape:
        kind = draw(st.sampled_from(["slice", "int", "newaxis"]))
        if kind == "int" and n > 0:
            items.append(draw(st.integers(-n, n - 1)))
        else:
            if kind == "newaxis":
                items.append(None)
            items.append(draw(_slices(n)))
    if len(items) > 1 and draw(st.booleans()):
        items = items[:draw(st.integers(0, len(items)))] + [Ellipsis]
    return shape, tuple(items)


@SETTINGS
@hypothesis.given(_indexed())
def test_basic_indexing_matches_numpy_with_gradient(case):
    shape, index = case
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    want = x[index]
    np.testing.assert_array_equal(tg.jit(lambda a: a[index])(x), want)
    (g,) = tg.vjp(lambda a: a[index], x)[1](np.ones(want.shape))
    hits = np.zeros_like(x)
    hits[index] += 1.0
    np.testing.assert_array_equal(g, hits)


def test_empty_reversed_slice_regression():
    # range(-1, -1, -1) is empty, numpy's x[-1::-1] is not
    x = np.arange(3.0)
    for index in [np.s_[-5::-1], np.s_[-4:-5:-1]]:
        np.testing.assert_array_equal(tg.jit(lambda a, i=index: a[i])(x), x[index])
        assert tg.vjp(lambda a, i=index: a[i], x)[1](np.ones(x[index].shape))[0].shape == (3,)


@st.composite
def _broadcastable(draw):
    base = draw(st.lists(st.integers(1, 3), max_size=3))

    def operand():
        dims = [d if draw(st.booleans()) else 1 for d in base]
        return tuple(dims[draw(st.integers(0, len(dims))):])
    return operand(), operand()


@SETTINGS
@hypothesis.given(_broadcastable(),
                  st.sampled_from(["add", "sub", "mul", "div", "maximum", "minimum", "pow"]))
def test_binary_broadcasting_values_and_gradients(shapes, name):
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0.5, 2, shapes[0]), rng.uniform(0.5, 2, shapes[1])
    fn = getattr(tg, name)
    want = {"div": np.divide, "pow": np.power, "sub": np.subtract,
            "mul": np.multiply}.get(name) or getattr(np, name)
    want = want(x, y)
    np.testing.assert_allclose(fn(x, y), want, rtol=1e-13)
    check_grads(fn, [x, y])


@st.composite
def _reduction(draw):
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    nd = len(shape)
    axes = draw(st.one_of(st.none(), st.lists(st.integers(-nd, nd - 1), max_size=nd,
                                              unique_by=lambda a: a % nd).map(tuple)))
    return shape, axes, draw(st.booleans())


def _np_reduce(name, x, axis, keepdims):
    if name == "logsumexp":
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    fn = {"max": np.amax, "min": np.amin}.get(name) or getattr(np, name)
    return fn(x, axis=axis, keepdims=keepdims)


@SETTINGS
@hypothesis.given(_reduction(), st.sampled_from(["sum", "mean", "max", "min", "prod",
                                                 "logsumexp"]))
def test_reductions_values_and_gradients(case, name):
    shape, axes, keepdims = case
    x = np.random.default_rng(1).uniform(-2, 2, shape)
    f = lambda a: getattr(tg, name)(a, axis=axes, keepdims=keepdims)
    np.testing.assert_allclose(f(x), _np_reduce(name, x, axes, keepdims), rtol=1e-12)
    check_grads(f, [x])

"""Every primitive in tracegrad.ir.OPS: its numpy reference against numpy directly, and the
tg.* function that issues it on numpy arrays (eagerly), through tg.jit and under tracing
(make_ir + verify + interpret), over dtypes, broadcasting, 0-d and 0-size arrays."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import OPS
from tracegrad.ir import emit as E

F32, F64, I32, I64, B = (np.dtype(d) for d in (np.float32, np.float64, np.int32, np.int64,
                                                np.bool_))
FLOATS, INTS = (F32, F64), (I32, I64)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (B,)


def erf_np(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
        return erf(x).astype(x.dtype)
    except ImportError:   # pragma: no cover - scipy is a dev dependency
        return np.vectorize(math.erf)(x).astype(x.dtype)


def data(shape: tuple, dtype: np.dtype, seed: int = 0, domain: str = "any") -> np.ndarray:
    """Test inputs of a dtype; `domain` keeps values where the op is defined."""
    rng = np.random.default_rng(seed)
    if dtype == B:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        low = {"pos": 1, "unit": 0, "small": 0}.get(domain, -5)
        high = {"small": 3, "unit": 1}.get(domain, 6)
        return np.asarray(rng.integers(low, high + 1, size=shape), dtype)
    lo, hi = {"pos": (0.1, 3.0), "unit": (-0.9, 0.9), "small": (0.1, 2.0)}.get(domain, (-3, 3))
    return np.asarray(rng.uniform(lo, hi, size=shape), dtype)


@dataclass
class Case:
    """A tg-level call that must issue primitive `op` and agree with `want` (numpy)."""
    op: str
    fn: Callable[..., Any]
    want: Callable[..., Any]
    args: list[np.ndarray]
    exact: bool = True
    emits: bool = True   # False where the call is an identity and records nothing

    def __repr__(self) -> str:
        sig = ",".join(f"{a.dtype}{list(a.shape)}" for a in self.args)
        return f"{self.op}({sig})"


CASES: list[Case] = []

# ---- elementwise -------------------------------------------------------------------------------

UNARY_FLOAT = {
    "exp": (tg.exp, np.exp, "any"), "log": (tg.log, np.log, "pos"),
    "log1p": (tg.log1p, np.log1p, "unit"), "expm1": (tg.expm1, np.expm1, "any"),
    "sin": (tg.sin, np.sin, "any"), "cos": (tg.cos, np.cos, "any"),
    "tan": (tg.tan, np.tan, "unit"), "tanh": (tg.tanh, np.tanh, "any"),
    "logistic": (tg.sigmoid, lambda x: 1 / (1 + np.exp(-x)), "any"),
    "sqrt": (tg.sqrt, np.sqrt, "pos"), "erf": (tg.erf, erf_np, "any"),
}
UNARY_SHAPES = [(3, 4), (), (0, 2), (2, 1, 3)]
for _op, (_fn, _np, _dom) in UNARY_FLOAT.items():
    for _shape in UNARY_SHAPES:
        for _dt in FLOATS:
            CASES.append(Case(_op, _fn, _np, [data(_shape, _dt, domain=_dom)], exact=False))
    # integer inputs compute in float32, the default float dtype
    CASES.append(Case(_op, _fn, lambda x, _np=_np: _np(x.astype(F32)),
                      [data((5,), I32, domain="pos" if _dom == "pos" else "small")], False))

for _op, _fn, _np in [("neg", tg.neg, np.negative), ("abs", tg.abs, np.abs),
                      ("sign", tg.sign, np.sign)]:
    for _shape in UNARY_SHAPES:
        for _dt in NUMERIC:
            CASES.append(Case(_op, _fn, _np, [data(_shape, _dt)]))
for _shape in UNARY_SHAPES:
    CASES.append(Case("not", tg.logical_not, np.logical_not, [data(_shape, B)]))
    for _dt in ALL:
        CASES.append(Case("stop_gradient", tg.stop_gradient, lambda x: x, [data(_shape, _dt)]))

BINARY = {
    "add": (tg.add, np.add, ALL), "sub": (tg.sub, np.subtract, NUMERIC),
    "mul": (tg.mul, np.multiply, ALL), "max": (tg.maximum, np.maximum, ALL),
    "min": (tg.minimum, np.minimum, ALL),
    "div": (tg.div, np.divide, FLOATS), "pow": (tg.pow, np.power, NUMERIC),
}
BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((), (3,)), ((3,), ()),
                 ((0, 3), (1, 3)), ((), ())]


def _bool_add(x, y):
    return np.logical_or(x, y) if x.dtype == B else np.add(x, y)


for _op, (_fn, _np, _dts) in BINARY.items():
    for _sx, _sy in BINARY_SHAPES:
        for _dt in _dts:
            dom = "pos" if _op == "pow" and _dt in FLOATS else (
                "small" if _op == "pow" else "any")
            x = data(_sx, _dt, 1, "pos" if _op == "pow" else "any")
            y = data(_sy, _dt, 2, dom if _op != "div" else "pos")
            CASES.append(Case(_op, _fn, _np, [x, y], exact=_op not in ("div", "pow")))
# true division of integers gives float32; floor division keeps the integer dtype
for _dt in INTS:
    _x, _y = data((3, 4), _dt, 3), data((4,), _dt, 4, "pos")
    CASES.append(Case("div", tg.div, lambda x, y: (x / y).astype(F32), [_x, _y], False))
    CASES.append(Case("div", tg.floor_divide, np.floor_divide, [_x, _y]))
    CASES.append(Case("div", tg.floor_divide, np.floor_divide, [-_x, _y]))

COMPARE = {"lt": (tg.less, np.less), "le": (tg.less_equal, np.less_equal),
           "gt": (tg.greater, np.greater), "ge": (tg.greater_equal, np.greater_equal),
           "eq": (tg.equal, np.equal), "ne": (tg.not_equal, np.not_equal)}
for _op, (_fn, _np) in COMPARE.items():
    for _sx, _sy in BINARY_SHAPES:
        for _dt in ALL:
            _x = data(_sx, _dt, 5, "small")
            _y = data(_sy, _dt, 6, "small")
            CASES.append(Case(_op, _fn, _np, [_x, _y]))
for _op, _fn, _np in [("and", tg.logical_and, np.logical_and),
                      ("or", tg.logical_or, np.logical_or)]:
    for _sx, _sy in BINARY_SHAPES:
        CASES.append(Case(_op, _fn, _np, [data(_sx, B, 7), data(_sy, B, 8)]))

for _dt in ALL:
    for _sc, _sx, _sy in [((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), ()), ((), (2, 3), (2, 3)),
                          ((0, 2), (2,), (1, 2))]:
        CASES.append(Case("select", tg.where, np.where,
                          [data(_sc, B, 9), data(_sx, _dt, 10), data(_sy, _dt, 11)]))

for _src in ALL:
    for _dst in ALL:
        if _src != _dst:
            CASES.append(Case("convert", lambda x, _d=_dst: tg.astype(x, _d),
                              lambda x, _d=_dst: x.astype(_d), [data((3, 4), _src, 12)]))
CASES.append(Case("convert", lambda x: tg.astype(x, tg.int32), lambda x: x.astype(I32),
                  [np.array([-1.7, -0.5, 0.5, 1.7, 2.5], F32)]))

# ---- reductions --------------------------------------------------------------------------------

REDUCE_AXES = [(None, False), (0, False), (1, True), (-1, False), ((0, 2), False),
               ((0, 2), True)]
REDUCE = {"reduce_sum": (tg.sum, np.sum), "reduce_max": (tg.max, np.max),
          "reduce_min": (tg.min, np.min), "reduce_prod": (tg.prod, np.prod)}
for _op, (_fn, _np) in REDUCE.items():
    for _axis, _keep in REDUCE_AXES:
        for _dt in NUMERIC:
            CASES.append(Case(
                _op, lambda x, _f=_fn, a=_axis, k=_keep: _f(x, axis=a, keepdims=k),
                lambda x, _f=_np, a=_axis, k=_keep: np.asarray(_f(x, axis=a, keepdims=k),
                                                               x.dtype),
                [data((2, 3, 4), _dt, 13, "small" if _op == "reduce_prod" else "any")],
                exact=_dt in INTS))
    # reducing a 0-d array is the identity: nothing to record
    CASES.append(Case(_op, _fn, lambda x, _f=_np: np.asarray(_f(x), x.dtype),
                      [np.array(2.5, F32)], emits=False))
# sums and products over empty axes give the identity; bool sums count
CASES.append(Case("reduce_sum", lambda x: tg.sum(x, axis=0), lambda x: np.sum(x, 0),
                  [np.zeros((0, 3), F32)]))
CASES.append(Case("reduce_prod", lambda x: tg.prod(x, axis=1), lambda x: np.prod(x, 1),
                  [np.zeros((2, 0), F64)]))
CASES.append(Case("reduce_sum", lambda x: tg.sum(x, axis=1),
                  lambda x: np.sum(x, 1).astype(I64), [data((3, 5), B, 14)]))
CASES.append(Case("reduce_max", lambda x: tg.max(x, axis=0), lambda x: np.max(x, 0),
                  [data((4, 2), B, 15)]))
for _op, _fn, _np in [("argmax", tg.argmax, np.argmax), ("argmin", tg.argmin, np.argmin)]:
    for _dt in NUMERIC:
        for _axis in (None, 0, 1, -1):
            CASES.append(Case(_op, lambda x, _f=_fn, a=_axis: _f(x, axis=a),
                              lambda x, _f=_np, a=_axis: np.asarray(_f(x, axis=a)),
                              [data((3, 4), _dt, 16)]))
    # ties pick the first index, as numpy
    CASES.append(Case(_op, lambda x, _f=_fn: _f(x, axis=1), lambda x, _f=_np: _f(x, axis=1),
                      [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], F32)]))

# ---- shapes and indexing -----------------------------------------------------------------------

for _dt in ALL:
    _x = data((2, 3, 4), _dt, 17)
    CASES += [
        Case("reshape", lambda x: tg.reshape(x, (4, 6)), lambda x: x.reshape(4, 6), [_x]),
        Case("reshape", lambda x: tg.reshape(x, 3, -1), lambda x: x.reshape(3, -1), [_x]),
        Case("reshape", lambda x: tg.expand_dims(x, 1), lambda x: np.expand_dims(x, 1), [_x]),
        Case("reshape", lambda x: tg.expand_dims(x, (0, -1)),
             lambda x: np.expand_dims(x, (0, -1)), [_x]),
        Case("reshape", lambda x: tg.squeeze(x[:1]), lambda x: np.squeeze(x[:1]), [_x]),
        Case("broadcast", lambda x: tg.broadcast_to(x, (5, 2, 3, 4)),
             lambda x: np.broadcast_to(x, (5, 2, 3, 4)), [_x]),
        Case("broadcast", lambda x: tg.broadcast_to(x[:, :1], (2, 3, 4)),
             lambda x: np.broadcast_to(x[:, :1], (2, 3, 4)), [_x]),
        Case("transpose", tg.transpose, np.transpose, [_x]),
        Case("transpose", lambda x: tg.transpose(x, (1, 2, 0)),
             lambda x: np.transpose(x, (1, 2, 0)), [_x]),
        Case("transpose", lambda x: tg.swapaxes(x, 0, -1), lambda x: np.swapaxes(x, 0, -1),
             [_x]),
        Case("slice", lambda x: x[1:, ::2, -3:], lambda x: x[1:, ::2, -3:], [_x]),
        Case("slice", lambda x: x[::-1, 2:0:-1, None, 3], lambda x: x[::-1, 2:0:-1, None, 3],
             [_x]),
        Case("slice", lambda x: x[..., 1:1], lambda x: x[..., 1:1], [_x]),
        Case("slice", lambda x: x[0, -1], lambda x: x[0, -1], [_x]),
        Case("concatenate", lambda x: tg.concatenate([x, x[:, :1]], axis=1),
             lambda x: np.concatenate([x, x[:, :1]], axis=1), [_x]),
        Case("concatenate", lambda x: tg.concatenate([x, x, x[..., :0]], axis=-1),
             lambda x: np.concatenate([x, x, x[..., :0]], axis=-1), [_x]),
        Case("concatenate", lambda x: tg.stack([x, x], axis=1),
             lambda x: np.stack([x, x], axis=1), [_x]),
        Case("take", lambda x: tg.take(x, np.array([2, 0, 2, 1]), axis=1),
             lambda x: np.take(x, [2, 0, 2, 1], axis=1), [_x]),
        Case("take", lambda x: tg.take(x, np.array([[3, -1], [0, 5]])),
             lambda x: np.take(x, [[3, -1], [0, 5]]), [_x]),
        Case("take", lambda x: x[:, np.array([-1, 0])], lambda x: x[:, np.array([-1, 0])],
             [_x]),
        Case("take", lambda x: tg.take(x, np.zeros((0,), np.int64), axis=2),
             lambda x: np.take(x, np.zeros((0,), np.int64), axis=2), [_x]),
    ]
    _g = data((2, 2), _dt, 18)
    CASES.append(Case("pad_slice", lambda g: E.pad_slice(g, (3, 4), ((1, 3, 1), (0, 4, 2))),
                      lambda g: _padded(g, (3, 4), np.s_[1:3, 0:4:2]), [_g]))
    CASES.append(Case("update_slice",
                      lambda x, g: E.update_slice(x, g, ((2, 0, -1), (1, 4, 2))),
                      lambda x, g: _updated(x, g, np.s_[2:0:-1, 1:4:2]),
                      [data((3, 4), _dt, 29), _g]))
    CASES.append(Case("update_slice",       # a row, from a scalar broadcast
                      lambda x: E.update_slice(x, 7, ((1, 2, 1), (0, 4, 1))),
                      lambda x: _updated(x, 7, np.s_[1:2, :]), [data((3, 4), _dt, 30)]))

# traced integer indices
CASES.append(Case("take", lambda x, i: tg.take(x, i, axis=0),
                  lambda x, i: np.take(x, i, axis=0), [data((4, 3), F32, 19),
                                                       np.array([3, 0, 0], I32)]))


def _padded(g, shape, index):
    out = np.zeros(shape, g.dtype)
    out[index] = g
    return out


def _updated(x, g, index):
    out = x.copy()
    out[index] = g
    return out


def _scatter_np(g, idx, axis, size):
    out = np.zeros(g.shape[:axis] + (size,) + g.shape[axis + idx.ndim:], g.dtype)
    moved = np.moveaxis(out, axis, 0)
    flat = np.moveaxis(g.reshape(g.shape[:axis] + (-1,) + g.shape[axis + idx.ndim:]), axis, 0)
    for k, i in enumerate(idx.ravel()):
        moved[i] += flat[k]
    return out


for _dt in NUMERIC:
    _idx = np.array([0, 2, 2, 1])
    CASES.append(Case("scatter_add", lambda g: E.scatter_add(g, _idx, 1, 5),
                      lambda g: _scatter_np(g, _idx, 1, 5), [data((3, 4), _dt, 20)]))
    CASES.append(Case("scatter_add", lambda g: E.scatter_add(g, _idx.reshape(2, 2), 0, 3),
                      lambda g: _scatter_np(g, _idx.reshape(2, 2), 0, 3),
                      [data((2, 2, 3), _dt, 21)]))


_COMBINE = {"set": lambda a, b: b, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


def _scatter_loop_np(x, v, idx, axis, mode):
    """scatter by a plain loop: each entry of idx in order, negatives from the end."""
    out = x.copy()
    moved = np.moveaxis(out, axis, 0)
    flat = np.moveaxis(v.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 1:]), axis, 0)
    for k, i in enumerate(idx.ravel()):
        moved[i] = _COMBINE[mode](moved[i], flat[k])
    return out


for _dt in ALL:
    for _mode in ("set", "mul", "min", "max"):
        _i1 = np.array([2, -1, 0, 2])      # a repeat, and -1 the last
        CASES.append(Case("scatter", lambda x, v, i, m=_mode: E.scatter(x, v, i, 1, m),
                          lambda x, v, i, m=_mode: _scatter_loop_np(x, v, i, 1, m),
                          [data((3, 5), _dt, 40), data((3, 4), _dt, 41), _i1]))
        _i2 = np.array([[1, 1], [0, -2]], np.int32)
        CASES.append(Case("scatter", lambda x, v, i, m=_mode: E.scatter(x, v, i, 0, m),
                          lambda x, v, i, m=_mode: _scatter_loop_np(x, v, i, 0, m),
                          [data((3, 2), _dt, 42), data((2, 2, 2), _dt, 43), _i2]))

# ---- linear algebra ----------------------------------------------------------------------------

MATMUL_SHAPES = [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((0, 4), (4, 3)), ((3, 0), (0, 2))]
for _dt in NUMERIC:
    for _sa, _sb in MATMUL_SHAPES:
        CASES.append(Case("matmul", tg.matmul, np.matmul,
                          [data(_sa, _dt, 22, "small"), data(_sb, _dt, 23, "small")],
                          exact=_dt in INTS))
    CASES.append(Case("matmul", lambda a, b: a @ b, np.matmul,
                      [data((2, 3, 4), _dt, 24, "small"), data((4, 2), _dt, 25, "small")],
                      exact=_dt in INTS))
    CASES.append(Case("matmul", tg.dot, np.dot,
                      [data((3, 4), _dt, 26, "small"), data((4,), _dt, 27, "small")],
                      exact=_dt in INTS))

# ---- creation ----------------------------------------------------------------------------------

for _dt in ALL:
    CASES.append(Case("full", lambda x, _d=_dt: tg.full_traced((2, 3), 1, _d) + x * 0
                      if _d != B else tg.logical_or(tg.full_traced((2, 3), True, _d), x),
                      lambda x, _d=_dt: np.full((2, 3), 1, _d), [data((2, 3), _dt, 28)]))
for _dt in NUMERIC:
    CASES.append(Case("iota", lambda x, _d=_dt: tg.arange_traced(5, dtype=_d) + x,
                      lambda x, _d=_dt: np.arange(5, dtype=_d) + x, [np.zeros((), _dt)]))
CASES.append(Case("iota", lambda x: tg.eye_traced(3, 4) + x, lambda x: np.eye(3, 4, dtype=F32) + x,
                  [np.zeros((), F32)]))
CASES.append(Case("iota", lambda x: tg.linspace_traced(0.0, 1.0, 5) + x,
                  lambda x: np.linspace(0, 1, 5, dtype=F32) + x, [np.zeros((), F32)]))
CASES.append(Case("iota", lambda x: tg.arange_traced(1, 10, 3) * x,
                  lambda x: np.arange(1, 10, 3) * x, [np.array(2, I64)]))


def test_every_primitive_has_a_case():
    # random, custom_vjp_call and scan (higher order: test_scan_primitive, test_roll_loops)
    covered = {c.op for c in CASES} | {"random", "custom_vjp_call", "scan"}
    assert set(OPS) - covered == set(), "add cases for these primitives to tests/test_ops.py"


def _check(got: Any, want: Any, exact: bool) -> None:
    want = np.asarray(want)
    got_arr = np.asarray(got)
    assert isinstance(got, np.ndarray), type(got)
    assert got_arr.shape == want.shape, (got_arr.shape, want.shape)
    assert got_arr.dtype == want.dtype, (got_arr.dtype, want.dtype)
    if exact or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got_arr, want)
    else:
        tol = 2e-6 if want.dtype == F32 else 1e-13
        np.testing.assert_allclose(got_arr, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_op(case: Case):
    with np.errstate(all="ignore"):
        want = np.asarray(case.want(*case.args))
    # eagerly on numpy arrays
    _check(case.fn(*case.args), want, case.exact)
    # under tracing: the graph verifies, issues the primitive and interprets to the same
    graph = tg.make_ir(case.fn)(*case.args)
    tg.ir.verify(graph)
    assert (case.op in {e.op for e in graph.eqns}) == case.emits, str(graph)
    (got,) = tg.ir.interpret(graph, case.args)
    _check(got, want, case.exact)
    # through jit (twice: the second call is a cache hit)
    jitted = tg.jit(case.fn)
    _check(jitted(*case.args), want, case.exact)
    _check(jitted(*case.args), want, case.exact)


# ---- the references themselves, called directly -----------------------------------------------

def test_references_elementwise_match_numpy():
    x = data((4, 5), F64, 30)
    pos = data((4, 5), F64, 31, "pos")
    for op, (_, fn, dom) in UNARY_FLOAT.items():
        arg = {"pos": pos, "unit": x * 0.3}.get(dom, x)
        np.testing.assert_allclose(OPS[op].ref(arg), fn(arg), rtol=1e-14, err_msg=op)
    for op, (_, fn, _) in BINARY.items():
        np.testing.assert_allclose(OPS[op].ref(pos, x), fn(pos, x), rtol=1e-14, err_msg=op)
    for op, (_, fn) in COMPARE.items():
        np.testing.assert_array_equal(OPS[op].ref(x, x.T[:1].T), fn(x, x.T[:1].T))


def test_reference_sigmoid_is_stable():
    x = np.array([-1e4, -50.0, 0.0, 50.0, 1e4], F32)
    with np.errstate(all="raise"):
        y = OPS["logistic"].ref(x)
    np.testing.assert_allclose(y, [0, 1 / (1 + np.exp(50.0)), 0.5, 1 / (1 + np.exp(-50.0)), 1],
                               rtol=1e-6)
    assert y.dtype == F32


def test_references_structural():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(OPS["reduce_sum"].ref(x, axes=(0, 2)), x.sum((0, 2)))
    np.testing.assert_array_equal(OPS["reduce_max"].ref(x, axes=(1,)), x.max(1))
    np.testing.assert_array_equal(OPS["argmin"].ref(-x, axis=2), np.argmin(-x, 2))
    np.testing.assert_array_equal(OPS["reshape"].ref(x, shape=(6, 4)), x.reshape(6, 4))
    np.testing.assert_array_equal(OPS["broadcast"].ref(x[0], shape=(5, 3, 4)),
                                  np.broadcast_to(x[0], (5, 3, 4)))
    np.testing.assert_array_equal(OPS["transpose"].ref(x, perm=(2, 0, 1)),
                                  x.transpose(2, 0, 1))
    np.testing.assert_array_equal(OPS["slice"].ref(x, index=((1, 2, 1), (2, -1, -1), (0, 4, 3))),
                                  x[1:2, 2::-1, 0:4:3])
    g = np.ones((1, 3, 2))
    np.testing.assert_array_equal(
        OPS["pad_slice"].ref(g, shape=(2, 3, 4), index=((1, 2, 1), (2, -1, -1), (0, 4, 3))),
        _padded(g, (2, 3, 4), np.s_[1:2, 2::-1, 0:4:3]))
    np.testing.assert_array_equal(
        OPS["update_slice"].ref(x, g * 5, index=((1, 2, 1), (2, -1, -1), (0, 4, 3))),
        _updated(x, g * 5, np.s_[1:2, 2::-1, 0:4:3]))
    np.testing.assert_array_equal(OPS["concatenate"].ref(x, x, axis=1),
                                  np.concatenate([x, x], 1))
    idx = np.array([[0, 3], [3, 3]])
    np.testing.assert_array_equal(OPS["take"].ref(x, idx, axis=2), np.take(x, idx, 2))
    np.testing.assert_array_equal(OPS["scatter_add"].ref(np.ones((2, 2, 2)), idx, axis=0,
                                                         size=4), _scatter_np(
        np.ones((2, 2, 2)), idx, 0, 4))
    np.testing.assert_array_equal(OPS["matmul"].ref(x, x.transpose(0, 2, 1)),
                                  x @ x.transpose(0, 2, 1))
    np.testing.assert_array_equal(OPS["iota"].ref(shape=(2, 3), dimension=1, dtype=I32),
                                  np.broadcast_to(np.arange(3, dtype=I32), (2, 3)))
    np.testing.assert_array_equal(OPS["full"].ref(shape=(2,), value=7, dtype=I64), [7, 7])
    np.testing.assert_array_equal(OPS["select"].ref(x > 5, x, -x), np.where(x > 5, x, -x))
    np.testing.assert_array_equal(OPS["convert"].ref(x, dtype=I32), x.astype(I32))
    np.testing.assert_array_equal(OPS["stop_gradient"].ref(x), x)
    np.testing.assert_array_equal(OPS["custom_vjp_call"].ref(x, x + 1, x + 2, n_args=1,
                                                             n_res=1, bwd=None)[0], x + 2)


def test_take_out_of_bounds():
    # concrete indices are checked by the front end, as numpy does
    with pytest.raises(IndexError):
        tg.take(np.arange(3.0), np.array([-4]))
    with pytest.raises(IndexError):
        tg.take(np.arange(3.0), np.array([3]))
    # traced indices: wrap once, then clamp -- the same in the interpreter and compiled code,
    # forward and backward (the gradient lands where the forward read)
    f = tg.value_and_grad(lambda x, i: tg.sum(tg.take(x, i, axis=0) * np.arange(1.0, 5.0)))
    x, i = np.arange(5.0), np.array([0, 7, -1, -9])
    graph = tg.ir.optimize(tg.make_ir(f)(x, i))
    want = tg.ir.interpret(graph, [x, i])
    np.testing.assert_array_equal(want[0], 0 * 1 + 4 * 2 + 4 * 3 + 0 * 4)
    np.testing.assert_array_equal(want[1], [1 + 4, 0, 0, 0, 2 + 3])
    from tracegrad.runtime import compile_graph
    for got, w in zip(compile_graph(graph)([x, i]), want):
        np.testing.assert_array_equal(got, w)


def test_integer_division_by_zero_does_not_crash():
    # numpy warns and gives 0 for integer floor division by zero; the reference does not raise
    out = tg.floor_divide(np.array([3, -3], I32), np.array([0, 0], I32))
    assert out.dtype == I32 and out.shape == (2,)


# ---- random (no numpy equivalent: check its defining properties) -------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_random(dtype):
    u = E.random((1000,), 7, "uniform", dtype)
    assert u.dtype == dtype and u.shape == (1000,)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.05
    np.testing.assert_array_equal(u, E.random((1000,), 7, "uniform", dtype))   # pure
    assert not np.array_equal(u, E.random((1000,), 8, "uniform", dtype))
    n = E.random((2000,), 3, "normal", dtype)
    assert abs(n.mean()) < 0.1 and abs(n.std() - 1) < 0.1
    f = lambda seed: E.random((4, 5), seed, "normal", dtype)
    # the bits are exact; the Box-Muller transform uses log/cos, which agree within ulps
    np.testing.assert_allclose(tg.jit(f)(np.int64(3)), f(np.int64(3)), rtol=1e-5, atol=1e-6)
    fu = lambda seed: E.random((4, 5), seed, "uniform", dtype)
    np.testing.assert_array_equal(tg.jit(fu)(np.int64(3)), fu(np.int64(3)))
    graph = tg.make_ir(f)(np.int64(3))
    tg.ir.verify(graph)
    assert [e.op for e in graph.eqns] == ["random"]


def test_custom_vjp_call_forward():
    @tg.custom_vjp
    def f(x):
        return tg.sin(x) * 2.0

    f.defvjp(lambda x: (f(x), x), lambda x, g: (g,))
    x = data((3,), F64, 40)
    np.testing.assert_allclose(f(x), 2 * np.sin(x))
    np.testing.assert_allclose(tg.jit(f)(x), 2 * np.sin(x))
    graph = tg.make_ir(f)(x)
    tg.ir.verify(graph)
    assert "custom_vjp_call" in {e.op for e in graph.eqns}
    np.testing.assert_allclose(tg.ir.interpret(graph, [x])[0], 2 * np.sin(x))


# ---- promotion rules (float32 default; Python scalars are weak) --------------------------------

@pytest.mark.parametrize("x,y,want", [
    (np.ones(2, F32), 1.5, F32), (np.ones(2, F32), 2, F32), (np.ones(2, I32), 2, I32),
    (np.ones(2, I32), 1.5, F32), (np.ones(2, F64), 1.5, F64), (np.ones(2, F32),
                                                                np.ones(2, F64), F64),
    (np.ones(2, B), 1, I64), (np.ones(2, I32), np.ones(2, I64), I64), (1.5, 2, F32),
    (np.ones(2, F32), np.float64(2.0), F32),   # numpy float scalars are weak (as in torch)
    (np.float64(1.0), np.float64(2.0), F64), (np.ones(2, F32), np.ones((), F64), F64),
], ids=str)
def test_promotion(x, y, want):
    assert tg.add(x, y).dtype == want
    assert tg.add(y, x).dtype == want
    assert tg.make_ir(lambda a: a + y)(x).outvars[0].aval.dtype == want


def test_numpy_arrays_mix_with_traced_values_in_either_order():
    a = data((3, 3), F32, 41)
    f = lambda x: (a @ x) + (x @ a) + a * x + x - a + (a > x) * 1.0
    x = data((3, 3), F32, 42)
    want = a @ x + x @ a + a * x + x - a + (a > x) * 1.0
    np.testing.assert_allclose(f(x), want, rtol=1e-6)
    np.testing.assert_allclose(tg.jit(f)(x), want, rtol=1e-6)


def test_logsumexp_and_mean():
    x = data((3, 4), F32, 43)
    np.testing.assert_allclose(tg.logsumexp(x, axis=1), np.log(np.exp(x).sum(1)), rtol=1e-6)
    np.testing.assert_allclose(tg.mean(x, axis=0), x.mean(0), rtol=1e-6)
    assert tg.mean(np.arange(4)).dtype == F32
    big = np.array([1e4, 1e4, -1e4], F32)
    np.testing.assert_allclose(tg.logsumexp(big), 1e4 + np.log(2), rtol=1e-6)
    np.testing.assert_array_equal(tg.logsumexp(np.full(3, -np.inf)), -np.inf)


def test_clip_relu_square_reciprocal():
    x = data((3, 4), F32, 44)
    np.testing.assert_array_equal(tg.clip(x, -1, 1), np.clip(x, -1, 1))
    np.testing.assert_array_equal(tg.relu(x), np.maximum(x, 0))
    np.testing.assert_array_equal(tg.square(x), x * x)
    np.testing.assert_allclose(tg.reciprocal(x), 1 / x, rtol=1e-6)
    np.testing.assert_array_equal(tg.relu(np.array([-2, 0, 3])), [0, 0, 3])

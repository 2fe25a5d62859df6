"""Bad input gets a clear error, never a crash: the op, the shapes/dtypes, the user's line
and what to do instead."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

import tracegrad as tg

A = np.ones((2, 3), np.float32)
B = np.ones((4, 5), np.float32)


def here(offset: int = 0) -> str:
    """`test_errors.py:<line of the caller + offset>`."""
    return f"test_errors.py:{sys._getframe(1).f_lineno + offset}"


# ---- shapes: the op, both shapes, the user's file:line -----------------------------------------

SHAPE_CASES = {
    "add": (lambda x, y: tg.add(x, y), "add", ["(2, 3)", "(4, 5)"]),
    "operator+": (lambda x, y: x + y, "add", ["(2, 3)", "(4, 5)"]),
    "mul": (lambda x, y: tg.mul(x, y), "mul", ["(2, 3)", "(4, 5)"]),
    "matmul": (lambda x, y: tg.matmul(x, y), "matmul", ["(2, 3)", "(4, 5)"]),
    "operator@": (lambda x, y: x @ y, "matmul", ["(2, 3)", "(4, 5)"]),
    "concatenate": (lambda x, y: tg.concatenate([x, y]), "concatenate", ["(2, 3)", "(4, 5)"]),
    "where": (lambda x, y: tg.where(x > 0, x, y), "select", ["(2, 3)", "(4, 5)"]),
    "maximum": (lambda x, y: tg.maximum(x, y), "max", ["(2, 3)", "(4, 5)"]),
    "less": (lambda x, y: tg.less(x, y), "lt", ["(2, 3)", "(4, 5)"]),
}


@pytest.mark.parametrize("name,mode", [
    (name, mode) for name in sorted(SHAPE_CASES) for mode in ["eager", "jit", "grad", "make_ir"]
    if not (mode == "eager" and name.startswith("operator"))])   # numpy's own operators
def test_incompatible_shapes_name_op_shapes_and_line(name, mode):
    fn, op, shapes = SHAPE_CASES[name]
    run = {
        "eager": lambda: fn(A, B),
        "jit": lambda: tg.jit(fn)(A, B),
        "grad": lambda: tg.grad(lambda x, y: tg.sum(fn(x, y)))(A, B),
        "make_ir": lambda: tg.make_ir(fn)(A, B),
    }[mode]
    with pytest.raises(ValueError) as e:
        run()
    msg = str(e.value)
    assert isinstance(e.value, tg.ShapeError)
    assert msg.startswith(op + ":"), msg
    for s in shapes:
        assert s in msg, msg
    # the line in SHAPE_CASES that issued the op
    line = [i for i, text in enumerate(open(__file__).read().splitlines(), 1)
            if text.strip().startswith(f'"{name}": (lambda')][0]
    assert f"test_errors.py:{line}" in msg, msg


def test_shape_error_points_at_the_users_line_inside_helpers():
    def model(x, w):
        h = tg.tanh(x @ w)    # the bad line
        return tg.sum(h)
    bad_line = model.__code__.co_firstlineno + 1
    with pytest.raises(tg.ShapeError, match=rf"matmul: .*\(2, 3\) @ \(4, 5\).*"
                                            rf"test_errors.py:{bad_line}"):
        tg.grad(model)(A, B)


@pytest.mark.parametrize("fn,op,words", [
    (lambda: tg.reshape(A, (4, 2)), "reshape", ["(2, 3)", "(4, 2)"]),
    (lambda: tg.broadcast_to(A, (3, 3)), "broadcast", ["(2, 3)", "(3, 3)"]),
    (lambda: tg.transpose(A, (0, 0)), "transpose", ["(0, 0)", "(2, 3)"]),
    (lambda: tg.jit(lambda x: tg.reshape(x, (7,)))(A), "reshape", ["(2, 3)", "(7,)"]),
])
def test_other_shape_errors(fn, op, words):
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert msg.startswith(op) and all(w in msg for w in words), msg
    assert "test_errors.py:" in msg


def test_shape_problems_without_a_primitive_are_value_errors():
    for fn in [lambda: tg.sum(A, axis=2), lambda: tg.squeeze(A, 0),
               lambda: tg.stack([A, B]), lambda: tg.reshape(A, (-1, -1))]:
        with pytest.raises(ValueError):
            fn()
    with pytest.raises(IndexError, match="out of bounds"):
        tg.jit(lambda x: x[5])(A)
    with pytest.raises(IndexError, match="too many indices"):
        tg.jit(lambda x: x[0, 0, 0])(A)


def test_axes_out_of_range_raise_as_numpy_and_torch():
    """An axis out of range was taken modulo the dimension (cat(axis=2) of 2-d arrays joined
    them along axis 0): now an AxisError, a ValueError and an IndexError as numpy's (torch
    raises IndexError), naming the op and the user's line."""
    t = tg.tensor(np.array(A))
    cases = [(lambda: tg.concatenate([A, A], axis=2), here(), "concatenate: axis 2"),
             (lambda: tg.cat([t, t], axis=-3), here(), "concatenate: axis -3"),
             (lambda: tg.stack([A, A], axis=3), here(), "stack: axis 3"),
             (lambda: t.unsqueeze(3), here(), "expand_dims: axis 3"),
             (lambda: tg.expand_dims(A, -4), here(), "expand_dims: axis -4"),
             (lambda: t.flatten(2), here(), "flatten: axis 2"),
             (lambda: tg.take(A, np.array([0]), axis=2), here(), "take: axis 2"),
             (lambda: tg.jit(lambda x: tg.concatenate([x, x], 2))(A), here(), "concatenate"),
             (lambda: tg.nn.functional.cross_entropy(t, np.zeros(2, np.int64), dim=2), here(),
              "cross_entropy: axis 2"),
             (lambda: tg.nn.Flatten(0, 2)(t), here(), "Flatten: axis 2")]
    for fn, line, words in cases:
        with pytest.raises(tg.AxisError, match=f"{words}.* out of bounds .*\\(at {line}\\)"):
            fn()
    assert issubclass(tg.AxisError, ValueError) and issubclass(tg.AxisError, IndexError)
    with pytest.raises(RuntimeError, match="start_dim cannot come after end_dim"):
        t.flatten(1, 0)
    assert t.unsqueeze(2).shape == (2, 3, 1) and t.unsqueeze(-3).shape == (1, 2, 3)
    assert tg.stack([A, A], axis=-1).shape == (2, 3, 2)


def test_index_errors_name_the_bad_index_and_the_users_line():
    t = tg.tensor(np.arange(6.0).reshape(3, 2))
    cases = [   # (fn, its line here, message): a too-negative one is named, not the largest
        (lambda x: x[np.array([-5, 1])], here(), r"indexing: index -5 is out of bounds for "
         r"axis 0 with size 3"),
        (lambda x: x[:, 7], here(), r"indexing: index 7 is out of bounds for axis 1 with "
         r"size 2"),
        (lambda x: x[np.array([0.5])], here(), r"indexing: index arrays must be integers, "
         r"got float64"),
    ]
    for fn, line, message in cases:
        for run, x in ((tg.jit(fn), t.numpy()), (fn, t)):   # traced, and a Tensor's indexing
            with pytest.raises(IndexError, match=f"{message} \\(at {line}\\)"):
                run(x)
    with pytest.raises(IndexError, match=r"at\[\]\.add: index -4 is out of bounds for axis 0 "
                       rf"with size 3 \(at {here(1)}\)"):
        tg.jit(lambda x: x.at[np.array([1, -4])].add(1.0))(t.numpy())
    assert tg.jit(lambda x: x[np.array([-1, 0])])(t.numpy()).tolist() == [[4, 5], [0, 1]]
    assert tg.jit(lambda x: x[[]])(t.numpy()).shape == (0, 2)     # numpy's x[[]] (integers)


def test_dtype_errors_are_type_errors():
    with pytest.raises(TypeError, match="take: indices must be integers, got float64"):
        tg.take(A, np.array([0.5]))
    with pytest.raises(TypeError, match="sub: does not accept bool"):
        tg.sub(np.ones(2, bool), np.ones(2, bool))
    with pytest.raises(TypeError, match="cross_entropy: labels must be integer"):
        tg.nn.functional.cross_entropy(A, np.ones(2))


# ---- grad of integers, of non-scalars ----------------------------------------------------------

@pytest.mark.parametrize("x", [np.arange(3), np.ones(3, bool), 3, np.int32(2)],
                         ids=["int64", "bool", "python_int", "int32_scalar"])
def test_grad_of_integer_or_bool_input(x):
    with pytest.raises(TypeError) as e:
        tg.grad(lambda x: tg.sum(tg.astype(x, tg.float32)))(x)
    msg = str(e.value)
    assert "only float" in msg and "differentiated" in msg, msg
    assert str(np.asarray(x).dtype) in msg, msg


def test_grad_int_input_excluded_by_argnums_is_fine():
    g = tg.grad(lambda x, n: tg.sum(x * tg.astype(n, tg.float32)))(A, np.arange(3))
    np.testing.assert_array_equal(g, np.broadcast_to(np.arange(3.0), (2, 3)))
    with pytest.raises(TypeError, match="only float"):
        tg.jacrev(lambda x: x * 1.0)(np.arange(3))


@pytest.mark.parametrize("f,got", [
    (lambda x: x * 2.0, r"\(2, 3\)"),
    (lambda x: (tg.sum(x), tg.sum(x)), "2 values"),
])
def test_grad_of_non_scalar_output(f, got):
    with pytest.raises(TypeError) as e:
        tg.grad(f)(A)
    msg = str(e.value)
    assert "scalar" in msg and "vjp" in msg and "jacrev" in msg, msg
    assert re.search(got, msg), msg


def test_grad_of_integer_output():
    with pytest.raises(TypeError, match="float"):
        tg.grad(lambda x: tg.argmax(x))(A)


# ---- branching on traced values ----------------------------------------------------------------

@pytest.mark.parametrize("transform", ["jit", "grad", "make_ir", "vjp", "jvp"])
def test_branching_on_a_traced_value(transform):
    def f(x):
        if tg.sum(x) > 0:    # not allowed: the value is unknown while tracing
            return tg.sum(x)
        return -tg.sum(x)
    line = f.__code__.co_firstlineno + 1
    run = {"jit": lambda: tg.jit(f)(A), "grad": lambda: tg.grad(f)(A),
           "make_ir": lambda: tg.make_ir(f)(A), "vjp": lambda: tg.vjp(f, A),
           "jvp": lambda: tg.jvp(f, (A,), (A,))}[transform]
    with pytest.raises(tg.TracingError) as e:
        run()
    msg = str(e.value)
    assert f"test_errors.py:{line}" in msg, msg
    assert "tg.where" in msg and "static_argnums" in msg, msg


@pytest.mark.parametrize("use", [float, int, bool, np.asarray, lambda t: range(t)],
                         ids=["float", "int", "bool", "asarray", "range"])
def test_concrete_value_of_a_traced_value(use):
    with pytest.raises(tg.TracingError, match="tg.where"):
        tg.jit(lambda x: use(tg.sum(x)))(A)


def test_static_argnums_is_the_way_out():
    f = tg.jit(lambda x, flag: x if flag > 0 else -x, static_argnums=1)
    np.testing.assert_array_equal(f(A, 1), A)
    np.testing.assert_array_equal(f(A, -1), -A)
    np.testing.assert_array_equal(tg.where(A > 0, A, -A), A)


def test_escaped_traced_value():
    leak = []
    tg.jit(lambda x: leak.append(x) or x)(A)
    with pytest.raises(tg.TracingError, match="escaped") as e:
        tg.exp(leak[0])
    assert here(-1) in str(e.value)
    with pytest.raises(tg.TracingError, match="escaped"):
        tg.jit(lambda x: x + leak[0])(A)


# ---- pytrees and argnums -----------------------------------------------------------------------

@pytest.mark.parametrize("leaf", ["hello", {1, 2}, object(), b"bytes"],
                         ids=["str", "set", "object", "bytes"])
def test_unknown_pytree_leaves(leaf):
    for run in [lambda: tg.grad(lambda x, y: tg.sum(x), argnums=1)(A, leaf),
                lambda: tg.jit(lambda x, y: x)(A, leaf),
                lambda: tg.vjp(lambda x, y: x, A, leaf)]:
        with pytest.raises(TypeError) as e:
            run()
        assert type(leaf).__name__ in str(e.value), str(e.value)
    # an argument grad does not differentiate is the function's Python value, as in JAX
    np.testing.assert_array_equal(tg.grad(lambda x, y: tg.sum(x))(A, leaf), np.ones_like(A))


def test_unknown_output_leaf():
    with pytest.raises(TypeError, match="output leaf 1 has type str"):
        tg.jit(lambda x: (x, "label"))(A)


def test_object_arrays_are_rejected():
    with pytest.raises(TypeError):
        tg.grad(lambda x: tg.sum(x))(np.array([1.0, None]))


@pytest.mark.parametrize("argnums,exc,words", [
    (2, ValueError, ["argnums 2", "out of range", "2 positional"]),
    (-3, ValueError, ["argnums -3", "out of range"]),
    ("0", TypeError, ["argnums must be ints"]),
    ((), ValueError, ["at least one"]),
    ((0, 5), ValueError, ["argnums 5"]),
])
def test_wrong_argnums(argnums, exc, words):
    with pytest.raises(exc) as e:
        tg.grad(lambda x, y: tg.sum(x * y), argnums=argnums)(A, A)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_wrong_static_argnums():
    with pytest.raises(ValueError, match="static_argnums 3 is out of range"):
        tg.jit(lambda x: x, static_argnums=3)(A)
    with pytest.raises(TypeError, match="hashable"):
        tg.jit(lambda x, lst: x, static_argnums=1)(A, [1])


def test_vjp_and_jvp_structure_errors():
    _, fn = tg.vjp(lambda x: x * 2.0, A)
    with pytest.raises(ValueError, match=r"cotangent shape \(3,\).*\(2, 3\)"):
        fn(np.ones(3))
    with pytest.raises(ValueError, match="cotangent structure"):
        fn((A, A))
    with pytest.raises(ValueError, match=r"tangent 0 has shape \(3,\).*\(2, 3\)"):
        tg.jvp(lambda x: x, (A,), (np.ones(3),))
    with pytest.raises(ValueError, match="tangent structure"):
        tg.jvp(lambda x: x, (A,), ((A, A),))


def test_has_aux_needs_a_pair():
    with pytest.raises(TypeError, match="pair"):
        tg.grad(lambda x: tg.sum(x), has_aux=True)(A)


def test_custom_vjp_backward_must_return_one_gradient_per_argument():
    @tg.custom_vjp
    def f(x, y):
        return x * y

    f.defvjp(lambda x, y: (f(x, y), (x, y)), lambda res, g: (g * res[1],))
    with pytest.raises(TypeError, match="one gradient per argument"):
        tg.grad(lambda x: tg.sum(f(x, A)))(A)

    @tg.custom_vjp
    def h(x):
        return x * 2.0

    h.defvjp(lambda x: (h(x), None), lambda res, g: (tg.sum(g),))
    with pytest.raises(ValueError, match=r"shape \(\) for an argument of shape \(2, 3\)"):
        tg.grad(lambda x: tg.sum(h(x)))(A)

"""The fast interpreter (`ir.Program`) against the reference interpreter: bit-identical values,
dtypes and shapes for every primitive's test cases, their gradients, and random programs."""
from __future__ import annotations

import numpy as np
import pytest
from random_programs import generate, output_weights, tracegrad_lib

import tracegrad as tg
from tracegrad import ir


def _same(got, want, what) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray), what
        assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, w.dtype, g.shape,
                                                           w.shape)
        np.testing.assert_array_equal(g, w, err_msg=what)


def _cases():
    from test_ops import CASES
    return [c for c in CASES if c.emits]


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_program_matches_reference_on_every_op_case(case):
    graph = tg.make_ir(case.fn)(*case.args)
    _same(ir.program(graph)(list(case.args)), ir.interpret(graph, case.args), str(case))
    floats = [i for i, a in enumerate(case.args) if np.asarray(a).dtype.kind == "f"]
    out = ir.interpret(graph, case.args)
    if floats and out and out[0].dtype.kind == "f":
        g = ir.vjp_graph(graph, floats)
        args = list(case.args) + [np.ones_like(o) for o in out]
        _same(ir.program(g)(args), ir.interpret(g, args), f"vjp of {case}")


def test_program_checks_its_inputs():
    graph = tg.make_ir(lambda x: tg.sin(x) * 2)(np.zeros(3, np.float32))
    prog = ir.program(graph)
    with pytest.raises(TypeError, match="f32\\[3\\]"):
        prog([np.zeros(4, np.float32)])
    with pytest.raises(TypeError, match="takes 1 inputs"):
        prog([])


def test_program_takes_arguments_that_are_not_arrays_of_its_input_types_as_the_reference():
    """Arrays of the input types are taken as they are (checked in one comparison); anything
    else (Python numbers, numpy scalars, array subclasses, other dtypes or shapes) goes
    through np.asarray and the per-input check, as before."""
    graph = tg.make_ir(lambda x, s: (tg.sin(x) * s, s + 1.0))(
        np.zeros(3, np.float32), np.float32(2.0))
    prog = ir.program(graph)
    x = np.arange(3, dtype=np.float32)
    for s in (np.asarray(2.5, np.float32), np.float32(2.5), np.array(2.5, np.float32)):
        _same(prog([x, s]), ir.interpret(graph, [x, s]), repr(type(s)))
    class Sub(np.ndarray):
        pass
    got = prog([x.view(Sub), np.float32(2.5)])
    assert all(type(o) is np.ndarray for o in got)
    _same(got, ir.interpret(graph, [x, np.float32(2.5)]), "an array subclass")
    with pytest.raises(TypeError, match="f32\\[\\]"):
        prog([x, 2.5])      # a Python float is a float64 array
    with pytest.raises(TypeError, match="f32\\[3\\]"):
        prog([x.astype(np.float64), np.float32(2.5)])
    with pytest.raises(TypeError, match="takes 2 inputs"):
        prog([x, np.float32(2.5), x])


def test_program_outputs_never_alias_inputs_or_each_other():
    x = np.arange(6, dtype=np.float32)
    graph = tg.make_ir(lambda x: (x.reshape(2, 3), x, tg.zeros(3)))(x)
    prog = ir.program(graph)
    a, b, z = prog([x])
    a[0, 0] = b[1] = z[0] = 9.0
    assert x[0] == 0 and x[1] == 1
    a2, b2, z2 = prog([x])
    assert a2[0, 0] == 0 and b2[1] == 1 and z2[0] == 0


def test_fresh_outputs_are_returned_without_a_copy_and_still_never_alias():
    """An output a ufunc or matmul made is the program's own new array: returned as it is.
    One returned twice, or also read as a view (its reshape), is copied where it repeats."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.ones((3, 3), np.float32)

    def f(x, w):
        y = tg.sin(x) + 1.0
        return y, y, y.reshape(3, 2), x @ w
    prog = ir.program(tg.make_ir(f)(x, w))
    y1, y2, r, m = prog([x, w])
    assert not np.shares_memory(y1, y2) and not np.shares_memory(y1, r)
    assert not np.shares_memory(m, x) and not np.shares_memory(m, w)
    want = [np.array(v) for v in (y1, y2, r, m)]
    y1[...] = -5.0
    m[...] = -5.0
    for got, w_ in zip(prog([x, w]), want):
        np.testing.assert_array_equal(got, w_)
    np.testing.assert_array_equal(y2, want[1])
    np.testing.assert_array_equal(r, want[2])


def test_outer_product_matmul_is_exact():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 1)), rng.standard_normal((1, 48))
    for dt in (np.float32, np.float64):
        x, y = a.astype(dt), b.astype(dt)
        graph = tg.make_ir(lambda x, y: x @ y)(x, y)
        _same(ir.program(graph)([x, y]), [np.matmul(x, y)], str(dt))


def test_2d_matmul_is_bit_identical_for_every_layout_and_special_value():
    """The Program calls np.dot on contiguous 2-d operands (cheaper to call than np.matmul,
    the same BLAS call) and np.matmul on the rest: both match the reference bit for bit."""
    rng = np.random.default_rng(3)
    graph_of = {}
    for trial in range(300):
        dt = (np.float32, np.float64)[trial % 2]
        m, k, n = (int(d) for d in rng.integers(1, 40, size=3))
        k += 1                                    # K = 1 takes the outer-product path
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((k, n)).astype(dt)
        if trial % 3 == 0:
            a.flat[rng.integers(0, a.size)] = (np.nan, np.inf, -0.0)[trial % 9 // 3]
            b.flat[rng.integers(0, b.size)] = -np.inf
        views = [(a, b), (np.asfortranarray(a), b), (a, b.T.copy().T),
                 (np.repeat(a, 2, axis=1)[:, ::2], b), (a, np.repeat(b, 2, axis=0)[::2])]
        key = (dt, m, k, n)
        if key not in graph_of:
            graph_of[key] = ir.program(tg.make_ir(lambda x, y: x @ y)(a, b))
        for x, y in views:
            with np.errstate(all="ignore"):
                got, want = graph_of[key]([x, y])[0], np.matmul(x, y)
            _same([got], [want], f"{key} {x.strides} {y.strides}")
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("seed", range(40))
def test_program_matches_reference_on_random_programs_and_gradients(seed):
    rng = np.random.default_rng(seed)
    prog = generate(lambda lo, hi: int(rng.integers(lo, hi + 1)))
    L = tracegrad_lib()
    for dtype in (np.float32, np.float64):
        xs = prog.inputs(seed, dtype)
        w = output_weights(prog, seed).astype(dtype)
        n = len(prog.shapes)
        for f in (lambda *a: prog.run(L, *a),
                  tg.grad(prog.loss(L, w), argnums=tuple(range(n)))):
            graph = tg.make_ir(f)(*xs)
            for g in (graph, ir.optimize(graph)):
                _same(ir.program(g)(xs), ir.interpret(g, xs), f"seed {seed} {dtype}")


def test_signed_zero_literals_and_products_match_the_reference():
    x = np.array([1.0, -2.0], np.float32)
    graph = tg.make_ir(lambda x: (x + 0.0) / (x * -0.0))(x)
    _same(ir.program(graph)([x]), ir.interpret(graph, [x]), "0.0 and -0.0 literals")
    a, b = np.array([[-1.0], [0.0]], np.float32), np.array([[0.0, 2.0]], np.float32)
    graph = tg.make_ir(lambda a, b: a @ b)(a, b)      # a K=1 product of -1 and 0 is 0, not -0
    _same(ir.program(graph)([a, b]), ir.interpret(graph, [a, b]), "K=1 matmul signs")


def test_reductions_of_broadcasts_sum_in_the_reference_order():
    rng = np.random.default_rng(3)
    for src, shape, axes in (((1, 300), (64, 300), (0, 1)), ((3, 1), (3, 500), (1,))):
        x = rng.standard_normal(src).astype(np.float32) * 100
        graph = tg.make_ir(lambda x: tg.sum(tg.broadcast_to(x, shape), axis=axes))(x)
        _same(ir.program(graph)([x]), ir.interpret(graph, [x]), f"{src}->{shape}")


def test_program_skips_equations_no_output_needs():
    from tracegrad.ir import Builder
    b = Builder("t")
    x = b.new_input(ir.Aval((3,), np.dtype(np.float32)))
    with b.active():
        dead = tg.log(x - 5.0)       # would warn/NaN if it ran
        out = tg.sin(x)
    graph = b.build([out])
    assert len(graph.eqns) == 3
    prog = ir.program(graph)
    assert len(prog.steps) == 1
    v = np.arange(3, dtype=np.float32)
    _same(prog([v]), ir.interpret(graph, [v]), "dead code")
    del dead


def test_program_ignores_float_errors_and_restores_the_callers_state():
    """A Program runs with numpy's float errors ignored (inf and nan are values, as in native
    code) — through numpy's error-state variable, not np.errstate — and leaves the caller's
    state as it was, also when a step raises."""
    import warnings
    graph = tg.make_ir(lambda x: tg.log(x) / x)(np.zeros(2, np.float32))
    prog = ir.program(graph)
    x = np.array([0.0, -1.0], np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = prog([x])[0]
    assert np.isneginf(out[0]) and np.isnan(out[1])
    assert np.geterr() == before
    with np.errstate(divide="raise", invalid="raise"):
        prog([x])
        assert np.geterr()["divide"] == "raise"
        bad = ir.program(tg.make_ir(lambda x: tg.log(x) / x)(np.zeros(2, np.float32)))

        def boom(*args):
            raise RuntimeError("a step failed")
        bad.steps = [(boom,) + step[1:] for step in bad.steps]
        with pytest.raises(RuntimeError, match="a step failed"):
            bad([x])
        assert np.geterr()["divide"] == "raise" and np.geterr()["invalid"] == "raise"
    assert np.geterr() == before


def _writes_in_place(prog) -> int:
    from tracegrad.ir.interpret import _IN_PLACE
    made = set(_IN_PLACE.values())      # the in-place updates (2 operands) and copying cuts
    return sum(1 for fn, _, _, n in prog.steps if fn in made and n == 2)


def _update_programs():
    """Graphs where updates may or may not write into their operand: (name, fn, in place)."""
    from tracegrad.ir import emit as E
    row = ((1, 2, 1), (0, 4, 1))

    def chain(x, v):        # x copied once, then written: each later update in place
        y = E.update_slice(x, v, row)
        y = E.update_slice(y, v * 2.0, ((2, 3, 1), (0, 4, 1)))
        return E.update_slice(y, v * 3.0, ((0, 1, 1), (0, 4, 1)))

    def view_read_after(x, v):      # a reshape of y is read after y is updated: y copied
        y = E.update_slice(x, v, row)
        r = E.reshape(y, (12,))
        z = E.update_slice(y, v * 2.0, row)
        return z, r * 1.0

    def slice_read_after(x, v):     # a slice of y is read after: it copies, y is written
        y = E.update_slice(x, v, row)
        s = E.slice_(y, row)
        z = E.update_slice(y, v * 2.0, row)
        return z + 0.0, s * 1.0

    def returned(x, v):         # y is returned: never written
        y = E.update_slice(x, v, row)
        return y, E.update_slice(y, v * 2.0, row)

    def read_again(x, v):       # y is read by a later step: copied
        y = E.update_slice(x, v, row)
        z = E.update_slice(y, v * 2.0, row)
        return z + y

    return [("chain", chain, 2), ("view_read_after", view_read_after, 0),
            ("slice_read_after", slice_read_after, 1), ("returned", returned, 0),
            ("read_again", read_again, 0)]


@pytest.mark.parametrize("name,fn,n_in_place", _update_programs(),
                         ids=[p[0] for p in _update_programs()])
def test_updates_write_in_place_only_where_nothing_else_reads_the_array(name, fn, n_in_place):
    """ir.in_place: an update_slice writes into its operand's array only where that array is
    its own (another update made it) and nothing may read it, or a view of it, later; the
    values stay bit-identical to the reference, call after call (inputs untouched)."""
    x = np.arange(12.0).reshape(3, 4)
    v = np.full((1, 4), -1.0)
    graph = tg.make_ir(fn)(x, v)
    prog = ir.program(graph)
    want = ir.interpret(graph, [x, v])
    for _ in range(2):
        _same(prog([x, v]), want, name)
    np.testing.assert_array_equal(x, np.arange(12.0).reshape(3, 4))
    assert _writes_in_place(prog) == n_in_place, [s[0] for s in prog.steps]


def test_renewed_program_decides_in_place_again():
    """Program.renewed (ir.template's new lengths) makes some steps again: a slice's step
    made again is a view, so in_place must run again, or the update writing into the array
    the slice reads would change the slice (it read [0, 0, 0, 0] here)."""
    from tracegrad.ir import emit as E
    from tracegrad.ir.interpret import restep
    row = ((2, 3, 1), (0, 4, 1))

    def f(a, v):
        x = E.update_slice(a, v, ((0, 1, 1), (0, 4, 1)))
        s = E.slice_(x, row)
        return E.update_slice(x, E.zeros_like(s), row), s
    a = np.arange(12.0).reshape(3, 4)
    v = np.full((1, 4), -1.0)
    graph = tg.make_ir(f)(a, v)
    prog = ir.program(graph)
    assert _writes_in_place(prog) == 1
    at = next(i for i, e in enumerate(graph.eqns) if e.op == "slice")
    e = graph.eqns[at]
    renewed = prog.renewed(graph, {}, (), {at: restep(e, None, e.params, None)})
    want = ir.interpret(graph, [a, v])
    for p in (prog, renewed):
        _same(p([a, v]), want, "renewed")
    assert _writes_in_place(renewed) == 1


def test_an_update_returned_is_not_copied_again():
    """A copying update_slice step makes a new array: returned as it is, not copied."""
    from tracegrad.ir import emit as E
    from tracegrad.ir.interpret import makes_new
    a = np.arange(12.0).reshape(3, 4)
    v = np.full((1, 4), -1.0)
    prog = ir.program(tg.make_ir(lambda a, v: E.update_slice(a, v, ((1, 2, 1), (0, 4, 1))))(a, v))
    (step,) = [s for s in prog.steps if s[2] == prog.outs[0]]
    assert makes_new(step[0])
    out = prog([a, v])[0]
    assert not np.shares_memory(out, a)
    np.testing.assert_array_equal(out[1], v[0])


def _random_update_graph(seed: int):
    """A random mix of updates, views (rows, reshapes, transposes) and arithmetic on (4, 5)
    arrays and their (1, 5) rows: the aliasing in_place has to get right."""
    from tracegrad.ir import emit as E
    rng = np.random.default_rng(seed)

    def f(x, r):
        whole, rows = [x], [r]
        for _ in range(int(rng.integers(3, 12))):
            k = int(rng.integers(0, 6))
            a = whole[int(rng.integers(0, len(whole)))]
            t = int(rng.integers(0, 4))
            if k <= 1:
                whole.append(E.update_slice(a, rows[int(rng.integers(0, len(rows)))],
                                            ((t, t + 1, 1), (0, 5, 1))))
            elif k == 2:
                rows.append(E.slice_(a, ((t, t + 1, 1), (0, 5, 1))))
            elif k == 3:
                whole.append(E.reshape(E.transpose(E.reshape(a, (5, 4)), (1, 0)), (4, 5)))
            elif k == 4:
                whole.append(E.tanh(a) if t % 2 else a + whole[-1])
            else:
                rows.append(rows[-1] * 2.0)
        picks = {int(i) for i in rng.integers(0, len(whole), 2)}
        return [whole[-1], rows[-1]] + [whole[i] for i in sorted(picks)]
    return f


@pytest.mark.parametrize("seed", range(60))
def test_random_update_programs_match_the_reference(seed):
    x = np.random.default_rng(seed).normal(size=(4, 5))
    r = np.random.default_rng(seed + 1).normal(size=(1, 5))
    graph = tg.make_ir(_random_update_graph(seed))(x, r)
    prog = ir.program(graph)
    want = ir.interpret(graph, [x, r])
    for _ in range(2):
        _same(prog([x.copy(), r.copy()]), want, f"seed {seed}")
    _same(prog([x, r]), want, f"seed {seed}")

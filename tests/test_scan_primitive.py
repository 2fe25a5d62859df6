"""The scan primitive, built by hand: its reference against a Python loop, the verifier,
unrolling, forward mode (finite differences, the unrolled graph's jvp), the IR passes, the
dump, and native code against the interpreter."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import graph_of, numerical_jvp

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir.scan import unroll_scans

F4, F8, I8 = np.dtype("f4"), np.dtype("f8"), np.dtype("i8")


def scan(body: ir.Graph, length: int, consts, carry, xs, reverse: bool = False) -> list:
    """Emit a scan into the active builder (xs: one stacked array per body input)."""
    return ir.bind("scan", *consts, *carry, *xs, body=body, length=length,
                   n_consts=len(consts), n_carry=len(carry), **({"reverse": True} if reverse
                                                                 else {}))


def scan_graph(body: ir.Graph, length: int, n_consts: int, n_carry: int,
               reverse: bool = False) -> ir.Graph:
    """A graph taking every input of one scan and returning every output."""
    head = body.in_avals[:n_consts + n_carry]
    stacked = [ir.Aval((length,) + a.shape, a.dtype) for a in body.in_avals[n_consts + n_carry:]]
    b = ir.Builder("outer")
    ins = [b.new_input(a) for a in head + stacked]
    with b.active():
        outs = scan(body, length, ins[:n_consts], ins[n_consts:n_consts + n_carry],
                    ins[n_consts + n_carry:], reverse)
    return b.build(outs)


def args_for(graph: ir.Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-3, 4, a.shape).astype(a.dtype) if a.dtype.kind in "iu"
            else (0.7 * rng.standard_normal(a.shape)).astype(a.dtype) for a in graph.in_avals]


def rnn_body(dtype=F4, n: int = 3) -> ir.Graph:
    """(W, h, x) -> (h' = tanh(h @ W + x), y = 2 h')."""
    def step(W, h, x):
        hn = tg.tanh(h @ W + x)
        return hn, hn * 2
    return graph_of(step, ir.Aval((n, n), dtype), ir.Aval((1, n), dtype), ir.Aval((1, n), dtype))


def nested_body(dtype=F4) -> ir.Graph:
    """An RNN step that runs an inner scan of two RNN steps (x, then x/2)."""
    inner = rnn_body(dtype)

    def step(W, h, x):
        hn, ys = scan(inner, 2, [W], [h], [tg.stack([x, x * 0.5])])
        return hn, ys[0] + tg.sin(ys[1])
    return graph_of(step, *inner.in_avals)


def counter_body(dtype=F4) -> ir.Graph:
    """An int carry next to a float one: (k, acc, x) -> (k + 1, acc + k x, y = acc * x)."""
    def step(k, acc, x):
        return k + 1, acc + tg.astype(k, dtype) * x, acc * x
    return graph_of(step, ir.Aval((), I8), ir.Aval((4,), dtype), ir.Aval((4,), dtype))


def map_body(dtype=F4) -> ir.Graph:
    """No carry: (W, x) -> (sin(x @ W), sum(x))."""
    return graph_of(lambda W, x: (tg.sin(x @ W), tg.sum(x)),
                    ir.Aval((3, 2), dtype), ir.Aval((4, 3), dtype))


def const_body(dtype=F4) -> ir.Graph:
    """A body holding constants of its own (numpy arrays captured while tracing it)."""
    m = np.linspace(-1, 1, 9).reshape(3, 3).astype(dtype)
    shift = np.arange(3, dtype=dtype) / 4

    def step(h, x):
        hn = tg.tanh(h @ m + x * shift)
        return hn, hn - shift
    return graph_of(step, ir.Aval((1, 3), dtype), ir.Aval((1, 3), dtype))


def passthrough_body(dtype=F4) -> ir.Graph:
    """Outputs that are no equation's: carry' = x, y = (the old carry, a literal)."""
    return graph_of(lambda h, x: (x, h, np.asarray(3.0, dtype)),
                    ir.Aval((2,), dtype), ir.Aval((2,), dtype))


# (name, body maker, length, n_consts, n_carry)
CASES = [
    ("rnn", rnn_body, 4, 1, 1),
    ("nested", nested_body, 3, 1, 1),
    ("int_carry", counter_body, 3, 0, 2),
    ("map", map_body, 3, 1, 0),
    ("body_consts", const_body, 3, 0, 1),
    ("passthrough", passthrough_body, 3, 0, 1),
]
IDS = [c[0] for c in CASES]


def case_graph(case, dtype=F4) -> ir.Graph:
    _, make, length, n_consts, n_carry = case
    return scan_graph(make(dtype), length, n_consts, n_carry)


def close(got, want, rtol=1e-5, atol=1e-6) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")


# ---- semantics ---------------------------------------------------------------------------------

def test_reference_runs_the_body_in_a_python_loop():
    g = case_graph(CASES[0], F8)
    args = args_for(g)
    W, h, xs = args
    assert xs.shape == (4, 1, 3)
    ys = []
    for x in xs:
        h = np.tanh(h @ W + x)
        ys.append(2 * h)
    close(ir.interpret(g, args), [h, np.stack(ys)], rtol=1e-12)
    eager = ir.bind("scan", *args, **g.eqns[0].params)    # outside a trace: evaluated
    close(eager, [h, np.stack(ys)], rtol=1e-12)
    back = ir.bind("scan", *args, **g.eqns[0].params, reverse=True)    # t = 3, 2, 1, 0
    h, ys = args[1], [None] * 4
    for t in (3, 2, 1, 0):
        h = np.tanh(h @ W + xs[t])
        ys[t] = 2 * h
    close(back, [h, np.stack(ys)], rtol=1e-12)


def test_int_carry_and_map_references():
    g = case_graph(CASES[2], F8)
    k, acc, xs = args_for(g)
    want_ys = []
    for x in xs:
        want_ys.append(acc * x)
        k, acc = k + 1, acc + k * x
    close(ir.interpret(g, args_for(g)), [k, acc, np.stack(want_ys)], rtol=1e-12)
    m = case_graph(CASES[3], F8)
    W, xs = args_for(m)
    want = [np.stack([np.sin(x @ W) for x in xs]), np.stack([np.sum(x) for x in xs])]
    close(ir.interpret(m, [W, xs]), want, rtol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_verifies_and_unrolls_to_the_same_values(case):
    g = case_graph(case, F8)
    ir.verify(g)
    flat = unroll_scans(g)
    ir.verify(flat)
    assert all(e.op != "scan" for e in flat.eqns)
    args = args_for(g)
    close(ir.interpret(flat, args), ir.interpret(g, args), rtol=1e-13, atol=0)


def test_unroll_returns_a_graph_without_scans_itself_and_copies_body_consts_once_per_scan():
    plain = graph_of(lambda x: (tg.sin(x),), ir.Aval((2,), F4))
    assert unroll_scans(plain) is plain
    body = const_body()
    g = scan_graph(body, 5, 0, 1)
    flat = unroll_scans(g)
    assert len(flat.constvars) == len(g.constvars) + len(body.constvars)
    # per step: the body, a slice and a reshape of the x, a reshape of the y; one concatenate
    assert len(flat.eqns) == 5 * (len(body.eqns) + 3) + 1


# ---- forward mode ------------------------------------------------------------------------------

def _jvp_values(graph, args, tans):
    out = ir.interpret(ir.jvp_graph(graph), list(args) + list(tans))
    return out[len(graph.outvars):]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp_matches_finite_differences_and_the_unrolled_jvp(case):
    g = case_graph(case, F8)
    args = args_for(g, 1)
    tans = [np.zeros_like(a) if a.dtype.kind in "iu" else t
            for a, t in zip(args, args_for(g, 2))]
    got = _jvp_values(g, args, tans)
    close(got, _jvp_values(unroll_scans(g), args, tans), rtol=1e-10, atol=1e-12)
    for i, v in enumerate(g.outvars):
        if v.aval.dtype.kind != "f":
            continue
        fd = numerical_jvp(lambda *xs: ir.interpret(g, [x.astype(a.dtype) for x, a in
                                                         zip(xs, args)])[i], args, tans)
        np.testing.assert_allclose(got[i], fd, rtol=1e-6, atol=1e-7, err_msg=f"output {i}")


def _partial_jvp(graph, args, tans):
    """Output tangents (None where zero) with tangents only where `tans` has them."""
    b = ir.Builder("jvp")
    ins = [b.new_input(v.aval) for v in graph.invars]
    given = [None if t is None else b.new_input(v.aval) for v, t in zip(graph.invars, tans)]
    _, touts = ir.forward_pass(b, graph, ins, given)
    live = [t for t in touts if t is not None]
    out = ir.interpret(b.build(live), list(args) + [t for t in tans if t is not None])
    it = iter(out)
    return [None if t is None else next(it) for t in touts]


@pytest.mark.parametrize("which", ["W", "x1", "h"])
def test_jvp_with_some_tangents_zero(which):
    """A tangent only on W (the carry's starts at zero and grows), only on step 1 of the xs
    (y_0's is zero), or only on the initial carry."""
    g = case_graph(CASES[0], F8)
    args = args_for(g, 3)
    pos = {"W": 0, "h": 1, "x1": 2}[which]
    tans = [None] * len(args)
    tans[pos] = args_for(g, 4)[pos]
    if which == "x1":
        tans[pos][[0, 2, 3]] = 0
    got = _partial_jvp(g, args, tans)
    want = _partial_jvp(unroll_scans(g), args, tans)
    assert got[0] is not None
    for gt, wt in zip(got, want):
        if gt is None:
            assert wt is None, which
        else:
            np.testing.assert_allclose(gt, 0 if wt is None else wt, rtol=1e-10, atol=1e-12)
    if which == "x1":
        assert not got[1][0].any() and got[1][1].any()


def test_jvp_body_is_built_once_per_body_and_tangent_mask():
    g = case_graph(CASES[0], F8)
    j1, j2 = ir.jvp_graph(g), ir.jvp_graph(g)
    bodies = [[e.params["body"] for e in j.eqns if e.op == "scan"] for j in (j1, j2)]
    assert len(bodies[0]) == 2 and bodies[0][1] is bodies[1][1]


def test_jvp_of_jvp_through_a_nested_scan():
    g = case_graph(CASES[1], F8)
    jj = ir.jvp_graph(ir.jvp_graph(g))
    ir.verify(jj)
    args = args_for(jj, 5)
    close(ir.interpret(jj, args), ir.interpret(unroll_scans(jj), args), rtol=1e-10, atol=1e-12)


# ---- bad inputs --------------------------------------------------------------------------------

def _emit(body, inputs, length=3, n_consts=1, n_carry=1):
    b = ir.Builder("bad")
    ins = [b.new_input(a).atom for a in inputs]
    b.emit("scan", ins, dict(body=body, length=length, n_consts=n_consts, n_carry=n_carry))


def test_bad_inputs_raise_shape_errors_naming_the_problem():
    body = rnn_body()
    W, h, x = body.in_avals
    with pytest.raises(ir.ShapeError, match=r"scan: .*body taking 3 values got 4 inputs"):
        _emit(body, [W, h, x, x])
    xs = ir.Aval((3,) + x.shape, x.dtype)
    with pytest.raises(ir.ShapeError, match=r"scan input 2 is f32\[3,1,4\], its body takes "
                                            r"f32\[3,1,3\]"):
        _emit(body, [W, h, ir.Aval((3, 1, 4), F4)])
    with pytest.raises(ir.ShapeError, match=r"scan input 2 is f32\[1,3\]"):   # not stacked
        _emit(body, [W, h, x])
    with pytest.raises(ir.ShapeError, match=r"scan input 1 is f64\[1,3\]"):
        _emit(body, [W, ir.Aval((1, 3), F8), xs])
    with pytest.raises(ir.ShapeError, match="length 0"):
        _emit(body, [W, h, ir.Aval((0,) + x.shape, x.dtype)], length=0)
    grows = graph_of(lambda h: (tg.concatenate([h, h], 0),), ir.Aval((2,), F4))
    with pytest.raises(ir.ShapeError, match=r"carry types change: f32\[2\] -> f32\[4\]"):
        _emit(grows, [ir.Aval((2,), F4)], n_consts=0)


def test_verify_checks_the_body_and_names_it():
    body = rnn_body()
    g = scan_graph(body, 2, 1, 1)
    ghost = ir.Var(body.in_avals[1])
    bad = ir.Graph(body.invars, [ir.Eqn("tanh", [ghost], [ir.Var(ghost.aval)])] + body.eqns,
                   body.outvars)
    g.eqns[0].params = dict(g.eqns[0].params, body=bad)
    with pytest.raises(ir.IRError, match=r"equation 0 \(scan\), in its body: equation 0 "
                                         r"\(tanh\): reads .*not defined"):
        ir.verify(g)
    g.eqns[0].params = dict(g.eqns[0].params, body="not a graph")
    with pytest.raises(ir.IRError, match=r"equation 0 \(scan\): its body 'not a graph'"):
        ir.verify(g)


# ---- passes and the dump -----------------------------------------------------------------------

def test_passes_keep_scans_whole():
    double = graph_of(lambda c: (c * 2,), ir.Aval((), F4))
    b = ir.Builder("o")
    with b.active():
        one = np.asarray(1.0, F4)
        a, = scan(double, 3, [], [one], [])
        a2, = scan(double, 3, [], [one], [])   # the same scan again
        g = b.build([a + a2])
    assert [e.op for e in ir.fold_constants(g).eqns].count("scan") == 2   # never folded
    assert [e.op for e in ir.cse(g).eqns].count("scan") == 1
    opt = ir.optimize(g)
    assert [e.op for e in opt.eqns].count("scan") == 1
    np.testing.assert_allclose(ir.interpret(opt, [])[0], 16.0)
    rnn = case_graph(CASES[0])
    only_y = ir.dce(ir.Graph(rnn.invars, rnn.eqns, rnn.outvars[1:2]))
    assert [e.op for e in only_y.eqns] == ["scan"]


def test_optimize_optimises_each_body_once_and_moves_its_constants_out():
    def step(W, h, x):
        dead = tg.exp(x)   # noqa: F841 - dead code the pass removes
        hn = tg.tanh((h @ W) * 1.0 + x)
        return hn, hn
    body = graph_of(step, *rnn_body().in_avals)
    g = scan_graph(body, 3, 1, 1)
    o1, o2 = ir.optimize(g), ir.optimize(g)
    b1 = o1.eqns[0].params["body"]
    assert b1 is o2.eqns[0].params["body"] and len(b1.eqns) == 3
    assert ir.optimize(o1).eqns[0].params["body"] is b1      # a fixed point
    args = args_for(g)
    close(ir.interpret(o1, args), ir.interpret(g, args))
    cg = case_graph(CASES[4])
    oc = ir.optimize(cg)
    ir.verify(oc)
    (e,) = [x for x in oc.eqns if x.op == "scan"]
    # m is read in the loop; x * shift and hn - shift are made before and after it
    assert not e.params["body"].constvars and e.params["n_consts"] == 1
    assert [x.op for x in e.params["body"].eqns] == ["matmul", "add", "tanh"]
    assert len(oc.constvars) == 2
    args = args_for(cg)
    close(ir.interpret(oc, args), ir.interpret(cg, args))


def test_dump_prints_the_body_as_a_nested_block():
    g = case_graph(CASES[1])
    text = str(g)
    lines = text.splitlines()
    assert lines[1].lstrip().startswith("d:f32[1,3] e:f32[3,1,3] = "
                                        "scan[length=3,n_consts=1,n_carry=1] a b c")
    assert lines[2] == "      body={ lambda a:f32[3,3] b:f32[1,3] c:f32[1,3] ."
    assert "            body={ lambda a:f32[3,3] b:f32[1,3] c:f32[1,3] ." in lines  # inner
    assert lines[-1] == "  in (d e) }"
    assert "tanh" in text and "{...}" not in text
    assert "scan x3" in g.to_dot()


# ---- native code -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in CASES if c[0] != "body_consts"], ids=IDS[:4] + IDS[5:])
def test_native_code_matches_the_interpreter(case, no_disk_cache):
    from tracegrad.runtime import compile_graph
    g = case_graph(case)
    args = args_for(g)
    close(compile_graph(g)(args), ir.interpret(g, args), rtol=2e-5, atol=2e-6)


def test_native_code_of_a_body_with_constants_after_optimize(no_disk_cache):
    from tracegrad.runtime import compile_graph
    g = case_graph(CASES[4])
    args = args_for(g)
    with pytest.raises(NotImplementedError, match="ir.optimize moves them out"):
        compile_graph(g)
    close(compile_graph(ir.optimize(g))(args), ir.interpret(g, args), rtol=2e-5, atol=2e-6)


def test_jit_compiles_a_function_with_a_scan(no_disk_cache):
    body = rnn_body()

    def f(W, h, xs):
        hn, ys = scan(body, 3, [W], [h], [xs])
        return tg.sum(hn) + ys[0] * ys[2]
    args = args_for(scan_graph(body, 3, 1, 1), 7)
    lowered = tg.jit(f).lower(*args)
    assert "scan" in [e.op for e in lowered.ir.eqns] and "tg_entry" in lowered.llvm_ir
    want = ir.interpret(tg.make_ir(f)(*args), args)[0]
    np.testing.assert_allclose(tg.jit(f)(*args), want, rtol=2e-5, atol=2e-6)
    jvp = ir.jvp_graph(lowered.ir)       # forward mode, compiled too
    from tracegrad.runtime import compile_graph
    targs = args + args_for(jvp, 8)[len(args):]
    close(compile_graph(ir.optimize(jvp))(targs), ir.interpret(jvp, targs), rtol=1e-4,
          atol=1e-5)

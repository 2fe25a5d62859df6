"""Property tests over random programs (hypothesis): compiled == interpreter for values and
gradients, vjp/jvp == finite differences, grad-of-grad on smooth programs, and the IR passes
(CSE, DCE, folding, fusion) preserving results. HYPOTHESIS_PROFILE=long runs more examples."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import check_grads
from random_programs import NUMPY, generate, output_weights, tracegrad_lib

import tracegrad as tg
from tracegrad import ir, runtime

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
L = tracegrad_lib()


@st.composite
def programs(draw, smooth=False, max_steps=8):
    prog = generate(lambda lo, hi: draw(st.integers(lo, hi)), smooth=smooth,
                    max_steps=max_steps)
    return prog, draw(st.integers(0, 2**16))


def _fewer(divisor: int) -> hypothesis.settings:
    return hypothesis.settings(
        max_examples=max(5, hypothesis.settings.default.max_examples // divisor))


def _close(got, want, dtype) -> None:
    want = np.asarray(want)
    scale = float(np.max(np.abs(want), initial=1.0))
    rtol, atol = (2e-4, 1e-5) if dtype == np.float32 else (1e-11, 1e-13)
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol * scale)


def _grad_fn(prog, w):
    n = len(prog.shapes)
    return tg.grad(prog.loss(L, w), argnums=tuple(range(n)))


@pytest.fixture(autouse=True)
def _native(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")
    monkeypatch.setattr(tg.config, "tiering", False)


@hypothesis.given(programs(), st.sampled_from([np.float32, np.float64]))
def test_compiled_matches_interpreter_values_and_gradients(case, dtype):
    prog, seed = case
    xs = prog.inputs(seed, dtype)
    w = output_weights(prog, seed).astype(dtype)
    for f in (lambda *a: prog.run(L, *a), _grad_fn(prog, w)):
        graph = tg.make_ir(f)(*xs)
        want = ir.interpret(graph, xs)
        got = runtime.run_graph(ir.optimize(graph), xs)
        for g, v in zip(got, want, strict=True):
            _close(g, v, dtype)
    # the public path: jit compiles on first call (tiering off)
    _close(tg.jit(lambda *a: prog.run(L, *a))(*xs), prog.run(NUMPY, *xs), dtype)


@hypothesis.given(programs(smooth=True))
def test_vjp_and_jvp_match_finite_differences(case):
    prog, seed = case
    check_grads(lambda *a: prog.run(L, *a), prog.inputs(seed), rtol=1e-5, seed=seed)


@_fewer(3)
@hypothesis.given(programs(smooth=True, max_steps=4))
def test_grad_of_grad_matches_finite_differences(case):
    prog, seed = case
    check_grads(lambda *a: prog.run(L, *a), prog.inputs(seed), order=2, rtol=1e-4,
                modes=("rev",), seed=seed)


@hypothesis.given(programs())
def test_passes_preserve_results(case):
    prog, seed = case
    xs = prog.inputs(seed)
    w = output_weights(prog, seed)
    # running the program twice gives CSE duplicates to merge
    twice = lambda *a: [prog.run(L, *a), prog.run(L, *a) * 2.0]
    for f in (twice, _grad_fn(prog, w)):
        graph = tg.make_ir(f)(*xs)
        want = ir.interpret(graph, xs)
        for p in (ir.cse, ir.dce, ir.simplify, ir.fold_constants, ir.optimize):
            out = p(graph)
            ir.verify(out)
            for g, v in zip(ir.interpret(out, xs), want, strict=True):
                np.testing.assert_allclose(g, v, rtol=1e-12, atol=1e-14, err_msg=p.__name__)
    graph = tg.make_ir(twice)(*xs)
    if graph.eqns:
        assert len(ir.cse(graph).eqns) < len(graph.eqns)

"""Shared test helpers: finite-difference gradient checks (like HIPS autograd's check_grads)
and jvp/vjp consistency, all in float64 on the reference interpreter."""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import pytest

import tracegrad as tg

EPS = 1e-6

try:
    import hypothesis
except ImportError:   # pragma: no cover - hypothesis is a dev dependency
    hypothesis = None
else:
    # "ci" (default) keeps the suite fast; HYPOTHESIS_PROFILE=long runs many more examples.
    _quiet = {"deadline": None, "suppress_health_check": list(hypothesis.HealthCheck)}
    hypothesis.settings.register_profile("ci", max_examples=30, derandomize=True, **_quiet)
    hypothesis.settings.register_profile("long", max_examples=1000, **_quiet)
    hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "slow: minutes-long reliability checks, run only with "
                            "TRACEGRAD_SLOW=1")


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    if os.environ.get("TRACEGRAD_SLOW", "") in ("", "0"):
        skip = pytest.mark.skip(reason="slow; set TRACEGRAD_SLOW=1 to run")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


def rand(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0,
         dtype: Any = np.float64) -> np.ndarray:
    """Deterministic uniform test data."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(dtype)


def _vdot(a: Any, b: Any) -> float:
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


def numerical_jvp(f: Callable, args: Sequence[np.ndarray], tangents: Sequence[np.ndarray],
                  eps: float = EPS) -> np.ndarray:
    """Central finite difference of `f` at `args` along `tangents`, in float64."""
    plus = f(*[a + eps * t for a, t in zip(args, tangents, strict=True)])
    minus = f(*[a - eps * t for a, t in zip(args, tangents, strict=True)])
    return (np.asarray(plus, np.float64) - np.asarray(minus, np.float64)) / (2 * eps)


def anchors() -> tuple[Any, Any]:
    """(torch, jax) where installed, else None: jax in float64 on the CPU, as the
    differential tests compare in float64."""
    try:
        import torch
    except ImportError:   # pragma: no cover - optional
        torch = None
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")
    except ImportError:   # pragma: no cover - optional
        jax = None
    return torch, jax


def check_grads(f: Callable, args: Sequence[Any], *, order: int = 1, rtol: float = 1e-5,
                atol: float = 1e-6, eps: float = EPS, seed: int = 0,
                modes: Sequence[str] = ("fwd", "rev")) -> None:
    """Check `f`'s derivatives at float64 `args` against central finite differences:
    forward mode (jvp) against the FD directional derivative, reverse mode (vjp) through
    <u, FD> == <vjp(u), v>, and jvp/vjp consistency <jvp(v), u> == <v, vjp(u)>.
    With order=2 the same checks run on the vjp function itself (derivatives of derivatives).
    `f` takes and returns arrays; it is called eagerly on numpy arrays and under tracing."""
    args = tuple(np.asarray(a, np.float64) for a in args)
    rng = np.random.default_rng(seed)
    out = np.asarray(f(*args))
    vs = tuple(rng.standard_normal(a.shape) for a in args)
    u = rng.standard_normal(out.shape)
    fd = numerical_jvp(f, args, vs, eps)
    scale = max(1.0, float(np.max(np.abs(fd), initial=0.0)))
    fwd = rev = None
    if "fwd" in modes:
        primal, fwd = tg.jvp(f, args, vs)
        np.testing.assert_allclose(primal, out, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(fwd, fd, rtol=rtol, atol=atol * scale,
                                   err_msg="jvp differs from finite differences")
    if "rev" in modes:
        primal, vjp_fn = tg.vjp(f, *args)
        np.testing.assert_allclose(primal, out, rtol=1e-10, atol=1e-12)
        grads = vjp_fn(u)
        assert len(grads) == len(args)
        for g, a in zip(grads, args, strict=True):
            assert np.shape(g) == a.shape, (np.shape(g), a.shape)
        rev = sum(_vdot(g, v) for g, v in zip(grads, vs, strict=True))
        want = _vdot(u, fd)
        assert abs(rev - want) <= rtol * abs(want) + atol * scale * max(1, u.size), \
            f"vjp disagrees with finite differences: {rev} vs {want}"
    if fwd is not None and rev is not None:
        lhs = _vdot(fwd, u)
        tol = max(1e-8, 1e-2 * rtol)
        assert abs(lhs - rev) <= tol * (abs(lhs) + abs(rev)) + 1e-10, \
            f"<jvp(v), u> = {lhs} but <v, vjp(u)> = {rev}"
    if order > 1:
        def vjp_dot(*xs: Any) -> Any:
            gs = tg.vjp(f, *xs)[1](u)
            total = 0.0
            for g, w in zip(gs, vs, strict=True):
                total = tg.add(total, tg.sum(tg.mul(g, w)))
            return total
        check_grads(vjp_dot, args, order=order - 1, rtol=rtol, atol=atol, eps=eps,
                    seed=seed + 1, modes=modes)


def count_ops(graph: tg.ir.Graph, op: str) -> int:
    return sum(e.op == op for e in graph.eqns)


def graph_of(fn, *avals: tg.ir.Aval) -> tg.ir.Graph:
    """The graph `fn` traces on fresh inputs of these types (e.g. a scan body)."""
    b = tg.ir.Builder("body")
    ins = [b.new_input(a) for a in avals]
    with b.active():
        outs = fn(*ins)
    return b.build(list(outs))


def rolled_and_unrolled(fn):
    """`fn()` with traced loops rolled into scans, and step by step: (rolled, unrolled)."""
    old = tg.config.roll_loops
    try:
        tg.config.roll_loops = False
        want = fn()
        tg.config.roll_loops = True
        got = fn()
    finally:
        tg.config.roll_loops = old
    return got, want


@pytest.fixture
def unrolled(monkeypatch):
    """Differentiate traced loops step by step (tg.config.roll_loops off) in this test."""
    monkeypatch.setattr(tg.config, "roll_loops", False)


@pytest.fixture
def interpreter_only(monkeypatch):
    """Run graphs on the reference interpreter even if a native backend is registered."""
    monkeypatch.setattr(tg.config, "disable_jit", True)


@pytest.fixture(scope="module")
def no_disk_cache():
    """Compile for real in this module: no object code from the on-disk cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRACEGRAD_DISK_CACHE", "0")
    yield
    mp.undo()


def build_graph(fn: Callable, *avals: tuple) -> tg.ir.Graph:
    """The graph of `fn` on fresh inputs of the given (shape, dtype) pairs."""
    b = tg.ir.Builder()
    xs = [b.new_input(tg.ir.Aval(tuple(s), np.dtype(d))) for s, d in avals]
    with b.active():
        out = fn(*xs)
    return b.build(list(out) if isinstance(out, (list, tuple)) else [out])

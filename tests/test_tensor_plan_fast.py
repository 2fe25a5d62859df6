"""Fast paths of recording and of composing backward Plans: `tg.f(tensor)` recorded without
the generic dispatch search, and the composer's shortcuts (concatenate's type, fresh outputs,
merged weight-gradient products). Each must give what the general path gives — the same grad_fn,
source line, bits — and must step aside where it does not apply."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir.core import Aval
from tracegrad.ir.ops import OPS
from tracegrad.tracer import autograd_compose, autograd_exec, autograd_template


# ---- tg.f(tensor) ----------------------------------------------------------------------------

def test_a_function_of_one_tensor_records_as_the_method_does():
    x = tg.tensor([[0.5, -1.0, 2.0]], requires_grad=True)
    for _ in range(2):      # recorded, then replayed
        y = tg.tanh(x)
        z = x.tanh()
        assert y.grad_fn.name() == z.grad_fn.name() == "TanhBackward0"
        assert y.grad_fn.src.startswith("test_tensor_plan_fast.py:")
        np.testing.assert_array_equal(y.detach().numpy(), z.detach().numpy())
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 - np.tanh(x.detach().numpy()) ** 2, rtol=1e-6)


def test_functions_with_keywords_subclasses_and_traced_values_take_the_general_path():
    x = tg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    s = tg.sum(x, axis=0)       # a keyword: recorded by `record`
    assert s.grad_fn.name() == "SumBackward1"
    p = tg.nn.Parameter(tg.tensor([0.25, 0.5]))
    e = tg.exp(p)               # a Tensor subclass: found by the dispatch search
    assert isinstance(e, tg.Tensor) and e.grad_fn.name() == "ExpBackward0"
    e.sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), np.exp([0.25, 0.5]), rtol=1e-6)
    g = tg.grad(lambda v: tg.sum(tg.tanh(v)))(np.array([0.0, 1.0], np.float32))
    np.testing.assert_allclose(g, 1 - np.tanh([0.0, 1.0]) ** 2, rtol=1e-6)


def test_tensors_inside_a_trace_on_another_thread_are_values_of_that_trace():
    """The recording fast paths read the trace stack from the thread's modes (one lookup
    less per op): it must be that thread's own stack, so a trace there is seen and the ops
    are the trace's, not nodes of the thread's tape."""
    import threading

    from tracegrad.ir import builder
    from tracegrad.tracer.grad_mode import mode
    a = tg.tensor([[1.0, 2.0]], requires_grad=True)
    b = tg.tensor([[3.0], [4.0]], requires_grad=True)
    a @ b, tg.tanh(a), a * a, a + a     # seen before: the fast paths
    out = {}

    def work():
        out["same"] = mode.state.traces is builder._state.stack
        f = tg.jit(lambda v: tg.tanh(a @ b) * v + (a * a).sum() + tg.tanh(a).sum())
        out["y"] = f(np.float32(2.0))
        out["recorded"] = len(mode.state.tape)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["same"] and out["recorded"] == 0
    want = np.tanh(11.0) * 2.0 + 5.0 + np.tanh([1.0, 2.0]).sum()
    np.testing.assert_allclose(out["y"], [[want]], rtol=1e-6)


def test_a_function_of_an_inference_tensor_stays_inference():
    with tg.inference_mode():
        y = tg.tanh(tg.ones(2))
    assert y.is_inference() and y.grad_fn is None


# ---- the composer's shortcuts ---------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,n", [((1, 4), 0, 3), ((3, 2), 1, 5), ((2, 3, 4), 2, 2),
                                          ((5,), 0, 7)])
def test_concatenate_of_one_type_has_the_rules_type(shape, axis, n):
    a = Aval(shape, np.dtype(np.float32))
    _, e = autograd_compose._synth("concatenate", (a,) * n, axis)
    assert e.outvars[0].aval == OPS["concatenate"].rule(*(a,) * n, axis=axis)


def rnn(T, W, U, xs, body=None):
    h = tg.zeros(1, W.shape[0], dtype=W.dtype)
    for t in range(T):
        h = (body or (lambda h, x, t: tg.tanh(h @ W + x @ U)))(h, xs[t], t)
    return (h * h).sum()


def test_fresh_outputs_are_found_as_by_a_scan_of_all_steps():
    rng = np.random.default_rng(0)
    W = tg.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    U = tg.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    xs = [tg.tensor(x) for x in rng.standard_normal((6, 1, 4)).astype(np.float32)]
    autograd_exec._grad_graphs.items.clear()
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()    # (another test's template would write T = 6's plan)
    autograd_template._shapes.clear()
    for T in (1, 3, 6):
        rnn(T, W, U, xs).backward()
    (W * 1.0).reshape(16).sum().backward()     # a gradient that is a reshape (a view)
    plans = [e.plan for e in autograd_exec._grad_graphs.values()]
    assert len(plans) == 4
    for p in plans:
        fresh = {out for fn, _, out, n in p.steps if n >= 0 and autograd_compose._makes_new(fn)}
        for k in range(len(p.init)):
            assert autograd_compose._fresh(p.steps, k) == (k in fresh)


def test_gradient_outputs_never_alias_inputs_or_each_other():
    x = tg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    y = tg.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    for _ in range(2):
        x.grad = y.grad = None
        (x + y).sum().backward()    # both gradients: the broadcast cotangent
        gx, gy = x.grad.numpy(), y.grad.numpy()
        assert not np.shares_memory(gx, gy)
        assert not np.shares_memory(gx, x.detach().numpy()) and \
            not np.shares_memory(gy, y.detach().numpy())
        np.testing.assert_array_equal(gx, np.ones((2, 3)))


def _variants(W, U, W2, xs):
    """RNN bodies where the composer's shortcuts must keep the general results."""
    half = lambda h, x, t: tg.tanh(h @ W + x @ U) if t < 3 else tg.sigmoid(h @ W + x @ U)
    leaf = lambda h, x, t: tg.tanh(h @ (W if t % 2 else W2) + x @ U)
    batch = lambda h, x, t: tg.tanh(h @ W + x @ U) if t != 2 else \
        tg.tanh(tg.concatenate([h, h]) @ W + tg.concatenate([x, x]) @ U)[:1]
    return {"plain": None, "half": half, "leaf": leaf, "batch": batch}


def _reference(T, w, u, w2, xs, body):
    """The same loss's gradients by the node-by-node engine (a hook on the loss forces it)."""
    W, U, W2 = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
    ts = [tg.tensor(x) for x in xs]
    loss = rnn(T, W, U, ts, _variants(W, U, W2, ts)[body])
    loss.register_hook(lambda g: g)
    loss.backward()
    return [None if t.grad is None else t.grad.numpy() for t in (W, U, W2)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_composed_plans_of_loop_variants_match_the_engine_bit_for_bit(dtype):
    rng = np.random.default_rng(3)
    w, u, w2 = ((rng.standard_normal((5, 5)) / 3).astype(dtype) for _ in range(3))
    xs = rng.standard_normal((7, 1, 5)).astype(dtype)
    W, U, W2 = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
    ts = [tg.tensor(x) for x in xs]
    for _ in range(2):      # composed, then taken from the cache
        for body in ("plain", "half", "leaf", "batch"):
            for T in (4, 7):
                W.grad = U.grad = W2.grad = None
                rnn(T, W, U, ts, _variants(W, U, W2, ts)[body]).backward()
                got = [None if t.grad is None else t.grad.numpy() for t in (W, U, W2)]
                for g, r in zip(got, _reference(T, w, u, w2, xs, body)):
                    assert (g is None) == (r is None)
                    if g is not None:
                        np.testing.assert_allclose(g, r, rtol=1e-5 if dtype == np.float32
                                                   else 1e-12, atol=1e-6)


def test_loop_gradients_match_finite_differences_in_float64():
    rng = np.random.default_rng(4)
    w, u, w2 = ((rng.standard_normal((3, 3)) / 2) for _ in range(3))
    xs = rng.standard_normal((5, 1, 3))

    def loss_of(w_, body):
        W, U, W2 = (tg.tensor(a) for a in (w_, u, w2))
        ts = [tg.tensor(x) for x in xs]
        return float(rnn(5, W, U, ts, _variants(W, U, W2, ts)[body]).item())

    for body in ("plain", "half", "leaf", "batch"):
        W, U, W2 = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
        ts = [tg.tensor(x) for x in xs]
        rnn(5, W, U, ts, _variants(W, U, W2, ts)[body]).backward()
        num = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            d = np.zeros_like(w)
            d[i] = 1e-6
            num[i] = (loss_of(w + d, body) - loss_of(w - d, body)) / 2e-6
        np.testing.assert_allclose(W.grad.numpy(), num, rtol=1e-5, atol=1e-7)


def test_no_grad_in_the_middle_of_a_loop_cuts_the_gradient():
    rng = np.random.default_rng(5)
    w, u = ((rng.standard_normal((4, 4)) / 3).astype(np.float32) for _ in range(2))
    xs = [tg.tensor(x) for x in rng.standard_normal((6, 1, 4)).astype(np.float32)]
    W, U = tg.tensor(w, requires_grad=True), tg.tensor(u, requires_grad=True)
    h = tg.zeros(1, 4)
    for t in range(6):
        if t == 3:
            with tg.no_grad():
                h = tg.tanh(h @ W + xs[t] @ U)
        else:
            h = tg.tanh(h @ W + xs[t] @ U)
    (h * h).sum().backward()
    hs = [np.zeros((1, 4), np.float32)]
    for t in range(6):
        hs.append(np.tanh(hs[-1] @ w + xs[t].numpy() @ u))
    g = 2 * hs[6]
    dw = np.zeros_like(w)
    for t in (6, 5):            # the steps after the no_grad one
        gz = g * (1 - hs[t] ** 2)
        dw += hs[t - 1].T @ gz
        g = gz @ w.T
    np.testing.assert_allclose(W.grad.numpy(), dw, rtol=1e-4, atol=1e-6)


def test_mixed_dtypes_in_a_loop_keep_their_types():
    rng = np.random.default_rng(6)
    W = tg.tensor(rng.standard_normal((3, 3)), dtype=np.float64, requires_grad=True)
    U = tg.tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True)
    xs = [tg.tensor(x) for x in rng.standard_normal((4, 1, 3)).astype(np.float32)]
    for _ in range(2):
        W.grad = U.grad = None
        h = tg.zeros(1, 3, dtype=np.float64)
        for t in range(4):
            h = tg.tanh(h @ W + (xs[t] @ U).astype(np.float64))
        (h * h).sum().backward()
        assert W.grad.dtype == np.float64 and U.grad.dtype == np.float32


def test_composing_a_plan_pauses_the_collector_and_restores_it(monkeypatch):
    """The cyclic collector is paused while a new graph's plan is composed (it made many
    small collections there), and left as it was: on, off (the user's choice), or after the
    composer raised."""
    import gc
    seen = []
    real = autograd_exec.compose

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)
    monkeypatch.setattr(autograd_exec, "compose", spy)

    def new_graph(n):
        w = tg.tensor(np.ones((2, 2), np.float32), requires_grad=True)
        h = tg.ones(1, 2)
        for _ in range(n):
            h = (h @ w).tanh()
        h.sum().backward()
    assert gc.isenabled()
    new_graph(3)
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        new_graph(4)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()

    def boom(*args):
        raise RuntimeError("composer failed")
    monkeypatch.setattr(autograd_exec, "compose", boom)
    with pytest.raises(RuntimeError, match="composer failed"):
        new_graph(5)
    assert gc.isenabled()


# ---- compiling in the background ---------------------------------------------------------------

def test_interpreting_while_a_graph_compiles_keeps_numpy_blas_to_one_thread(monkeypatch):
    """A backward graph that turned hot compiles in the background; until it is ready, the
    interpreted runs keep numpy's BLAS to one thread (the compile has the other core), then
    give the thread count back; the count of compiles in flight goes back to 0."""
    import threading
    import time
    from tracegrad.tracer import executor
    if not autograd_exec.has_backend():
        pytest.skip("no native backend")
    calls = []

    class OneThread:
        def __enter__(self):
            calls.append("enter")

        def __exit__(self, *exc):
            calls.append("exit")
    monkeypatch.setitem(executor._backend, "one_blas_thread", OneThread())
    monkeypatch.setattr(autograd_exec, "COMPILE_SECONDS_PER_EQN", 0.0)   # hot at once
    gate = threading.Event()
    compile_now = autograd_exec.CachedGraph._compile

    def slow_compile(self):
        assert gate.wait(60)
        return compile_now(self)
    monkeypatch.setattr(autograd_exec.CachedGraph, "_compile", slow_compile)
    rng = np.random.default_rng(5)
    w = tg.tensor(rng.standard_normal((13, 7)).astype(np.float32), requires_grad=True)
    x = tg.tensor(rng.standard_normal((11, 13)).astype(np.float32))

    def step():
        tg.tanh(x @ w).sum().backward()
        g = w.grad.numpy().copy()
        w.grad = None
        return g
    try:
        first = step()          # interpreted, then submitted
        assert autograd_exec._compiling[0] == 1 and calls == []
        second = step()         # interpreted while it compiles
        assert calls == ["enter", "exit"]
    finally:
        gate.set()
    deadline = time.monotonic() + 60
    while autograd_exec._compiling[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert autograd_exec._compiling[0] == 0
    third = step()          # native
    assert calls == ["enter", "exit"]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(third, first, rtol=1e-5, atol=1e-6)


def test_numpy_blas_guard_is_shared_with_the_kernels_and_restores_the_count():
    from tracegrad.runtime import blas
    guard = blas.numpy_one_blas_thread()
    found = blas.gemm()
    if found is not None and found.int_bits == 64:       # the kernels call numpy's OpenBLAS
        assert guard is blas.one_blas_thread()
    if guard._set is None:
        pytest.skip("no OpenBLAS thread setter in numpy's libraries")
    before = guard._set(3)
    try:
        with guard:
            with guard:                    # nested (another thread's) use
                assert guard._set(1) == 1
            assert guard._set(1) == 1
        assert guard._set(3) == 3
    finally:
        guard._set(before)

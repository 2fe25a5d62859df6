"""The composer's branches (autograd_compose.forward/backward and the merged weight-gradient
sums) on small graphs that reach each of them: every composed plan must run as ir.Program runs
the plan's own graph, bit for bit, and give the gradients the node-by-node engine gives; and
the types of the steps the composer makes itself, found without the ops' rules, must be the
rules' types."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir.core import Aval
from tracegrad.ir.ops import OPS
from tracegrad.tracer import autograd_compose, autograd_exec

N = 4


def _bodies(W, U, W2):
    """Loop bodies, each reaching a branch of the composer the plain RNN does not."""
    return {
        # a weight read at every step by one recipe step: its products merged into one matmul
        "plain": lambda h, x: tg.tanh(h @ W + x @ U),
        # a node's output read as a matmul's right operand: a lone product whose left operand
        # is a deferred transpose, emitted when that node's reverse pass reads it
        "right": lambda h, x: tg.tanh(x @ tg.tanh(W) + h @ U),
        # recipes with literals (forward and reverse constants) and several uses of `h`
        "consts": lambda h, x: tg.tanh(h @ W * 0.5 + x @ U - 1.0) + 0.25 * h,
        # `h` read by two matmuls (its transpose shared), two weights of one type
        "shared": lambda h, x: tg.sigmoid(h @ W + h @ W2 + x @ U),
        # products of two operand types for one weight: merged per type
        "types": lambda h, x: tg.tanh(h @ W + tg.concatenate([x, x])[:1] @ U
                                      + (tg.concatenate([h, h]) @ W2)[1:]),
        # a node of three arguments, one of them without a gradient
        "three": lambda h, x: tg.tanh(tg.concatenate([h, x, 2.0 * h]) @ W)[2:] + x @ U,
    }


def _loss(T, W, U, W2, xs, body):
    h = tg.zeros(1, N, dtype=W.dtype)
    for t in range(T):
        h = _bodies(W, U, W2)[body](h, xs[t])
    return (h * h).sum()


def _composed(monkeypatch) -> list:
    """The plans `compose` makes from now on."""
    plans = []
    compose = autograd_exec.compose

    def spy(*args):
        made = compose(*args)
        plans.append(made[0])
        return made
    monkeypatch.setattr(autograd_exec, "compose", spy)
    return plans


@pytest.mark.parametrize("body", ["plain", "right", "consts", "shared", "types",
                                  "three"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_composed_plans_run_as_their_graphs_and_match_the_engine(monkeypatch, body, dtype):
    rng = np.random.default_rng(5)
    w, u, w2 = ((rng.standard_normal((N, N)) / 2).astype(dtype) for _ in range(3))
    xs = rng.standard_normal((6, 1, N)).astype(dtype)
    for cache in vars(autograd_exec).values():     # plans of these graphs made by other tests
        if isinstance(cache, autograd_exec._LRU):
            cache.items.clear()
    plans = _composed(monkeypatch)
    W, U, W2 = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
    ts = [tg.tensor(x) for x in xs]
    for T in (1, 2, 3, 6):
        for t in (W, U, W2):
            t.grad = None
        _loss(T, W, U, W2, ts, body).backward()
        got = [t.grad for t in (W, U, W2)]
        # the reference: a hook on the loss makes the node-by-node engine run
        Wr, Ur, W2r = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
        loss = _loss(T, Wr, Ur, W2r, ts, body)
        loss.register_hook(lambda g: g)
        loss.backward()
        for g, r in zip(got, (Wr.grad, Ur.grad, W2r.grad), strict=True):
            assert (g is None) == (r is None)
            if g is not None:
                np.testing.assert_allclose(g.numpy(), r.numpy(), atol=1e-6,
                                           rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert len(plans) == 4, "each length should have been composed once"
    for plan in plans:
        args = [rng.standard_normal(v.aval.shape).astype(v.aval.dtype) for v in plan.in_vars]
        outs = plan(args)
        refs = autograd_exec.execute_interpreted(plan.graph(), args)
        assert len(outs) == len(refs)
        for o, r in zip(outs, refs, strict=True):
            assert o.dtype == r.dtype and o.shape == r.shape
            np.testing.assert_array_equal(o, r)


@pytest.mark.parametrize("op,shapes", [("transpose", [(3, 5)]), ("transpose", [(1, 4)]),
                                       ("matmul", [(5, 3), (3, 2)]),
                                       ("matmul", [(64, 7), (7, 64)])])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_composer_made_types_are_the_rules_types(op, shapes, dtype):
    ins = tuple(Aval(s, np.dtype(dtype)) for s in shapes)
    params = {"perm": (1, 0)} if op == "transpose" else {}
    assert autograd_compose._synth_type(op, ins) == OPS[op].rule(*ins, **params)
    _, e = autograd_compose._synth(op, ins)
    assert e.outvars[0].aval == OPS[op].rule(*ins, **params)


def test_composer_made_types_leave_other_cases_to_the_rule():
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    assert autograd_compose._synth_type("matmul", (Aval((2, 3), f32), Aval((3,), f32))) is None
    assert autograd_compose._synth_type("matmul", (Aval((2, 3), f32), Aval((3, 2), i32))) is None
    assert autograd_compose._synth_type("matmul", (Aval((2, 3), i32), Aval((3, 2), i32))) is None
    assert autograd_compose._synth_type("transpose", (Aval((2, 3, 4), f32),)) is None


@pytest.mark.parametrize("body", ["plain", "right", "shared", "types"])
def test_plan_matmuls_skip_their_checks_only_while_the_inputs_are_contiguous(monkeypatch, body):
    """A plan's matmuls whose operands are contiguous when its inputs are run as
    np.ndarray.dot (no _dot frame, no flags read); a call with an input in neither order runs
    them as _dot again. Both must compute what ir.Program computes for the plan's graph."""
    rng = np.random.default_rng(7)
    w, u, w2 = ((rng.standard_normal((N, N)) / 2).astype(np.float32) for _ in range(3))
    xs = rng.standard_normal((5, 1, N)).astype(np.float32)
    autograd_exec._tape_plans.items.clear()
    plans = _composed(monkeypatch)
    W, U, W2 = (tg.tensor(a, requires_grad=True) for a in (w, u, w2))
    _loss(5, W, U, W2, [tg.tensor(x) for x in xs], body).backward()
    plan, = plans
    dots = [s for s in plan.steps if s[0] is autograd_compose._ndot]
    assert plan.dots and len(dots) >= 5
    if body == "plain":     # every operand: an input, a matmul's or tanh's result, W.T
        assert not any(s[0] is autograd_compose._dot for s in plan.steps)
    checked = []
    real = autograd_compose._checked
    monkeypatch.setattr(autograd_compose, "_checked", lambda s: checked.append(1) or real(s))
    args = [rng.standard_normal(v.aval.shape).astype(np.float32) for v in plan.in_vars]
    strided = [np.repeat(a, 2, axis=-1)[..., ::2] if a.ndim == 2 else a for a in args]
    assert not all(a.flags.forc for a in strided)
    for ins, fallback in ((args, False), (strided, True), (args, False)):
        outs = plan(ins)
        assert bool(checked) == fallback
        checked.clear()
        refs = autograd_exec.execute_interpreted(plan.graph(), ins)
        for o, r in zip(outs, refs, strict=True):
            np.testing.assert_array_equal(o, r)

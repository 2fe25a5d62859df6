"""Plan templates (autograd_template): the backward of a loop's tape at a length not composed
before is written from the plans composed at two other lengths. Each test checks that what
the template writes is step for step what compose makes (`check` mode composes anyway and
compares), that the gradients are bit for bit those of composed plans, and that tapes a
template cannot vouch for are composed."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import autograd_compose, autograd_exec, autograd_template
from tracegrad.tracer.grad_mode import mode

H = 6
RNG = np.random.default_rng(3)
W0 = (RNG.standard_normal((H, H)) / 3).astype(np.float32)
U0 = (RNG.standard_normal((H, H)) / 3).astype(np.float32)
B0 = RNG.standard_normal((1, H)).astype(np.float32)
XS = RNG.standard_normal((24, 2, H)).astype(np.float32)
LENGTHS = [5, 12, 8, 15, 11, 7, 14, 10, 6, 13, 9, 20, 4, 3]


@pytest.fixture
def fresh(monkeypatch):
    """No plans or templates from earlier tests; counts the walks (compositions)."""
    autograd_exec._tape_plans.items.clear()
    autograd_exec._grad_graphs.items.clear()
    autograd_template._forms.clear()
    autograd_template._shapes.clear()
    mode.state.clear_tape()
    walks = []
    real = autograd_exec.grad_walk

    def counted(roots):
        walks.append(1)
        return real(roots)
    monkeypatch.setattr(autograd_exec, "grad_walk", counted)
    return walks


def _rnn(T, kind="tanh"):
    W = tg.tensor(W0, requires_grad=True)
    U = tg.tensor(U0, requires_grad=True)
    B = tg.tensor(B0, requires_grad=True)
    h = tg.zeros(2, H)
    acc = None
    for t in range(T):
        x = tg.tensor(XS[t])
        if kind == "tanh":
            h = tg.tanh(h @ W + x @ U)
        elif kind == "bias":
            h = tg.tanh(h @ W + x @ U + B)
        else:   # every step's output summed, a weight read twice per step
            h = tg.sigmoid(h @ W + x @ W.T) * U[0]
            acc = h if acc is None else acc + h
    loss = (h * h).sum() if acc is None else acc.mean()
    loss.backward()
    return [t.grad.numpy() if t.grad is not None else None for t in (W, U, B)]


def _bits(grads):
    return [None if g is None else g.view(np.uint32).tolist() for g in grads]


@pytest.mark.parametrize("kind", ["tanh", "bias", "summed"])
def test_a_template_writes_what_compose_makes(fresh, monkeypatch, kind):
    monkeypatch.setattr(autograd_template, "check", True)   # compose all, compare each
    compared = []
    real = autograd_template._same_parts
    monkeypatch.setattr(autograd_template, "_same_parts",
                        lambda x, y: compared.append(1) or real(x, y))
    composed = {T: _bits(_rnn(T, kind)) for T in LENGTHS}
    assert len(compared) == 1 + len([T for T in LENGTHS[2:] if T >= 5])  # (1: deriving)
    assert len(fresh) == len(LENGTHS)
    monkeypatch.setattr(autograd_template, "check", False)
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()
    for T in LENGTHS:
        assert _bits(_rnn(T, kind)) == composed[T]
    assert len(fresh) == len(LENGTHS) + 3 + 2   # three to learn from, two below them


def test_lengths_not_seen_before_are_written_not_composed(fresh):
    composed = {}
    for T in LENGTHS[:3]:   # two to derive the template from, a third to check it
        composed[T] = _bits(_rnn(T))
    assert len(fresh) == 3
    for T in LENGTHS[3:12]:
        grads = _bits(_rnn(T))
        assert grads == _bits(_rnn(T))      # (now from _tape_plans)
    assert len(fresh) == 3
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()
    for T in LENGTHS[3:12]:     # the same bits as composed plans
        composed[T] = _bits(_rnn(T))
    autograd_exec._tape_plans.items.clear()
    for T in LENGTHS[:12]:
        assert _bits(_rnn(T)) == composed[T]


def test_a_length_below_the_two_it_was_made_from_is_composed(fresh):
    _rnn(8)
    _rnn(12)
    assert len(fresh) == 2
    _rnn(5)
    assert len(fresh) == 3
    _rnn(9)                 # (the check)
    assert len(fresh) == 4
    _rnn(10)
    assert len(fresh) == 4


def test_a_written_plan_computes_what_its_ir_graph_does(fresh):
    _rnn(6)
    _rnn(9)
    _rnn(7)
    W = tg.tensor(W0, requires_grad=True)
    U = tg.tensor(U0, requires_grad=True)
    h = tg.zeros(2, H)
    for t in range(13):
        h = tg.tanh(h @ W + tg.tensor(XS[t]) @ U)
    loss = (h * h).sum()
    tape = mode.state.tape
    key = autograd_exec.tape_walk(tape, loss)
    plan, wrt, where = autograd_template.plan_for(key, tape, loss)
    args = [tape[i].args[j][2] for i, j in where]
    args = [a if isinstance(a, np.ndarray) else a.values[tape[i].args[j][0].id]
            for a, (i, j) in zip(args, where)] + [np.ones((), np.float32)]
    by_plan = plan(args)
    by_graph = tg.ir.interpret(plan.graph(), args)
    assert len(by_plan) == len(by_graph) == 1 + len(wrt)
    for a, b in zip(by_plan, by_graph):
        np.testing.assert_array_equal(a, b)
    # its matmuls are np.ndarray.dot, as the composed plans' (the merged weight gradients'
    # too), and they run checked for inputs not contiguous
    assert plan.dots and not any(s[0] is autograd_compose._dot for s in plan.steps)
    args = [np.asfortranarray(np.repeat(a, 2, axis=-1)[..., ::2]) if a.ndim == 2 else a
            for a in args]
    args[0] = np.repeat(args[0], 2, axis=-1)[..., ::2]
    assert not args[0].flags.forc
    for a, b in zip(plan(args), tg.ir.interpret(plan.graph(), args)):
        np.testing.assert_array_equal(a, b)
    loss.backward()


def test_hooks_and_other_programs_are_not_written(fresh):
    _rnn(6)
    _rnn(9)
    seen = []
    W = tg.tensor(W0, requires_grad=True)
    W.register_hook(lambda g: seen.append(1))
    h = tg.zeros(2, H)
    for t in range(11):
        h = tg.tanh(h @ W + tg.tensor(XS[t]) @ W)
    (h * h).sum().backward()
    assert seen == [1]
    n = len(fresh)
    _rnn(7, "bias")     # another form: composed
    assert len(fresh) == n + 1


def test_the_alignment_refuses_plans_that_differ_other_than_in_runs():
    d = 1
    assert autograd_template._align(list("xabcy"), list("xabcabcy"), d) == [
        ("fix", 0, 0, 1), ("run", 1, 1, 3, 1, 2), ("fix", 4, 7, 1)]
    assert autograd_template._align(list("xaby"), list("xabz"), d) is None
    assert autograd_template._align(list("xabcy"), list("xaby"), d) is None
    assert autograd_template._operands((14, 10, 4), (19, 15, 11, 5), 1) == (
        (14, 5, -4, 2, 1), (4, 1))
    with pytest.raises(autograd_template._Refused):
        autograd_template._operands((1, 2, 4), (1, 2, 4, 9, 30), 2)


def _chained(T):
    """Two states, one summing the other's products: the gradient of h sums a chain of adds
    whose first add (of two products) is unlike the rest (a sum and a product)."""
    rng = np.random.default_rng(0)
    W, U, V = (tg.tensor(rng.standard_normal(s) * 0.3, requires_grad=True)
               for s in ((3, 3), (2, 3), (3, 3)))
    b, c = (tg.tensor(rng.standard_normal(3) * 0.5, requires_grad=True) for _ in range(2))
    h = tg.zeros(3, 3, dtype=tg.float64) + b
    acc = tg.zeros(3, 3, dtype=tg.float64)
    for t in range(T):
        xe = tg.tensor(XS[t, :, :2].astype(np.float64).repeat(2, 0)[:3]) @ U + c
        acc = acc + h @ W
        h = h + xe @ V
    (h.sum() + acc.sum()).backward()
    return [p.grad.numpy().tolist() for p in (W, U, V, b, c)]


def test_a_run_whose_stride_two_blocks_give_is_not_extrapolated(fresh, monkeypatch):
    """Lengths 4 and 5 leave that chain one and two blocks long past its odd first block:
    a stride from two blocks fits any line (it wrote the wrong slots at every even length,
    reading a product where the chain's sum was)."""
    lengths = [4, 5, 6, 7, 8, 9, 10]
    monkeypatch.setattr(autograd_template, "check", True)   # compose all, compare each
    composed = {T: _chained(T) for T in lengths}
    monkeypatch.setattr(autograd_template, "check", False)
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()
    autograd_template._shapes.clear()
    for T in lengths:
        assert _chained(T) == composed[T]
    assert len(fresh) == len(lengths) + 3       # still a template, from the first two


def test_a_template_a_third_count_contradicts_is_dropped(fresh, monkeypatch):
    """The check at a third count: with strides taken from two blocks again (the bug above),
    lengths 4 and 5 give a wrong template; length 6's composed plan differs from it, so it
    is dropped, nothing is written from it, and every length is composed."""
    lengths = [4, 5, 6, 7, 8, 9, 10]
    composed = {T: _chained(T) for T in lengths}
    monkeypatch.setattr(autograd_template, "STRIDE_BLOCKS", 2)
    monkeypatch.setattr(autograd_template, "check", True)
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()
    autograd_template._shapes.clear()
    for T in (4, 5):
        _chained(T)
    with pytest.raises(AssertionError, match="differs from compose at n=5"):
        _chained(6)     # (a wrong template: check mode says so)
    monkeypatch.setattr(autograd_template, "check", False)
    mode.state.clear_tape()     # (T = 6's, left by the error)
    autograd_exec._tape_plans.items.clear()
    autograd_template._forms.clear()
    autograd_template._shapes.clear()
    del fresh[:]
    for T in lengths:
        assert _chained(T) == composed[T]
    assert len(fresh) == len(lengths)
    assert all(entry[1] is None for entry in autograd_template._forms.values())

"""ir.loop_form names equations by value: its memos (by the identity of params and types)
must give two graphs one form exactly when they are equal but for the loop's length and
the literals outside it, whichever params and type objects the graphs happen to share."""
import numpy as np

import tracegrad as tg
from tracegrad.ir import Aval, Eqn, Graph, Lit, Var
from tracegrad.ir.loop_form import loop_form
from tracegrad.tracer.trace import trace

F32 = np.dtype(np.float32)


def _chain(T, shape=(4,), params=None, scale=2.0, back=1):
    """`h = tanh(reshape(h) * x) * scale` T times (h of step t - back), hand-built: each
    call makes its own params dicts unless `params` gives the reshape's."""
    av = Aval(shape, F32)
    x = Var(av)
    hs = [x] * back
    eqns = []
    for _ in range(T):
        r, m, t, s = Var(av), Var(av), Var(av), Var(av)
        eqns += [Eqn("reshape", [hs[-back]], [r], params or {"shape": shape}),
                 Eqn("mul", [r, x], [m]), Eqn("tanh", [m], [t]),
                 Eqn("mul", [t, Lit(scale, F32)], [s])]
        hs.append(s)
    return Graph([x], eqns, [hs[-1]])


def _form(graph):
    found = loop_form(graph)
    return None if found is None else found[0]


def test_equal_params_in_other_dicts_give_one_form():
    shared = {"shape": (4,)}
    forms = {_form(_chain(5)), _form(_chain(5)), _form(_chain(5, params=shared)),
             _form(_chain(7)), _form(_chain(7, params=shared))}
    assert len(forms) == 1 and None not in forms


def test_graphs_differing_in_a_type_a_literal_or_a_reach_back_differ():
    shared = {"shape": (4,)}
    base = _form(_chain(6, params=shared))
    other_type = _form(_chain(6, shape=(5,), params=shared))     # same params dict
    other_lit = _form(_chain(6, params=shared, scale=3.0))
    two_back = _form(_chain(6, params=shared, back=2))
    assert None not in (base, other_type, other_lit, two_back)
    assert len({base, other_type, other_lit, two_back}) == 4
    assert _form(_chain(6, shape=(5,), params=shared)) == other_type    # the memo's hit


def test_slice_starts_are_part_of_the_form():
    H = 3
    xs = np.ones((40, 1, H), np.float32)
    W = np.eye(H, dtype=np.float32)

    def run(order):
        def f(W, xs, T):
            h = tg.zeros((1, H))
            for t in range(T):
                h = tg.tanh(h @ W + xs[order(t, T)])
            return tg.sum(h)
        return lambda T: _form(trace(f, (W, xs, T), (2,))[0].graph)
    forward, shifted = run(lambda t, T: t), run(lambda t, T: t + 1)
    every_other, backward = run(lambda t, T: 2 * t), run(lambda t, T: 20 - t)
    assert forward(5) == forward(9) and every_other(5) == every_other(9)
    assert backward(5) == backward(9) and None not in (forward(5), backward(5))
    assert len({forward(5), shifted(5), every_other(5), backward(5)}) == 4
    assert run(lambda t, T: t * t)(6) not in (forward(6), every_other(6))   # uneven


def test_runs_found_alike_with_and_without_looking_the_first_starts_up(monkeypatch):
    """_runs looks up the next equal code for the first few starts and uses a table after:
    the runs must be those the table alone finds, wherever they start."""
    from tracegrad.ir import loop_form as lf
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(300):
        body = list(rng.integers(0, 6, rng.integers(1, 7)))
        head = list(rng.integers(0, 9, rng.integers(0, 14)))
        tail = list(rng.integers(0, 9, rng.integers(0, 5)))
        cases.append(head + body * int(rng.integers(1, 6)) + tail)
    probed = [list(lf._runs(c)) for c in cases]
    monkeypatch.setattr(lf, "PROBED", 0)
    assert probed == [list(lf._runs(c)) for c in cases]
    assert sum(map(bool, probed)) > 50

"""jit of grad over a loop whose length is a static argument: after two lengths (and a third
that checks), the graph for a new length is written from a template (ir.template) instead of
being rolled and differentiated again. Every result must be bit-identical to what a fresh
jit (no template) computes, and anything the template cannot account for must fall back."""
import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir.loop_form import loop_form
from tracegrad.ir.template import Template
from tracegrad.tracer.trace import trace

H = 8


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((H, H)) / 3).astype(np.float32)
    U = (rng.standard_normal((H, H)) / 3).astype(np.float32)
    xs = rng.standard_normal((20, 1, H)).astype(np.float32)
    return W, U, xs


def rnn(W, U, xs, T):
    h = tg.zeros((1, H))
    for t in range(T):
        h = tg.tanh(h @ W + xs[t] @ U)
    return tg.sum(h * h)


def _same(a, b):
    fa, fb = tg.tree_flatten(a)[0], tg.tree_flatten(b)[0]
    return len(fa) == len(fb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                      for x, y in zip(fa, fb))


def _check(make, args, lengths, static=(3,)):
    """Call one jitted function at every length, each result against a fresh jit's."""
    step = tg.jit(make(), static_argnums=static)
    for T in lengths:
        got = step(*args, T)
        want = tg.jit(make(), static_argnums=static)(*args, T)
        assert _same(got, want), f"length {T}"
    return step


def _templated(step):
    return [f for f in step._families.values() if f.checked]


def test_rnn_lengths_match_fresh_jit_and_use_the_template(data):
    lengths = [5, 12, 8, 15, 11, 7, 14, 10, 6, 13, 9, 16, 5, 3, 4, 20]
    step = _check(lambda: tg.value_and_grad(rnn, argnums=(0, 1)), data, lengths)
    assert _templated(step), "the loop was never written from a template"


def test_grad_and_has_aux_use_the_template(data):
    def aux(W, U, xs, T):
        return rnn(W, U, xs, T), tg.sum(W)
    step = _check(lambda: tg.grad(rnn, argnums=1), data, [4, 6, 5, 9, 7, 8])
    assert _templated(step)
    step = _check(lambda: tg.value_and_grad(aux, argnums=0, has_aux=True), data,
                  [4, 6, 5, 9, 7, 8])
    assert _templated(step)


def test_loop_with_bias_and_invariant_from_before_the_loop(data):
    W, U, xs = data
    b = np.linspace(-1, 1, H).astype(np.float32)

    def f(W, U, xs, b, T):
        Wt = tg.transpose(W) * 0.5        # read by every step: made before the loop
        h = tg.ones((1, H))
        for t in range(T):
            h = tg.tanh(h @ Wt + xs[t] @ U + b)
        return tg.mean(h * h)
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1, 3)), (W, U, xs, b),
                  [3, 7, 4, 9, 5, 11, 6], static=(4,))
    assert _templated(step), "a value made before the loop kept the loop from a template"


def test_every_other_input_and_stacked_outputs(data):
    W, U, xs = data

    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[2 * t] @ U)
            hs.append(h)
        return tg.sum(tg.stack(hs) ** 2)
    _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data, [3, 6, 4, 9, 5, 8, 7])


@pytest.mark.parametrize("body", ["reversed", "two_back", "scaled_by_T", "fixed_trips",
                                  "half_trips"])
def test_look_alikes_fall_back(data, body):
    """Loops whose graphs change with T in ways no template fits: results stay exact."""
    W, U, xs = data

    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        prev = h
        trips = {"fixed_trips": max(T, 8), "half_trips": T // 2 + 3}.get(body, T)
        for t in range(trips):
            x = xs[T - 1 - t] if body == "reversed" else xs[t % 20]
            if body == "two_back":
                h, prev = tg.tanh(prev @ W + x @ U), h
            else:
                h = tg.tanh(h @ W + x @ U)
            if body == "scaled_by_T":
                h = h * (1.0 / T)
        return tg.sum(h * h)
    _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data,
           [4, 6, 5, 9, 7, 8, 12, 10, 11, 13, 3, 14])


def test_captured_array_replaced_between_calls(data):
    W, U, xs = data
    box = {"c": np.ones((1, H), np.float32)}

    def f(W, U, xs, T):
        h = tg.zeros((1, H)) + box["c"]
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        return tg.sum(h * h)
    step = tg.jit(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3,))
    for T in (4, 6, 5):
        step(W, U, xs, T)
    box["c"] = np.full((1, H), 3.0, np.float32)     # a new array: jit traces with it
    got = step(W, U, xs, 9)
    want = tg.jit(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3,))(W, U, xs, 9)
    assert _same(got, want)


def test_loop_form_tells_lengths_alike_and_other_graphs_apart(data):
    W, U, xs = data
    forms = {T: loop_form(trace(rnn, (W, U, xs, T), (3,))[0].graph) for T in (4, 5, 9)}
    assert forms[4][2] == []        # no literals outside the loop
    assert forms[4][1] == 4 and forms[9][1] == 9
    assert forms[4][0] == forms[5][0] == forms[9][0]

    def other(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U) * 1.5
        return tg.sum(h * h)
    assert loop_form(trace(other, (W, U, xs, 5), (3,))[0].graph)[0] != forms[5][0]
    assert loop_form(trace(rnn, (W, U, xs[:12], 5), (3,))[0].graph)[0] != forms[5][0]


def test_template_refuses_what_is_not_linear_in_the_count():
    def graph(n, k):
        f32 = np.dtype(np.float32)
        x, y = tg.ir.Var(tg.ir.Aval((20, 3), f32)), tg.ir.Var(tg.ir.Aval((k, 3), f32))
        e = tg.ir.Eqn("slice", [x], [y], {"index": ((0, k, 1), (0, 3, 1))})
        return tg.ir.Graph([x], [e], [y])
    assert Template.derive(graph(4, 8), 4, [], graph(6, 12), 6, []).ints   # k = 2n: linear
    assert Template.derive(graph(4, 8), 4, [], graph(7, 9), 7, []) is None  # 1/3 per trip
    t = Template.derive(graph(4, 8), 4, [], graph(6, 12), 6, [])
    assert t.matches(graph(9, 18), 9, []) and not t.matches(graph(9, 17), 9, [])
    made = t.instantiate(5, [])
    assert made.eqns[0].params["index"][0] == (0, 10, 1)
    assert made.outvars[0].aval.shape == (10, 3)


def test_instantiate_writes_the_graph_only_when_read(data):
    """A new length's Program is made from the template's without writing its graph; the
    graph written later is the one the Program runs (the same steps as a Program built from
    it, bit for bit), and tiering's size estimate is that graph's. (rnn's backward has
    (H, T) @ (T, H) matmuls: a contraction over the count.)"""
    from tracegrad.codegen.plan import compiled_size
    from tracegrad.ir.interpret import Program
    from tracegrad.ir.loops import unrolled_size
    W, U, xs = data

    def stacked(W, U, xs, T):     # the steps stacked after the loop: a (T, 1, H) map
        h = tg.zeros((1, H))
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
            hs.append(h)
        return tg.sum(tg.stack(hs) * 0.3) + tg.sum(h * h)
    for f in (rnn, stacked):
        step = tg.jit(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3,))
        for T in (5, 9, 7):
            step(W, U, xs, T)
        (family,) = [fam for fam in step._families.values() if fam.checked]
        for T in (4, 11, 16):
            _, n, lits = loop_form(trace(f, (W, U, xs, T), (3,))[0].graph)
            made = family.template.instantiate(n, lits)
            assert "eqns" not in made.__dict__
            got = tg.ir.program(made)([W, U, xs])
            assert "eqns" not in made.__dict__     # running it reads only its Program
            sizes = unrolled_size(made), compiled_size(made)
            assert "eqns" not in made.__dict__     # nor does weighing it for tiering
            written = tg.ir.Graph(made.invars, made.eqns, made.outvars, made.constvars,
                                  made.consts)
            assert sizes == (unrolled_size(written), compiled_size(written))
            assert _same(got, Program(written)([W, U, xs]))
            assert _same(got, tg.jit(tg.value_and_grad(f, argnums=(0, 1)),
                                     static_argnums=(3,))(W, U, xs, T))


def test_new_lengths_run_without_writing_their_graphs(data, monkeypatch):
    """A jitted call at a new length runs its template-written graph on the interpreter
    without writing its equations out, tiering's compile estimate included (it once forced
    the write: +25% on a new length's call). Values as a fresh jit's. (In a process whose
    compile-cache lookups have stopped: one that hits looks a new graph up, optimised.)"""
    from tracegrad.tracer import executor
    from tracegrad.tracer.executor import Tiered
    monkeypatch.setitem(executor._lookups, "hits", 0)
    monkeypatch.setitem(executor._lookups, "misses", executor.LOOKUP_TRIES)
    W, U, xs = data
    step = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))
    for T in (5, 9, 7):
        step(W, U, xs, T)
    for T in (11, 16):
        got = step(W, U, xs, T)
        run = step.cache[step._last_key].run
        if not isinstance(run, Tiered):
            pytest.skip("no native backend: nothing is tiered")
        assert run.native is None and type(run.graph).__name__ == "_Written"
        assert "eqns" not in run.graph.__dict__
        assert _same(got, tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)),
                                 static_argnums=(3,))(W, U, xs, T))


def test_remade_matmul_reads_the_new_types_of_reused_steps():
    """A matmul whose operands come from steps reused as they are (neg, transpose: the same
    function at any shape) picks its function from their new types: its contraction is 1
    at the template's count, 4 at this one (review)."""
    from tracegrad.ir.interpret import Program, program
    f32 = np.dtype(np.float32)

    def graph(k):
        x = tg.ir.Var(tg.ir.Aval((20, 4), f32))
        s, t = tg.ir.Var(tg.ir.Aval((k, 4), f32)), tg.ir.Var(tg.ir.Aval((k, 4), f32))
        tt, m = tg.ir.Var(tg.ir.Aval((4, k), f32)), tg.ir.Var(tg.ir.Aval((4, 4), f32))
        return tg.ir.Graph([x], [
            tg.ir.Eqn("slice", [x], [s], {"index": ((0, k, 1), (0, 4, 1))}),
            tg.ir.Eqn("neg", [s], [t], {}), tg.ir.Eqn("transpose", [t], [tt], {"perm": (1, 0)}),
            tg.ir.Eqn("matmul", [tt, t], [m], {})], [m])
    x = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    for n1, n2, n in [(3, 4, 6), (6, 5, 3)]:
        t = Template.derive(graph(n1 - 2), n1, [], graph(n2 - 2), n2, [])
        made = t.instantiate(n, [])
        fresh = Program(graph(n - 2))
        assert [s[0] for s in program(made).steps][-1] is fresh.steps[-1][0]
        assert _same(program(made)([x]), fresh([x]))


def test_threads_making_the_first_templated_lengths(data, monkeypatch):
    """Two threads instantiating a template for the first time at once: the second must not
    see it half prepared (review: it read an empty list of scan sizes)."""
    import threading
    import time

    import tracegrad.ir.template as template_module
    W, U, xs = data
    step = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))
    for T in (5, 9, 7):
        step(W, U, xs, T)
    real = template_module.scans_of

    def slow(g):        # widens the window between preparing's parts
        time.sleep(0.02)
        return real(g)
    monkeypatch.setattr(template_module, "scans_of", slow)
    got, errors = {}, []

    def call(T):
        try:
            got[T] = step(W, U, xs, T)
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append((T, repr(e)))
    threads = [threading.Thread(target=call, args=(T,)) for T in (11, 12)]
    for t in threads:
        t.start()
        time.sleep(0.005)
    for t in threads:
        t.join()
    assert not errors
    for T, out in got.items():
        assert _same(out, tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)),
                                 static_argnums=(3,))(W, U, xs, T))


def test_static_float_is_not_taken_from_the_template(data):
    """A static float is an input of f's trace but a constant of jit's graph (review)."""
    W, U, xs = data

    def f(W, U, xs, T, scale):
        return rnn(W, U, xs, T) * scale
    step = tg.jit(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3, 4))
    for T, s in [(4, 1.0), (6, 1.0), (5, 1.0), (9, 2.0), (7, -3.0), (8, -0.0), (4, (0.5))]:
        want = tg.jit(tg.value_and_grad(f, argnums=(0, 1)), static_argnums=(3, 4))(
            W, U, xs, T, s)
        assert _same(step(W, U, xs, T, s), want), (T, s)


def test_output_tree_of_each_length_is_its_own(data):
    """aux's structure may depend on T: each length returns its own (review)."""
    W, U, xs = data

    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        aux = [h] if T > 6 else (h,)
        return tg.sum(h * h), {f"h_{T}": h, "a": aux}
    step = tg.jit(tg.value_and_grad(f, argnums=(0, 1), has_aux=True), static_argnums=(3,))
    for T in [4, 6, 5, 9, 7, 8]:
        (_, aux), _ = step(W, U, xs, T)
        assert sorted(aux) == ["a", f"h_{T}"] and type(aux["a"]) is (list if T > 6 else tuple)


def test_a_short_first_length_does_not_stop_templates(data):
    """n = 3 is rolled differently; the family starts again from the next lengths."""
    step = _check(lambda: tg.value_and_grad(rnn, argnums=(0, 1)), data,
                  [3, 7, 5, 9, 6, 8, 10, 11])
    assert _templated(step)


def _two_chains(coupled: bool):
    """h deepens by four equations a step, g by two of its own: coupled (g reads h), both
    deepen alike; not, at different rates."""
    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        g = tg.ones((1, H))
        for t in range(T):
            h = tg.tanh(tg.sin(h @ W) + xs[t] @ U)
            g = tg.tanh(g @ U + h) if coupled else tg.tanh(g @ U)
        return tg.sum(h * g)
    return f


def test_loop_found_turned_keeps_one_form_for_every_length(data):
    """A loop whose run is found starting mid-step leaves the last step's slice after the
    run: its start is written relative to the run, so every length has one form."""
    W, U, xs = data
    f = _two_chains(coupled=True)
    found = [loop_form(trace(f, (W, U, xs, T), (3,))[0].graph) for T in (5, 6, 9)]
    assert len({form for form, _, _ in found}) == 1
    assert any(s[0] == "next" for s in found[0][0].starts)     # (it is turned)
    _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data, [5, 6, 9, 7, 8, 12])


def test_recurrences_deepening_at_different_rates_get_no_template(data):
    """roll_loops sorts equations by depth: recurrences that deepen at different rates
    per step (h: four equations, g: two; or a state nobody reads, `g = g * x`) fall into
    blocks that change with the length (two or three lengths' graphs do not tell the next:
    review, the fourth length differed in the last bit), so they get no form."""
    W, U, xs = data
    two_rates = _two_chains(coupled=False)

    def dead_state(W, U, xs, T):
        h = tg.zeros((1, H)) + 0.1
        g = tg.zeros((1, H)) + 0.2
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
            g = g * xs[t]
            hs.append(h)
        a = tg.zeros((1, H))
        accs = []
        for x in hs:
            a = a * 0.3 + tg.sin(x)
            accs.append(a)
        return tg.sum(h) + tg.sum(tg.stack(accs) ** 2)
    for f in (two_rates, dead_state):
        assert all(loop_form(trace(f, (W, U, xs, T), (3,))[0].graph) is None
                   for T in (7, 9, 12))
        _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data, [7, 8, 9, 10, 11, 12, 13])


def test_wrappers_of_a_gradient_are_jitted_as_themselves():
    """functools.wraps copies attributes: jit must not take a wrapper for the gradient it
    wraps (review), nor trip on a callable's own attribute of that name."""
    import functools

    def f(x, n):
        y = x
        for _ in range(n):
            y = tg.sin(y) * x
        return tg.sum(y * y)
    x = np.array([0.3, -0.7, 1.1], np.float32)
    hess = tg.jacfwd(tg.grad(f))
    assert tg.jit(hess, static_argnums=(1,))(x, 2).shape == (3, 3)
    vg = tg.value_and_grad(f)

    @functools.wraps(vg)
    def scaled(x, n):
        v, g = vg(x, n)
        return v * 10.0, g * 10.0
    assert _same(tg.jit(scaled, static_argnums=(1,))(x, 2), scaled(x, 2))

    class Scaled:
        def __init__(self):
            self._tg_traced = []

        def __call__(self, x, n):
            return x * n
    np.testing.assert_array_equal(tg.jit(Scaled(), static_argnums=(1,))(x, 2), x * 2)


def test_fixed_loop_rolled_with_the_first_steps_is_not_extrapolated(data):
    """roll_loops may roll a fixed 12-step loop together with the first steps of the T
    loop: the graphs then differ in a loop that shrinks as T grows, which no template may
    carry past T = 12 (review: wrong aux, or a scan of negative length)."""
    W, U, xs = data
    V = (np.random.default_rng(1).standard_normal((H, H)) / 3).astype(np.float32)

    def f(W, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t])
        g = tg.ones((1, H))
        for _ in range(12):
            g = tg.sin(g @ V) + 0.5
        return tg.sum(h * h) + 0.1 * tg.sum(g), tg.sum(g)
    _check(lambda: tg.value_and_grad(f, has_aux=True), (W, xs), [4, 6, 5, 9, 12, 13, 20, 11],
           static=(2,))


def test_threads_calling_one_function_at_many_lengths(data):
    import threading
    W, U, xs = data
    step = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))
    out, errors = {}, []

    def call(T):
        try:
            out[T] = step(W, U, xs, T)
        except Exception as e:     # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=call, args=(T,)) for T in range(4, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for T, got in out.items():
        want = tg.jit(tg.value_and_grad(rnn, argnums=(0, 1)), static_argnums=(3,))(W, U, xs, T)
        assert _same(got, want), T


def test_mean_over_the_steps_takes_this_length_literal(data):
    """`loss / T` puts a literal that changes with T outside the loop: the template writes
    each length's own value wherever the graphs carried it (forward and backward)."""
    W, U, xs = data
    ys = np.random.default_rng(2).standard_normal((20, 1, H)).astype(np.float32)

    def f(W, U, xs, ys, T):
        h = tg.zeros((1, H))
        loss = 0.0
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
            loss = loss + tg.sum((h - ys[t]) ** 2)
        return loss / T
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), (W, U, xs, ys),
                  [5, 12, 8, 15, 11, 7, 14, 10, 6, 13, 9], static=(4,))
    assert _templated(step)


@pytest.mark.parametrize("kind", ["step_of_T", "derived", "two_alike"])
def test_literals_the_template_cannot_carry_fall_back(data, kind):
    """A literal that stayed equal in the lengths a template was made from (but changes
    later), one used with others (1/T scaled twice), and two literals always equal (which
    one a graph's literal is cannot be told): results stay exact."""
    W, U, xs = data

    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U)
        s = tg.sum(h * h)
        if kind == "step_of_T":
            return s * (1.0 if T < 10 else 2.0)
        if kind == "derived":
            return (s * (1.0 / T)) * 2.0 + s / (T * 2.0)
        return s / T + tg.sum(h) / T
    _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data,
           [5, 7, 6, 8, 9, 10, 12, 11, 14, 13, 15])


def test_outside_literal_equal_to_one_in_the_loop():
    """At T = 8 the last step's 1/T equals the loop's 0.125: roll_loops then takes that step
    into the loop, so the template must not write that length (review: gradients 1 ulp
    off)."""
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((H, H)) / 3).astype(np.float32)
    U = (rng.standard_normal((H, H)) / 3).astype(np.float32)
    xs = rng.standard_normal((40, 1, H)).astype(np.float32)

    def f(W, U, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U) * 0.125
        u = xs[39] @ U
        h = tg.tanh(h @ W + u) * (1.0 / T)
        return tg.sum(h * h)
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), (W, U, xs), [5, 6, 7, 8, 9])
    assert _templated(step)


@pytest.mark.parametrize("kind", ["before", "alternating"])
def test_loops_whose_first_run_differs_in_a_literal_still_get_a_template(data, kind):
    W, U, xs = data

    def f(W, U, xs, T):
        h = tg.ones((1, H)) * 2.0 if kind == "before" else tg.zeros((1, H))
        for t in range(T):
            c = 0.5 if kind == "before" or t % 2 else 0.25
            h = tg.tanh(h @ W + xs[t] @ U) * c
        return tg.sum(h * h)
    lengths = [6, 10, 8, 12, 14, 16] if kind == "alternating" else [5, 12, 8, 15, 11, 7]
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data, lengths)
    assert _templated(step)


def test_a_dict_of_parameters_gets_a_template(data):
    W, U, xs = data

    def f(p, xs, T):
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ p["W"] + xs[t] @ p["U"])
        return tg.sum(h ** 2) / T
    step = _check(lambda: tg.value_and_grad(f), ({"W": W, "U": U}, xs), [4, 6, 5, 9, 7, 8],
                  static=(2,))
    assert _templated(step)


def test_public_pieces_refuse_what_they_cannot_do():
    f32 = np.dtype(np.float32)

    def graph(n):
        x, y = tg.ir.Var(tg.ir.Aval((20, 3), f32)), tg.ir.Var(tg.ir.Aval((n, 3), f32))
        z = tg.ir.Var(tg.ir.Aval((n, 3), f32))
        return tg.ir.Graph([x], [tg.ir.Eqn("slice", [x], [y], {"index": ((0, n, 1), (0, 3, 1))}),
                                 tg.ir.Eqn("neg", [y], [z], {})], [z])
    t = Template.derive(graph(4), 4, [], graph(6), 6, [])
    with pytest.raises(ValueError, match="count -2"):
        t.instantiate(-2, [])
    with pytest.raises(ValueError, match="expected 0 literals"):
        t.instantiate(5, [tg.ir.Lit(1.0, f32)])
    with pytest.raises(TypeError, match="ir.Lit"):
        t.instantiate(5, [1.0])
    with pytest.raises(TypeError, match="loop_form"):
        loop_form(None)

    def one(op):
        x, y = tg.ir.Var(tg.ir.Aval((3,), f32)), tg.ir.Var(tg.ir.Aval((3,), f32))
        return tg.ir.Graph([x], [tg.ir.Eqn(op, [x], [y], {})], [y])
    with pytest.raises(ValueError, match="not this Program's"):
        tg.ir.Program(one("neg")).respecialized(one("exp"), [])


def _hs(W, U, xs, T):
    h = tg.zeros((1, H))
    hs = []
    for t in range(T):
        h = tg.tanh(h @ W + xs[t] @ U)
        hs.append(h)
    return hs


def test_values_made_before_the_loop_keep_one_form(data):
    """Every step reads `xu = xs @ U` (sliced per step) and a scaled bias made before the
    loop: each block reads them from further back, so they are named by where they are
    made; the carry's first value, made before the loop too, stays a read of the previous
    step."""
    W, U, xs = data
    b = np.linspace(-1, 1, H).astype(np.float32)

    def f(W, U, xs, b, T):
        xu = tg.reshape(xs, (20, H)) @ U
        bb = b * 2.0
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xu[t:t + 1] + bb)
        return tg.sum(h * h)
    forms = {loop_form(trace(f, (W, U, xs, b, T), (4,))[0].graph)[0] for T in (4, 6, 9)}
    assert len(forms) == 1 and None not in forms
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1, 3)), (W, U, xs, b),
                  [5, 12, 8, 15, 11, 7, 3], static=(4,))
    assert _templated(step)


def test_a_slice_as_long_as_the_loop_before_it_keeps_one_form(data):
    """`xs[:T] @ U` before the loop: the slice's length, and the shapes of what reads it,
    are the loop's length (written "n" in the form), so every length has one form; a
    slice of a fixed length that happens to equal the loop's is told apart."""
    W, U, xs = data

    def f(W, U, xs, T):
        xu = tg.reshape(xs[:T], (T, H)) @ U
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xu[t])
        return tg.sum(h * h)

    def fixed(W, U, xs, T):
        xu = tg.reshape(xs[:6], (6, H)) @ U
        h = tg.zeros((1, H))
        for t in range(T):
            h = tg.tanh(h @ W + xs[t] @ U + xu[2])
        return tg.sum(h * h)

    def form(g, T):
        return loop_form(trace(g, (W, U, xs, T), (3,))[0].graph)[0]
    assert form(f, 5) == form(f, 9) == form(f, 12)
    assert form(fixed, 6) != form(fixed, 9)
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data,
                  [5, 12, 8, 15, 11, 7, 3, 20])
    assert _templated(step)
    _check(lambda: tg.value_and_grad(fixed, argnums=(0, 1)), data, [6, 9, 5, 6, 12, 7, 4])


@pytest.mark.parametrize("kind", ["stack", "mean", "shifted", "concat", "mapped", "losses",
                                  "first", "sum", "chain"])
def test_values_of_every_step_read_after_the_loop(data, kind):
    """After the loop, `tg.stack(hs)` (a reshape per step, then one concatenate of T
    values), maps over the steps and reads of the first step are named free of the length:
    one form, one template, results equal to a fresh jit's."""
    def f(W, U, xs, T):
        hs = _hs(W, U, xs, T)
        if kind == "stack":
            return tg.sum(tg.stack(hs) ** 2)
        if kind == "mean":          # 1/(T*H) is a literal outside the loop
            return tg.mean(tg.stack(hs))
        if kind == "shifted":
            return tg.sum(tg.stack(hs[1:]) * tg.stack(hs[:-1]))
        if kind == "concat":
            return tg.sum(tg.concatenate(hs, axis=0) @ W)
        if kind == "mapped":        # a map over the steps, then a map over that map
            return tg.sum(tg.stack([tg.sin(h) for h in hs]) * tg.stack([h * 2.0 for h in hs]))
        if kind == "losses":
            return tg.sum(tg.stack([tg.sum(h * h) for h in hs]))
        if kind == "sum":           # Python's sum: 0 + l_0, then a chain over the steps
            return sum([tg.sum(h * h) for h in hs]) / 2.0
        if kind == "chain":         # a chain whose last value is read
            m = hs[0]
            for h in hs[1:]:
                m = tg.maximum(m, h * 0.5)
            return tg.sum(m * hs[-1])
        return tg.sum(hs[0] * hs[-1])
    W, U, xs = data
    forms = {loop_form(trace(f, (W, U, xs, T), (3,))[0].graph)[0] for T in (5, 6, 9)}
    assert len(forms) == 1 and None not in forms
    step = _check(lambda: tg.value_and_grad(f, argnums=(0, 1)), data,
                  [5, 12, 8, 15, 11, 7, 14, 4, 3])
    assert _templated(step)


def test_reads_after_the_loop_named_by_their_step(data):
    """A step read after the loop is named from the start of the loop when in its first
    half, else from the end: the middle step (hs[T // 2]) gets another form at each length,
    the first three steps (hs[:3]) one form at every length. Every length is exact."""
    W, U, xs = data

    def middle(W, U, xs, T):
        hs = _hs(W, U, xs, T)
        return tg.sum(hs[T // 2] * hs[-1])

    def head(W, U, xs, T):
        hs = _hs(W, U, xs, T)
        return tg.sum(tg.stack(hs[:3]) ** 2)

    def reversed_every_other(W, U, xs, T):
        hs = _hs(W, U, xs, T)
        return tg.sum(tg.stack(hs[::-1]) * tg.stack(hs)) + tg.sum(tg.stack(hs[::2]))

    def form(f, T):
        return loop_form(trace(f, (W, U, xs, T), (3,))[0].graph)[0]
    assert form(middle, 8) != form(middle, 12)
    assert form(head, 8) == form(head, 12) != form(rnn, 8)
    _check(lambda: tg.value_and_grad(middle, argnums=(0, 1)), data, [8, 12, 10, 16, 9, 14])
    _check(lambda: tg.value_and_grad(reversed_every_other, argnums=(0, 1)), data,
           [8, 12, 10, 16, 9, 14, 11])
    step = _check(lambda: tg.value_and_grad(head, argnums=(0, 1)), data,
                  [8, 12, 10, 16, 9, 14])
    assert _templated(step)


def test_two_layer_rnn_gets_a_template(data):
    def two_layer(W, U, xs, T):
        h1 = tg.zeros((1, H))
        h2 = tg.zeros((1, H))
        for t in range(T):
            h1 = tg.tanh(h1 @ W + xs[t] @ U)
            h2 = tg.tanh(h2 @ U + h1 @ W)
        return tg.sum(h2 * h2)
    step = _check(lambda: tg.value_and_grad(two_layer, argnums=(0, 1)), data,
                  [5, 12, 8, 15, 11, 7, 3])
    assert _templated(step)


def test_a_literal_that_comes_to_equal_a_map_literal_is_not_templated():
    """3/T (outside the loop) is 0.3 at T = 10, the literal of the map after the loop:
    roll_loops, comparing literals by value, then joins `hs[0] * 0.3` to the map and makes
    another graph (equal up to summation order). The template must not write that length
    (review: `fits` looked only at the loop's own literals)."""
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((3, 3)) / 2).astype(np.float32)
    xs = rng.standard_normal((30, 1, 3)).astype(np.float32)

    def f(W, xs, T):
        h = tg.zeros((1, 3))
        hs = []
        for t in range(T):
            h = tg.tanh(h @ W + xs[t])
            hs.append(h)
        a = hs[0] * (3.0 / T)
        q = h * 2.0                      # (between `a` and the map)
        m = [x * 0.3 for x in hs[1:]]
        return tg.sum(tg.stack([a] + m) ** 2) + tg.sum(q)
    step = _check(lambda: tg.value_and_grad(f), (W, xs), [8, 9, 11, 10, 12], static=(2,))
    assert _templated(step)


def test_compare_takes_a_shared_param_or_aval_as_equal_and_still_finds_the_integers():
    """The fast paths of template._compare: one params object (or aval) in both graphs is
    equal at once; integers that differ beside it are still found."""
    from tracegrad.ir import Eqn, Graph, Var
    from tracegrad.ir.fission import aval
    from tracegrad.ir.template import _compare

    f32 = np.dtype(np.float32)
    x_type = aval((3,), f32)

    def graph(n: int, shared: list) -> Graph:
        x, y, z = Var(x_type), Var(x_type), Var(aval((n, 3), f32))
        return Graph([x], [Eqn("neg", [x], [y], {"w": shared}),
                           Eqn("broadcast", [y], [z], {"shape": (n, 3)})], [z])

    shared = [np.float32("nan"), {"k": 1}]
    diffs: dict = {}
    _compare(graph(4, shared), graph(7, shared), diffs, {})
    assert diffs == {(1, ("out", 0, 0)): (4, 7), (1, ("param", "shape", 0)): (4, 7)}

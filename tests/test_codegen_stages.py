"""Stages (independent kernels run as one pool job) and matmul epilogues (a loop run inside the
matmul's tasks on the block each task computed): planning, and results vs the interpreter
with GEMMs split across threads."""
import numpy as np
import pytest

from tracegrad import ir, runtime
from tracegrad.codegen import plan_graph
from tracegrad.codegen.linalg import loop_tasks
from tracegrad.codegen.plan import epilogues, stages
from conftest import build_graph
from tracegrad.ir import emit as E

F32 = np.dtype("float32")
RNG = np.random.default_rng(3)

pytestmark = pytest.mark.usefixtures("no_disk_cache")


@pytest.fixture(params=[2, 3])
def threads(request):
    before = runtime.num_threads()
    runtime.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        runtime.set_num_threads(before)


def check(graph, args, rtol=2e-4, atol=2e-4):
    ref = ir.interpret(graph, args)
    out = runtime.compile_graph(graph)(args)
    for k, (r, o) in enumerate(zip(ref, out, strict=True)):
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol, err_msg=f"output {k}")
    again = runtime.compile_graph(graph)(args)
    for o, a in zip(out, again, strict=True):
        np.testing.assert_array_equal(o, a)   # deterministic for a fixed thread count


def sgd_step(x, w0, b0, w1, b1):
    """One SGD step of a 2-layer tanh net on sum of squares, written out by hand: the
    backward has independent dW and dX matmuls, and every weight update reads a GEMM."""
    h = E.tanh(x @ w0 + b0)
    y = h @ w1 + b1
    dh = (y @ E.transpose(w1, (1, 0))) * (1.0 - h * h)
    dw1 = E.transpose(h, (1, 0)) @ y
    dw0 = E.transpose(x, (1, 0)) @ dh
    return [w0 - 0.01 * dw0, b0 - 0.01 * E.reduce_sum(dh, (0,)), w1 - 0.01 * dw1,
            b1 - 0.01 * E.reduce_sum(y, (0,))]


def sgd_graph(batch, d_in, d_hid, d_out):
    return build_graph(sgd_step, ((batch, d_in), F32), ((d_in, d_hid), F32), ((d_hid,), F32),
                       ((d_hid, d_out), F32), ((d_out,), F32))


def test_independent_matmuls_share_a_stage_and_updates_are_accumulated():
    plan = plan_graph(sgd_graph(128, 300, 256, 200))
    mm = [i for i, g in enumerate(plan.groups) if g.kind == "matmul"]
    shapes = {i: plan.groups[i].domain for i in mm}
    dx = next(i for i in mm if shapes[i] == (128, 256) and i != mm[0])
    dw1 = next(i for i in mm if shapes[i] == (256, 200))
    assert any(dx in s and dw1 in s for s in stages(plan))
    epi = epilogues(plan)
    # the weight updates are the weight gradients' own (accumulated onto W by ?gemm)
    assert not [g for g in plan.groups if g.kind == "loop" and g.domain in ((300, 256),
                                                                            (256, 200))]
    assert all(plan.groups[i].acc is not None for i in mm if shapes[i] in ((300, 256),
                                                                          (256, 200)))
    fused = {li: mi for mi, li in epi.items()}
    run = [i for s in stages(plan, fused) for i in s]
    assert sorted(run + list(fused)) == list(range(len(plan.groups)))
    for li, mi in fused.items():   # every group still runs after what it reads
        assert li not in run and mi in run


def test_batch_one_weight_gradients_split_by_rows_with_their_updates():
    # at batch 1 dW = x.T @ dh is an outer product, a generated i-k-j loop: split by rows, so
    # the update runs on each task's block (was one task, then the update reading the whole
    # product back from memory: 245 against 94 us at 784x512); the update is the product's
    # own (Group.acc), applied to the block each task just made
    plan = plan_graph(sgd_graph(1, 784, 512, 300))
    outer = [i for i, g in enumerate(plan.groups) if g.kind == "matmul"
             and g.domain in ((784, 512), (512, 300))]
    assert len(outer) == 2 and all(plan.groups[i].acc is not None for i in outer)
    for i in outer:
        tasks, rows, by_columns = loop_tasks(plan.groups[i], 2)
        assert tasks == 2 and not by_columns and rows * 2 >= plan.groups[i].domain[0]
        assert loop_tasks(plan.groups[i], 1)[0] == 1
    rows = [g for g in plan.groups if g.kind == "matmul" and g.domain[0] == 1]
    assert rows and all(loop_tasks(g, 2)[0] == 1 for g in rows)  # (measured slower split)


@pytest.mark.parametrize("dims", [(128, 300, 256, 200), (512, 96, 64, 700), (48, 70, 90, 30),
                                  (1, 784, 512, 300)])
def test_sgd_step_with_split_gemms_matches_interpreter(threads, dims):
    g = sgd_graph(*dims)
    b, d_in, d_hid, d_out = dims
    args = [RNG.standard_normal((b, d_in)).astype(F32)]
    for m, n in ((d_in, d_hid), (d_hid, d_out)):
        args += [(RNG.standard_normal((m, n)) / np.sqrt(m)).astype(F32),
                 RNG.standard_normal(n).astype(F32)]
    check(g, args)


ACCUMULATE = {      # each a w (m, n), a (k, m), b (k, n), s () -> [result]
    "sub": lambda w, a, b, s: [w - 0.01 * (E.transpose(a, (1, 0)) @ b)],
    "add": lambda w, a, b, s: [w + (E.transpose(a, (1, 0)) @ b) * 0.5],
    "add_left": lambda w, a, b, s: [(E.transpose(a, (1, 0)) @ b) * -2.0 + w],
    "scale_input": lambda w, a, b, s: [w - s * (E.transpose(a, (1, 0)) @ b)],
}


@pytest.mark.parametrize("form", sorted(ACCUMULATE))
@pytest.mark.parametrize("dims", [(784, 128, 512), (300, 10, 1000), (64, 64, 64), (3, 5, 7),
                                  (2, 64, 96), (40, 1, 30), (6, 0, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_update_onto_a_product_is_accumulated_by_it(threads, form, dims, dtype):
    """w - c * (a.T @ b), and the like: the loop folds into the matmul (?gemm adds -c times
    the product onto a copy of w; generated products, few-row ones included, apply the loop's
    operations to their block), split across threads or not, an empty contraction too."""
    m, k, n = dims
    dt = np.dtype(dtype)
    g = build_graph(ACCUMULATE[form], ((m, n), dt), ((k, m), dt), ((k, n), dt), ((), dt))
    plan = plan_graph(g)
    assert [gr.kind for gr in plan.groups] == ["matmul"] and plan.groups[0].acc is not None
    args = [RNG.standard_normal(s).astype(dt) for s in ((m, n), (k, m), (k, n))]
    check(g, args + [np.asarray(0.3, dt)], *((1e-12, 1e-12) if dt == np.float64 else ()))


@pytest.mark.parametrize("case", ["product_read_twice", "bias_broadcast", "product_minus_w",
                                  "vector_scale", "scale_computed", "batched"])
def test_update_not_accumulated_where_it_is_not_w_minus_c_times_the_product(case):
    """Each near miss keeps its loop (and its product in a buffer), with the right values."""
    def build(case):
        if case == "batched":
            return build_graph(lambda w, a, b: [w - 0.1 * (a @ b)],
                               ((4, 30, 40), F32), ((4, 30, 20), F32), ((4, 20, 40), F32))
        body = {
            "product_read_twice": lambda w, p, v: [w - 0.1 * p, E.tanh(p)],
            "bias_broadcast": lambda w, p, v: [v - 0.1 * p],
            "product_minus_w": lambda w, p, v: [0.1 * p - w],
            "vector_scale": lambda w, p, v: [w - v * p],
            "scale_computed": lambda w, p, v: [w - E.tanh(w) * p],
        }[case]
        return build_graph(lambda w, a, b, v: body(w, a @ b, v), ((30, 40), F32),
                           ((30, 20), F32), ((20, 40), F32), ((40,), F32))
    g = build(case)
    plan = plan_graph(g)
    assert all(gr.acc is None for gr in plan.groups) and len(plan.groups) > 1
    args = [RNG.standard_normal(v.aval.shape).astype(F32) for v in g.invars]
    check(g, args)


def test_epilogue_never_reads_outside_its_block(threads):
    # the transposed read of the product crosses task blocks: that loop must not be fused
    def f(a, b, c):
        p = a @ b
        return [p + E.transpose(p, (1, 0)) * c, E.tanh(p + c)]
    g = build_graph(f, ((300, 200), F32), ((200, 300), F32), ((300,), F32))
    plan = plan_graph(g)
    for li in epilogues(plan).values():
        assert all(e.op != "transpose" for e in plan.groups[li].eqns)
    check(g, [RNG.standard_normal((300, 200)).astype(F32),
              RNG.standard_normal((200, 300)).astype(F32), RNG.standard_normal(300).astype(F32)])


def test_workspace_lifetime_spans_stages_out_of_plan_order():
    # `n` is read by the concatenate (late stage) and by the transpose, which is issued last
    # (last in plan order) but runs in stage 1: its last use is the late stage, so the chain's
    # buffers must not reuse its memory (was: lifetime taken from the last group in plan
    # order, and the concatenate read the tanh chain's values in n's place)
    def f(a, b, w):
        n = 1.0 - a
        h = b
        for _ in range(3):
            h = E.tanh(h @ w)
        return [E.concatenate([n, h], 0), E.transpose(n, (1, 0))]
    g = build_graph(f, ((1, 3), F32), ((1, 3), F32), ((3, 3), F32))
    plan = plan_graph(g)
    order = [i for s in stages(plan) for i in s]
    assert order != sorted(order)   # the stages do reorder the plan's groups
    check(g, [RNG.standard_normal((1, 3)).astype(F32), RNG.standard_normal((1, 3)).astype(F32),
              RNG.standard_normal((3, 3)).astype(F32)])

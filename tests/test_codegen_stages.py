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


def test_independent_matmuls_share_a_stage_and_updates_are_epilogues():
    plan = plan_graph(sgd_graph(128, 300, 256, 200))
    mm = [i for i, g in enumerate(plan.groups) if g.kind == "matmul"]
    shapes = {i: plan.groups[i].domain for i in mm}
    dx = next(i for i in mm if shapes[i] == (128, 256) and i != mm[0])
    dw1 = next(i for i in mm if shapes[i] == (256, 200))
    assert any(dx in s and dw1 in s for s in stages(plan))
    epi = epilogues(plan)
    updates = [i for i, g in enumerate(plan.groups) if g.kind == "loop"
               and g.domain in ((300, 256), (256, 200))]
    assert sorted(epi[i] for i in epi if epi[i] in updates) == sorted(updates)
    fused = {li: mi for mi, li in epi.items()}
    run = [i for s in stages(plan, fused) for i in s]
    assert sorted(run + list(fused)) == list(range(len(plan.groups)))
    for li, mi in fused.items():   # every group still runs after what it reads
        assert li not in run and mi in run


def test_batch_one_weight_gradients_split_by_rows_with_their_updates():
    # at batch 1 dW = x.T @ dh is an outer product, a generated i-k-j loop: split by rows, so
    # the update runs as its epilogue on each task's block (was one task, then the update
    # reading the whole product back from memory: 245 against 94 us at 784x512)
    plan = plan_graph(sgd_graph(1, 784, 512, 300))
    epi = epilogues(plan)
    outer = [i for i, g in enumerate(plan.groups) if g.kind == "matmul"
             and g.domain in ((784, 512), (512, 300))]
    assert len(outer) == 2 and all(i in epi for i in outer)
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

"""Fused compositions and gradient graphs compiled natively vs the interpreter; fusion shape
(how many kernels) and thread-count independence."""
import numpy as np
import pytest

from tracegrad import ir, runtime
from tracegrad.codegen import lower_graph, plan_graph
from conftest import build_graph
from tracegrad.ir import emit as E

F32, F64, I64 = np.dtype("float32"), np.dtype("float64"), np.dtype("int64")
RNG = np.random.default_rng(1)


pytestmark = pytest.mark.usefixtures("no_disk_cache")
build = build_graph


def check(graph, args, rtol=1e-5, atol=1e-5):
    ref = ir.interpret(graph, args)
    out = runtime.compile_graph(graph)(args)
    for k, (r, o) in enumerate(zip(ref, out, strict=False)):
        assert o.shape == r.shape and o.dtype == r.dtype
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"output {k}")
    return out


def grad_graph(g, wrt):
    return ir.optimize(ir.vjp_graph(g, wrt))


def ew_chain(x):
    return E.reduce_sum(E.tanh(x) * E.sigmoid(x) + E.exp(-x * x) * E.log1p(x * x)
                        + E.sin(x) * E.cos(x), (0,))


@pytest.mark.parametrize("n", [1000, 1 << 17])
def test_ew_chain_value_and_grad_is_one_loop(n):
    gg = grad_graph(build(ew_chain, ((n,), F32)), [0])
    groups = plan_graph(gg).groups
    assert len(groups) == 1 and groups[0].kind == "loop"
    x = RNG.standard_normal(n).astype(F32)
    check(gg, [x, np.float32(1.0)], rtol=1e-4)


def test_long_chain_compiles_to_one_loop():
    def f(x):
        for _ in range(100):
            x = E.sin(x) * 1.01 + 0.1 * E.tanh(x)
        return E.reduce_sum(x, (0,))
    gg = grad_graph(build(f, ((1000,), F32)), [0])
    assert len(plan_graph(gg).groups) == 1
    check(gg, [RNG.standard_normal(1000).astype(F32), np.float32(1.0)], rtol=1e-4, atol=1e-4)


def mlp_loss(x, lab, *params):
    h = x
    n = len(params) // 2
    for i in range(n):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n - 1:
            h = E.tanh(h)
    b = h.shape[0]
    m = E.reduce_max(h, (1,))
    z = h - E.reshape(m, (b, 1))
    lse = E.log(E.reduce_sum(E.exp(z), (1,)))
    onehot = E.equal(E.iota(h.shape, 1, I64), E.reshape(lab, (b, 1)))
    picked = E.reduce_sum(E.where(onehot, z, 0.0), (1,))
    return E.reduce_sum(lse - picked, (0,)) * (1.0 / b)


@pytest.mark.parametrize("sizes,batch", [((12, 16, 16, 10), 8), ((100, 64, 48, 10), 64)])
def test_mlp_gradients(sizes, batch):
    avals = [((batch, sizes[0]), F32), ((batch,), I64)]
    for a, b in zip(sizes[:-1], sizes[1:], strict=False):
        avals += [((a, b), F32), ((b,), F32)]
    gg = grad_graph(build(mlp_loss, *avals), list(range(2, len(avals))))
    args = [RNG.standard_normal(avals[0][0]).astype(F32), RNG.integers(0, 10, batch)]
    args += [(RNG.standard_normal(s) * 0.2).astype(F32) for s, _ in avals[2:]]
    check(gg, args + [np.float32(1.0)], rtol=1e-4, atol=1e-5)


def test_softmax_layernorm_like_compositions():
    def f(x, w):
        m = E.reduce_max(x, (1,))
        e = E.exp(x - E.reshape(m, (4, 1, 6)))
        sm = e / E.reshape(E.reduce_sum(e, (1,)), (4, 1, 6))
        mu = E.reduce_sum(x, (0, 2)) * (1.0 / 24)
        c = x - E.reshape(mu, (1, 5, 1))
        var = E.reduce_sum(c * c, (0, 2)) * (1.0 / 24)
        ln = c / E.sqrt(E.reshape(var, (1, 5, 1)) + 1e-5) * w
        return [sm, ln, E.reduce_sum(sm * ln, (0, 1, 2)), E.transpose(sm, (2, 0, 1)) * 2.0]
    g = build(f, ((4, 5, 6), F64), ((6,), F64))
    check(g, [RNG.standard_normal((4, 5, 6)), RNG.standard_normal(6)], rtol=1e-12,
          atol=1e-12)
    gg = grad_graph(build(lambda x, w: f(x, w)[2], ((4, 5, 6), F64), ((6,), F64)), [0, 1])
    check(gg, [RNG.standard_normal((4, 5, 6)), RNG.standard_normal(6), np.float64(1.0)],
          rtol=1e-10, atol=1e-12)


def test_embedding_gradient_through_take_and_slices():
    def f(w, idx):
        e = E.take(w, idx, 0)                       # (6, 4)
        y = E.concatenate([E.slice_(e, ((0, 6, 1), (0, 2, 1))),
                           E.slice_(e, ((5, 0, -1), (2, 4, 1)))], 0)
        return E.reduce_sum(E.tanh(y) * y, (0, 1))
    gg = grad_graph(build(f, ((7, 4), F64), ((6,), I64)), [0])
    idx = np.array([0, 3, 3, 6, -1, 2])
    check(gg, [RNG.standard_normal((7, 4)), idx, np.float64(1.0)], rtol=1e-12, atol=1e-12)


def test_reduction_split_across_tasks_and_middle_axes():
    def f(x):
        y = E.exp(x * 0.1)
        return [E.reduce_sum(y, (0,)), E.reduce_sum(y, (1,)), E.reduce_max(y, (0, 2)),
                E.reduce_sum(y, (0, 1, 2)), E.reduce_min(y * 2.0, (2,))]
    g = build(f, ((300, 40, 33), F32))
    check(g, [RNG.standard_normal((300, 40, 33)).astype(F32)], rtol=1e-4)


def test_unrolled_rnn_shares_kernel_bodies():
    h_dim, steps = 16, 6

    def f(w, u, xs):
        h = E.full((1, h_dim), 0.0, F32)
        for t in range(steps):
            x_t = E.reshape(E.slice_(xs, ((t, t + 1, 1), (0, h_dim, 1))), (1, h_dim))
            h = E.tanh(h @ w + x_t @ u)
        return E.reduce_sum(h * h, (0, 1))
    gg = grad_graph(build(f, ((h_dim, h_dim), F32), ((h_dim, h_dim), F32),
                          ((steps, h_dim), F32)), [0, 1])
    lowered = lower_graph(gg)
    bodies = [fn for fn in lowered.module.functions if fn.name.endswith("_body")]
    assert len(bodies) < lowered.layout.n_kernels // 2
    args = [(RNG.standard_normal((h_dim, h_dim)) * 0.3).astype(F32) for _ in range(2)]
    check(gg, args + [RNG.standard_normal((steps, h_dim)).astype(F32), np.float32(1.0)])


def test_threaded_results_equal_single_threaded():
    gg = grad_graph(build(ew_chain, ((1 << 18,), F32)), [0])
    args = [RNG.standard_normal(1 << 18).astype(F32), np.float32(1.0)]
    exe = runtime.compile_graph(gg)
    assert exe.layout.n_parallel >= 1
    _same_on_one_and_three_threads(exe, args)   # bitwise: tasks are fixed at compile time


@pytest.mark.parametrize("shape", [(1000, 515), (517, 300), (301, 2049), (3, 300, 200),
                                   (2, 700, 300), (40, 70, 80), (2, 3, 150, 170)])
def test_elementwise_reads_through_a_transpose_run_in_tiles(shape):
    """A group reading an array transposed in its last two axes walks them in tiles
    (codegen/loops._tiled): the same values as row by row, for sizes that are no multiple of
    the tile, with the task loop over the leading axes or over all but the last (1 and 3
    threads: bit for bit, and against the interpreter)."""
    from tracegrad.codegen.loops import _tiled, split
    *lead, m, n = shape
    perm = tuple(range(len(lead))) + (len(lead) + 1, len(lead))

    def f(a, b, c):
        at = E.transpose(a, perm)
        return [at + b * c, E.tanh(at) * b]
    g = build(f, ((*lead, n, m), F32), (shape, F32), ((), F32))
    plan = plan_graph(g)
    loops = [grp for grp in plan.groups if grp.kind == "loop" and grp.domain == shape]
    assert loops and all(_tiled(grp, split(grp)[0], [], None) for grp in loops)
    args = [RNG.standard_normal((*lead, n, m)).astype(F32), RNG.standard_normal(shape).astype(F32),
            np.float32(0.75)]
    out = check(g, args)
    np.testing.assert_array_equal(out[0], args[0].transpose(perm) + args[1] * args[2])
    _same_on_one_and_three_threads(runtime.compile_graph(g), args)


@pytest.mark.parametrize("shape", [(1000, 515), (2, 700, 300)])
@pytest.mark.parametrize("over", ["leading", "all", "rows", "rows and more"])
def test_reductions_over_transposed_reads_run_in_tiles(shape, over):
    """Sums over the leading axes (each element added to its output in memory: the same
    order as row by row) and over everything (one accumulator per task, in tile order)
    walk tiles too; for one along the rows the transpose is stored first, walking tiles, and
    the sums read it row by row (plan._Planner.tiled_apart). Bit for bit on 1 and 3
    threads, and against the interpreter."""
    from tracegrad.codegen.loops import _tiled, reductions, split
    *lead, m, n = shape
    perm = tuple(range(len(lead))) + (len(lead) + 1, len(lead))
    axes = {"leading": tuple(range(len(shape) - 1)), "all": tuple(range(len(shape))),
            "rows": (len(shape) - 1,), "rows and more": tuple(range(1, len(shape)))}[over]
    g = build(lambda a, b: [E.reduce_sum(E.transpose(a, perm) * b, axes)],
              ((*lead, n, m), F32), (shape, F32))
    groups = [grp for grp in plan_graph(g).groups if grp.kind == "loop"]
    if over.startswith("rows"):
        stored, grp = groups
        assert [e.op for e in stored.eqns] == ["transpose"] and not stored.reductions
        assert _tiled(stored, split(stored)[0], [], None)
        assert "transpose" not in [e.op for e in grp.eqns]
    else:
        grp, = groups
        p, tasks = split(grp)
        assert _tiled(grp, p, reductions(grp, p, tasks), None)
    args = [RNG.standard_normal((*lead, n, m)).astype(F32),
            RNG.standard_normal(shape).astype(F32)]
    check(g, args, rtol=1e-4, atol=1e-3)
    _same_on_one_and_three_threads(runtime.compile_graph(g), args)


@pytest.mark.parametrize("shape", [(300, 300), (16, 9000), (9000, 16), (4096, 64), (64, 4096),
                                   (8, 128, 128)])
def test_small_or_narrow_transposes_read_by_row_sums_stay_fused(shape):
    """Below TILE_MIN_SIZE elements, an axis under ROWS_APART_LEN, or matrices under
    ROWS_APART_MATRIX elements (their rows stay cached), the row walk reads the transpose in
    place (one group, nothing stored)."""
    *lead, m, n = shape
    perm = tuple(range(len(lead))) + (len(lead) + 1, len(lead))
    g = build(lambda a, b: [E.reduce_sum(E.transpose(a, perm) * b, (len(shape) - 1,))],
              ((*lead, n, m), F32), (shape, F32))
    grp, = [grp for grp in plan_graph(g).groups if grp.kind == "loop"]
    assert "transpose" in [e.op for e in grp.eqns]
    args = [RNG.standard_normal((*lead, n, m)).astype(F32), RNG.standard_normal(shape).astype(F32)]
    check(g, args, rtol=1e-4, atol=1e-3)


def _same_on_one_and_three_threads(exe, args):
    """Tasks are fixed when compiling: any pool gives the same bits."""
    before = runtime.num_threads()
    try:
        runtime.set_num_threads(1)
        one = exe(args)
        runtime.set_num_threads(3)
        three = exe(args)
    finally:
        runtime.set_num_threads(before)
    for a, b in zip(one, three, strict=True):
        np.testing.assert_array_equal(a, b)

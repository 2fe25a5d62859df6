"""Every primitive compiled natively vs the reference interpreter: dtypes, broadcasting,
0-d and 0-size operands, NaN/inf. Ops are grouped into few graphs to keep compiles cheap."""
import numpy as np
import pytest

from tracegrad import ir, runtime
from tracegrad.codegen import linalg, plan_graph
from conftest import build_graph
from tracegrad.ir import emit as E

F32, F64, I32, I64, BOOL = (np.dtype(t) for t in ("float32", "float64", "int32", "int64",
                                                  "bool"))
RNG = np.random.default_rng(0)


pytestmark = pytest.mark.usefixtures("no_disk_cache")
build = build_graph


def rand(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return RNG.random(shape) < 0.5
    if dtype.kind == "i":
        return RNG.integers(-9, 10, size=shape).astype(dtype)
    return (RNG.standard_normal(shape) * 2).astype(dtype)


def check(graph, args, rtol=None, atol=None):
    ref = ir.interpret(graph, args)
    out = runtime.compile_graph(graph)(args)
    assert len(out) == len(ref)
    for k, (r, o) in enumerate(zip(ref, out, strict=False)):
        assert o.shape == r.shape and o.dtype == r.dtype, (k, o.shape, r.shape, o.dtype)
        if r.dtype.kind == "f":
            tol = 3e-6 if r.dtype == F32 else 1e-13
            np.testing.assert_allclose(o, r, rtol=rtol or tol, atol=atol or tol,
                                       equal_nan=True, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(o, r, err_msg=f"output {k}")
    return out


SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 17)]
FLOAT_UNARY = ["exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "sigmoid",
               "sqrt", "erf", "neg", "abs", "sign", "stop_gradient"]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", SHAPES)
def test_float_unary(dtype, shape):
    g = build(lambda x: [getattr(E, op)(x) for op in FLOAT_UNARY], (shape, dtype))
    check(g, [rand(shape, dtype)])


@pytest.mark.parametrize("dtype", [F32, F64])
def test_float_unary_special_values(dtype):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 80.0, -80.0, 1e4,
                  -1e4, 0.5, -0.5, 3.0], dtype)
    g = build(lambda x: [getattr(E, op)(x) for op in FLOAT_UNARY], (x.shape, dtype))
    check(g, [x], rtol=1e-5 if dtype == F32 else 1e-12, atol=1e-30)


@pytest.mark.parametrize("dtype", [I32, I64])
def test_int_unary(dtype):
    g = build(lambda x: [E.neg(x), E.abs(x), E.sign(x)], ((4, 6), dtype))
    check(g, [rand((4, 6), dtype)])


def test_not_and_convert():
    dts = [F32, F64, I32, I64, BOOL]
    g = build(lambda *xs: [E.logical_not(xs[4])] + [E.convert(x, d) for x in xs for d in dts],
              *[((3, 4), d) for d in dts])
    args = [rand((3, 4), d) for d in dts]
    args[0][0, 0] = 0.0
    check(g, args)


BINARY = ["add", "sub", "mul", "maximum", "minimum", "pow"]
PAIRS = [((3, 4), (4,)), ((2, 1, 5), (3, 1)), ((), (4,)), ((0, 3), (3,)), ((5,), ()),
         ((1,), (6, 1))]


@pytest.mark.parametrize("dtype", [F32, F64, I32, I64])
@pytest.mark.parametrize("sx,sy", PAIRS)
def test_binary_broadcasting(dtype, sx, sy):
    ops = BINARY + ["floor_divide"] + (["div"] if dtype.kind == "f" else [])
    g = build(lambda x, y: [getattr(E, op)(x, y) for op in ops], (sx, dtype), (sy, dtype))
    x, y = rand(sx, dtype), rand(sy, dtype)
    if dtype.kind == "i":
        y = np.abs(y) % 4 if np.ndim(y) else np.asarray(abs(int(y)) % 4, dtype)
    else:
        x = np.abs(x)
    check(g, [x, y])


def test_int_division_edge_cases():
    for dt in (I32, I64):
        mn = np.iinfo(dt).min
        x = np.array([7, -7, 7, -7, 5, mn, mn, 0, 3], dt)
        y = np.array([2, 2, -2, -2, 0, -1, 1, 0, 7], dt)
        g = build(lambda a, b: [E.floor_divide(a, b), E.pow(a, b)], (x.shape, dt),
                  (y.shape, dt))
        check(g, [x, y])


@pytest.mark.parametrize("dtype", [F32, F64])
def test_power_of_two_is_a_product(dtype):
    """x ** 2 lowers to x * x (not the pow routine): exact, with pow's special values; other
    exponents still call pow."""
    x = np.array([1.5, -3.25, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -7e18, 2.0 ** -70],
                 dtype)
    g = build(lambda a: [E.pow(a, 2.0), E.pow(a, 3.0), E.pow(E.abs(a), 0.5)], (x.shape, dtype))
    with np.errstate(all="ignore"):
        sq, cube, root = runtime.compile_graph(g)([x])
        np.testing.assert_array_equal(sq, x * x)
        np.testing.assert_array_equal(np.signbit(sq), np.signbit(x * x))
        check(g, [x])
    from llvmlite import ir as llvm_ir
    from tracegrad.codegen.scalar import lower_elementwise
    ft = llvm_ir.FloatType() if dtype == F32 else llvm_ir.DoubleType()
    fn = llvm_ir.Function(llvm_ir.Module(), llvm_ir.FunctionType(ft, [ft]), "f")
    b = llvm_ir.IRBuilder(fn.append_basic_block())
    for y, product in ((2.0, True), (3.0, False), (2.5, False)):
        v = lower_elementwise(b, "pow", {}, [fn.args[0], llvm_ir.Constant(ft, y)],
                              [dtype, dtype], dtype)
        assert (getattr(v, "opname", None) == "fmul") == product, y


def test_literals_and_bool_arithmetic():
    g = build(lambda x, p, q: [x * 2.5 + 1.0, 3.0 - x, E.add(p, q), E.mul(p, q),
                               E.maximum(p, q), E.minimum(p, q)],
              ((4,), F32), ((4,), BOOL), ((4,), BOOL))
    check(g, [rand((4,), F32), rand((4,), BOOL), rand((4,), BOOL)])


@pytest.mark.parametrize("dtype", [F32, I64, BOOL])
def test_compare_logical_select(dtype):
    cmp = ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal"]

    def f(x, y, c):
        outs = [getattr(E, op)(x, y) for op in cmp]
        outs += [E.logical_and(outs[0], c), E.logical_or(outs[1], c), E.where(c, x, y)]
        return outs
    g = build(f, ((3, 4), dtype), ((4,), dtype), ((3, 1), BOOL))
    x, y = rand((3, 4), dtype), rand((4,), dtype)
    x[0] = y
    if dtype == F32:
        x[1, 1] = np.nan
    check(g, [x, y, rand((3, 1), BOOL)])


AXES = [(0,), (1,), (2,), (0, 1), (1, 2), (0, 2), (0, 1, 2)]


@pytest.mark.parametrize("dtype", [F32, F64, I32, BOOL])
def test_reductions(dtype):
    ops = ["reduce_sum", "reduce_max", "reduce_min"] + (["reduce_prod"] if dtype != BOOL
                                                         else [])
    g = build(lambda x: [getattr(E, op)(x, ax) for op in ops for ax in AXES],
              ((3, 4, 33), dtype))
    x = rand((3, 4, 33), dtype)
    if dtype.kind == "f":
        x = (x * 0.5 + 1).astype(dtype)
        x[1, 2, 3] = np.nan
    check(g, [x], rtol=1e-5 if dtype == F32 else None)


def test_reductions_zero_size_and_scalar():
    g = build(lambda x, s: [E.reduce_sum(x, (0,)), E.reduce_prod(x, (0, 1)),
                            E.reduce_sum(x, (1,)), E.reduce_sum(E.reshape(s, (1,)), (0,))],
              ((0, 3), F32), ((), F32))
    check(g, [np.zeros((0, 3), F32), np.float32(2.5)])


@pytest.mark.parametrize("dtype", [F32, I32, BOOL])
def test_argmax_argmin(dtype):
    g = build(lambda x: [E.argmax(x, a) for a in range(3)] + [E.argmin(x, a) for a in range(3)]
              + [E.argmax(E.exp(x) if dtype == F32 else x, 2)], ((3, 4, 5), dtype))
    x = rand((3, 4, 5), dtype)
    if dtype != BOOL:
        x = x // 3 if dtype.kind == "i" else np.round(x)   # ties: the first one wins
    if dtype == F32:
        x[0, 1, 2] = np.nan
        x[2, 3, 0] = np.nan
    check(g, [x])


def test_shape_ops():
    def f(x, y):
        return [E.reshape(x, (6, 2, 5)), E.reshape(x, (3, 20)), E.reshape(x, (2, 3, 1, 2, 5)),
                E.transpose(x, (2, 0, 1)), E.broadcast_to(y, (2, 3, 4, 5)),
                E.slice_(x, ((1, 3, 1), (3, 0, -1), (0, 5, 2))),
                E.slice_(x, ((0, 3, 1), (0, 4, 1), (4, 0, -2))),
                E.slice_(x, ((2, -1, -1), (3, -1, -1), (4, -1, -3))),   # x[::-1, ::-1, ::-3]
                E.pad_slice(E.slice_(x, ((2, -1, -1), (0, 4, 1), (0, 5, 1))), (3, 4, 5),
                            ((2, -1, -1), (0, 4, 1), (0, 5, 1))),
                E.pad_slice(y, (5, 10), ((1, 5, 1), (1, 10, 2))),
                E.pad_slice(y, (5, 5), ((4, 0, -1), (0, 5, 1))),
                E.update_slice(x, E.exp(E.slice_(x, ((0, 3, 2), (1, 3, 1), (4, -1, -2)))),
                               ((2, -1, -2), (1, 3, 1), (0, 5, 2))),
                E.update_slice(y * 2.0, 1.5, ((3, 4, 1), (0, 5, 1))),
                E.concatenate([x, x * 2.0, E.slice_(x, ((0, 3, 1), (0, 4, 1), (0, 1, 1)))], 2),
                E.concatenate([E.reshape(y, (1, 4, 5)), E.full((2, 4, 5), 0.0, F32)], 0),
                E.transpose(E.reshape(E.exp(x), (12, 5)), (1, 0))]
    g = build(f, ((3, 4, 5), F32), ((4, 5), F32))
    # pad_slice needs operands of the slice's shape
    x, y = rand((3, 4, 5), F32), rand((4, 5), F32)
    check(g, [x, y])


def test_take_and_scatter_add():
    def f(x, i, j):
        return [E.take(x, i, 0), E.take(x, j, 1), E.take(E.exp(x), i, 1) * 2.0,
                E.scatter_add(E.take(x, i, 0), i, 0, 5),
                E.scatter_add(E.take(x, j, 1), j, 1, 6)]
    g = build(f, ((5, 6), F32), ((7,), I64), ((2, 3), I32))
    i = np.array([0, 4, -1, 2, 2, 0, 3], np.int64)
    j = np.array([[0, 5, 1], [1, 1, -6]], np.int32)
    check(g, [rand((5, 6), F32), i, j])


MATMUL_SHAPES = [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((3, 5), (5, 4)),
                 ((2, 3, 5), (2, 5, 4)), ((64, 70), (70, 40)), ((0, 5), (5, 3)),
                 ((3, 0), (0, 4))]


@pytest.mark.parametrize("dtype", [F32, F64, I64])
def test_matmul(dtype):
    shapes = MATMUL_SHAPES
    g = build(lambda *xs: [E.matmul(xs[i], xs[i + 1]) for i in range(0, len(xs), 2)],
              *[(s, dtype) for pair in shapes for s in pair])
    args = [rand(s, dtype) for pair in shapes for s in pair]
    check(g, args, rtol=1e-5 if dtype == F32 else None, atol=1e-4 if dtype == F32 else None)


# (m, k, n) of products with few rows (linalg.few_rows): 2-12 rows of generated loops
# streaming B once (register blocks of columns, then single columns), up to 12 rows times a
# transposed B with k >= 8 as dot products, and their neighbours that keep the i-k-j loop or
# sgemm (13 rows, k = 7)
FEW_ROWS = [(1, 3, 7), (2, 70, 17), (3, 5, 64), (3, 70, 31), (4, 33, 603), (1, 784, 512),
            (2, 512, 512), (6, 100, 70), (5, 9, 40), (1, 1, 9), (12, 300, 203), (13, 64, 70),
            (8, 8, 100), (7, 7, 50), (10, 10, 512)]


def _products_graph(dims, dtype):
    """Each (m, k, n) of `dims` as a product in all 4 forms: A or A.T times B or B.T."""
    shapes = [s for m, k, n in dims for s in ((m, k), (k, n), (n, k), (k, m))]

    def products(*xs):
        out = []
        for a, b, bt, at in zip(xs[0::4], xs[1::4], xs[2::4], xs[3::4], strict=True):
            out += [a @ b, a @ E.transpose(bt, (1, 0)), E.transpose(at, (1, 0)) @ b,
                    E.transpose(at, (1, 0)) @ E.transpose(bt, (1, 0))]
        return out
    return build(products, *[(s, dtype) for s in shapes]), [rand(s, dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [F32, F64, I64])
def test_products_of_few_rows(dtype):
    # (sums of up to 784 products: another order's error)
    g, args = _products_graph(FEW_ROWS, dtype)
    tol = {F32: (1e-4, 1e-3), F64: (1e-11, 1e-10)}.get(dtype, (None, None))
    check(g, args, rtol=tol[0], atol=tol[1])


def test_products_of_few_rows_split_by_columns_equal_one_task():
    """Big enough, they are split across tasks by columns: each element is still summed by
    one task in one order, so the results equal a single task's bit for bit."""
    g, args = _products_graph(FEW_ROWS, F32)
    _compiled_for_two_threads_equals_one(g, args)


# (m, k, n) of thin products (linalg.thin): contractions of at most 16 ("k": register
# blocks of 4 rows, row and column tails after them) and products at most 16 wide ("n": dot
# products of rows, or vectors of rows for a transposed A, with tails of rows and of the
# contraction), and neighbours that keep ?gemm or the i-k-j loop: 15 rows, 17 everything,
# a B too big to copy transposed to the stack unless stored transposed. (100, 300, 10) is
# split into tasks of 50 rows: not whole vectors of rows
THIN = [(128, 10, 512), (33, 7, 45), (16, 2, 40), (50, 16, 32), (128, 512, 10),
        (512, 128, 10), (37, 100, 3), (20, 16, 16), (100, 300, 10), (17, 17, 17),
        (15, 10, 512), (40, 3000, 12)]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_thin_products(dtype):
    g, args = _products_graph(THIN, dtype)
    kinds = [linalg.thin(grp) for grp in plan_graph(g).groups if grp.kind == "matmul"]
    # 4 and 5 shapes of each kind in all 4 forms, and the too-big B in the 3 needing no copy
    assert kinds.count("k") == 4 * 4 and kinds.count("n") == 5 * 4 + 3, kinds
    tol = {F32: (1e-4, 1e-3), F64: (1e-11, 1e-10)}[dtype]
    check(g, args, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("m,k,n", [(128, 10, 512), (512, 128, 10), (128, 512, 10),
                                   (100, 300, 10)])
def test_thin_products_split_by_rows_equal_one_task(m, k, n):
    """One product per graph (products sharing a stage share the threads and run unsplit)."""
    for ta, tb in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        g = build(lambda a, b, ta=ta, tb=tb: [(E.transpose(a, (1, 0)) if ta else a) @
                                              (E.transpose(b, (1, 0)) if tb else b)],
                  ((k, m) if ta else (m, k), F32), ((n, k) if tb else (k, n), F32))
        args = [rand((k, m) if ta else (m, k), F32), rand((n, k) if tb else (k, n), F32)]
        _compiled_for_two_threads_equals_one(g, args)


def test_thin_products_take_an_update_and_an_epilogue():
    """The SGD update of a thin weight gradient (mlp_step's last layer) folded into the
    product, and a bias + tanh epilogue after one."""
    g = build(lambda w, h, d, x, b: [w - 0.01 * (E.transpose(h, (1, 0)) @ d),
                                     E.tanh(x @ w + b)],
              ((512, 10), F32), ((128, 512), F32), ((128, 10), F32), ((128, 512), F32),
              ((10,), F32))
    check(g, [rand(s, F32) for s in ((512, 10), (128, 512), (128, 10), (128, 512), (10,))],
          rtol=1e-4, atol=1e-3)


def _compiled_for_two_threads_equals_one(g, args):
    """Compiled for a pool of 2 (splitting across tasks), `g` gives what it gives compiled
    for 1, bit for bit."""
    before = runtime.num_threads()
    try:
        runtime.set_num_threads(1)
        one = runtime.compile_graph(g)(args)
        runtime.set_num_threads(2)
        two = runtime.compile_graph(g)
        assert two.layout.n_parallel >= 1
        two = two(args)
    finally:
        runtime.set_num_threads(before)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


# (m, k, n) of products that keep the i-k-j loop: big enough ones (outer products, mlp_step's
# weight gradients at batch 1) are split by rows, and a row vector times B is not
IKJ_SPLIT = [(784, 1, 512), (300, 1, 900), (33, 1, 8000), (40, 3, 4096), (1, 784, 512),
             (1, 300, 1000)]


@pytest.mark.parametrize("dtype", [F32, I64])
def test_ikj_products_split_across_tasks_equal_one_task(dtype):
    """Each element of a split product is still summed by one task in one order: the
    results equal one task's bit for bit, and the interpreter's (for an update fused after
    the product too, the SGD step at batch 1: w - 0.01 * x.T @ g)."""
    shapes = [s for m, k, n in IKJ_SPLIT for s in ((m, k), (k, n), (m, n))]

    def products(*xs):
        out = []
        for a, b, w in zip(xs[0::3], xs[1::3], xs[2::3], strict=True):
            p = a @ b
            out += [p, w - p * 3 if dtype == I64 else w - 0.01 * p]
        return out
    g = build(products, *[(s, dtype) for s in shapes])
    args = [rand(s, dtype) for s in shapes]
    _compiled_for_two_threads_equals_one(g, args)
    check(g, args, rtol=1e-5 if dtype == F32 else None, atol=1e-4 if dtype == F32 else None)


@pytest.mark.parametrize("m,k,n", [(4, 3, 5), (128, 64, 96), (250, 256, 128), (64, 512, 600)])
def test_matmul_transposed_operands(m, k, n):
    g = build(lambda a, b: [E.transpose(a, (1, 0)) @ E.transpose(b, (1, 0)),
                            E.transpose(a, (1, 0)) @ E.reshape(b, (k, n))],
              ((k, m), F32), ((n, k), F32))
    check(g, [rand((k, m), F32), rand((n, k), F32)], rtol=1e-4, atol=1e-3)


def test_large_batched_matmul_split_across_tasks():
    g = build(lambda a, b: [a @ b, E.transpose(a, (0, 2, 1)) @ b],
              ((3, 130, 130), F32), ((3, 130, 130), F32))
    check(g, [rand((3, 130, 130), F32), rand((3, 130, 130), F32)], rtol=1e-4, atol=1e-3)


# (m, k, n) of products the packed GEMM runs (linalg.packs, TRACEGRAD_GEMM=packed): a last
# block of rows shorter than MR, a last panel narrower than 2 registers (even than one),
# B's rows in several blocks of KC_PANEL with a shorter last one, contractions not a
# multiple of the squares a transposed B is packed in, a task split whose last share is
# shorter (by columns: 45 into 23 + 22; by rows: 301 into 151 + 150)
PACKED = [(128, 784, 512), (37, 200, 45), (13, 193, 70), (100, 400, 40), (64, 453, 96),
          (301, 150, 64)]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_packed_gemm_products(dtype, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_GEMM", "packed")
    g, args = _products_graph(PACKED, dtype)
    groups = [gr for gr in plan_graph(g).groups if gr.kind == "matmul"]
    assert len(groups) == 4 * len(PACKED) and all(linalg.packs(gr, 512) for gr in groups)
    check(g, args, *((1e-4, 1e-3) if dtype == F32 else (1e-10, 1e-9)))
    _compiled_for_two_threads_equals_one(g, args)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_packed_gemm_batched_and_accumulated(dtype, monkeypatch):
    """Batched products (a task per batch) and SGD updates w - c * (a.T @ b) stored by the
    last block of B's rows (one block, several), against the interpreter; and the packed
    GEMM against ?gemm."""
    def f(x, y, w1, a1, b1, w2, a2, b2):
        return [x @ y, E.transpose(x, (0, 2, 1)) @ y,
                w1 - 0.01 * (E.transpose(a1, (1, 0)) @ b1),
                (E.transpose(a2, (1, 0)) @ b2) * -2.0 + w2]
    shapes = [(3, 130, 130), (3, 130, 130), (300, 100), (128, 300), (128, 100),
              (70, 90), (400, 70), (400, 90)]
    g = build(f, *[(s, dtype) for s in shapes])
    args = [rand(s, dtype) for s in shapes]
    monkeypatch.setenv("TRACEGRAD_GEMM", "packed")
    groups = [gr for gr in plan_graph(g).groups if gr.kind == "matmul"]
    assert sum(gr.acc is not None for gr in groups) == 2
    assert all(linalg.packs(gr, 512) for gr in groups)
    tol = (1e-4, 1e-3) if dtype == F32 else (1e-10, 1e-9)
    packed = check(g, args, *tol)
    _compiled_for_two_threads_equals_one(g, args)
    monkeypatch.setenv("TRACEGRAD_GEMM", "blas")
    for p, q in zip(packed, runtime.compile_graph(g)(args), strict=True):
        np.testing.assert_allclose(p, q, *tol)


def test_create_ops():
    def f(seed):
        return [E.iota((3, 4), 1, I32), E.iota((5, 2), 0, F32), E.full((2, 3), 1.5, F64),
                E.full((), 7, I64), ir.bind("random", seed, shape=(1000,), dist="uniform",
                                            dtype=F32),
                ir.bind("random", seed, shape=(10, 30), dist="normal", dtype=F64),
                ir.bind("random", seed, shape=(4, 5), dist="normal", dtype=F32)]
    g = build(f, ((), I64))
    out = check(g, [np.int64(1234)])
    ref = ir.interpret(g, [np.int64(1234)])
    np.testing.assert_array_equal(out[4], ref[4])   # uniform draws are bit-exact


def test_custom_vjp_call_is_identity_on_outputs():
    def f(x, r):
        y = E.exp(x)
        (o,) = ir.bind("custom_vjp_call", x, r, y, n_args=1, n_res=1, bwd=None)
        return [o * 2.0, o]
    g = build(f, ((3,), F32), ((3,), F32))
    check(g, [rand((3,), F32), rand((3,), F32)])


def test_outputs_that_are_inputs_literals_or_repeated():
    b = ir.Builder()
    x = b.new_input(ir.Aval((3,), F32))
    with b.active():
        y = E.exp(x)
    g = b.build([x, y, y, 2.0])
    out = check(g, [rand((3,), F32)])
    assert out[1] is not out[2]


def _update_graphs():
    """(name, fn, number of updates written in place, of update groups): chains of updates
    the planner may write into one buffer, and the cases where it must copy."""
    row = lambda t: ((t, t + 1, 1), (0, 5, 1))      # noqa: E731

    def chain(x, v):            # a loop filling rows: one buffer, each update in place
        buf = E.full((6, 5), 0.0, F64)
        for t in range(6):
            buf = E.update_slice(buf, E.tanh(v * float(t)), row(t))
        return [buf * 2.0]

    def chain_out(x, v):        # the chain's buffer is the output's
        buf = x * 1.0
        for t in (4, 0, 2):
            buf = E.update_slice(buf, v + float(t), row(t))
        return [buf]

    def read_before(x, v):      # each operand also read for the next row: in place, after it
        buf = x * 1.0
        for t in range(1, 4):
            buf = E.update_slice(buf, E.slice_(buf, row(t - 1)) * 2.0, row(t))
        return [buf]

    def read_later(x, v):       # the operand read later in the program, by a group that
        y = x * 1.0             # may run before the update: in place, the update waiting
        z = E.update_slice(y, v, row(1))
        return [z * 3.0, E.reduce_sum(y, (0,))]

    def read_with(x, v):        # read by a group that also reads the update: copied
        y = x * 1.0
        z = E.update_slice(y, v, row(1))
        return [z + y]

    def strided(x, v):          # a strided, reversed slice, a scalar broadcast and a column
        buf = E.exp(x)
        buf = E.update_slice(buf, E.reshape(E.slice_(v, ((0, 1, 1), (0, 3, 1))), (3, 1)),
                             ((5, -1, -2), (4, 5, 1)))
        buf = E.update_slice(buf, 7.5, ((0, 6, 1), (2, -1, -2)))
        return [buf]

    return [("chain", chain, 6, 6), ("chain_out", chain_out, 3, 3),
            ("read_before", read_before, 3, 3), ("read_later", read_later, 1, 1),
            ("read_with", read_with, 0, 1),
            ("strided", strided, 2, 2)]


@pytest.mark.parametrize("name,fn,n_in_place,n_updates", _update_graphs(),
                         ids=[c[0] for c in _update_graphs()])
def test_updates_write_into_their_operands_buffer_where_they_may(name, fn, n_in_place,
                                                                  n_updates):
    from tracegrad.codegen.plan import plan_graph
    g = build(fn, ((6, 5), F64), ((1, 5), F64))
    plan = plan_graph(g)
    assert sum(gr.kind == "update" for gr in plan.groups) == n_updates
    assert len(plan.in_place) == n_in_place
    x, v = rand((6, 5), F64), rand((1, 5), F64)
    for _ in range(2):      # (the buffer is the run's own: the second run starts afresh)
        check(g, [x, v])


def test_a_long_chain_of_updates_compiles():
    """400 updates in a chain were fused into one loop whose every element selected among
    all 400: lowering it recursed 400 deep (RecursionError)."""
    def f(v):
        buf = E.full((400, 3), 0.0, F64)
        for t in range(400):
            buf = E.update_slice(buf, v * float(t), ((t, t + 1, 1), (0, 3, 1)))
        return [buf]
    g = build(f, ((1, 3), F64))
    check(g, [rand((1, 3), F64)])


def test_two_updates_of_one_operand_and_an_update_by_itself():
    """Two updates of one value: one may write into it (after the other has copied it), not
    both; an update of a whole value by itself reads what it writes: copied."""
    def f(x, v):
        y = x * 1.0
        a = E.update_slice(y, v, ((0, 1, 1), (0, 5, 1)))
        b = E.update_slice(y, v * 2.0, ((5, 6, 1), (0, 5, 1)))
        z = E.exp(x)
        c = E.update_slice(z, z, ((0, 6, 1), (0, 5, 1)))
        return [a * 1.0, b * 1.0, c]
    g = build(f, ((6, 5), F64), ((1, 5), F64))
    from tracegrad.codegen.plan import plan_graph
    assert len(plan_graph(g).in_place) == 1
    check(g, [rand((6, 5), F64), rand((1, 5), F64)])

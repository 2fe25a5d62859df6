"""The generated-GEMM path taken where no BLAS is found (no numpy-bundled OpenBLAS, no scipy):
large matmuls (and their gradients) compiled with no BLAS must agree with the interpreter.
Runs in a child process with TRACEGRAD_BLAS=none, in which scipy's BLAS cannot be imported
either; and numpy's OpenBLAS and scipy's agree bitwise where both are found."""
import os
import subprocess
import sys
import textwrap

import numpy as np

CHILD = textwrap.dedent("""
    import sys
    sys.modules["scipy.linalg.cython_blas"] = None      # import of scipy's BLAS now fails
    import numpy as np
    import tracegrad as tg
    from tracegrad import ir
    from tracegrad.runtime import blas, compile_graph
    assert blas.gemm_addresses() == (0, 0)
    rng = np.random.default_rng(0)
    cases = [((64, 300), (300, 70)), ((3, 40, 50), (3, 50, 60)), ((200,), (200, 90)),
             ((90, 200), (200,))]
    for dtype in (np.float32, np.float64):
        for sa, sb in cases:
            a = rng.standard_normal(sa).astype(dtype)
            b = rng.standard_normal(sb).astype(dtype)
            f = tg.value_and_grad(lambda a, b: tg.sum(tg.tanh(a @ b)), argnums=(0, 1))
            graph = ir.optimize(tg.make_ir(f)(a, b))
            want = ir.interpret(graph, [a, b])
            got = compile_graph(graph)([a, b])
            tol = 2e-4 if dtype == np.float32 else 1e-10
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
            # a transposed operand (fused as a transposed GEMM operand)
            if a.ndim == 2 and b.ndim == 2:
                graph = ir.optimize(tg.make_ir(lambda a, b: (b.T @ a.T).T)(a, b))
                np.testing.assert_allclose(compile_graph(graph)([a, b])[0], a @ b,
                                           rtol=tol, atol=tol)
    print("ok")
""")


def test_large_matmuls_without_blas_match_the_interpreter():
    env = dict(os.environ, TRACEGRAD_DISK_CACHE="0", TRACEGRAD_BLAS="none",
               TRACEGRAD_GEMM="blas")     # (not the packed GEMM an AVX-512 CPU would run)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


BOTH = textwrap.dedent("""
    import os, sys
    import numpy as np
    import tracegrad as tg
    from tracegrad.runtime import blas
    print(blas.blas_int_bits())
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 100)).astype(np.float32)
    f = tg.jit(lambda a, b: (a @ b, a.T @ (a @ b)))
    np.save(sys.argv[1], np.concatenate([r.ravel() for r in f(a, b)]))
""")


def test_numpy_and_scipy_openblas_agree(tmp_path):
    outs = {}
    for choice in ("", "scipy"):
        env = dict(os.environ, TRACEGRAD_DISK_CACHE="0", TRACEGRAD_BLAS=choice,
                   TRACEGRAD_GEMM="blas")
        path = str(tmp_path / f"out{choice}.npy")
        res = subprocess.run([sys.executable, "-c", BOTH, path], capture_output=True,
                             text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        outs[choice] = (res.stdout.split(), np.load(path))
    assert outs["scipy"][0] == ["32"]
    np.testing.assert_array_equal(outs[""][1], outs["scipy"][1])

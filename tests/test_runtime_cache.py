"""The runtime: disk cache reuse across processes, corrupt entries, LRU unloading, dumps and
compile logs, argument checking and the Executable's attributes."""
import gc
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

from tracegrad import ir, runtime
from tracegrad.ir import emit as E
from tracegrad.runtime import cache

F32 = np.dtype("float32")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GRAPH_SRC = """
import numpy as np
from tracegrad import ir
from tracegrad.ir import emit as E

def make_graph(scale):
    b = ir.Builder()
    x = b.new_input(ir.Aval((3, 4), np.dtype("float32")))
    w = b.new_input(ir.Aval((4, 2), np.dtype("float32")))
    with b.active():
        y = E.reduce_sum(E.tanh(x @ w) * scale, (0, 1))
    return ir.optimize(ir.vjp_graph(b.build([y]), [0, 1]))
"""
exec(GRAPH_SRC)   # defines make_graph, shared with the child process below


def args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 4)).astype(F32), rng.standard_normal((4, 2)).astype(F32),
            np.float32(1.0)]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "1")
    runtime.clear_memory_cache()
    yield tmp_path
    runtime.clear_memory_cache()


def snapshot(tmp_path) -> str:
    """A copy of the package for child processes to import. The working tree may be edited
    while the suite runs (other work going on), and an edit to codegen/ or runtime/ rightly
    changes the cache key (backend_revision): two processes must run the same code for the
    second to find the first one's entry."""
    dest = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "tracegrad"), dest / "tracegrad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return str(dest)


def run_child(src: str, code: str, *argv: str) -> str:
    env = dict(os.environ, PYTHONPATH=src, PYTHONDONTWRITEBYTECODE="1")
    # run from `src`: `python -c` puts the working directory first on sys.path
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env=env, cwd=src, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_second_process_compiles_nothing(cache_dir):
    src = snapshot(cache_dir)
    child = GRAPH_SRC + textwrap.dedent("""
        import sys
        import tracegrad
        from tracegrad import runtime
        assert tracegrad.__file__.startswith(sys.argv[2]), tracegrad.__file__
        rng = np.random.default_rng(0)
        a = [rng.standard_normal((3, 4)).astype("f4"), rng.standard_normal((4, 2)).astype("f4"),
             np.float32(1.0)]
        out = runtime.run_graph(make_graph(2.0), a)
        np.save(sys.argv[1], out[2])
        print(runtime.stats.compiles, runtime.stats.disk_hits)
    """)
    first, second = (str(cache_dir / name) for name in ("first.npy", "second.npy"))
    assert run_child(src, child, first, src).split() == ["1", "0"]
    assert run_child(src, child, second, src).split() == ["0", "1"]
    np.testing.assert_array_equal(np.load(second), np.load(first))
    expected = ir.interpret(make_graph(2.0), args())   # noqa: F821
    np.testing.assert_allclose(np.load(first), expected[2], rtol=1e-5, atol=1e-6)


def test_cache_key_describes_the_code_loaded_not_the_files_now(tmp_path):
    # object code compiled by a process must not be filed under the key of source edited
    # after that process imported it: a process running the edited code would load it
    src = snapshot(tmp_path)
    module = os.path.join(src, "tracegrad", "codegen", "module.py")
    edit_after_import = textwrap.dedent(f"""
        import tracegrad
        from tracegrad.runtime import cache
        assert tracegrad.__file__.startswith({src!r}), tracegrad.__file__
        with open({module!r}, "a") as f:
            f.write("\\n# edited after this process imported the code generator\\n")
        print(cache.backend_revision())
    """)
    loaded = run_child(src, edit_after_import).strip()
    edited = run_child(src, "from tracegrad.runtime import cache; "
                            "print(cache.backend_revision())").strip()
    assert loaded != edited


def test_cache_key_changes_with_numpy(monkeypatch):
    # the entry compares numpy's type numbers, which numpy 2 renumbered on some platforms:
    # code compiled under one numpy is not loaded under another
    same = cache._source_digest()
    monkeypatch.setattr(np, "__version__", np.__version__ + ".other")
    assert cache._source_digest() != same


def test_corrupt_entry_is_rebuilt_with_a_warning(cache_dir):
    g = make_graph(3.0)   # noqa: F821
    expected = runtime.run_graph(g, args())
    path = cache.entry_path(cache.cache_key(g))
    data = open(path, "rb").read()
    for broken in (data[: len(data) // 2], data[:20] + b"x" + data[21:]):
        with open(path, "wb") as f:
            f.write(broken)
        runtime.clear_memory_cache()
        before = runtime.stats.compiles
        with pytest.warns(UserWarning, match="corrupt cache entry"):
            out = runtime.run_graph(g, args())
        assert runtime.stats.compiles == before + 1
        for a, b in zip(out, expected, strict=False):
            np.testing.assert_array_equal(a, b)
        assert open(path, "rb").read() == data   # rewritten, atomically, in full


def test_memory_cache_is_lru_and_unloads(cache_dir, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_SIZE", "2")
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")
    first = runtime.compile_graph(make_graph(4.0))   # noqa: F821
    assert runtime.compile_graph(make_graph(4.0)) is first   # noqa: F821
    ref = weakref.ref(first._tracker)
    del first
    runtime.compile_graph(make_graph(5.0))   # noqa: F821
    runtime.compile_graph(make_graph(6.0))   # noqa: F821
    gc.collect()
    assert ref() is None   # evicted: its code was unloaded


def test_dump_and_compile_log(cache_dir, monkeypatch, caplog, tmp_path):
    dump = tmp_path / "dump"
    monkeypatch.setenv("TRACEGRAD_DUMP", str(dump))
    monkeypatch.setenv("TRACEGRAD_LOG_COMPILES", "1")
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")
    with caplog.at_level(logging.INFO, logger="tracegrad"):
        exe = runtime.compile_graph(make_graph(7.0))   # noqa: F821
    assert any("compiled graph" in r.getMessage() and " ms" in r.getMessage()
               for r in caplog.records)
    names = sorted(os.listdir(dump))
    assert [n.rsplit(".", 1)[-1] for n in names] == ["txt", "ll", "s"] or len(names) == 3
    assert "tg_entry" in exe.llvm_ir and "tg_entry" in exe.asm


def test_argument_checks_and_layouts(cache_dir):
    g = make_graph(2.0)   # noqa: F821
    exe = runtime.compile_graph(g)
    x, w, ct = args()
    ref = ir.interpret(g, [x, w, ct])
    with pytest.raises(TypeError, match="argument 0 must be float32"):
        exe([x.astype(np.float64), w, ct])
    with pytest.raises(TypeError, match="takes 3 arguments"):
        exe([x, w])
    big = np.zeros((6, 8), F32)
    big[::2, ::2] = x
    odd = [big[::2, ::2], np.asfortranarray(w), ct]                  # strided, Fortran
    rev = [x[::-1, ::-1].copy()[::-1, ::-1], w[::-1][::-1], ct]     # negative strides
    for variant in (odd, rev):
        for a, b in zip(exe(variant), ref, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    o1, o2 = exe([x, w, ct]), exe([x, w, ct])
    assert all(a is not b and not np.shares_memory(a, b) for a, b in zip(o1, o2, strict=False))


def test_entry_checks_every_argument_natively(cache_dir):
    """The entry reads the arrays itself (codegen/unbox.py): whatever it rejects is
    converted or reported in Python, and nothing it accepts runs on the wrong layout."""
    g = make_graph(2.0)   # noqa: F821
    exe = runtime.compile_graph(g)
    x, w, ct = args()
    ct = np.asarray(ct)
    ref = ir.interpret(g, [x, w, ct])

    class Sub(np.ndarray):
        pass

    raw = np.zeros(x.size * 4 + 1, np.uint8)[1:]
    unaligned = raw.view(F32).reshape(x.shape)
    unaligned[...] = x
    assert not unaligned.flags.aligned
    swapped = w.astype(">f4")
    for variant in ([x.view(Sub), w, ct], [unaligned, w, ct], (x, w, ct),
                    [x, w, np.asarray([1.0], F32).reshape(())]):
        for a, b in zip(exe(variant), ref, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match=r"argument 1 must be float32\[4, 2\], got >f4"):
        exe([x, swapped, ct])
    with pytest.raises(TypeError, match=r"argument 1 must be float32\[4, 2\], got "
                                        r"float32\[2, 4\]"):
        exe([x, w.T.copy(), ct])
    with pytest.raises(TypeError, match=r"argument 2 must be float32\[\], got float32\[1\]"):
        exe([x, w, ct.reshape(1)])
    with pytest.raises(TypeError, match=r"argument 0 of type dict is not an array \(expected "
                                        r"float32\[3, 4\]\)"):
        exe([{"x": x}, w, ct])
    with pytest.raises(TypeError, match=r"takes 3 arguments \(float32\[3, 4\], float32\[4, "
                                        r"2\], float32\[\]\), got 4"):
        exe([x, w, ct, ct])
    class Shaped(np.ndarray):      # a subclass's own shape is not what the entry reads
        shape = property(lambda self: (3, 4))

    with pytest.raises(TypeError, match=r"argument 0 must be float32\[3, 4\], got "
                                        r"float32\[12\]"):
        exe([x.reshape(12).view(Shaped), w, ct])


@pytest.mark.skipif(os.name != "posix" or "t" in getattr(sys, "abiflags", ""),
                    reason="the check peeks through the C library's write (POSIX); a "
                           "free-threaded build has no native backend")
def test_layout_check_reports_instead_of_crashing_and_falls_back_to_the_interpreter(tmp_path):
    """On a build whose objects the entry cannot read, importing tracegrad warns (at the
    user's import) and runs graphs on the interpreter; compiling says why, before any work.
    The check reads the pointers it doubts through write(2): offsets that are wrong give a
    reason, not a segfault."""
    child = textwrap.dedent("""
        import sys, warnings
        import numpy as np
        import numpy.testing
        real = getattr(sys, "abiflags", "")
        sys.abiflags = real + "t"       # as a free-threaded build's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tracegrad as tg
            from tracegrad import ir, runtime
        sys.abiflags = real
        print([w.filename for w in caught if "no native backend" in str(w.message)]
              == ["<string>"])
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        g = tg.jit(tg.grad(lambda x: tg.sum(tg.sin(x) * x)))
        np.testing.assert_allclose(g(x), np.sin(x) + x * np.cos(x), rtol=1e-5)
        print(runtime.stats.compiles)
        b = ir.Builder()
        v = b.new_input(ir.Aval((3,), np.dtype(np.float32)))
        with b.active():
            out = v * 2.0
        try:
            runtime.compile_graph(b.build([out]))
        except RuntimeError as e:
            print("free-threaded" in str(e) and runtime.stats.compiles == 0)
        from tracegrad.codegen import unbox
        from tracegrad.runtime import executable
        print(executable._layout_problem())
        for name, wrong in (("LIST_ITEMS", 32), ("ARRAY_DIMS", 24), ("ARRAY_ND", 28)):
            right = getattr(unbox, name)
            setattr(unbox, name, wrong)
            print(executable._layout_problem() is not None)
            setattr(unbox, name, right)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TRACEGRAD_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "0", "True", "None", "True", "True", "True"]


@pytest.mark.parametrize("first", ["int64", "longlong"])
def test_int64_of_either_type_number_runs_code_compiled_for_the_other(cache_dir, first):
    """int64 is numpy's `long` and `longlong` (two type numbers, equal dtypes, one cache key):
    code one process compiled for one runs arrays of both in a process whose graph has the
    other."""
    src = snapshot(cache_dir)
    child = textwrap.dedent("""
        import sys
        import numpy as np
        from tracegrad import ir, runtime
        b = ir.Builder()
        n = b.new_input(ir.Aval((3,), np.dtype(getattr(np, sys.argv[1]))))
        with b.active():
            out = n * 3
        exe = runtime.compile_graph(b.build([out]))
        for dtype in (np.int64, np.longlong):
            print(*exe([np.array([1, 2, 3], dtype)])[0])
        print(runtime.stats.disk_hits)
    """)
    second = "int64" if first == "longlong" else "longlong"
    assert run_child(src, child, first).split() == ["3", "6", "9"] * 2 + ["0"]
    assert run_child(src, child, second).split() == ["3", "6", "9"] * 2 + ["1"]


def test_zero_size_and_scalar_graphs(cache_dir):
    b = ir.Builder()
    x = b.new_input(ir.Aval((0, 3), F32))
    s = b.new_input(ir.Aval((), F32))
    with b.active():
        outs = [E.exp(x), E.reduce_sum(x, (0,)), s * 2.0, E.reduce_sum(x, (0, 1)) + s]
    g = b.build(outs)
    a = [np.zeros((0, 3), F32), np.float32(1.5)]
    for r, o in zip(ir.interpret(g, a), runtime.run_graph(g, a), strict=False):
        assert r.shape == o.shape and r.dtype == o.dtype
        np.testing.assert_array_equal(r, o)


def test_graph_without_matmul_does_not_import_scipy_linalg(tmp_path):
    child = textwrap.dedent("""
        import sys
        import numpy as np
        import tracegrad as tg
        tg.jit(lambda x: tg.sin(x) * 2.0)(np.ones(10, np.float32))
        print("scipy.linalg" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TRACEGRAD_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False"]

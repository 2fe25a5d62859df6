"""Thread and process safety: jitted functions, transforms and Tensor programs called from 8
Python threads at once; two processes compiling the same graph into one disk cache at once;
a truncated, garbage or unreadable cache entry is detected and rebuilt."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import runtime
from tracegrad.runtime import cache

N_THREADS = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_threads(work, n=N_THREADS):
    """Run work(i) on n threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    errors: list = []

    def run(i):
        try:
            barrier.wait()
            work(i)
        except BaseException as e:   # noqa: B036 - reported to the main thread
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


@pytest.fixture(autouse=True)
def _native(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tg.config, "tiering", False)
    runtime.clear_memory_cache()
    yield
    runtime.clear_memory_cache()


def test_jitted_functions_from_8_threads_at_once():
    @tg.jit
    def step(w, x, y):
        loss = lambda w: tg.mean(tg.square(tg.tanh(x @ w) - y))
        value, g = tg.value_and_grad(loss)(w)
        return value, w - 0.1 * g

    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((16, 4)), rng.standard_normal((4, 3)),
             rng.standard_normal((16, 3))) for _ in range(N_THREADS)]
    want = []
    for x, w, y in data:   # reference: numpy, same update
        h = np.tanh(x @ w)
        g = x.T @ (2 * (h - y) * (1 - h ** 2)) / y.size
        want.append((np.mean((h - y) ** 2), w - 0.1 * g))
    shapes = [(16, 4), (8, 4)]   # two signatures: threads also race to compile the second

    def work(i):
        x, w, y = data[i]
        for k in range(40):
            rows = shapes[k % 2][0]
            value, w_new = step(w, x[:rows], y[:rows])
            if rows == 16:
                np.testing.assert_allclose(value, want[i][0], rtol=1e-10)
                np.testing.assert_allclose(w_new, want[i][1], rtol=1e-9)
    _in_threads(work)


def test_first_call_compiles_race_from_8_threads():
    # every thread compiles (or waits for) the same new graphs at the same moment
    fns = [tg.jit(lambda a, k=k: tg.sum(tg.exp(a * (k + 1.0)), axis=0)) for k in range(6)]
    x = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)

    def work(i):
        for k, f in enumerate(fns):
            np.testing.assert_allclose(f(x), np.exp(x * (k + 1)).sum(0), rtol=1e-5)
    _in_threads(work)


def test_transforms_and_tensors_from_8_threads():
    def work(i):
        for k in range(20):
            x = np.full(5, 0.1 * i + 0.01 * k)
            g = tg.grad(lambda a: tg.sum(tg.sin(a) * (i + 1)))(x)
            np.testing.assert_allclose(g, np.cos(x) * (i + 1), rtol=1e-12)
            t = tg.tensor(x, requires_grad=True)
            (t.tanh() * (i + 1)).sum().backward()
            np.testing.assert_allclose(t.grad.numpy(), (1 - np.tanh(x) ** 2) * (i + 1),
                                       rtol=1e-12)
    _in_threads(work)


def test_tiered_background_compiles_with_threads(monkeypatch):
    # tiering compiles hot graphs in a background thread while others compile in front
    monkeypatch.setattr(tg.config, "tiering", True)

    def work(i):
        x = np.linspace(-1, 1, 6) + i
        for _ in range(30):
            t = tg.tensor(x, requires_grad=True)
            (t.exp() * 3.0).sum().backward()
            np.testing.assert_allclose(t.grad.numpy(), 3 * np.exp(x), rtol=1e-12)
            np.testing.assert_allclose(tg.jit(lambda a: tg.exp(a) * 3.0)(x), 3 * np.exp(x))
    _in_threads(work)


CHILD = """
import os, sys, time
import numpy as np
import tracegrad as tg
from tracegrad import runtime
tg.config.tiering = False
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.001)
f = tg.jit(lambda w, x: tg.grad(lambda w: tg.sum(tg.tanh(x @ w) ** 2))(w))
x = np.linspace(-1, 1, 64 * 32).reshape(64, 32)
w = np.linspace(-1, 1, 32 * 16).reshape(32, 16)
out = f(w, x)
print(runtime.stats.compiles + runtime.stats.disk_hits, float(out.sum()))
"""


def test_two_processes_compile_the_same_graph_into_one_disk_cache(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "cache"),
               TRACEGRAD_DISK_CACHE="1", PYTHONPATH=ROOT)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(1.5)   # both imported and waiting
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "corrupt" not in err and "Warning" not in err, err
    values = {out.split()[1] for out, _ in results}
    assert len(values) == 1
    entries = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "cache") for f in fs]
    assert entries and all(e.endswith(".tgo") for e in entries)   # no temp files left
    for e in entries:   # each entry is complete and valid
        assert cache._read_entry(e) is not None


def _entry_for(f, *args) -> str:
    graph = tg.jit(f).lower(*args).ir
    return cache.entry_path(cache.cache_key(graph))


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "flipped_bit",
                                    "magic_only", "directory"])
def test_damaged_cache_entry_is_detected_and_rebuilt(damage, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "1")
    f = lambda a: tg.sum(tg.sigmoid(a) * 3.0, axis=1)
    x = np.linspace(-3, 3, 20).reshape(4, 5)
    want = tg.jit(f)(x)
    path = _entry_for(f, x)
    good = open(path, "rb").read()
    if damage == "directory":
        os.remove(path)
        os.makedirs(path)
    else:
        broken = {"truncated": good[: len(good) // 3], "empty": b"",
                  "garbage": np.random.default_rng(0).bytes(len(good)),
                  "flipped_bit": good[:-9] + bytes([good[-9] ^ 1]) + good[-8:],
                  "magic_only": good[:8]}[damage]
        with open(path, "wb") as fh:
            fh.write(broken)
    runtime.clear_memory_cache()
    before = runtime.stats.compiles
    with pytest.warns(UserWarning, match="cache entry"):
        out = tg.jit(f)(x)
    np.testing.assert_array_equal(out, want)
    assert runtime.stats.compiles == before + 1       # recompiled, not loaded
    if damage != "directory":
        assert open(path, "rb").read() == good          # and rewritten in full
        runtime.clear_memory_cache()
        before = runtime.stats.disk_hits
        np.testing.assert_array_equal(tg.jit(f)(x), want)
        assert runtime.stats.disk_hits == before + 1


def _openblas_thread_count():
    """numpy's OpenBLAS's thread count getter, or None (then the tests below skip)."""
    import glob
    from tracegrad.runtime.blas import gemm
    found = gemm()
    if found is None or found.int_bits != 64 or not found.set_threads:    # not numpy's
        return None
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas64*.so*")):
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                     "openblas_get_num_threads"):
            fn = getattr(ctypes.CDLL(path), name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return fn
    return None


@pytest.mark.parametrize("callers", [1, N_THREADS])
def test_split_gemms_leave_openblas_thread_count_as_they_found_it(callers, monkeypatch):
    # the kernels set numpy's OpenBLAS to 1 thread around their ?gemm calls; the setter acts
    # process-wide, so overlapping set/restore pairs (two pool tasks, two Python threads)
    # once left it at 1 for good and numpy's own matmuls ran on one core afterwards
    count = _openblas_thread_count()
    if count is None:
        pytest.skip("tracegrad does not call numpy's OpenBLAS here")
    monkeypatch.setenv("TRACEGRAD_GEMM", "blas")    # (not the packed GEMM of AVX-512 CPUs)
    before, threads = count(), runtime.num_threads()
    runtime.set_num_threads(2)
    try:
        f = tg.jit(lambda a, b: a @ b)
        a = np.random.default_rng(0).random((512, 512), np.float32)
        want = a @ a
        _in_threads(lambda i: [np.testing.assert_allclose(f(a, a), want, rtol=1e-4)
                               for _ in range(300 // callers)], callers)
    finally:
        runtime.set_num_threads(threads)
    assert count() == before


def test_one_blas_thread_restores_the_count_after_an_interrupt():
    """Ctrl-C between the guard's set and its depth's change (in __enter__ or __exit__)
    must not leave numpy's OpenBLAS on one thread for good: the next use restores it."""
    import _thread
    import random
    from tracegrad.runtime.blas import OneBlasThread, numpy_one_blas_thread
    count = _openblas_thread_count()
    if count is None or numpy_one_blas_thread()._set is None:
        pytest.skip("tracegrad does not call numpy's OpenBLAS here")
    before = count()
    guard = OneBlasThread(ctypes.cast(numpy_one_blas_thread()._set, ctypes.c_void_p).value)
    rng = random.Random(0)
    for _ in range(100):
        go, delay = threading.Event(), rng.uniform(0, 5e-4)

        def interrupt():
            go.wait()
            time.sleep(delay)
            _thread.interrupt_main()
        t = threading.Thread(target=interrupt)
        t.start()
        try:
            go.set()
            while True:
                with guard:
                    pass
        except KeyboardInterrupt:
            pass
        t.join()
        with guard:
            assert count() == 1
        assert count() == before

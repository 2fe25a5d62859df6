"""Review of the performance changes since 14c6b11 (scan VJP typed without rules, interned
avals, Program built in one pass, flat equation keys, VJP templates keyed by params as given,
native unrolling by steps, `_join_rows`, the disk-cache listing memo).

The cases that failed (fixed since) say which bug they found; the other tests pin behaviours
the review checked adversarially (bodies evicted and their ids reused, joined rows read by a
later loop, per-step values in the native unrolling), so a later fast path that breaks them
shows up."""
from __future__ import annotations

import gc

import numpy as np

import tracegrad as tg
from tracegrad import ir
from tracegrad.ir import loops
from tracegrad.ir.scan import unroll_scans

F8 = np.dtype("f8")


# ---- runtime/cache.py: may_have_compiled remembers a listing for RELIST_S seconds ---------------

def _tiny_graph():
    b = ir.Builder("review")
    x = b.new_input(ir.Aval((3,), F8))
    with b.active():
        y = tg.sin(x) * 2.0 + 1.0
    return b.build([y])


def test_may_have_compiled_sees_an_entry_this_process_wrote(tmp_path, monkeypatch):
    # (review: the listing memo did not learn of this process's own disk entry; fixed)
    from tracegrad.runtime import cache
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "1")
    monkeypatch.setattr(cache, "_memory", cache._LRU())         # leave the shared cache alone
    monkeypatch.setattr(cache, "_listed", [None, 0.0, False])
    monkeypatch.setattr(cache, "RELIST_S", 3600.0)   # (deterministic: the real one is 1 s)
    g = _tiny_graph()
    assert not cache.may_have_compiled()      # an empty folder: nothing can hit, right
    cache.compile_graph(g)                    # compiles and writes the entry to tmp_path
    assert any(tmp_path.iterdir())
    cache._memory.clear()                     # e.g. clear_memory_cache(), or a new LRU
    assert cache.find_compiled(g) is not None            # a lookup would hit...
    cache._memory.clear()
    assert cache.may_have_compiled()                     # ...but the memo says it cannot


# ---- ir/unroll.py (ed4fd2a): a concatenate of one-row values known by its rows ------------------

def _stack_of_final_carries(W, X, h, c):
    for t in range(5):
        h = tg.tanh(h @ W + X[t])
        c = tg.sin(c) + h
    return tg.sum(tg.sin(tg.stack([h, c])) * 2.0)     # stack: concatenate of reshape(carry)


def _carries_args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 3)) / 2, rng.standard_normal((5, 1, 3)),
            rng.standard_normal((1, 3)), rng.standard_normal((1, 3))]


def test_unrolled_stack_of_a_loops_final_carries_is_defined():
    # (review: rows() read a row through the original equation, not the one written; fixed)
    args = _carries_args()
    g = tg.make_ir(tg.grad(_stack_of_final_carries, argnums=(0, 2, 3)))(*args)
    assert any(e.op == "scan" for e in g.eqns)
    flat = unroll_scans(g)
    ir.verify(flat)
    for a, b in zip(ir.interpret(flat, args), ir.interpret(g, args)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_jit_grad_of_a_stack_of_a_loops_final_carries(monkeypatch):
    # (review: the same bug crashed compiling tg.jit(tg.grad(f)); fixed)
    from tracegrad.runtime import cache
    monkeypatch.setattr(tg.config, "tiering", False)
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")        # compile for real, here
    monkeypatch.setattr(cache, "_memory", cache._LRU())
    args = _carries_args()
    want = tg.grad(_stack_of_final_carries, argnums=(0, 2, 3))(*args)
    got = tg.jit(tg.grad(_stack_of_final_carries, argnums=(0, 2, 3)))(*args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


# ---- pinned: caches keyed by bodies whose ids are reused ----------------------------------------

def _rnn_collect(W, X, h):
    hs = []
    for t in range(6):
        h = tg.tanh(h @ W + X[t])
        hs.append(h)
    S = tg.stack(hs)          # joined into one slice of the scan's stacked output
    g = h
    for t in range(6):        # a second loop reading the joined rows, one per step
        g = tg.tanh(g @ W + S[5 - t] * S[t])
    return tg.sum(g * g) + tg.sum(tg.sin(S) * S)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((3, 3)) / 2, rng.standard_normal((6, 1, 3)),
            rng.standard_normal((1, 3))]


def test_bodies_evicted_and_ids_reused_keep_their_gradients(unrolled):
    args = _args()
    want = tg.grad(_rnn_collect, argnums=(0, 1, 2))(*args)
    tg.config.roll_loops = True
    for _ in range(3):
        loops._BODIES.clear()       # bodies die; the id-keyed memos must not hand out theirs
        gc.collect()
        got = tg.grad(_rnn_collect, argnums=(0, 1, 2))(*args)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_joined_rows_program_and_unrolling_agree_with_interpret():
    args = _args(1)
    g = tg.make_ir(tg.grad(_rnn_collect, argnums=(0, 1, 2)))(*args)
    assert any(e.op == "scan" for e in g.eqns)
    want = ir.interpret(g, args)
    for got in (ir.program(g)(args), ir.program(ir.optimize(g))(args)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)            # the Program is bit-identical
    for a, b in zip(ir.interpret(unroll_scans(ir.optimize(g)), args), want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)

"""Tiering of retraced jit signatures: interpreted until hot, looked up in the compile caches
while lookups pay off, and always the same values as compiled code."""
from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.tracer import executor


@pytest.fixture
def fresh_lookups(monkeypatch, no_disk_cache):
    monkeypatch.setattr(tg.config, "tiering", True)
    monkeypatch.setattr(executor, "_lookups", {"hits": 0, "misses": 0})


def _scaled(x, k):
    y = x
    for _ in range(k):
        y = tg.sin(y) * 1.25
    return tg.sum(y)


def _entry(jitted, k):
    return next(e for key, e in jitted.cache.items() if key[2] == (k,))


def test_retraced_signature_finds_code_compiled_before(fresh_lookups):
    x = np.linspace(0, 1, 7, dtype=np.float32)
    tg.jit(lambda x: _scaled(x, 3))(x)                   # compiled natively (first signature)
    f = tg.jit(_scaled, static_argnums=(1,))
    f(x, 2)                                              # first signature: compiled
    out = f(x, 3)                                        # retrace: tiered, found in the cache
    assert _entry(f, 3).run.native is not None
    np.testing.assert_allclose(out, _scaled(x, 3), rtol=1e-6)


def test_lookups_stop_when_they_never_hit_and_results_stay_right(fresh_lookups):
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    f = tg.jit(tg.value_and_grad(_scaled), static_argnums=(1,))
    f(x, 1)
    for k in range(2, 4 + executor.LOOKUP_TRIES):
        v, g = f(x, k)
        want_v, want_g = tg.value_and_grad(_scaled)(x, k)
        np.testing.assert_allclose(v, want_v, rtol=1e-5)
        np.testing.assert_allclose(g, want_g, rtol=1e-5, atol=1e-6)
    assert executor._lookups == {"hits": 0, "misses": executor.LOOKUP_TRIES}
    late = _entry(f, 3 + executor.LOOKUP_TRIES).run
    assert late.native is None and not late.optimized     # interpreted as traced
    assert late.executable is not None and late.optimized  # compiles (optimised) when asked
    v, g = f(x, 3 + executor.LOOKUP_TRIES)
    np.testing.assert_allclose(g, tg.grad(_scaled)(x, 3 + executor.LOOKUP_TRIES), rtol=1e-5,
                               atol=1e-6)
    # lower() shows the optimised graph
    text = str(f.lower(x, 3 + executor.LOOKUP_TRIES).ir)
    assert "sin" in text and "cos" in text

"""Differential testing: a corpus of random programs (tests/random_programs.py, seeds
0..N_PROGRAMS-1) run in tracegrad, JAX and PyTorch; values and gradients of every input must
agree in float64. Each framework is skipped when it is not installed.

Every program runs in tracegrad on the interpreter and against PyTorch; to keep the suite
fast, every third also runs compiled and every fourth also against (jitted) JAX.
TRACEGRAD_DIFF_FULL=1 runs every program every way."""
from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import anchors
from random_programs import (generate, jax_lib, output_weights, rng_picker, torch_lib,
                             tracegrad_lib)

import tracegrad as tg

torch, jax = anchors()

N_PROGRAMS = int(os.environ.get("TRACEGRAD_DIFF_PROGRAMS", "240"))
FULL = os.environ.get("TRACEGRAD_DIFF_FULL", "") not in ("", "0")
pytestmark = pytest.mark.skipif(torch is None and jax is None,
                                reason="neither torch nor jax is installed")
LIBS = {"tracegrad": tracegrad_lib()}
if torch is not None:
    LIBS["torch"] = torch_lib()
if jax is not None:
    LIBS["jax"] = jax_lib()


@pytest.fixture(autouse=True)
def _native(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_DISK_CACHE", "0")
    monkeypatch.setattr(tg.config, "tiering", False)


def _ours(prog, w, xs, compiled):
    L = LIBS["tracegrad"]
    grad = tg.grad(prog.loss(L, w), argnums=tuple(range(len(xs))))
    f = tg.jit(lambda *a: (prog.run(L, *a), grad(*a)))
    old = tg.config.disable_jit
    tg.config.disable_jit = not compiled
    try:
        out, grads = f(*xs)
    finally:
        tg.config.disable_jit = old
    return out, list(grads)


def _torch(prog, w, xs):
    L = LIBS["torch"]
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    out = prog.run(L, *ts)
    (out * L.const(w)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
                                  for t in ts]


def _jax(prog, w, xs):
    L = LIBS["jax"]
    grad = jax.grad(prog.loss(L, w), argnums=tuple(range(len(xs))))
    out, grads = jax.jit(lambda *a: (prog.run(L, *a), grad(*a)))(*xs)
    return np.asarray(out), [np.asarray(g) for g in grads]


@pytest.mark.parametrize("seed", range(N_PROGRAMS))
def test_program_matches_torch_and_jax(seed):
    prog = generate(rng_picker(seed))
    xs = prog.inputs(seed)
    w = output_weights(prog, seed)
    out, grads = _ours(prog, w, xs, compiled=False)
    if FULL or seed % 3 == 0:
        c_out, c_grads = _ours(prog, w, xs, compiled=True)
        for a, b in zip([out, *grads], [c_out, *c_grads], strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    theirs = {}
    if torch is not None:
        theirs["torch"] = _torch(prog, w, xs)
    if jax is not None and (FULL or seed % 4 == 0):
        theirs["jax"] = _jax(prog, w, xs)
    for name, (t_out, t_grads) in theirs.items():
        msg = f"{name} disagrees on {prog}"
        np.testing.assert_allclose(out, t_out, rtol=1e-9, atol=1e-11, err_msg=msg)
        for g, tg_ in zip(grads, t_grads, strict=True):
            np.testing.assert_allclose(g, tg_, rtol=1e-8, atol=1e-10, err_msg=msg)

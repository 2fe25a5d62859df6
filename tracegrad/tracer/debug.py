"""`tg.config.debug_nans`: stop at the first equation that produces a NaN."""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Iterator

import numpy as np

# the module, not the function `tracegrad.ir.interpret` that ir/__init__ re-exports
interp_mod = importlib.import_module("..ir.interpret", __package__)


def _has_nan(x) -> bool:
    return x.dtype.kind == "f" and bool(np.isnan(x).any())


def describe(source: str | None) -> tuple[str, str]:
    """(phase, where) of an equation from its source: backward equations carry
    "file:line (backward of op)", tangent equations "file:line (tangent of op)"."""
    if not source:
        return "forward", "an unknown line"
    line, _, note = source.partition(" (")
    note = note.rstrip(")")
    if note.startswith("backward"):
        return "backward", f"{line} ({note})"
    if note.startswith("tangent"):
        return "forward-mode (jvp)", f"{line} ({note})"
    return "forward", line


def check_nans(eqn, ins, outs) -> None:
    if any(_has_nan(np.asarray(i)) for i in ins):
        return   # not the first NaN
    for o in outs:
        if _has_nan(o):
            phase, where = describe(eqn.source)
            raise FloatingPointError(
                f"NaN produced by {eqn.op} in the {phase} pass, from {where}; inputs: "
                + ", ".join(f"{np.asarray(i).dtype}{list(np.shape(i))}" for i in ins))


@contextmanager
def nan_checking() -> Iterator[None]:
    old = interp_mod.eqn_hook
    interp_mod.eqn_hook = check_nans
    try:
        yield
    finally:
        interp_mod.eqn_hook = old

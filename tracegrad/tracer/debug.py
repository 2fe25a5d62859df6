"""`tg.config.debug_nans`: stop at the first equation that produces a NaN."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

from ..ir import interpret as interp_mod


def _has_nan(x) -> bool:
    return x.dtype.kind == "f" and bool(np.isnan(x).any())


def _check(eqn, ins, outs) -> None:
    if any(_has_nan(np.asarray(i)) for i in ins):
        return   # not the first NaN
    for o in outs:
        if o.dtype.kind == "f" and np.isnan(o).any():
            src = eqn.source or "an unknown line"
            phase = "backward" if "(backward" in src else "forward"
            line = src.split(" (")[0]
            raise FloatingPointError(
                f"NaN produced by {eqn.op} in the {phase} pass, from {line}")


@contextmanager
def nan_checking() -> Iterator[None]:
    old = interp_mod.eqn_hook
    interp_mod.eqn_hook = _check
    try:
        yield
    finally:
        interp_mod.eqn_hook = old

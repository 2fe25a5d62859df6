"""Process-wide settings, initialised from the environment."""
from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


class Config:
    """`tg.config`: attributes may be set at any time and take effect on the next call."""

    def __init__(self) -> None:
        # Run graphs seen for the first time on the interpreter, compile once they are hot.
        self.tiering: bool = _flag("TRACEGRAD_TIERING", True)
        # Raise FloatingPointError at the first op producing a NaN (forces the interpreter).
        self.debug_nans: bool = _flag("TRACEGRAD_DEBUG_NANS", False)
        # Run everything on the reference interpreter.
        self.disable_jit: bool = _flag("TRACEGRAD_DISABLE_JIT", False)
        self.log_compiles: bool = _flag("TRACEGRAD_LOG_COMPILES", False)
        # Differentiate a traced Python loop as one `scan` (ir.roll_loops) rather than step by
        # step: the backward pass and the interpreter's setup stop growing with the length.
        self.roll_loops: bool = _flag("TRACEGRAD_ROLL_LOOPS", True)

    def __repr__(self) -> str:
        return f"Config({vars(self)})"


config = Config()

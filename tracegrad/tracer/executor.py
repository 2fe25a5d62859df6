"""Where graphs run: the native backend once `tracegrad.runtime` registers itself, the
reference interpreter otherwise (or when `tg.config.disable_jit` / `debug_nans` is set)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import ir
from ..config import config

# backend(graph) -> callable(list of arrays) -> list of arrays; set by tracegrad.runtime
_backend: dict[str, Callable] = {}


def set_backend(compile_fn: Callable, run_fn: Callable) -> None:
    _backend["compile"] = compile_fn
    _backend["run"] = run_fn


def _interpret(graph: ir.Graph, args: Sequence[Any]) -> list[np.ndarray]:
    if config.debug_nans:
        from .debug import nan_checking
        with nan_checking():
            return ir.interpret(graph, args)
    return ir.interpret(graph, args)


def execute(graph: ir.Graph, args: Sequence[Any]) -> list[np.ndarray]:
    """Run an (optimised) graph once; compiled code is cached by the backend."""
    if config.disable_jit or config.debug_nans or "run" not in _backend:
        return _interpret(graph, args)
    return _backend["run"](graph, list(args))


def compile_graph(graph: ir.Graph) -> Callable[[Sequence[Any]], list[np.ndarray]]:
    """A callable running `graph`: native code when a backend exists, else the interpreter."""
    if "compile" in _backend and not config.disable_jit:
        native = _backend["compile"](graph)

        def run(args):
            if config.disable_jit or config.debug_nans:
                return _interpret(graph, args)
            return native(list(args))
        run.executable = native
        return run
    return lambda args: _interpret(graph, args)

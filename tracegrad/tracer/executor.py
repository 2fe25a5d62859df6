"""Where graphs run: the native backend once `tracegrad.runtime` registers itself, the
reference interpreter otherwise (or when `tg.config.disable_jit` / `debug_nans` is set).

Tiering (`tg.config.tiering`, on by default): a graph the compile cache does not already hold
(in memory or on disk) runs on the interpreter until the time spent interpreting it reaches
what compiling it is expected to cost, then compiles (ski rental: never more than twice the
better choice made in hindsight). Measured on the dev machine (2-core EPYC): compiling costs
about 2 ms per equation (RNN, 163 equations: 0.31 s) while interpreting the same graph takes
1.0 ms, so a graph whose shape changes every few calls never waits on the compiler, and a
graph called in a loop is native after a few hundred calls. The estimate follows the compile
times this process actually measures."""
from __future__ import annotations

import contextlib
import gc
import importlib
import time
from typing import Any, Callable, Sequence

import numpy as np

from .. import ir
from ..config import config
from ..ir.loops import unrolled_size

# set by tracegrad.runtime: compile(graph) -> callable(list of arrays) -> list of arrays,
# lookup(graph) -> compiled code already cached, or None (see set_backend for the rest)
_backend: dict[str, Callable] = {}
_reference = importlib.import_module("tracegrad.ir.interpret")   # ir.interpret is the function

COMPILE_SECONDS_PER_EQN = 0.002   # initial estimate, then a running mean of measured compiles
_cost = {"per_eqn": COMPILE_SECONDS_PER_EQN}
_heat: dict[str, float] = {}      # structural hash -> seconds spent interpreting it
MAX_HEAT_ENTRIES = 4096


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off meanwhile (it runs again after). For work that
    makes thousands of small objects and keeps most (tracing, differentiating, composing a
    plan): the collector would run several times meanwhile, scanning them and everything
    recorded before. A collector already off (the user's) stays off; one another thread
    turns off meanwhile is turned on again here (a window of one such piece of work)."""
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def set_backend(compile_fn: Callable, lookup_fn: Callable | None = None,
                may_hit_fn: Callable | None = None,
                one_blas_thread: Any = None, size_fn: Callable | None = None,
                unsupported_fn: Callable | None = None) -> None:
    """`one_blas_thread`: a context manager keeping numpy's BLAS to one thread. `size_fn`:
    the equations the backend compiles for a graph (what the compile estimate scales with;
    default: its scans unrolled). `unsupported_fn(graph)`: a dtype of the graph the backend
    cannot compile, or None (such graphs run on the interpreter)."""
    _backend["compile"] = compile_fn
    if size_fn is not None:
        _backend["size"] = size_fn
    if unsupported_fn is not None:
        _backend["unsupported"] = unsupported_fn
    if lookup_fn is not None:
        _backend["lookup"] = lookup_fn
    if may_hit_fn is not None:
        _backend["may_hit"] = may_hit_fn
    if one_blas_thread is not None:
        _backend["one_blas_thread"] = one_blas_thread


def _interpret(graph: ir.Graph, args: Sequence[Any]) -> list[np.ndarray]:
    if config.debug_nans:
        from .debug import nan_checking
        with nan_checking():
            return ir.interpret(graph, args)
    if _reference.eqn_hook is not None:    # someone watches each equation
        return ir.interpret(graph, args)
    return ir.program(graph)(args)


class Interpreted:
    """What `_native` gives for a graph the backend cannot compile (a dtype it has no type
    for): the interpreter, which runs every dtype, in every tier alike."""
    __slots__ = ("graph", "why")

    def __init__(self, graph: ir.Graph, why: str):
        self.graph, self.why = graph, why

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        return _interpret(self.graph, args)

    @property
    def llvm_ir(self) -> str:
        return f"; no native code: {self.why} (the graph runs on the interpreter)"

    asm = llvm_ir


def _native(graph: ir.Graph) -> Any:
    """Compile `graph` (or fetch it from the cache), keeping the per-equation estimate; a
    graph the backend cannot compile gets the interpreter."""
    unsupported = _backend.get("unsupported")
    bad = unsupported(graph) if unsupported is not None else None
    if bad is not None:
        return Interpreted(graph, f"the native backend does not support dtype {bad}")
    t0 = time.perf_counter()
    exe = _backend["compile"](graph)
    took = time.perf_counter() - t0
    if took > 0.01 and graph.eqns:   # a real compile, not a cache hit
        _cost["per_eqn"] = 0.75 * _cost["per_eqn"] + 0.25 * took / _compiled_size(graph)
    return exe


def compile_estimate(graph: ir.Graph) -> float:
    """Seconds compiling `graph` is expected to take."""
    return _cost["per_eqn"] * max(_compiled_size(graph), 1)


def _compiled_size(graph: ir.Graph) -> int:
    size = _backend.get("size")
    return unrolled_size(graph) if size is None else size(graph)


def _may_hit() -> bool:
    """Whether a compile-cache lookup can find anything (a cold cache never hits)."""
    may_hit = _backend.get("may_hit")
    return may_hit is None or may_hit()


def _tiered(graph: ir.Graph) -> bool:
    return config.tiering and "lookup" in _backend


def execute(graph: ir.Graph, args: Sequence[Any]) -> list[np.ndarray]:
    """Run an (optimised) graph once; compiled code is cached by the backend. With tiering,
    a graph not compiled before is interpreted until it is hot."""
    if config.disable_jit or config.debug_nans or "compile" not in _backend:
        return _interpret(graph, args)
    if not _tiered(graph):
        return _native(graph)(args)
    exe = _backend["lookup"](graph) if _may_hit() else None
    if exe is not None:
        return exe(args)
    key = ir.structural_hash(graph)
    spent = _heat.get(key, 0.0)
    if spent >= compile_estimate(graph):
        _heat.pop(key, None)
        return _native(graph)(args)
    t0 = time.perf_counter()
    out = _interpret(graph, args)
    if len(_heat) > MAX_HEAT_ENTRIES:
        _heat.clear()
    _heat[key] = spent + time.perf_counter() - t0
    return out


# Looking a cold graph up in the compile caches needs it optimised and hashed, which costs about
# as much as interpreting it a few times. Tiered graphs look up while lookups are paying off:
# always after a hit, and for the first few graphs of a process (a cold cache never hits).
LOOKUP_TRIES = 3
_lookups = {"hits": 0, "misses": 0}


class Tiered:
    """A callable running one graph: interpreted until hot (see the module docstring), then
    native. `.executable` compiles at once (for `.lower()` and dumps). An unoptimised graph
    (`optimized=False`) is interpreted as it is and optimised when it is looked up or
    compiled."""
    __slots__ = ("graph", "spent", "native", "optimized")

    def __init__(self, graph: ir.Graph, optimized: bool = True):
        self.graph = graph
        self.spent = 0.0
        self.optimized = optimized
        self.native = None
        if (optimized or _lookups["hits"] or _lookups["misses"] < LOOKUP_TRIES) and \
                _may_hit():
            self.native = _backend["lookup"](self.optimized_graph)
            _lookups["hits" if self.native is not None else "misses"] += 1

    @property
    def optimized_graph(self) -> ir.Graph:
        if not self.optimized:
            self.graph = ir.optimize(self.graph)
            self.optimized = True
        return self.graph

    @property
    def executable(self) -> Any:
        if self.native is None:
            self.native = _native(self.optimized_graph)
        return self.native

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        native = self.native
        if native is not None and not (config.disable_jit or config.debug_nans):
            return native(args)
        if config.disable_jit or config.debug_nans:   # optimised: no dead code to trip on
            return _interpret(self.optimized_graph, args)
        if not config.tiering or self.spent >= compile_estimate(self.graph):
            return self.executable(args)
        t0 = time.perf_counter()
        out = _interpret(self.graph, args)
        self.spent += time.perf_counter() - t0
        return out


def compile_graph(graph: ir.Graph, tiered: bool = False, optimized: bool = True
                  ) -> Callable[[Sequence[Any]], list[np.ndarray]]:
    """A callable running `graph`: native code when a backend exists, else the interpreter.
    `tiered`: interpret until hot (when `config.tiering` is on and the cache lacks it).
    `optimized=False`: `graph` is not optimised yet (done here when it is needed)."""
    if "compile" in _backend and not config.disable_jit:
        if tiered and _tiered(graph):
            return Tiered(graph, optimized)
        if not optimized:
            graph = ir.optimize(graph)
        native = _native(graph)

        def run(args):
            if config.disable_jit or config.debug_nans:
                return _interpret(graph, args)
            return native(args)
        run.executable = native
        run.graph = graph
        return run
    if not optimized:
        graph = ir.optimize(graph)
    run = lambda args: _interpret(graph, args)    # noqa: E731
    run.graph = graph
    return run

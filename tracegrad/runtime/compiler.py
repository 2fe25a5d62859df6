"""Compiling a graph to object code: lower, optimise at O3, emit; dumps and compile logs."""
from __future__ import annotations

import logging
import os
import time

from ..codegen import Layout, lower_graph
from ..ir import Graph
from . import stats
from .target import emit_assembly, emit_object, gemm_vector_bits, optimise

logger = logging.getLogger("tracegrad")


def _log_enabled() -> bool:
    return os.environ.get("TRACEGRAD_LOG_COMPILES", "") not in ("", "0")


def log_compile(msg: str) -> None:
    if _log_enabled():
        if not logger.handlers and not logging.getLogger().handlers:
            logger.addHandler(logging.StreamHandler())
            logger.setLevel(logging.INFO)
        logger.info(msg)
    else:
        logger.debug(msg)


def optimised_module(graph: Graph, blas: int, threads: int = 1):
    """`blas`: the width of BLAS integer arguments, 0 for no BLAS (`cache.blas_for`)."""
    lowered = lower_graph(graph, use_blas=blas > 0, threads=threads, blas_int_bits=blas or 32,
                          vector_bits=gemm_vector_bits())
    return lowered, optimise(str(lowered.module))


def compile_object(graph: Graph, key: str, blas: int,
                   threads: int = 1) -> tuple[bytes, Layout, object]:
    """Returns (object code, layout, optimised module)."""
    t0 = time.perf_counter()
    lowered, mod = optimised_module(graph, blas, threads)
    t1 = time.perf_counter()
    obj = emit_object(mod)
    t2 = time.perf_counter()
    stats.compiles += 1
    lay = lowered.layout
    log_compile(f"tracegrad: compiled graph {key[:12]} ({len(graph.eqns)} eqns -> "
                f"{lay.n_kernels} kernels, {lay.n_parallel} parallel) in "
                f"{(t2 - t0) * 1e3:.1f} ms (lower+opt {(t1 - t0) * 1e3:.1f} ms, "
                f"codegen {(t2 - t1) * 1e3:.1f} ms)")
    dump_dir = os.environ.get("TRACEGRAD_DUMP")
    if dump_dir:
        dump(dump_dir, key, graph, str(mod), emit_assembly(mod))
    return obj, lay, mod


def dump(dump_dir: str, key: str, graph: Graph, llvm_ir: str, asm: str) -> None:
    os.makedirs(dump_dir, exist_ok=True)
    stem = os.path.join(dump_dir, f"graph_{key[:16]}")
    for ext, text in ((".ir.txt", str(graph)), (".ll", llvm_ir), (".s", asm)):
        with open(stem + ext, "w") as f:
            f.write(text)

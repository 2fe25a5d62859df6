"""Native execution: target machine, LLJIT, compile cache (memory + disk), the native call."""
from . import stats
from .blas import numpy_one_blas_thread
from .cache import (cache_dir, clear_memory_cache, compile_graph, find_compiled,
                    may_have_compiled, run_graph)
from .executable import LAYOUT_PROBLEM, Executable
from .pool import num_threads, set_num_threads

__all__ = ["Executable", "cache_dir", "clear_memory_cache", "compile_graph", "num_threads",
           "run_graph", "set_num_threads", "stats"]


def _register() -> None:
    """Make the tracer (jit, Tensors, transforms) run graphs natively."""
    try:
        from ..tracer import executor
    except ImportError:   # the tracer is optional for the runtime
        return
    if LAYOUT_PROBLEM:
        import os
        import sys
        import warnings
        # (pointing at the user's import: the first frame outside tracegrad, counted as
        # `warnings` counts, skipping the import machinery's frames)
        ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        level, f = 1, sys._getframe(0)
        while (f := f.f_back) is not None:
            name = f.f_code.co_filename
            if "importlib" in name and "_bootstrap" in name:
                continue
            level += 1
            if not name.startswith(ours):
                break
        warnings.warn(f"tracegrad: no native backend on this Python ({LAYOUT_PROBLEM}); "
                      "graphs run on the reference interpreter", RuntimeWarning,
                      stacklevel=level)
        return
    from ..codegen.dtypes import unsupported_dtype
    from ..codegen.plan import compiled_size
    executor.set_backend(compile_graph, find_compiled, may_have_compiled,
                         numpy_one_blas_thread(), compiled_size, unsupported_dtype)


_register()

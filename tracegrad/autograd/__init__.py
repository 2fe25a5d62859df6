"""`tg.autograd`: `grad`, `backward`, `Function` and `graph.saved_tensors_hooks`."""
from ..tracer.autograd_engine import backward, grad
from ..tracer.autograd_function import Function, FunctionCtx, once_differentiable
from ..tracer.grad_mode import (
    enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled,
)
from . import graph

__all__ = ["Function", "FunctionCtx", "backward", "enable_grad", "grad", "graph",
           "inference_mode", "is_grad_enabled", "no_grad", "once_differentiable",
           "set_grad_enabled"]

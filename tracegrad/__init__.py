"""tracegrad: trace-and-compile automatic differentiation.

PyTorch's autograd semantics and JAX's composable transforms on one core: a tracer records
Python into IR, reverse mode turns it into gradient IR, llvmlite compiles it natively."""
from . import ir
from .config import config
from .ir.builder import TracingError
from .ir.ops import AxisError, DTypeError, ShapeError
from .tracer.custom import custom_vjp
from .tracer.indexing import getitem
from .tracer.jit import jit
from .tracer.numpy_api import (
    abs, add, all, amax, amin, any, arange_traced, argmax, argmin, astype, bool_, broadcast_to,
    cast, cat, clamp, clip, concatenate, cos, div, divide, dot, equal, erf, exp, expand_dims,
    expm1, eye_traced, float32, float64, floor_divide, full_traced, greater, greater_equal,
    int32, int64, less, less_equal, linspace_traced, log, log1p, logical_and, logical_not,
    logical_or, logsumexp, matmul, max, maximum, mean, min, minimum, mul, multiply, neg,
    not_equal, pow, power, prod, reciprocal, relu, reshape, sigmoid, sign, sin, sqrt, square,
    squeeze, stack, std, stop_gradient, sub, subtract, sum, swapaxes, take, tan, tanh,
    transpose, true_divide, var, where,
)
from .tracer.pytree import register_pytree_node, tree_flatten, tree_map, tree_unflatten
from .tracer.random import manual_seed
from .tracer.transforms import grad, hessian, jacfwd, jacrev, jvp, make_ir, value_and_grad, vjp
from . import nn  # noqa: E402

__version__ = "0.1.0"
from . import runtime  # noqa: E402  (registers the native backend)
from . import optim, viz  # noqa: E402
from .checkpoint import checkpoint  # noqa: E402
from .serialization import load, save  # noqa: E402
from .tracer import tensor_ops as _tensor_ops  # noqa: E402, F401  (Tensor methods)
from .tracer.grad_mode import (  # noqa: E402
    enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled,
)
from .tracer.tensor import Tensor  # noqa: E402
from .tracer.tensor_factories import (  # noqa: E402
    arange, eye, full, linspace, ones, ones_like, rand, randn, tensor, zeros, zeros_like,
)
from . import autograd  # noqa: E402
from . import distributed  # noqa: E402  (tg.distributed; imports mpi4py only in init())

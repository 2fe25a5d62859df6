"""Tracing Python into IR: pytrees, the numpy-like ops, transforms, jit, Tensors."""
from . import methods  # noqa: F401  (installs array methods on traced values)

"""Optimizers (`tg.optim`): PyTorch-style classes for Tensors and pure updates for jit."""
from .functional import (  # noqa: F401
    adam_init, adam_update, adamw_init, adamw_update, sgd_init, sgd_update,
)
from .optimizer import SGD, Adam, AdamW, Optimizer  # noqa: F401

"""Neural-network building blocks written on the public API (`tg.nn`)."""
from . import functional, init  # noqa: F401
from .layers import (  # noqa: F401
    GELU, CrossEntropyLoss, Dropout, Embedding, Flatten, Identity, Linear, LogSoftmax,
    ModuleList, MSELoss, ReLU, Sequential, Sigmoid, Softmax, Tanh,
)
from .module import Module  # noqa: F401
from .normalization import BatchNorm1d, LayerNorm  # noqa: F401
from .parameter import Parameter  # noqa: F401

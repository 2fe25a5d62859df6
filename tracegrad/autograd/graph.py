"""`tg.autograd.graph`: hooks on the values the autograd graph saves for backward."""
from __future__ import annotations

from typing import Any, Callable

from ..tracer.autograd_graph import AccumulateGrad, Node
from ..tracer.grad_mode import mode

__all__ = ["saved_tensors_hooks", "Node", "AccumulateGrad"]


class saved_tensors_hooks:  # noqa: N801 - PyTorch's name
    """Inside, each value an op saves for backward is passed through `pack_hook` once (when
    saved) and its result through `unpack_hook` when backward needs the value."""

    def __init__(self, pack_hook: Callable[[Any], Any], unpack_hook: Callable[[Any], Any]):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> saved_tensors_hooks:
        mode.saved_hooks.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc: Any) -> None:
        mode.saved_hooks.pop()


class disable_saved_tensors_hooks:  # noqa: N801
    def __init__(self, error_message: str = ""):
        self.error_message = error_message

    def __enter__(self) -> None:
        self._saved = list(mode.saved_hooks)
        mode.saved_hooks.clear()

    def __exit__(self, *exc: Any) -> None:
        mode.saved_hooks[:] = self._saved

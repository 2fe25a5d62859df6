"""Grad modes: `no_grad`, `enable_grad`, `set_grad_enabled`, `inference_mode` (thread-local,
nestable, usable as context managers and as decorators), the saved-tensor hook stack, and
the tape of nodes recorded since the last backward."""
from __future__ import annotations

import functools
import itertools
import sys
import threading
from typing import Any, Callable

from ..ir.builder import _state as _trace_state


TAPE_ROOM = 256     # the tape's first pruning point (see prune_tape)


class ThreadMode:
    """One thread's modes in plain slots. Recording reads several of them on every op, and
    each attribute of a thread-local costs a lookup of the thread's dict: recording reads
    `mode.state` once and then these."""
    __slots__ = ("grad", "inference", "saved_hooks", "tape", "tape_room", "tape_gen",
                 "traces")

    def __init__(self) -> None:
        # This thread's stack of traces being recorded (ir.builder's, the same list): the op
        # recording fast paths read it here, one thread-local lookup less per op.
        self.traces: list = _trace_state.stack
        self.grad = True          # record autograd graphs
        self.inference = False    # inference mode: no graphs, results are inference tensors
        self.saved_hooks: list[tuple[Callable, Callable]] = []
        # The differentiable nodes this thread recorded since its last backward, in order
        # (see autograd_exec.tape_walk), pruned when longer than tape_room (prune_tape).
        self.tape: list = []
        self.tape_room = TAPE_ROOM
        self.tape_gen = next(_tape_gens)     # which tape this is (see Tensor._gsrc)

    def clear_tape(self) -> None:
        """Start the tape again: a backward ran (see autograd_exec.tape_walk)."""
        self.tape.clear()
        self.tape_room = TAPE_ROOM
        self.tape_gen = next(_tape_gens)


_tape_gens = itertools.count()      # numbers tapes across threads: none is handed out twice


def prune_tape(st: ThreadMode) -> None:
    """Drop from the tape the nodes only it still holds (recorded, then dropped without a
    backward: an evaluation with grad on), newest first, so that their inputs go with them;
    then let it grow to twice what is left (at least TAPE_ROOM). So a graph dropped is freed
    within a few hundred ops, or as many as the live graphs have nodes; reading a value
    prunes too (autograd_exec.realize), so sooner."""
    tape = st.tape
    for i in range(len(tape) - 1, -1, -1):
        if sys.getrefcount(tape[i]) <= 2:     # the tape's reference, and the call's
            tape[i] = None
    tape[:] = [n for n in tape if n is not None]
    st.tape_room = max(TAPE_ROOM, 2 * len(tape))


def _field(name: str) -> property:
    return property(lambda self: getattr(self.state, name),
                    lambda self, value: setattr(self.state, name, value))


class _Mode(threading.local):
    """The calling thread's ThreadMode, its fields also readable and settable here."""

    def __init__(self) -> None:
        self.state = ThreadMode()

    grad = _field("grad")
    inference = _field("inference")
    saved_hooks = _field("saved_hooks")
    tape = _field("tape")


mode = _Mode()


def is_grad_enabled() -> bool:
    return mode.grad


def is_inference_mode_enabled() -> bool:
    return mode.inference


class _ModeContext:
    """Base of the mode context managers: save the mode on enter, restore it on exit."""

    def __new__(cls, *args: Any) -> Any:
        if cls in (no_grad, enable_grad) and len(args) == 1 and callable(args[0]):
            return cls()(args[0])      # bare `@no_grad`, as PyTorch allows
        return super().__new__(cls)

    def _enter(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> None:
        self._saved = (mode.grad, mode.inference)
        self._enter()

    def __exit__(self, *exc: Any) -> None:
        mode.grad, mode.inference = self._saved

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.clone():
                return fn(*args, **kwargs)
        return wrapped

    def clone(self) -> _ModeContext:
        return type(self)()


class no_grad(_ModeContext):  # noqa: N801 - PyTorch's name
    """Operations inside are not recorded for differentiation."""

    def _enter(self) -> None:
        mode.grad = False


class enable_grad(_ModeContext):  # noqa: N801
    """Re-enable recording inside a `no_grad` region (not inside inference mode's tensors)."""

    def _enter(self) -> None:
        mode.grad = True


class set_grad_enabled(_ModeContext):  # noqa: N801
    """`set_grad_enabled(False)` as a call sets the mode now; as a context it restores it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self._saved = (mode.grad, mode.inference)
        mode.grad = self.enabled

    def _enter(self) -> None:
        mode.grad = self.enabled

    def __enter__(self) -> None:
        self._enter()    # the mode to restore was saved at construction, as PyTorch does

    def clone(self) -> set_grad_enabled:
        saved = mode.grad
        ctx = set_grad_enabled(self.enabled)
        mode.grad = saved
        return ctx

    def __call__(self, fn: Callable) -> Callable:
        mode.grad, mode.inference = self._saved   # used as a decorator: undo the call's effect
        return super().__call__(fn)


class inference_mode(_ModeContext):  # noqa: N801
    """Like `no_grad`, and tensors made inside are inference tensors (never recorded later)."""

    def __new__(cls, mode_on: Any = True) -> Any:
        if callable(mode_on):
            return cls(True)(mode_on)    # bare `@inference_mode`
        return object.__new__(cls)

    def __init__(self, mode_on: bool = True) -> None:
        self.mode_on = bool(mode_on)

    def _enter(self) -> None:
        if self.mode_on:
            mode.grad = False
            mode.inference = True

    def clone(self) -> inference_mode:
        return inference_mode(self.mode_on)

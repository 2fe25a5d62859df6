"""`tg.nn.Module`: a tree of parameters, buffers and submodules, usable eagerly (Tensors,
`loss.backward()`) and purely (`module.apply(variables, x)` on arrays or traced values, so a
whole training step can be `tg.jit`-compiled with the parameters as a pytree)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple

import numpy as np

from ..ir import is_float
from ..ir.builder import Traced, current_builder
from . import parameter as P


@dataclass
class _Frame:
    """One active `apply`: which module has which name, the buffer updates it collected and
    the seed its dropout layers draw from."""
    names: dict[int, str]
    seed: Any
    updates: dict[str, Any] = field(default_factory=dict)
    draws: int = 0


class _Stack(threading.local):
    def __init__(self) -> None:
        self.frames: list[_Frame] = []


_stack = _Stack()


def _frame_of(module: Module) -> _Frame | None:
    for frame in reversed(_stack.frames):
        if id(module) in frame.names:
            return frame
    return None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of layers and models: assign parameters with `register_parameter` (or a
    `tg.nn.Parameter`), buffers with `register_buffer`, submodules by attribute."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- registration ----------------------------------------------------------------------
    def register_parameter(self, name: str, value: Any) -> None:
        self._parameters[name] = None if value is None else (
            value if _is_parameter(value) else P.parameter(value))

    def register_buffer(self, name: str, value: Any) -> None:
        self._buffers[name] = None if value is None else P.buffer(value)

    def add_module(self, name: str, module: Module | None) -> None:
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError("cannot assign to a Module before Module.__init__() is called")
        if isinstance(value, Module):
            params.pop(name, None)
            self._buffers.pop(name, None)
            self.__dict__.pop(name, None)
            self._modules[name] = value
            return
        self._modules.pop(name, None)
        if _is_parameter(value) or name in params:
            self.__dict__.pop(name, None)
            self.register_parameter(name, value)
        elif name in self._buffers:
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    # -- traversal -------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()

        def walk(m: Module, p: str) -> Iterator[tuple[str, Module]]:
            if id(m) in seen:
                return
            seen.add(id(m))
            yield p, m
            for name, child in m._modules.items():
                if child is not None:
                    yield from walk(child, _join(p, name))
        return walk(self, prefix)

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self) -> Iterator[Module]:
        return (m for _, m in self.named_children())

    def _named(self, store: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for k, v in getattr(m, store).items():
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                yield _join(mp, k), v

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple]:
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Any]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple]:
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Any]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    # -- modes and gradients ---------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout active, batch statistics); orthogonal to `tg.no_grad`."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            if P.is_tensor(p):
                p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if P.is_tensor(p) and p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer as numpy arrays, by dotted name."""
        out: dict[str, np.ndarray] = {}
        for p, m in self.named_modules():
            for store in (m._parameters, m._buffers):
                for k, v in store.items():
                    if v is not None:
                        out[_join(p, k)] = np.array(P.to_numpy(v))
        return out

    def param_dict(self) -> dict[str, np.ndarray]:
        """The trainable parameters as a flat dict of numpy arrays: the pytree that
        `apply`, `tg.grad` and the pure optimizer updates take."""
        return {k: np.array(P.to_numpy(v)) for k, v in self.named_parameters()}

    def buffer_dict(self) -> dict[str, np.ndarray]:
        """The buffers (running statistics...) as a flat dict of numpy arrays."""
        return {k: np.array(P.to_numpy(v)) for k, v in self.named_buffers()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values into this module's parameters and buffers (in place)."""
        slots = self._slots()
        missing = [k for k in slots if k not in state]
        unexpected = [k for k in state if k not in slots]
        errors = []
        if strict and (missing or unexpected):
            if missing:
                errors.append("Missing key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in missing) + ".")
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in unexpected) + ".")
        for k, (store, name) in slots.items():
            if k not in state:
                continue
            new, cur = P.to_numpy(state[k]), store[name]
            if tuple(new.shape) != tuple(cur.shape):
                errors.append(f"size mismatch for {k}: copying a param with shape "
                              f"{tuple(new.shape)} from checkpoint, the shape in current "
                              f"model is {tuple(cur.shape)}.")
                continue
            P.assign(cur, np.array(new, cur.dtype))     # (a copy: the caller's array may change)
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                               + "\n\t".join(errors))
        return IncompatibleKeys(missing, unexpected)

    def _slots(self) -> dict[str, tuple[dict, str]]:
        slots = {}
        for p, m in self.named_modules():
            for store in (m._parameters, m._buffers):
                for k, v in store.items():
                    if v is not None:   # (as state_dict: Linear(bias=False)'s bias is None)
                        slots[_join(p, k)] = (store, k)
        return slots

    def astype(self, dtype: Any) -> Module:
        """Convert floating-point parameters and buffers to `dtype` (new leaves)."""
        for m in self.modules():
            for k, v in m._parameters.items():
                if v is not None and is_float(v.dtype):
                    m._parameters[k] = P.parameter(P.to_numpy(v).astype(dtype))
            for k, v in m._buffers.items():
                if v is not None and is_float(v.dtype):
                    m._buffers[k] = P.buffer(P.to_numpy(v).astype(dtype))
        return self

    def double(self) -> Module:
        return self.astype(np.float64)

    def float(self) -> Module:
        return self.astype(np.float32)

    # -- the pure form ---------------------------------------------------------------------
    def apply(self, variables: Any, *args: Any, training: bool | None = None, seed: Any = None,
              mutable: bool = False, **kwargs: Any) -> Any:
        """Call the module with `variables` (dotted name -> array, e.g. `param_dict()`)
        in place of its own parameters/buffers; names left out keep the module's values.

        Pure: nothing is mutated. `training` overrides the modules' modes for this call;
        `seed` (an int or a traced int64 scalar) drives dropout; with `mutable=True` the
        result is `(out, updates)` where `updates` holds the new buffer values (BatchNorm
        running statistics in training). `module.apply(fn)` with one callable argument
        is PyTorch's: call `fn` on every submodule."""
        if callable(variables) and not isinstance(variables, dict) and not args and not kwargs:
            for m in list(self.modules())[::-1]:
                variables(m)
            return self
        with self._functional(variables or {}, training, seed) as frame:
            out = self(*args, **kwargs)
        return (out, frame.updates) if mutable else out

    @contextmanager
    def _functional(self, variables: dict, training: bool | None,
                    seed: Any) -> Iterator[_Frame]:
        slots = self._slots()
        unknown = [k for k in variables if k not in slots]
        if unknown:
            raise KeyError(f"{type(self).__name__}.apply: unknown variable(s) {unknown}; this "
                           f"module has {list(slots)}")
        saved = [(store, name, store[name]) for k, (store, name) in slots.items()
                 if k in variables]
        modules = list(self.named_modules())
        modes = [(m, m.training) for _, m in modules]
        frame = _Frame({id(m): p for p, m in modules}, seed)
        try:
            for k, v in variables.items():
                store, name = slots[k]
                store[name] = v
            if training is not None:
                self.train(training)
            _stack.frames.append(frame)
            yield frame
        finally:
            if _stack.frames and _stack.frames[-1] is frame:
                _stack.frames.pop()
            for store, name, value in saved:
                store[name] = value
            for m, mode in modes:
                object.__setattr__(m, "training", mode)

    # -- helpers for layers ----------------------------------------------------------------
    def _update_buffer(self, name: str, value: Any) -> None:
        """Record a new buffer value: into the active `apply(..., mutable=True)` results,
        or in place when running eagerly."""
        frame = _frame_of(self)
        if frame is not None:
            frame.updates[_join(frame.names[id(self)], name)] = value
            return
        if isinstance(value, Traced) or current_builder() is not None:
            raise RuntimeError(
                f"{type(self).__name__} updates its buffer '{name}' in training mode, which "
                "cannot happen inside a traced function; call model.eval() or use "
                "model.apply(variables, x, mutable=True), which returns the new buffers")
        P.assign(self._buffers[name], P.detach(value))

    def _dropout_seed(self, x: Any) -> Any:
        """The seed for this dropout call: derived from `apply`'s seed, else the global
        generator (eager only: a traced function would bake it in as a constant)."""
        frame = _frame_of(self)
        if frame is not None and frame.seed is not None:
            frame.draws += 1
            from ..tracer import numpy_api as tnp
            seed = tnp.astype(frame.seed, np.int64)
            return tnp.add(tnp.mul(seed, 65537), frame.draws)
        if isinstance(x, Traced) or current_builder() is not None:
            raise ValueError(
                f"{type(self).__name__} in training mode inside a traced function needs a "
                "seed: call model.apply(params, x, seed=s) with s a traced int (e.g. the "
                "step number), or put the model in eval mode")
        return None

    # -- printing --------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {child}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _is_parameter(value: Any) -> bool:
    return isinstance(value, P.Parameter)


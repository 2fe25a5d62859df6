"""Building graphs: the Builder that records equations and the Traced values it hands out.

`bind(op, *args, **params)` is the single entry every op goes through: it emits an equation
into the innermost active builder (lifting values captured from outer builders), or, when no
builder is active and no argument is traced, evaluates the numpy reference eagerly.
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

from .core import Atom, Aval, Eqn, Graph, Lit, Var, aval_of, remember
from .ops import OPS, DTypeError, ShapeError

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TracingError(RuntimeError):
    """A traced value was used where a concrete Python value is needed."""


# id(code object) -> (the code object, its file's name or None if ours). Keyed by id: hashing
# a code object hashes its constants. The entry keeps the code alive, so its id stays its own.
_CODE_FILES: dict[int, tuple[Any, str | None]] = {}


def user_source() -> str | None:
    """The `file:line` of the innermost frame outside the tracegrad package."""
    f = sys._getframe(1)
    files = _CODE_FILES
    while f is not None:
        code = f.f_code
        hit = files.get(id(code))
        if hit is None or hit[0] is not code:
            fn = code.co_filename
            hit = remember(files, id(code), (code, None if fn.startswith(_PKG_DIR)
                                             or fn.startswith("<frozen")
                                             else os.path.basename(fn)))
        if hit[1] is not None:
            return f"{hit[1]}:{f.f_lineno}"
        f = f.f_back
    return None


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[Builder] = []


_state = _State()


_RULES: dict[Any, list[Aval]] = {}   # (op, input avals, params) -> output avals


def out_avals_of(op: str, avals: list[Aval], params: dict, source: str | None = None
                 ) -> list[Aval]:
    """The output avals of `op` on inputs `avals`, by its shape/dtype rule (remembered: the
    rules are pure). Errors name the op and the user's line."""
    try:
        key = (op, *avals, *params.items()) if params else (op, *avals)
        hit = _RULES.get(key)
    except TypeError:       # a parameter that cannot be hashed
        key = hit = None
    if hit is not None:
        return hit
    opdef = OPS[op]
    try:
        out = opdef.rule(*avals, **params)
    except (ShapeError, DTypeError) as e:
        where = f" (at {source})" if source else ""
        raise type(e)(f"{op}: {e}{where}") from None
    out = list(out) if opdef.multi_out else [out]
    return out if key is None else remember(_RULES, key, out, 16384)


class Builder:
    """Records equations into a graph under construction."""

    def __init__(self, name: str = "trace"):
        self.name = name
        self.invars: list[Var] = []
        self.eqns: list[Eqn] = []
        self.constvars: list[Var] = []
        self.consts: list[np.ndarray] = []
        self._const_ids: dict[int, Var] = {}
        self._keepalive: list[Any] = []
        self.captured: list[Traced] = []          # outer values this graph reads
        self._capture_vars: dict[int, Var] = {}   # id(outer Traced) -> our input var
        self.capture_invars: list[Var] = []
        self.weak_inputs: set[int] = set()        # ids of inputs passed as Python scalars
        self.source_override: str | None = None
        self.done = False
        self.optimized_later = False   # the built graph goes through ir.optimize (jit)

    # -- inputs and constants
    def new_input(self, aval: Aval) -> Traced:
        v = Var(aval)
        self.invars.append(v)
        return Traced(self, v)

    def const(self, value: np.ndarray) -> Var:
        key = id(value)
        hit = self._const_ids.get(key)
        if hit is not None:
            return hit
        arr = np.asarray(value)
        v = Var(aval_of(arr))
        self.constvars.append(v)
        self.consts.append(arr)
        self._const_ids[key] = v
        self._keepalive.append(value)   # keeps id(value) from being reused
        return v

    def lift(self, t: Traced) -> Var:
        if t.builder is self:
            return t.atom
        if t.builder.done:
            raise TracingError(
                "a traced value escaped from a finished trace (stored in a global or "
                "returned through a side channel); pass it as an argument instead")
        v = self._capture_vars.get(id(t))
        if v is None:
            v = Var(t.aval)
            self._capture_vars[id(t)] = v
            self.captured.append(t)
            self.capture_invars.append(v)
        return v

    def atom(self, x: Any) -> Atom:
        if isinstance(x, Traced):
            return self.lift(x)
        if isinstance(x, (Var, Lit)):
            return x
        arr = np.asarray(x)
        if arr.ndim == 0 and arr.dtype != object:
            return Lit(arr, arr.dtype)
        if arr.dtype == object:
            raise TypeError(f"cannot use a value of type {type(x).__name__} as an array")
        return self.const(arr)

    # -- equations
    def emit(self, op: str, inputs: Sequence[Atom], params: dict,
             source: str | None = None) -> list[Var]:
        source = source or self.source_override or user_source()
        out_avals = out_avals_of(op, [a.aval for a in inputs], params, source)
        outs = [Var(a) for a in out_avals]
        self.eqns.append(Eqn(op, list(inputs), outs, params, source))
        return outs

    def inline(self, graph: Graph, args: Sequence[Any]) -> list[Traced]:
        """Copy `graph`'s equations in, reading `args` for its inputs (no re-checking)."""
        env: dict[int, Atom] = {}
        for v, a in zip(graph.invars, args):
            env[v.id] = self.atom(a)
        for v, c in zip(graph.constvars, graph.consts):
            env[v.id] = self.const(c)

        def read(a: Atom) -> Atom:
            return a if isinstance(a, Lit) else env[a.id]

        for e in graph.eqns:
            outs = [Var(v.aval) for v in e.outvars]
            for v, o in zip(e.outvars, outs):
                env[v.id] = o
            self.eqns.append(Eqn(e.op, [read(a) for a in e.inputs], outs, e.params, e.source))
        return [Traced(self, read(a)) for a in graph.outvars]

    def build(self, outs: Sequence[Any]) -> Graph:
        out_atoms = [self.atom(o) for o in outs]
        self.done = True
        return Graph(self.invars + self.capture_invars, self.eqns, out_atoms,
                     self.constvars, self.consts)

    # -- the active-builder stack
    @contextmanager
    def active(self) -> Iterator[Builder]:
        _state.stack.append(self)
        try:
            yield self
        finally:
            _state.stack.pop()


def current_builder() -> Builder | None:
    return _state.stack[-1] if _state.stack else None


def bind(op: str, *args: Any, **params: Any) -> Any:
    """Apply primitive `op`: record it when tracing, else evaluate the numpy reference."""
    b = current_builder()
    if b is None:
        for a in args:
            if isinstance(a, Traced):
                b = a.builder
                break
        if b is not None and b.done:   # recording into it would silently lose the op
            src = user_source()
            raise TracingError(
                f"{op}: a traced value escaped from a finished trace (stored in a global or "
                "returned through a side channel) and was used outside it"
                + (f" (at {src})" if src else "") + "; pass it as an argument instead")
    if b is None:
        arrays = [np.asarray(a) for a in args]
        opdef = OPS[op]
        try:
            opdef.rule(*[aval_of(a) for a in arrays], **params)
        except (ShapeError, DTypeError) as e:
            src = user_source()
            raise type(e)(f"{op}: {e}" + (f" (at {src})" if src else "")) from None
        out = opdef.ref(*arrays, **params)
        # numpy hands back scalars for 0-d results; eager ops return arrays, as jit does
        return tuple(map(np.asarray, out)) if opdef.multi_out else np.asarray(out)
    outs = b.emit(op, [b.atom(a) for a in args], params)
    if OPS[op].multi_out:
        return [Traced(b, v) for v in outs]
    return Traced(b, outs[0])


class Traced:
    """A value being recorded into a graph: what user code and autodiff rules compute with."""
    __slots__ = ("builder", "atom", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, builder: Builder, atom: Atom):
        self.builder = builder
        self.atom = atom

    @property
    def aval(self) -> Aval:
        return self.atom.aval

    @property
    def shape(self) -> tuple[int, ...]:
        return self.atom.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.atom.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.atom.aval.shape)

    @property
    def size(self) -> int:
        return self.atom.aval.size

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d traced value")
        return self.shape[0]

    def _concrete_error(self, what: str) -> TracingError:
        src = user_source()
        return TracingError(
            f"{what} of a traced value {self.aval} is not known while tracing"
            + (f" (at {src})" if src else "")
            + ": Python control flow cannot depend on traced values. "
            "Use tg.where(cond, a, b) to select values, or mark the argument static "
            "with static_argnums.")

    def __bool__(self) -> bool:
        raise self._concrete_error("the truth value")

    def __index__(self) -> int:
        raise self._concrete_error("the integer value")

    def __float__(self) -> float:
        raise self._concrete_error("the float value")

    def __int__(self) -> int:
        raise self._concrete_error("the integer value")

    def __array__(self, dtype=None, copy=None):
        raise self._concrete_error("the numpy value")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"Traced<{self.aval}>"

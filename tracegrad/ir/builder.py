"""Building graphs: the Builder that records equations and the Traced values it hands out.

`bind(op, *args, **params)` is the single entry every op goes through: it emits an equation
into the innermost active builder (lifting values captured from outer builders), or, when no
builder is active and no argument is traced, evaluates the numpy reference eagerly.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from sys import _getframe
from typing import Any, Sequence

import numpy as np

from .core import Atom, Aval, Eqn, Graph, Lit, Var, aval_of, remember
from .core import _ids as _var_ids
from .ops import OPS, DTypeError, ShapeError

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # ".../tracegrad/"


class TracingError(RuntimeError):
    """A traced value was used where a concrete Python value is needed."""


# id(code object) -> None if the code is ours, else (its file's base name, {instruction offset:
# "file:line"}). Keyed by id: hashing a code object hashes its constants. `_CODES` keeps the
# code objects alive, so their ids stay theirs; both are emptied together.
_CODE_SITES: dict[int, tuple[str, dict[int, str]] | None] = {}
_CODES: list[Any] = []


def _learn_code(code: Any) -> tuple[str, dict[int, str]] | None:
    if len(_CODES) >= 4096:
        _CODE_SITES.clear()
        _CODES.clear()
    _CODES.append(code)
    fn = code.co_filename
    ours = fn.startswith(_PKG_DIR) or fn.startswith("<frozen")
    info = _CODE_SITES[id(code)] = None if ours else (os.path.basename(fn), {})
    return info


def user_source(skip: int = 0) -> str | None:
    """The `file:line` of the innermost frame outside the tracegrad package, looking from
    `skip` frames above the caller (callers skip the frames they know are tracegrad's). A
    call site's text is remembered by its instruction offset (`f_lineno` decodes the line
    table)."""
    try:
        f = sys._getframe(1 + skip)
    except ValueError:      # fewer frames than skipped (a thread started on an op)
        return None
    global _last_site
    sites = _CODE_SITES
    last_code, lines = _last_site     # (one read: another thread may replace it)
    while f is not None:
        code = f.f_code
        if code is not last_code:
            info = sites.get(id(code), False)
            if info is False:
                info = _learn_code(code)
            if info is None:    # ours
                f = f.f_back
                continue
            lines = info[1]
            _last_site = (code, lines)
        line = lines.get(f.f_lasti)
        if line is None:
            line = lines[f.f_lasti] = f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
        return line
    return None


# (code object, its {instruction offset: "file:line"}) of the user's frame user_source found
# last: a loop tracing ops comes from one function, so most lookups end at the first frame
# looked at. The code object held keeps its id its own; the table stays right for it when
# _CODE_SITES is emptied.
_last_site: tuple = (None, None)


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[Builder] = []


_state = _State()


_RULES: dict[Any, list[Aval]] = {}   # (op, input avals, params) -> output avals
# (op, ids of the input avals, params) -> (output avals, the input avals). A trace hands the
# same Aval objects from one equation to the next (outputs come from `_RULES`), so most
# lookups hash ids rather than shapes and dtypes; each entry keeps its input avals alive, so
# their ids stay theirs while it exists.
_RULES_BY_ID: dict[Any, tuple[list[Aval], tuple[Aval, ...]]] = {}
_AVALS: dict[Aval, Aval] = {}   # the avals of inputs and constants, one object per type
_new = object.__new__


def _interned(aval: Aval) -> Aval:
    return _AVALS.get(aval) or remember(_AVALS, aval, aval)


def out_avals_of(op: str, avals: Sequence[Aval], params: dict, source: str | None = None
                 ) -> list[Aval]:
    """The output avals of `op` on inputs `avals`, by its shape/dtype rule (remembered: the
    rules are pure). Errors name the op and the user's line."""
    n = len(avals)   # (unpacking into a tuple costs more than spelling out the short cases)
    ids = ((op, id(avals[0]), id(avals[1])) if n == 2 else (op, id(avals[0])) if n == 1
           else (op, *map(id, avals)))
    try:
        if params:
            ids = (ids, tuple(params.items()))
        hit = _RULES_BY_ID.get(ids)
    except TypeError:       # a parameter that cannot be hashed
        return _apply_rule(op, avals, params, source)
    if hit is not None:
        return hit[0]
    key = (op, *avals, *params.items())
    out = _RULES.get(key)
    if out is None:
        out = remember(_RULES, key, _apply_rule(op, avals, params, source), 16384)
    remember(_RULES_BY_ID, ids, (out, tuple(avals)), 16384)
    return out


def _apply_rule(op: str, avals: Sequence[Aval], params: dict, source: str | None) -> list[Aval]:
    opdef = OPS[op]
    try:
        out = opdef.rule(*avals, **params)
    except (ShapeError, DTypeError) as e:
        where = f" (at {source})" if source else ""
        raise type(e)(f"{op}: {e}{where}") from None
    return list(out) if opdef.multi_out else [out]


# Literals, shared by the equations that use equal ones (keyed by dtype and bits: 0.0 and -0.0
# differ), so that their avals are shared too (see _RULES_BY_ID).
_LITS: dict[Any, Lit] = {}


def _literal(arr: np.ndarray) -> Lit:
    """The literal holding the 0-d array `arr`."""
    key = (arr.dtype, arr.tobytes())
    lit = _LITS.get(key)
    if lit is None:
        lit = remember(_LITS, key, Lit(arr.copy(), arr.dtype))
    return lit


def scalar_literal(value: int | float, dtype: np.dtype) -> Lit:
    """The literal of `dtype` holding the Python number `value` (as `np.asarray(value,
    dtype)`)."""
    if value != 0 and value == value:    # (0.0 and -0.0 are equal, NaN is not itself)
        key = (type(value), value, dtype)
        lit = _LITS.get(key)
        if lit is None:
            lit = remember(_LITS, key, _literal(np.asarray(value, dtype)))
        return lit
    return _literal(np.asarray(value, dtype))


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
        # one Aval object per type, so rules are looked up by id (see _RULES_BY_ID)
        v = Var(_interned(aval))
        self.invars.append(v)
        return Traced(self, v)

    def const(self, value: np.ndarray) -> Var:
        key = id(value)
        hit = self._const_ids.get(key)
        if hit is not None:
            return hit
        arr = np.asarray(value)
        v = Var(_interned(aval_of(arr)))
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
        if arr.ndim == 0 and arr.dtype.kind != "O":
            return _literal(arr)
        if arr.dtype == object:
            raise TypeError(f"cannot use a value of type {type(x).__name__} as an array")
        return self.const(arr)

    # -- equations
    def emit(self, op: str, inputs: Sequence[Atom], params: dict,
             source: str | None = None) -> list[Var]:
        source = source or self.source_override or user_source()
        inputs = list(inputs)
        outs = [Var(a) for a in out_avals_of(op, [a.aval for a in inputs], params, source)]
        self.eqns.append(Eqn(op, inputs, outs, params, source))
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

    # -- the active-builder stack: `with b.active(): ...` (a plain context manager: a generator
    # one costs microseconds, once per trace and per transform)
    def active(self) -> Builder:
        return self

    def __enter__(self) -> Builder:
        _state.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.stack.pop()


def current_builder() -> Builder | None:
    return _state.stack[-1] if _state.stack else None


def bind(op: str, *args: Any, **params: Any) -> Any:
    """Apply primitive `op`: record it when tracing, else evaluate the numpy reference."""
    stack = _state.stack
    if stack:
        b = stack[-1]
    else:
        b = _eager_or_owner(op, args)
        if b is None:
            return _evaluate(op, args, params)
    inputs = [a.atom if type(a) is Traced and a.builder is b else b.atom(a) for a in args]
    source = b.source_override or user_source(1)
    # (Builder.emit, inlined: a call fewer on the path of every op bind_traced leaves to us)
    outs = [Var(a) for a in out_avals_of(op, [a.aval for a in inputs], params, source)]
    b.eqns.append(Eqn(op, inputs, outs, params, source))
    if OPS[op].multi_out:
        return [Traced(b, v) for v in outs]
    return Traced(b, outs[0])


def bind_traced(op: str, x: Traced | Lit, y: Traced | Lit | None = None,
                params: dict | None = None, token: int | None = None) -> Traced:
    """`bind(op, x)` or `bind(op, x, y)` for a single-output `op` on traced values or
    literals, with `params` (hashable, normalised as `bind`'s callers would; the equation keeps
    the dict): the ops most steps are made of (`tanh(h @ W + b)`, `xs[t]`, `2.0 * x`).
    Equations of types seen before are written directly, the rest goes through `bind`.
    `token`: an int from `params_token` naming `params` (no hashing them per equation). For
    tracegrad's op functions only: the user's line is looked for above the caller."""
    stack = _state.stack
    if stack:
        b = stack[-1]
        t = type(x)
        ax = x.atom if t is Traced and x.builder is b else x if t is Lit else None
        if y is None:
            key = (op, id(ax.aval)) if ax is not None else None
            inputs = [ax]
        else:
            t = type(y)
            ay = y.atom if t is Traced and y.builder is b else y if t is Lit else None
            key = (op, id(ax.aval), id(ay.aval)) if ax is not None and ay is not None else None
            inputs = [ax, ay]
        if key is not None:
            if params:
                key = (key, tuple(params.items()) if token is None else token)
            hit = _RULES_BY_ID.get(key)
            if hit is None and token is not None and params:
                # the first equation of its type under this token: the rule as remembered
                # by the params (by `bind`, for an earlier equation), or bind's below
                hit = _RULES_BY_ID.get((key[0], tuple(params.items())))
                if hit is not None:
                    remember(_RULES_BY_ID, key, hit, 16384)
            if hit is not None:
                # the variable, equation and traced value written directly (a constructor
                # call each costs about twice the slot stores: a few percent of a trace)
                out = _new(Var)
                out.aval = hit[0][0]
                out.id = next(_var_ids)
                e = _new(Eqn)
                e.op = op
                e.inputs = inputs
                e.outvars = [out]
                e.params = params or {}
                src = b.source_override
                if src is None:
                    # user_source(2)'s common case inline: the op function's caller, or its
                    # caller's when that one is ours too (`x @ W`, `tg.tanh(x)`, `xs[t]`), is
                    # the user's function it found last
                    try:
                        f = _getframe(2)
                    except ValueError:      # (a thread started on an op function)
                        f = None
                    last = _last_site       # (one read: another thread may replace it)
                    if f is not None and f.f_code is not last[0] and \
                            _CODE_SITES.get(id(f.f_code), False) is None:
                        f = f.f_back
                    src = (last[1].get(f.f_lasti) if f is not None and f.f_code is last[0]
                           else None)
                    if src is None:
                        src = user_source(2)
                e.source = src
                b.eqns.append(e)
                t = _new(Traced)
                t.builder = b
                t.atom = out
                return t
    params = params or {}
    return bind(op, x, **params) if y is None else bind(op, x, y, **params)


_TOKENS = itertools.count()


def params_token() -> int:
    """A new int for `bind_traced` to name a params dict by: its caller keeps the pair (the
    same token for equal params, never one token for two), and tokens are never handed out
    twice."""
    return next(_TOKENS)


def _eager_or_owner(op: str, args: Sequence[Any]) -> Builder | None:
    """With no active builder: the builder of a traced argument, or None (evaluate)."""
    for a in args:
        if isinstance(a, Traced):
            b = a.builder
            if b.done:   # recording into it would silently lose the op
                src = user_source(2)
                raise TracingError(
                    f"{op}: a traced value escaped from a finished trace (stored in a global "
                    "or returned through a side channel) and was used outside it"
                    + (f" (at {src})" if src else "") + "; pass it as an argument instead")
            return b
    return None


def _evaluate(op: str, args: Sequence[Any], params: dict) -> Any:
    arrays = [np.asarray(a) for a in args]
    opdef = OPS[op]
    try:
        opdef.rule(*[aval_of(a) for a in arrays], **params)
    except (ShapeError, DTypeError) as e:
        src = user_source(2)
        raise type(e)(f"{op}: {e}" + (f" (at {src})" if src else "")) from None
    out = opdef.ref(*arrays, **params)
    # numpy hands back scalars for 0-d results; eager ops return arrays, as jit does
    return tuple(map(np.asarray, out)) if opdef.multi_out else np.asarray(out)


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

"""The IR's data types: abstract values, variables, literals, equations and graphs."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_SHORT = {
    np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.float16): "f16",
    np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8", np.dtype(np.bool_): "bool",
}


def remember(table: dict, key: Any, value: Any, limit: int = 8192) -> Any:
    """`table[key] = value` for the memo tables of the tracing path, emptied when they reach
    `limit` entries (what they hold is cheap to make again). Returns `value`."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value


def short_dtype(dtype: np.dtype) -> str:
    short = _SHORT.get(dtype)
    return short if short is not None else _SHORT.get(np.dtype(dtype), str(dtype))


def is_float(dtype: np.dtype) -> bool:
    kind = getattr(dtype, "kind", None)    # a dtype; np.issubdtype costs a microsecond
    return kind == "f" if kind is not None else np.issubdtype(dtype, np.floating)


@dataclass(frozen=True, slots=True)
class Aval:
    """The abstract value of an array: its shape and dtype."""
    shape: tuple[int, ...]
    dtype: np.dtype
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # avals key every memo of the tracing path: hash them once
        object.__setattr__(self, "_hash", hash((self.shape, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:     # the hash is made again in the process that loads it
        return (Aval, (self.shape, self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)    # (np.prod costs ~4 us: shape rules ask this often)

    def __str__(self) -> str:
        text = _AVAL_TEXT.get(self)
        if text is None:
            text = remember(_AVAL_TEXT, self,
                            f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]")
        return text


_AVAL_TEXT: dict[Aval, str] = {}


def aval_of(value: Any) -> Aval:
    arr = np.asarray(value)
    return Aval(tuple(arr.shape), arr.dtype)


_ids = itertools.count()


class Var:
    """A value in a graph, defined once (by an input binder or an equation)."""
    __slots__ = ("aval", "id")

    def __init__(self, aval: Aval):
        self.aval = aval
        self.id = next(_ids)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.aval.dtype

    def __repr__(self) -> str:
        return f"Var({self.id}:{self.aval})"


class Lit:
    """A scalar constant written inline in an equation, e.g. `2.0:f32[]`."""
    __slots__ = ("value", "aval")

    def __init__(self, value: Any, dtype: np.dtype):
        self.value = np.asarray(value, dtype=dtype)
        self.aval = Aval((), np.dtype(dtype))

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    @property
    def dtype(self) -> np.dtype:
        return self.aval.dtype

    def key(self) -> tuple:
        """Equal for literals of the same dtype and bits (0.0 and -0.0 differ)."""
        return ("lit", self.aval.dtype.str, self.value.tobytes())

    def __repr__(self) -> str:
        return f"{self.value.item()!r}:{self.aval}"


Atom = Var | Lit


@dataclass(slots=True, eq=False)
class Eqn:
    """One primitive application: `outvars = op[params] inputs`."""
    op: str
    inputs: list[Atom]
    outvars: list[Var]
    # never changed in place (a rewrite makes a new dict): equations share params dicts (x[t]'s
    # slices), and memo tables key equations by id(params) (builder, loop_form)
    params: dict[str, Any] = field(default_factory=dict)
    source: str | None = None   # the user's `file:line` that issued the op

    @property
    def out(self) -> Var:
        return self.outvars[0]


@dataclass(eq=False)
class Graph:
    """A closed computation: inputs, captured constants, equations in order, outputs."""
    invars: list[Var]
    eqns: list[Eqn]
    outvars: list[Atom]
    constvars: list[Var] = field(default_factory=list)
    consts: list[np.ndarray] = field(default_factory=list)

    @property
    def in_avals(self) -> list[Aval]:
        return [v.aval for v in self.invars]

    @property
    def out_avals(self) -> list[Aval]:
        return [v.aval for v in self.outvars]

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)

    def pretty(self, source: bool = False) -> str:
        from .printer import format_graph
        return format_graph(self, source=source)

    def to_dot(self) -> str:
        from .printer import graph_to_dot
        return graph_to_dot(self)

    def structural_hash(self) -> str:
        from .hashing import structural_hash
        return structural_hash(self)

"""`tg.jit`: trace once per signature, compile, and call the cached code afterwards."""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import ir
from ..config import config
from .executor import Tiered, collector_paused, compile_graph
from .pytree import TreeDef, tree_flatten, unflattener
from ..ir.builder import current_builder
from ..ir.core import remember
from ..ir.loop_form import loop_form
from ..ir.template import Template
from .trace import leaf_values, trace, tracing

log = logging.getLogger("tracegrad")


_UNFLATTENERS: dict[Any, Callable] = {}   # made by eval (~0.1 ms): once per output tree


def _unflattener(tree: TreeDef) -> Callable:
    # keyed with the tree's text too: equal trees may differ in the types of their dict keys
    # (1, 1.0, True), which the unflattener rebuilds
    try:
        key = (tree, repr(tree))
        fn = _UNFLATTENERS.get(key)
    except TypeError:     # a registered node type with unhashable metadata
        return unflattener(tree)
    if fn is None:
        fn = remember(_UNFLATTENERS, key, unflattener(tree), 1024)
    return fn


@dataclass
class _Entry:
    out_tree: TreeDef
    run: Callable
    unflatten: Callable | None = None     # (made from out_tree when not given)

    def __post_init__(self) -> None:
        if self.unflatten is None:
            self.unflatten = _unflattener(self.out_tree)

    @property
    def graph(self) -> ir.Graph:
        """The optimised graph (a tiered entry optimises it now if it has not yet)."""
        run = self.run
        return run.optimized_graph if isinstance(run, Tiered) else run.graph


class _Family:
    """The graphs one jitted function made for traces of one loop at several lengths: two
    give a template, a third checks it (see ir.template); after that, one is written from
    the template for each new length at least as long as the shortest of those (a loop too
    short is rolled differently). Graphs that give no template are tried again with the next
    lengths a few times; a template a third length contradicts is given up for good (the
    function is then rolled and differentiated each time, as without one)."""
    __slots__ = ("out_tree", "unflatten", "first", "counts", "template", "checked", "dead",
                 "least", "tries", "lock")
    TRIES = 3

    def __init__(self, out_tree: TreeDef):
        self.out_tree = out_tree
        self.unflatten = _unflattener(out_tree)     # (once: its entries share it)
        self.first: tuple | None = None     # (graph, n, literals) of a first count
        self.counts: tuple = ()             # the two counts the template was made from
        self.template: Template | None = None
        self.checked = False                # (once True, nothing here changes again)
        self.dead = False
        self.least = 0                      # the fewest trips of the graphs it was made from
        self.tries = 0
        self.lock = threading.Lock()

    def add(self, graph: ir.Graph, n: int, lits: list) -> None:
        """Another length's graph: `n` trips, `lits` the literals of its trace outside
        the loop (see ir.loop_form)."""
        with self.lock:
            if self.dead or self.checked:
                return
            if self.template is None:
                if self.first is None:
                    self.first = (graph, n, lits)
                elif self.first[1] != n:
                    template = Template.derive(*self.first, graph, n, lits)
                    if template is None:        # start again from this one
                        self.tries += 1
                        self.first = (graph, n, lits)
                        self.dead = self.tries >= self.TRIES
                        return
                    self.counts = (self.first[1], n)
                    self.least = min(self.counts)
                    self.first = None
                    template.give_program(graph)
                    self.template = template
            elif n not in self.counts:      # a third count
                if self.template.matches(graph, n, lits):
                    self.least = min(self.least, n)
                    self.template.give_program(graph)
                    self.checked = True
                else:
                    self.dead = True
                    self.template = None


def _leaf_key(x: Any) -> Any:
    if isinstance(x, (np.ndarray, np.generic)):   # before float: np.float64 is a float
        return (x.shape, x.dtype.str)
    if isinstance(x, float):
        return "f"
    if isinstance(x, bool):
        return "b"
    if isinstance(x, int):
        return "i"
    arr = getattr(x, "__tg_array__", None)
    if arr is not None:
        a = arr()
        return (a.shape, a.dtype.str)
    raise TypeError(f"jit: argument leaf of type {type(x).__name__} is not an array or a "
                    "Python scalar (mark it static with static_argnums)")


def _fast_key(args: Sequence[Any], static: tuple = ()) -> tuple[Any, list]:
    """(key, leaves) for arguments that are numpy arrays or lists/tuples of them, and the
    static values at positions `static` (in the key as they are) — the common calls, keyed
    without the pytree machinery — else (None, [])."""
    key, flat = [], []
    for i, a in enumerate(args):
        if static and i in static:
            key.append(a)
            continue
        t = type(a)
        if t is np.ndarray:
            key.append((a.shape, a.dtype))
            flat.append(a)
        elif t is list or t is tuple:
            sub = []
            for x in a:
                if type(x) is not np.ndarray:
                    return None, []
                sub.append((x.shape, x.dtype))
                flat.append(x)
            key.append((t, *sub))
        else:
            return None, []
    return tuple(key), flat


def _arrays_only(args: list) -> bool:
    """Whether every leaf of `args` is a numpy array."""
    for a in args:
        if type(a) is not np.ndarray:
            return all(type(x) is np.ndarray for x in tree_flatten(tuple(args))[0])
    return True


def _describe(key_part: Any) -> str:
    if isinstance(key_part, tuple) and len(key_part) == 2:
        shape, dt = key_part
        return f"{ir.short_dtype(np.dtype(dt))}{list(shape)}"
    return {"f": "float", "b": "bool", "i": "int"}.get(key_part, repr(key_part))


class Lowered:
    """What `jit(f).lower(*args)` returns: the graph and its native code as text."""

    def __init__(self, graph: ir.Graph, run: Callable):
        self.ir = graph
        self._run = run

    @property
    def llvm_ir(self) -> str:
        exe = getattr(self._run, "executable", None)
        return exe.llvm_ir if exe is not None else "; no native backend (interpreter)"

    @property
    def asm(self) -> str:
        exe = getattr(self._run, "executable", None)
        return exe.asm if exe is not None else "; no native backend (interpreter)"

    def as_text(self) -> str:
        return str(self.ir)


class Jitted:
    def __init__(self, f: Callable, static_argnums: Sequence[int] = (),
                 donate_argnums: Sequence[int] = ()):
        self.f = f
        self.static = tuple(sorted((static_argnums,) if isinstance(static_argnums, int)
                                   else static_argnums))
        self.donate = tuple((donate_argnums,) if isinstance(donate_argnums, int)
                            else donate_argnums)
        self.cache: dict[Any, _Entry] = {}
        self._last_key: Any = None
        self._fast: dict[Any, _Entry] = {}
        self._by_keywords: dict[Any, Jitted] = {}
        self._families: dict[Any, _Family] = {}     # see _compile_loop
        # updated=(): copying f.__dict__ would let a callable object's attributes
        # (a `cache`, an `f`) overwrite ours
        functools.update_wrapper(self, f, updated=())

    def _split(self, args: tuple) -> tuple[list[Any], list[Any], TreeDef]:
        static = self.static
        for i in static:
            if i >= len(args):
                raise ValueError(f"jit: static_argnums {i} is out of range for "
                                 f"{len(args)} argument(s)")
        dyn = [a for i, a in enumerate(args) if i not in static] if static else list(args)
        leaves, tree = tree_flatten(tuple(dyn))
        svals = [args[i] for i in static]
        return leaves, svals, tree

    def _key(self, leaves: list, svals: list, tree: TreeDef) -> Any:
        try:
            hash(tuple(svals))
        except TypeError:
            raise TypeError("jit: static arguments must be hashable, got "
                            + ", ".join(type(s).__name__ for s in svals)) from None
        return (tree, tuple(_leaf_key(x) for x in leaves), tuple(svals))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return self._call_with_keywords(args, kwargs)
        # Fast path: numpy arrays (and static values) only, outside any trace: the key is the
        # arrays' types and the static values.
        fast = None
        if current_builder() is None:
            static = self.static
            if not static or static[-1] < len(args):
                fast, flat = _fast_key(args, static)
            if fast is not None:
                try:
                    entry = self._fast.get(fast)
                except TypeError:       # an unhashable static value: the slow path says so
                    entry = fast = None
                if entry is not None:
                    return entry.unflatten(entry.run(flat))
        leaves, svals, tree = self._split(args)
        if tracing([x for x in leaves]):
            return self.f(*args)     # inside another transform: trace through
        key = self._key(leaves, svals, tree)
        entry = self.cache.get(key)
        if entry is not None:
            return self._run(entry, leaves, fast)
        # (tracing, differentiating and the first run, which writes the interpreter's plan,
        # make thousands of objects and keep most: bench `dynamic` jit pass -6%)
        with collector_paused():
            return self._run(self._compile(args, key), leaves, fast)

    def _run(self, entry: _Entry, leaves: list, fast: Any) -> Any:
        values = leaf_values(leaves, "argument")
        # (the fast path hands its arrays to the entry as they are: not those leaf_values
        # converts, in the other byte order)
        if fast is not None and all(v is x for v, x in zip(values, leaves)):
            self._fast[fast] = entry
        return entry.unflatten(entry.run(values))

    def _call_with_keywords(self, args: tuple, kwargs: dict) -> Any:
        """Keyword arguments are traced like trailing positional ones (one cache per names)."""
        from .transforms import _positional
        keys = tuple(kwargs)
        inner = self._by_keywords.get((len(args), keys))
        if inner is None:
            inner = Jitted(_positional(self.f, len(args), keys), self.static, self.donate)
            self._by_keywords[(len(args), keys)] = inner
        return inner(*args, *kwargs.values())

    def _compile(self, args: tuple, key: Any) -> _Entry:
        t0 = time.perf_counter()
        traced = getattr(self.f, "_tg_traced", None)
        # (arrays only: f's own trace, made outside jit's, must see what jit's trace would;
        # a Python number would be a weak input of one and a Traced of the other)
        if type(traced) is tuple and traced[0] is self.f and self.static and \
                config.roll_loops and _arrays_only(
                    [a for i, a in enumerate(args) if i not in self.static]):
            entry = self._compile_loop(args, key, *traced[1:])
        else:
            tf, _ = trace(self.f, args, self.static, optimized_later=True)
            # Like JAX, the first signature compiles on the first call. A function that
            # retraces (static arguments, or a second signature) is tiered: new signatures
            # run on the interpreter until hot. bench `dynamic` (RNN, 11 lengths over 60
            # calls): a compile per length (0.31-0.50 s each, measured) would cost 57-92
            # ms/iter; tiered, the run measured 7.6 ms/iter.
            tiered = bool(self.static) or bool(self.cache)
            entry = _Entry(tf.out_tree, compile_graph(tf.graph, tiered=tiered,
                                                      optimized=False))
        if config.log_compiles:
            reason = self._miss_reason(key)
            log.warning("jit: compiled %s in %.1f ms%s", getattr(self.f, "__name__", "fn"),
                        1e3 * (time.perf_counter() - t0), reason)
        self.cache[key] = entry
        self._last_key = key
        return entry

    def _compile_loop(self, args: tuple, key: Any, start: Callable, finish: Callable
                      ) -> _Entry:
        """`_compile` of a transform that traces the user's function first (`grad`,
        `value_and_grad`: `start` traces, `finish` differentiates inside jit's trace). When
        that trace is a loop whose other signatures made graphs differing only in integers
        linear in the trip count, the graph for this one is written from their template
        instead of being rolled and differentiated again (see ir.template)."""
        started = start(args)
        tf_f, _, meta = started
        # a static value f's trace does not see as a Python value (a float is an input of
        # f's trace but a constant of jit's graph) is read by the pipeline outside the form:
        # then no family, and no form to look for
        found = loop_form(tf_f.graph) if all(i in meta.static for i in self.static) else None
        family = fkey = None
        if found is not None:
            form, n, lits = found
            try:        # f's output tree too is read outside the form
                fkey = (key[0], key[1], form, tf_f.out_tree, repr(tf_f.out_tree))
                family = self._families.get(fkey)
            except TypeError:
                found = None
            if family is not None and family.checked and n >= family.least and \
                    family.template.fits(lits, form):
                return _Entry(family.out_tree, compile_graph(
                    family.template.instantiate(n, lits), tiered=True, optimized=False),
                    family.unflatten)
        tf, _ = trace(lambda *a: finish(a, started), args, self.static, optimized_later=True)
        if found is not None:
            if family is None:
                family = remember(self._families, fkey, _Family(tf.out_tree), 64)
            family.add(tf.graph, n, lits)
        return _Entry(tf.out_tree, compile_graph(tf.graph, tiered=True, optimized=False))

    def _miss_reason(self, key: Any) -> str:
        old = self._last_key
        if old is None:
            return ""
        if old[0] != key[0]:
            return f" (retraced: argument structure changed from {old[0]} to {key[0]})"
        for i, (a, b) in enumerate(zip(old[1], key[1])):
            if a != b:
                return (f" (retraced: argument leaf {i} changed from {_describe(a)} to "
                        f"{_describe(b)})")
        for i, (a, b) in enumerate(zip(old[2], key[2])):
            if a != b:
                return (f" (retraced: static argument {self.static[i]} changed from {a!r} "
                        f"to {b!r})")
        return ""

    def lower(self, *args: Any) -> Lowered:
        leaves, svals, tree = self._split(args)
        key = self._key(leaves, svals, tree)
        entry = self.cache.get(key) or self._compile(args, key)
        return Lowered(entry.graph, entry.run)


def jit(f: Callable | None = None, static_argnums: Sequence[int] = (),
        donate_argnums: Sequence[int] = ()) -> Any:
    """Compile `f` per signature (pytree structure, shapes, dtypes, static values)."""
    if f is None:
        return lambda g: Jitted(g, static_argnums, donate_argnums)
    return Jitted(f, static_argnums, donate_argnums)

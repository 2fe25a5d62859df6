"""The reference interpreter: runs a graph with each op's numpy reference. The oracle."""
from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .core import Graph, Lit, remember
from .ops import OPS, convert_value, np_index
from .passes import _frozen_params

# Called after every equation with (eqn, inputs, outputs); set by tracegrad.config.debug_nans.
eqn_hook: Callable | None = None


def interpret(graph: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    if len(args) != len(graph.invars):
        raise TypeError(f"graph takes {len(graph.invars)} inputs, got {len(args)}")
    env: dict[int, np.ndarray] = {}
    for v, a in zip(graph.invars, args):
        arr = np.asarray(a)
        if arr.shape != v.aval.shape or arr.dtype != v.aval.dtype:
            raise TypeError(f"input expects {v.aval}, got {arr.dtype}{list(arr.shape)}")
        env[v.id] = arr
    for v, c in zip(graph.constvars, graph.consts):
        env[v.id] = c

    def read(a):
        return a.value if isinstance(a, Lit) else env[a.id]

    hook = eqn_hook
    for e in graph.eqns:
        ins = [read(a) for a in e.inputs]
        out = OPS[e.op].ref(*ins, **e.params)
        outs = out if OPS[e.op].multi_out else (out,)
        for v, o in zip(e.outvars, outs):
            env[v.id] = np.asarray(o, dtype=v.aval.dtype).reshape(v.aval.shape)
        if hook is not None:
            hook(e, ins, [env[v.id] for v in e.outvars])
    return [np.array(read(a)) for a in graph.outvars]


# ---- the fast interpreter ----------------------------------------------------------------------
# Graphs that run many times on the interpreter (cold signatures under tiering, the Tensor API's
# recorded graphs) go through a Program: variables live in slots of a list, each equation's numpy
# function is chosen once, and constants (literals, `full`, `iota`) are computed once. Where an
# op's fast function could differ from its reference (integer reductions, mixed dtypes), the
# reference runs, so results are bit-identical to `interpret`.

_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
          "min": np.minimum, "lt": np.less, "le": np.less_equal, "gt": np.greater,
          "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
          "and": np.logical_and, "or": np.logical_or,
          "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sin": np.sin,
          "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "sqrt": np.sqrt, "neg": np.negative,
          "abs": np.abs, "sign": np.sign, "not": np.logical_not}
_FLOAT_ONLY = {"div": np.divide, "pow": np.power}
_REDUCE = {"reduce_sum": np.add.reduce, "reduce_max": np.maximum.reduce,   # what np.sum...
           "reduce_min": np.minimum.reduce, "reduce_prod": np.multiply.reduce}  # call
_CREATE = {"full", "iota"}


def _outer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """matmul with a contraction of length 1: one product per element, added to 0 as matmul's
    sum starts (so -0.0 products become 0.0, as in matmul)."""
    out = np.multiply(a, b)
    if out.dtype.kind in "fc":
        out += 0.0
    return out


def _broadcast(x: np.ndarray, shape: tuple) -> np.ndarray:
    """np.ascontiguousarray(np.broadcast_to(x, shape)), at a third of the cost."""
    out = np.empty(shape, x.dtype)
    out[...] = x
    return out


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2-d float matmul. On contiguous operands (C or Fortran order) np.matmul and np.dot
    make the same BLAS call, and np.dot costs less than half as much to call (`a.dot`, its
    C function without the array-function dispatch, less again: 0.7 against 0.9 us for a
    (1,64)x(64,64) product); on others np.matmul may run its own loop, so it runs."""
    if a.flags.forc and b.flags.forc:
        return a.dot(b)
    return _np_matmul(a, b)


_np_matmul = np.matmul
# _dot without its checks: for operands known to be contiguous (see `contiguity`)
_ndot = np.ndarray.dot


def _updater(idx: tuple) -> Callable:
    """The step of an update_slice: a copy of `x` with its slice `idx` set to `v`. (Its
    `index` marks it for `in_place`.)"""
    def update(x: np.ndarray, v: np.ndarray) -> np.ndarray:
        out = x.copy()
        out[idx] = v
        return out
    update.index = idx
    update.fresh = True     # (a new array: see makes_new)
    global _updates
    _updates = True
    return update


_updates = False    # whether `_updater` made a step yet (until then `in_place` has no work)


def _slicer(idx: tuple) -> Callable:
    """The step of a slice: a view. (Its `cut` marks it for `in_place`.)"""
    def cut(x: np.ndarray) -> np.ndarray:
        return x[idx]
    cut.cut = idx
    return cut


def _cut_copy(view: Callable) -> Callable:
    """`_slicer`'s step `view`, copying the slice (one per step function, as below)."""
    fn = _IN_PLACE.get(view)
    if fn is None:
        idx = view.cut

        def fn(x: np.ndarray) -> np.ndarray:
            return x[idx].copy()
        remember(_IN_PLACE, view, fn, 4096)
    return fn


def _update_in_place(copying: Callable) -> Callable:
    """`_updater`'s step `copying`, writing into its operand (one per step function, so that
    plans made alike have the same functions: see tracer.autograd_template)."""
    fn = _IN_PLACE.get(copying)
    if fn is None:
        idx = copying.index

        def fn(x: np.ndarray, v: np.ndarray) -> np.ndarray:
            x[idx] = v
            return x
        remember(_IN_PLACE, copying, fn, 4096)
    return fn


_IN_PLACE: dict[Callable, Callable] = {}


def in_place(steps: list, outs: Iterable[int]) -> list:
    """`steps` (a Program's or a composed plan's: (function, input slots, output slot or
    slots, arity)) with each update_slice step that may write into its operand's array doing
    so instead of copying it, so that a loop's `buf[t] = h` costs a row, not the buffer. It
    may where the operand was made by another update_slice step (an array of the run's own:
    never an input or a constant) and nothing reads it, or any value that may share its
    memory, after this step, nor is it one of the slots `outs` returned. Every other step
    is taken to possibly return a view of its operands, but a slice: a slice of an array
    written in place copies instead (it costs its size, where the update saves the whole's),
    so a gradient's `g[t]` read before `g[t]` is zeroed does not keep g from being written."""
    if not _updates:
        return steps
    ups = [i for i, s in enumerate(steps) if getattr(s[0], "index", None) is not None]
    if not ups:
        return steps
    last: dict[int, int] = {}       # slot -> the last step reading it
    for i, s in enumerate(steps):
        for k in s[1]:
            last[k] = i
    for k in outs:
        last[k] = len(steps)
    made = {steps[i][2]: i for i in ups}
    owners: dict[int, Any] = {k: (k,) for k in made}   # slot -> the arrays it may share
    until = {k: last.get(k, -1) for k in made}      # an array -> the last step reading it
    cuts = []       # (step, the arrays it may share) per slice of one
    for i, (fn, ins, out, n) in enumerate(steps):
        if made.get(out, -1) == i:
            continue
        shared = {r for k in ins for r in owners.get(k, ())}
        if not shared:
            continue
        if getattr(fn, "cut", None) is not None:
            cuts.append((i, shared))
            continue
        for o in (out,) if n >= 0 else out:
            owners[o] = shared
            t = last.get(o, -1)
            for r in shared:
                if until[r] < t:
                    until[r] = t
    steps = list(steps)
    written = set()
    for i in ups:
        fn, ins, out, n = steps[i]
        x = ins[0]
        if x in made and until[x] == i:
            steps[i] = (_update_in_place(fn), ins, out, n)
            written.add(x)
    for i, shared in cuts:
        if not written.isdisjoint(shared):
            fn, ins, out, n = steps[i]
            steps[i] = (_cut_copy(fn), ins, out, n)
    return steps


def _flip(x: np.ndarray) -> np.ndarray:
    """A 2-d transpose (a view: contiguous when `x` is, in the other order)."""
    return x.T


# numpy's C functions behind their __array_function__ dispatchers (numpy >= 1.25), which look
# at every argument for an override plain arrays never have: np.concatenate of 10 small
# pieces costs 4.1 us through its dispatcher, 2.0 us without
concatenate = getattr(np.concatenate, "_implementation", np.concatenate)
where = getattr(np.where, "_implementation", np.where)

try:    # numpy's floating-point error state: a context variable holding an "extobj"
    from numpy._core.umath import _extobj_contextvar as _error_state
except ImportError:     # pragma: no cover - another numpy: np.errstate itself
    _error_state = None
_QUIET: dict[Any, Any] = {}     # an error state -> the same with every error ignored


def errors_off() -> Any:
    """`np.errstate(all="ignore")` entered (a Program runs what the user wrote: inf and nan
    are values, as in native code, not warnings), without np.errstate's cost: 2.6 us a use,
    against 0.8 for errors_off and errors_back together. Returns what `errors_back` needs
    to restore the caller's state."""
    if _error_state is None:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state
    now = _error_state.get()
    quiet = _QUIET.get(now)     # (the caller's state: its buffer size and callback kept)
    if quiet is None:
        with np.errstate(all="ignore"):
            quiet = remember(_QUIET, now, _error_state.get(), 64)
    return _error_state.set(quiet)


def errors_back(token: Any) -> None:
    if _error_state is None:
        token.__exit__(None, None, None)
    else:
        _error_state.reset(token)


def _fast_fn(e: Any) -> Callable | None:
    """A numpy function computing `e` exactly as its reference does, or None."""
    op, p = e.op, e.params
    out = e.outvars[0].aval
    in_dtypes = {a.aval.dtype for a in e.inputs}
    same = in_dtypes == {out.dtype} or (op in ("lt", "le", "gt", "ge", "eq", "ne", "and",
                                               "or") and len(in_dtypes) == 1)
    if op == "not" and out.dtype != np.bool_:
        return None
    if op in _UFUNC and same and (op not in ("neg", "abs", "sign") or out.dtype != np.bool_):
        return _UFUNC[op]
    if op in _FLOAT_ONLY and same and out.dtype.kind == "f":
        return _FLOAT_ONLY[op]
    if op in _REDUCE and same and out.dtype.kind == "f":
        fn, axes = _REDUCE[op], tuple(p["axes"])
        return lambda x: fn(x, axis=axes)
    if op == "matmul" and same:
        a, b = e.inputs[0].aval.shape, e.inputs[1].aval.shape
        if len(a) == 2 and len(b) == 2 and a[1] == 1:
            return _outer
        if len(a) == 2 and len(b) == 2 and out.dtype.kind == "f":
            return _dot
        return np.matmul
    if op == "reshape":
        shape = tuple(p["shape"])
        return lambda x: x.reshape(shape)
    if op == "transpose":
        perm = tuple(p["perm"])
        return _flip if perm == (1, 0) else lambda x: x.transpose(perm)
    if op == "broadcast":   # contiguous, as the reference (a reduction of a stride-0 view
        shape = tuple(p["shape"])     # sums in another order)
        return lambda x: _broadcast(x, shape)
    if op == "slice":
        return _slicer(np_index(p["index"]))
    if op == "update_slice" and same:
        return _updater(np_index(p["index"]))
    if op == "concatenate" and same:
        return concatenation(p["axis"])
    if op == "select" and len({a.aval.dtype for a in e.inputs[1:]} | {out.dtype}) == 1:
        return where
    if op == "convert":
        dt = np.dtype(p["dtype"])
        if e.inputs[0].aval.dtype.kind == "f" and dt.kind in "iu":
            return lambda x: convert_value(x, dt)
        return lambda x: x.astype(dt)
    if op == "stop_gradient":
        return lambda x: x
    return None


def _generic_fn(e: Any) -> Callable:
    opdef, params = OPS[e.op], e.params
    avals = [(v.aval.dtype, v.aval.shape) for v in e.outvars]
    if opdef.multi_out:
        def run(*ins):
            return tuple(np.asarray(o, dtype=d).reshape(s)
                         for o, (d, s) in zip(opdef.ref(*ins, **params), avals))
        return run
    ((dt, shape),) = avals
    return lambda *ins: np.asarray(opdef.ref(*ins, **params), dtype=dt).reshape(shape)


def _scalar_result(fn: Callable) -> Callable:
    """numpy hands back scalars for 0-d results; keep every value an array."""
    return lambda *ins: np.asarray(fn(*ins))


def _live(graph: Graph) -> list:
    """The equations some output needs (graphs interpreted unoptimised may carry dead ones)."""
    used = {a.id for a in graph.outvars if type(a) is not Lit}
    add = used.add
    live = []
    for e in reversed(graph.eqns):
        outs = e.outvars
        if outs and (outs[0].id in used or (len(outs) > 1 and any(v.id in used for v in outs))):
            live.append(e)
            for a in e.inputs:
                if type(a) is not Lit:
                    add(a.id)
    if len(live) == len(graph.eqns):
        return graph.eqns
    live.reverse()
    return live


_FNS: dict[Any, Callable] = {}   # (op, params, input and output types) -> step function


def _step_fn(e: Any, multi: bool) -> Callable:
    """The function running `e` in a Program; equations of one signature share it."""
    params = e.params
    try:    # params as given; equal dicts listed in another order only miss
        key = (e.op, tuple(params.items()) if params else (), *[a.aval for a in e.inputs], None,
               *[v.aval for v in e.outvars])
        fn = _FNS.get(key)
    except TypeError:
        try:
            key = (e.op, ("frozen", _frozen_params(params)), *[a.aval for a in e.inputs], None,
                   *[v.aval for v in e.outvars])
            fn = _FNS.get(key)
        except TypeError:   # params that cannot be hashed
            key = fn = None
    if fn is not None:
        return fn
    fn = None if multi else _fast_fn(e)
    if fn is None:
        fn = _generic_fn(e)
    elif not e.outvars[0].aval.shape:
        fn = _scalar_result(fn)
    return fn if key is None else remember(_FNS, key, fn)


def shapeless(e: Any) -> bool:
    """Whether the step a Program makes for `e` is the same for operands of any shapes (its
    params and dtypes as they are): what `_fast_fn` picks depends on the shapes only for a
    matmul; scans, constants and the reference's own loop (`_generic_fn`) are made for their
    types."""
    return not OPS[e.op].multi_out and e.op not in ("matmul", "scan") and \
        e.op not in _CREATE and _fast_fn(e) is not None


def restep(e: Any, fn: Callable, params: dict, in_shapes: list | None) -> Callable | None:
    """The function a Program would pick for equation `e` (whose step function is `fn`)
    given other `params` and operand shapes (read for a matmul only), where that needs no
    equation: a reshape or a slice (made from their params) and a 2-d matmul of one dtype
    (_fast_fn's choice); else None (ir.template makes the rest from stand-in equations)."""
    op = e.op
    if op == "reshape" and e.outvars[0].aval.shape:
        shape = tuple(params["shape"])
        return lambda x: x.reshape(shape)
    if op == "slice" and e.outvars[0].aval.shape:
        return _slicer(np_index(params["index"]))
    if op == "matmul" and (fn is _dot or fn is _outer) and len(in_shapes[0]) == 2 and \
            len(in_shapes[1]) == 2:     # (one dtype throughout: _fast_fn picked these)
        if in_shapes[0][1] == 1:
            return _outer
        return _dot if e.outvars[0].aval.dtype.kind == "f" else None
    return None


class Program:
    """`graph` prepared for repeated interpretation (bit-identical to `interpret`)."""
    __slots__ = ("graph", "init", "steps", "plain", "outs", "in_avals", "n_in", "made",
                 "out_steps", "in_sig")

    def __init__(self, graph: Graph):
        self.graph = graph
        slots: dict[int, int] = {v.id: k for k, v in enumerate(graph.invars)}
        init: list[Any] = [None] * len(graph.invars)
        for v, c in zip(graph.constvars, graph.consts):
            slots[v.id] = len(init)
            init.append(np.asarray(c))
        lits: dict[Any, int] = {}

        def slot_of(a: Any) -> int:
            if type(a) is not Lit:
                return slots[a.id]
            key = a.key()
            k = lits.get(key)
            if k is None:
                k = lits[key] = len(init)
                init.append(a.value)
            return k

        steps: list[tuple] = []
        # id(equation) -> its step's index, or (its slot,) for a constant (for respecialized)
        made: dict[int, Any] = {}
        for e in _live(graph):
            op, outvars = e.op, e.outvars
            if op in _CREATE:
                made[id(e)] = (len(init),)
                slots[outvars[0].id] = len(init)
                init.append(_created(e))
                continue
            made[id(e)] = len(steps)
            ins = tuple([slots[a.id] if type(a) is not Lit else slot_of(a) for a in e.inputs])
            first = len(init)
            init += [None] * len(outvars)
            if len(outvars) == 1 and not OPS[op].multi_out:
                slots[outvars[0].id] = first
                fn = _scan_fn(e) if op == "scan" else _step_fn(e, False)
                steps.append((fn, ins, first, len(ins)))
                continue
            for k, v in enumerate(outvars, first):
                slots[v.id] = k
            fn = _scan_fn(e) if op == "scan" else _step_fn(e, True)
            steps.append((fn, ins, tuple(range(first, len(init))), -1))
        self.init = init
        self.made = made
        self.outs = [slot_of(a) for a in graph.outvars]
        self.plain = steps      # (before in_place: what `renewed` starts from)
        self.steps = steps = in_place(steps, self.outs)
        self.in_avals = [(v.aval.shape, v.aval.dtype) for v in graph.invars]
        self.in_sig = [(np.ndarray, *t) for t in self.in_avals]     # see __call__
        self.n_in = len(graph.invars)
        # per output: the step making it alone (an array of its own: returned as it is when
        # that step's function makes a new array), else -1 (copied)
        by_slot = {out: j for j, (_, _, out, n) in enumerate(steps) if n >= 0}
        self.out_steps = tuple([by_slot.get(k, -1) if self.outs.count(k) == 1 else -1
                                for k in self.outs])

    def respecialized(self, graph: Graph, changed: Sequence[int],
                      literals: Sequence[tuple[int, int]] = ()) -> Program:
        """The Program of `graph`, a graph equal to this one's but for the params and types of
        the equations at positions `changed`, and the literal inputs at (position, input)
        `literals` (see ir.template): those steps are made again, the rest shared. (The new
        Program has no `made`: it cannot be respecialized again.)"""
        if len(graph.eqns) != len(self.graph.eqns) or any(
                e.op != f.op or len(e.inputs) != len(f.inputs)
                for e, f in zip(graph.eqns, self.graph.eqns)):
            raise ValueError("respecialized: the graph is not this Program's with other types")
        eqns = graph.eqns
        return self.renewed(graph, {at: eqns[at] for at in changed},
                            [(at, i, eqns[at].inputs[i].value) for at, i in literals])

    def renewed(self, graph: Graph, changed: dict[int, Any],
                literals: Sequence[tuple[int, int, Any]] = (),
                fns: dict[int, Callable] | None = None) -> Program:
        """`respecialized` with the changed equations given directly: `changed` maps a
        position to an equation standing for the one `graph` has there (its op, params and
        types; its step is made from it), `fns` a position to its step's function made
        already (see `restep`), and `literals` lists (position, input, value). An equation
        whose step holds at any shape (see `shapeless`) and whose params did not change need
        not be listed: `graph` may be written later, or never (ir.template)."""
        if self.made is None:
            raise ValueError("respecialized: this Program was itself respecialized; "
                             "respecialize the one it came from")
        new = object.__new__(Program)
        new.graph = graph
        new.init = init = list(self.init)
        # from the steps before in_place, which runs again on the new ones: a step made
        # again (a slice's view, a copying update) must not undo what it decided, nor leave
        # an update writing into an array a remade view still reads
        new.plain = steps = list(self.plain)
        new.made = None
        new.outs, new.in_avals, new.n_in = self.outs, self.in_avals, self.n_in
        new.in_sig = self.in_sig
        new.out_steps = self.out_steps
        made, old = self.made, self.graph.eqns
        for at, e in changed.items():
            k = made.get(id(old[at]))
            if k is None:       # dead
                continue
            if type(k) is tuple:
                init[k[0]] = _created(e)
                continue
            _, ins, out, n = steps[k]
            fn = _scan_fn(e) if e.op == "scan" else _step_fn(e, n < 0)
            steps[k] = (fn, ins, out, n)
        for at, fn in (fns or {}).items():
            k = made.get(id(old[at]))
            if k is not None:
                _, ins, out, n = steps[k]
                steps[k] = (fn, ins, out, n)
        for at, i, value in literals:      # a slot of its own (equal literals share one)
            k = made.get(id(old[at]))
            if k is None:       # dead
                continue
            assert type(k) is not tuple, "a constant's equation has no literal inputs"
            fn, ins, out, n = steps[k]
            init.append(value)
            steps[k] = (fn, ins[:i] + (len(init) - 1,) + ins[i + 1:], out, n)
        new.steps = in_place(steps, new.outs)
        return new

    def __call__(self, args: Sequence[Any]) -> list[np.ndarray]:
        env = list(self.init)
        try:    # the common case, checked in C: arrays of the types expected
            same = list(map(_signature, args)) == self.in_sig
        except AttributeError:      # (a Python number)
            same = False
        if same:
            env[:self.n_in] = args
        else:
            if len(args) != self.n_in:
                raise TypeError(f"graph takes {self.n_in} inputs, got {len(args)}")
            for k, (a, (shape, dtype)) in enumerate(zip(args, self.in_avals)):
                arr = a if type(a) is np.ndarray else np.asarray(a)
                if arr.shape != shape or arr.dtype != dtype:
                    raise TypeError(f"input expects {self.graph.invars[k].aval}, got "
                                    f"{arr.dtype}{list(arr.shape)}")
                env[k] = arr
        token = errors_off()
        try:
            for fn, ins, out, n in self.steps:
                if n == 1:
                    env[out] = fn(env[ins[0]])
                elif n == 2:
                    env[out] = fn(env[ins[0]], env[ins[1]])
                elif n >= 0:
                    env[out] = fn(*[env[i] for i in ins])
                else:
                    for k, o in zip(out, fn(*[env[i] for i in ins])):
                        env[k] = o
        finally:
            errors_back(token)
        steps = self.steps
        return [env[k] if j >= 0 and makes_new(steps[j][0]) else np.array(env[k])
                for k, j in zip(self.outs, self.out_steps)]


# an argument's (type, shape, dtype), as Program.__call__ compares them to its inputs' (an
# attrgetter: no Python frame per argument)
_signature = operator.attrgetter("__class__", "shape", "dtype")

# step functions that always return a new array (their outputs need no copy when returned);
# `concatenation` adds its functions
_FRESH = {*_UFUNC.values(), *_FLOAT_ONLY.values(), np.matmul, _dot, _outer}
_CONCATENATIONS: dict[int, Callable] = {}   # axis -> step function


def makes_new(fn: Callable) -> bool:
    """Whether step function `fn` always returns a new array: one of _FRESH's, or a copying
    update_slice step (made per index, so marked rather than kept in _FRESH)."""
    return fn in _FRESH or getattr(fn, "fresh", False)


def concatenation(axis: int) -> Callable:
    """The step concatenating its operands (of one dtype) along `axis`."""
    fn = _CONCATENATIONS.get(axis)
    if fn is None:
        fn = _CONCATENATIONS.setdefault(axis, lambda *xs: concatenate(xs, axis))
        _FRESH.add(fn)
    return fn


def contiguity(steps: Sequence[tuple], known: list) -> tuple[list, set]:
    """Which `_dot`s of a scan body's Program `steps` may be `_ndot`: those whose operands are
    contiguous (C or Fortran order) whenever some inputs are. `known` holds per slot -1 if it
    always holds a contiguous array, an input's slot if it does when that input does, else
    None; given for the inputs and constants, it is filled in for the steps' results: those of
    functions making new arrays (a new 2-d array is one or the other, and only 2-d `_dot`
    operands are asked about) and 2-d transposes of known ones. Returns (the `_dot`s' step
    indices, the inputs they rest on, -1 included)."""
    fresh = _FRESH
    dots, needs = [], set()
    for j, (fn, ins, out, _) in enumerate(steps):
        if fn in fresh:         # (multi-output steps' functions are not)
            if fn is _dot:
                a, b = known[ins[0]], known[ins[1]]
                if a is not None and b is not None:
                    dots.append(j)
                    needs.add(a)
                    needs.add(b)
            known[out] = -1
        elif fn is _flip:
            known[out] = known[ins[0]]
    return dots, needs


def _known(n_slots: int, inputs: Iterable[int], consts: Iterable[tuple[int, Any]]) -> list:
    """`contiguity`'s `known` before the steps: the slots `inputs` rest on themselves, the
    (slot, value) `consts` that are contiguous are."""
    known: list = [None] * n_slots
    for k in inputs:
        known[k] = k
    for k, v in consts:
        if type(v) is np.ndarray and v.flags.forc:
            known[k] = -1
    return known


def _created(e: Any) -> np.ndarray:
    """The value of a `full` or `iota` equation."""
    out = e.outvars[0].aval
    return np.asarray(OPS[e.op].ref(**e.params), out.dtype).reshape(out.shape)


def _scan_fn(e: Any) -> Callable:
    """A step running a scan as a loop over its body's Program (built once per body). The
    loop is written as Python source, the body's slots as local variables (a list of slots
    costs an index per read and write, several per op), and compiled once per body and
    layout; the ys are collected per step and stacked at the end."""
    p = e.params
    key = (id(p["body"]), p["n_consts"], p["n_carry"], bool(p.get("reverse")))
    hit = _LOOPS.get(key)
    if hit is None or hit[0] is not p["body"]:
        hit = remember(_LOOPS, key, (p["body"], _loop_source(e)), 1024)
    make = hit[1]
    return make(p["length"], [(v.aval.shape, v.aval.dtype) for v in e.outvars[p["n_carry"]:]])


_LOOPS: dict[Any, tuple] = {}


def _loop_source(e: Any) -> Callable:
    """(length, the ys' types) -> the function running scan `e`'s loop. Per call, not per
    step: the body's 2-d matmuls call ndarray.dot where their operands are known contiguous
    once the loop's inputs are (`_loop_dots`; checked on entry, else `_dot` runs); the xs
    are iterated, not indexed; and a carry whose values before and after each step are both
    ys (scan_vjp's residuals) is collected once, c_0 .. c_T, stacked once, and sliced."""
    p = e.params
    prog = program(p["body"])
    n_c, n_k, n_in = p["n_consts"], p["n_carry"], prog.n_in
    rev = bool(p.get("reverse"))
    x_avals = p["body"].in_avals[n_c + n_k:]
    read = {i for step in prog.steps for i in step[1]} | set(prog.outs)
    names = {k: f"s{k}" for k in range(len(prog.init))}
    ns: dict[str, Any] = {"_stack": _stack, "_dot": _dot, "_ndot": _ndot}
    for k in range(n_in, len(prog.init)):       # the body's constants and literals
        ns[names[k]] = prog.init[k]
    carry_outs, y_outs = prog.outs[:n_k], prog.outs[n_k:]
    pairs = _carry_ys(n_c, carry_outs, y_outs)
    paired = {j for pair in pairs.values() for j in pair}
    fast, needs = _loop_dots(prog, n_c, n_k)
    ins = [names[k] for k in range(n_c + n_k)] + [f"x{k}" for k in range(n_c + n_k, n_in)]
    lines = [f"def run({', '.join(ins)}):"]
    dot = "_ndot"
    if fast and needs:
        dot = "_d"
        lines.append("    _d = _ndot if " + " and ".join(
            f"x{k}.flags.c_contiguous" if k >= n_c + n_k else f"{names[k]}.flags.forc"
            for k in needs) + " else _dot")
    lines += [f"    y{j} = []" for j in range(len(y_outs)) if j not in paired]
    lines += [f"    c{c} = [{names[n_c + c]}]" for c in pairs]
    xs = [k for k in range(n_c + n_k, n_in) if k in read]
    if xs and all(x_avals[k - n_c - n_k].shape for k in xs):
        seqs = [f"x{k}[::-1]" if rev else f"x{k}" for k in xs]
        lines.append(f"    for {', '.join(names[k] for k in xs)} in "
                     f"{seqs[0] if len(xs) == 1 else 'zip(' + ', '.join(seqs) + ')'}:")
    else:   # 0-d xs: x[t, ...] is an array, x[t] a numpy scalar
        lines.append("    for t in _order:")
        lines += [f"        {names[k]} = x{k}[t{'' if x_avals[k - n_c - n_k].shape else ', ...'}]"
                  for k in xs]
    for i, (fn, s_ins, out, m) in enumerate(prog.steps):
        ns[f"f{i}"] = fn
        args = ", ".join(names[k] for k in s_ins)
        outs = names[out] if m >= 0 else "".join(f"{names[k]}, " for k in out)
        lines.append(f"        {outs} = {dot if i in fast else f'f{i}'}({args})")
    lines += [f"        y{j}.append({names[k]})" for j, k in enumerate(y_outs) if j not in paired]
    lines += [f"        c{c}.append({names[carry_outs[c]]})" for c in pairs]
    if n_k:
        lines.append(f"        {''.join(names[k] + ', ' for k in range(n_c, n_c + n_k))}= "
                     f"{''.join(names[k] + ', ' for k in carry_outs)}")
    if rev:
        lines += [f"    y{j}.reverse()" for j in range(len(y_outs)) if j not in paired]
        lines += [f"    c{c}.reverse()" for c in pairs]
    lines += [f"    c{c} = _stack(c{c}, _cs[{i}])" for i, c in enumerate(pairs)]
    ys = {j: f"_stack(y{j}, _ys[{j}])" for j in range(len(y_outs)) if j not in paired}
    for c, (before, after) in pairs.items():  # reversed: [c_T .. c_0]
        ys[before], ys[after] = (f"c{c}[1:]", f"c{c}[:-1]") if rev else \
            (f"c{c}[:-1]", f"c{c}[1:]")
    lines.append("    return (" + "".join(names[k] + ", " for k in range(n_c, n_c + n_k))
                 + "".join(ys[j] + ", " for j in range(len(y_outs))) + ")")
    source = "def make(_order, _ys, _cs):\n" + "\n".join("    " + line for line in lines) + \
        "\n    return run"
    exec(compile(source, "<scan loop>", "exec"), ns)   # noqa: S102 - our own source
    factory = ns["make"]
    afters = [after for _, after in pairs.values()]

    def make(length: int, y_avals: list) -> Callable:
        c_avals = [((length + 1, *y_avals[j][0][1:]), y_avals[j][1]) for j in afters]
        return factory(range(length - 1, -1, -1) if rev else range(length), y_avals, c_avals)
    return make


def _carry_ys(n_c: int, carry_outs: list, y_outs: list) -> dict[int, tuple[int, int]]:
    """carry -> (y, y) of a scan body's ys that are that carry before and after the step."""
    pairs: dict[int, tuple[int, int]] = {}
    taken: set = set()
    for c, out in enumerate(carry_outs):
        before = n_c + c
        if out != before and before in y_outs and out in y_outs:
            j, j2 = y_outs.index(before), y_outs.index(out)
            if j not in taken and j2 not in taken:
                pairs[c] = (j, j2)
                taken |= {j, j2}
    return pairs


def _loop_dots(prog: Program, n_c: int, n_k: int) -> tuple[set, list]:
    """The steps of a scan body whose `_dot` may be `_ndot` (see `contiguity`), and the body
    inputs that rests on: consts and initial carries (contiguous), xs (C-contiguous, so that
    each x[t] is). A carry is known contiguous only if its new value is too, and what that
    rests on is needed as well."""
    carries = range(n_c, n_c + n_k)
    inputs = set(range(prog.n_in))
    consts = [(k, v) for k, v in enumerate(prog.init) if v is not None]
    while True:
        known = _known(len(prog.init), inputs, consts)
        dots, needs = contiguity(prog.steps, known)
        lost = {k for k in carries if k in inputs and known[prog.outs[k - n_c]] is None}
        if not lost:
            break
        inputs -= lost
    todo = [k for k in needs if k in carries]
    while todo:         # a carry's later values: what its new value rests on
        more = known[prog.outs[todo.pop() - n_c]]
        if more not in needs:
            needs.add(more)
            todo += [more] if more in carries else []
    needs.discard(-1)
    return set(dots), sorted(needs)


def _stack(parts: list, aval: tuple) -> np.ndarray:
    """The per-step values `parts` as one array of type `aval` (shape, dtype)."""
    shape, dtype = aval
    if len(shape) > 1:     # pieces of one shape, one after the other: as np.stack lays them
        out = concatenate(parts).reshape(shape)
        # (astype(copy=False) of the dtype it has returns it, at a call's cost: asked first)
        return out if out.dtype == dtype else out.astype(dtype)
    return np.array(parts, dtype)


def program(graph: Graph) -> Program:
    """The graph's Program, built on first use and kept on the graph."""
    prog = graph.__dict__.get("_program")
    if prog is None:
        prog = graph.__dict__["_program"] = Program(graph)
    return prog

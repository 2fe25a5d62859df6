"""Running recorded Tensor IR: walking the Node graph into one IR graph, recognising graphs
seen before by their nodes' signatures (so a training step's graph is built once and then
costs a walk, a dictionary lookup and one call; its backward, one pass over the nodes
recorded since the last backward, see tape_walk), realising pending values, and the
one-graph backward pass used when no hook needs to see intermediate gradients (its graph is
composed from per-op backward templates, see autograd_compose)."""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable

import numpy as np

from .. import ir
from ..ir.core import Var
from . import autograd_template
from .autograd_compose import NoTemplate, Plan, compose, compose_graph
from .autograd_template import NEW as _NEW, NEW_OWN as _NEW_OWN, NEW_WRT as _NEW_WRT
from .autograd_graph import (AccumulateGrad, Inplace, Node, check_saved, grad_edges, plain_extras,
                             rename_input)
from ..config import config
from . import executor
from .executor import collector_paused, compile_graph
from .grad_mode import mode, prune_tape

CACHE_SIZE = 512
# Roughly what compiling costs per equation (cold); interpretation time is weighed against it.
COMPILE_SECONDS_PER_EQN = 1e-3


class Bail(Exception):
    """The graph needs the general, node-by-node engine."""


class Walk:
    """A post-order walk of nodes from some roots: the nodes, the graph inputs they read (with
    where gradients go, for a backward walk), and a structural key (None if some node has no
    signature)."""
    __slots__ = ("order", "index", "in_vars", "in_vals", "in_gsrc", "key", "leafs", "slots",
                 "reaching", "forced", "force", "pending")

    def __init__(self) -> None:
        self.order: list[Node] = []
        self.index: dict[int, int] = {}
        self.in_vars: list[Var] = []
        self.in_vals: list[Any] = []
        self.in_gsrc: list[Any] = []
        self.slots: dict[Any, int] = {}     # var id (or var id, leaf: see _own_slot) -> slot
        self.key: list | None = []
        self.leafs: list[Node] = []
        self.reaching: set[int] = set()
        self.forced = False     # some node is walked for its internal values
        self.force: dict | None = None
        self.pending: list = []

    def _input(self, var: Var, val: Any, gsrc: Any) -> int:
        k = self.slots.get(var.id)
        if k is not None and gsrc is not None and self.in_gsrc[k] is None:
            raise Bail      # read without a gradient first, now with one: node by node
        if k is None:
            k = self.slots[var.id] = len(self.in_vars)
            self.in_vars.append(var)
            self.in_vals.append(val)
            self.in_gsrc.append(gsrc)
            if gsrc is not None:
                self.reaching.add(var.id)
        return k


def _drop_unreached(w: Walk, roots: list[Node]) -> None:
    """Read as plain inputs the leaves of a walk that no gradient edge reaches: the general
    walk goes into a pending value's node whatever reads it, and a leaf read only by what
    has no gradient (a comparison's operands: `where(a @ w > 0, a, 0)`'s w) would get a
    zero .grad, where torch leaves it None (its optimizers then skip it)."""
    in_gsrc = w.in_gsrc
    if all(g is None for g in in_gsrc):
        return
    reached = grad_edges(roots)[1]
    for k, g in enumerate(in_gsrc):
        if g is not None and id(g) not in reached:
            in_gsrc[k] = None


def _cached(node: Node, var: Var) -> Any:
    vals = node.values
    return None if vals is None else vals.get(var.id)


def _source(entry: tuple, grad: bool, force: dict) -> tuple[Any, Node | None]:
    """(known value or None, node to walk into or None) for one entry of a node."""
    var, gsrc, vsrc = entry
    if grad:
        if isinstance(gsrc, Node):
            return None, gsrc
        if isinstance(gsrc, AccumulateGrad):    # leaves are inputs, even pending ones
            if isinstance(vsrc, np.ndarray):
                return vsrc, None
            return _cached(vsrc, var), None
    if var is None:
        return None, vsrc
    if force:
        forced = force.get(var.id)
        if forced is not None:
            return None, forced
    if isinstance(vsrc, np.ndarray):
        return vsrc, None
    val = _cached(vsrc, var)
    return (val, None) if val is not None else (None, vsrc)


def _out_index(node: Node, var: Var | None) -> int:
    if var is None:
        return -1
    for i, v in enumerate(node.out_vars):
        if v is var:
            return i
    return -2


def walk(roots: list[Node], grad: bool, force: dict | None = None) -> Walk:
    """Walk the nodes computing `roots`. With `grad`, follow gradient edges too and raise
    Bail where the one-graph backward would not match the node-by-node semantics. Known
    values are read as inputs, except those of `force` (var id -> node recomputing it)."""
    w = Walk()
    w.force = force
    state: dict[int, bool] = {}
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, done = stack.pop()
        if done:
            _finish(w, n, grad, force)
            continue
        if id(n) in state:
            continue
        state[id(n)] = True
        stack.append((n, True))
        if grad:
            _check_plain(n)
        for entry in reversed(n.args):
            if entry[0] is None:
                w.forced = True
            val, sub = _source(entry, grad, force)
            if sub is not None:
                if id(sub) not in state:
                    stack.append((sub, False))
            elif grad and isinstance(entry[1], AccumulateGrad):
                _check_leaf(entry[1])
    return w


def _finish(w: Walk, n: Node, grad: bool, force: dict) -> None:
    refs = []
    for entry in n.args:
        var, gsrc, vsrc = entry
        val, sub = _source(entry, grad, force)
        if sub is None:
            if val is None:     # a leaf whose in-place update is pending
                w.pending.append((var, vsrc))
            k = w.slots.get(var.id)
            if grad and k is not None and gsrc is not None and w.in_gsrc[k] is not None \
                    and w.in_gsrc[k] is not gsrc:
                k = _own_slot(w, n, var, gsrc, val)
                if k is None:
                    raise Bail
                k &= _WRT - 1
            else:
                k = w._input(var, val, gsrc if grad else None)
            refs.append(k)
            if grad and gsrc is None and var.id in w.reaching:
                raise Bail
        else:
            pos = _out_index(sub, var)
            if grad and (pos < 0 or not sub.grad and isinstance(gsrc, Node)):
                raise Bail
            refs.append((w.index[id(sub)], pos))
            if grad and gsrc is None and var.id in w.reaching:
                raise Bail    # a no-grad use of a differentiable value
    if n.leaf_chain:
        w.leafs.append(n)
    w.index[id(n)] = len(w.order)
    w.order.append(n)
    if grad and n.grad:
        w.reaching.update(v.id for v in n.out_vars)
    if w.key is not None:
        if n.sig is None:
            w.key = None
        else:
            w.key.append((n.sig, tuple(refs)))


def _check_plain(n: Node) -> None:
    if n.tensor_hooks or n.retains or n.pre_hooks or n.post_hooks or n.fn_ctx is not None \
            and not isinstance(n.fn_ctx, dict):
        raise Bail
    if n.grad and not n.has_eqns():
        raise Bail
    for s in n.saved or ():
        if s.unpack is not None:
            raise Bail


def _check_leaf(acc: AccumulateGrad) -> None:
    if _hooked_leaf(acc):
        raise Bail


def _hooked_leaf(acc: AccumulateGrad) -> bool:
    """Whether a hook watches the gradient accumulated into `acc`'s leaf (the one-graph walks
    that run on every backward spell this out inline)."""
    return bool(acc.post_hooks or acc.pre_hooks or acc.variable._get("hooks"))


class CachedGraph:
    """A graph to run. With `config.tiering` it runs on the interpreter until the time spent
    interpreting it approaches what compiling would cost, then compiles in a background
    thread and switches to native code when that is ready — so a program whose graph keeps
    changing never waits on the compiler, and a hot one ends up native. An unoptimised graph
    (`optimized=False`) is interpreted as it is and optimised only when it is compiled: for a
    graph seen a few times, optimising costs more than it saves. A composed backward comes as
    a Plan (see autograd_compose), interpreted as it is; its IR is written when compiled."""
    __slots__ = ("_graph", "plan", "spent", "fn", "extra", "future", "optimized")

    def __init__(self, graph: ir.Graph | None, extra: Any = None, optimized: bool = True,
                 plan: Plan | None = None):
        self._graph = graph
        self.plan = plan
        self.spent = 0.0
        self.fn = None
        self.extra = extra
        self.future = None
        self.optimized = optimized

    @property
    def graph(self) -> ir.Graph:
        if self._graph is None:
            self._graph = self.plan.graph()
        return self._graph

    def __call__(self, args: list) -> list:
        fn = self.fn
        if fn is not None:
            return fn(args)
        if not config.tiering or not has_backend():
            self.fn = self._compile()
            return self.fn(args)
        if self.future is not None:
            if self.future.done():
                self.fn = self.future.result()
                return self.fn(args)
            return self._interpret(args)
        t0 = time.perf_counter()
        out = self._interpret(args)
        self.spent += time.perf_counter() - t0
        n = len(self.plan.steps) if self.plan is not None else len(self.graph.eqns)
        if self.spent > COMPILE_SECONDS_PER_EQN * n:
            with _compiling_lock:
                _compiling[0] += 1
            try:
                self.future = _compiler().submit(_in_background, self._compile)
            except BaseException:       # (a pool shut down at exit: it never runs)
                with _compiling_lock:
                    _compiling[0] -= 1
                raise
        return out

    def _interpret(self, args: list) -> list:
        one_thread = executor._backend.get("one_blas_thread") if _compiling[0] else None
        if one_thread is None:
            return self._interpret_now(args)
        # A compile in the background takes a core: numpy's matmuls here keep to one thread
        # meanwhile (two would share the other core with it, each waiting on the other: an
        # MLP step in Tensors stalled 115-132 ms while its graph compiled, 28-40 so)
        with one_thread:
            return self._interpret_now(args)

    def _interpret_now(self, args: list) -> list:
        plan = self.plan
        if plan is not None and not config.debug_nans and executor._reference.eqn_hook is None:
            return plan(args)
        return execute_interpreted(self.graph, args)

    def _compile(self) -> Any:
        return compile_graph(self.graph if self.optimized else ir.optimize(self.graph))


_pool: list = []


def has_backend() -> bool:
    return "compile" in executor._backend and not config.disable_jit


def execute_interpreted(graph: ir.Graph, args: list) -> list:
    return executor._interpret(graph, args)


_compiling = [0]     # compiles submitted to _compiler and not finished (see _interpret)
_compiling_lock = threading.Lock()


def _in_background(compile_fn: Callable) -> Any:
    try:
        return compile_fn()
    finally:
        with _compiling_lock:
            _compiling[0] -= 1


def _compiler() -> Any:
    if not _pool:
        from concurrent.futures import ThreadPoolExecutor
        _pool.append(ThreadPoolExecutor(1, thread_name_prefix="tracegrad-compile"))
    return _pool[0]


class _LRU:
    """A dict of at most `size` entries, the least recently used dropped first. A hit stamps
    its entry with a clock rather than moving it to the end (OrderedDict.move_to_end hashes
    and compares the key again: a tape's key is a tuple of hundreds of ints); a put past
    `size` looks for the oldest stamp."""

    def __init__(self, size: int):
        self.size = size
        self.items: dict = {}       # key -> [value, stamp]
        self.clock = 0

    def get(self, key: Any) -> Any:
        entry = self.items.get(key)
        if entry is None:
            return None
        self.clock = entry[1] = self.clock + 1    # (a race only misorders two stamps)
        return entry[0]

    def put(self, key: Any, value: Any) -> None:
        self.clock += 1
        self.items[key] = [value, self.clock]
        if len(self.items) > self.size:
            entries = list(self.items.items())      # (atomic: another thread may put)
            oldest = min(entries, key=_stamp)[0]
            self.items.pop(oldest, None)

    def values(self) -> list:
        return [entry[0] for entry in list(self.items.values())]


def _stamp(item: tuple) -> int:
    return item[1][1]


REALIZE_PRUNE = 32     # tape length from which reading a value prunes it (see realize)
_value_graphs = _LRU(CACHE_SIZE)
_grad_graphs = _LRU(CACHE_SIZE)


# ---- realising values -------------------------------------------------------------------------

def realize(tensors: list) -> None:
    """Compute the values of pending tensors together, in one graph. A value asked for is
    also when graphs recorded and dropped since (an evaluation with grad on reading its
    loss) stop being held by the tape: they hold their inputs' arrays."""
    st = mode.state
    if len(st.tape) > REALIZE_PRUNE:
        prune_tape(st)
    targets, seen = [], set()
    for t in tensors:
        if t._value is None and t._var.id not in seen:
            val = _cached(t._node, t._var)
            if val is not None:
                t._value = val
                continue
            seen.add(t._var.id)
            targets.append((t._var, t._node))
    if targets:
        realize_vars(targets)
    for t in tensors:
        if t._value is None:
            t._value = t._node.values[t._var.id]


def realize_vars(targets: list[tuple[Var, Node]]) -> None:
    """Compute `var`s of `node`s, caching the values in the nodes."""
    roots = [n for _, n in targets]
    w = walk(roots, grad=False)
    while w.forced:    # a node recomputed for its internals may also produce an input:
        made = {v.id: n for n in w.order for e in n.eqns for v in e.outvars}
        clash = {v.id: made[v.id] for v in w.in_vars if v.id in made}
        if not clash:     # then read it from that node, so it is ordered first
            break
        w = walk(roots, grad=False, force=clash if w.force is None else {**w.force, **clash})
    asked = {v.id for v, _ in targets}     # (a target's node may be a leaf too: an output
    extra = [(v, n) for n in w.leafs for v in n.out_vars if v.id not in asked]   # once)
    outs = targets + extra
    key = None
    if w.key is not None:
        key = (tuple(w.key), tuple((w.index[id(n)], _out_index(n, v)) for v, n in outs))
    entry = _value_graphs.get(key) if key is not None else None
    if entry is None:
        eqns = [e for n in w.order for e in n.eqns]
        graph = ir.optimize(ir.Graph(w.in_vars, eqns, [v for v, _ in outs]))
        entry = CachedGraph(graph)
        if key is not None:
            _value_graphs.put(key, entry)
    vals = entry(w.in_vals)
    for (v, n), val in zip(outs, vals, strict=True):
        if n.values is None:
            n.values = {}
        n.values[v.id] = val
    for n in w.leafs:     # (a node a leaf's value is pending on may also be in a graph: a
        if not n.grad:    # detached alias written through, d.add_(x); it keeps its history)
            release(n)
    for _, n in targets:
        if not n.grad:
            release(n)


def release(node: Node) -> None:
    """Forget how a no-grad node's values were computed once they are all known."""
    vals = node.values
    if vals is not None and all(v.id in vals for v in node.out_vars):
        node.eqns = []
        node.args = []
        node.leaf_chain = 0
        node.sig = None


# ---- the one-graph backward ----------------------------------------------------------------------

def fast_backward(roots: list, grads: list, retain: bool, collect: dict | None = None,
                  accept: Any = None) -> bool:
    """`backward()` as one graph — forward and backward of everything from the leaves to the
    roots — when no hook, retain_grad, Function or unpack hook needs a node-by-node walk.
    `grads`: the roots' cotangents, as arrays. `collect`: the leaves' gradients go there
    (id(leaf) -> array; `autograd.grad`), not into `.grad`; `accept(in_gsrc)`: whether to
    go on, asked once the graph's leaves are known, before anything runs. Returns False
    (having changed nothing) when the graph needs the general engine."""
    fns = [t._fn for t in roots]
    for n in fns:
        if type(n) is not Node:
            return False
    tape = mode.state.tape
    found = tape_walk(tape, roots[0]) if len(roots) == 1 else None
    if found is not None:
        known = _tape_plans.get(found)
        if known is None:
            known = _from_template(found, tape, roots[0])
        if known is not None:
            ins = _tape_inputs(tape, known)
            if ins is None and _realize_pending_leaves(tape, known):
                ins = _tape_inputs(tape, known)
            if ins is not None:
                if accept is not None and not accept(ins[1]):
                    return False
                _run_backward(known[0], roots, grads, ins[0], ins[1], ins[2], retain, collect)
                return True
    try:
        w = grad_walk(fns)
        if w is None:
            found = None
            w = walk(fns, grad=True)
            if w.pending:   # compute pending leaf values (optimizer updates) first
                realize_vars(w.pending)
                w = walk(fns, grad=True)
            if w.forced:
                return False
            for n in w.order:
                if n.grad:
                    check_saved(n)
            _drop_unreached(w, fns)
            if w.key is not None:
                w.key.append(tuple([g is not None for g in w.in_gsrc]))
    except Bail:
        return False
    if accept is not None and not accept(w.in_gsrc):
        return False
    key = w.key
    if key is not None:
        index = w.index
        for t in roots:
            n = t._fn
            pos = 0 if n.out_vars[0] is t._var else _out_index(n, t._var)
            key.append(-1 - (index[id(n)] << 16 | pos))
        key = tuple(key)
        entry = _grad_graphs.get(key)
    else:
        entry = None
    if entry is None:
        entry = _backward_graph(w, roots)
        if key is not None:
            _grad_graphs.put(key, entry)
    if found is not None and key is not None:
        recipe = _tape_recipe(tape, w, entry)
        _tape_plans.put(found, recipe)
        autograd_template.learn(found, tape, roots[0], recipe)
    _run_backward(entry, roots, grads, w.in_vals, w.in_gsrc, w.order, retain, collect)
    return True


def _run_backward(entry: CachedGraph, roots: list, grads: list, in_vals: list, in_gsrc: list,
                  order: list, retain: bool, collect: dict | None = None) -> None:
    """Run a backward plan and hand out its results: the roots' values, the leaves' grads;
    free the graph unless retained."""
    vals = entry(in_vals + grads)
    for t, v in zip(roots, vals, strict=False):
        n = t._fn
        if n.values is None:
            n.values = {t._var.id: v}
        else:
            n.values[t._var.id] = v
        t._value = v
    if Tensor is None:
        _bind_tensor()
    leaves = [in_gsrc[slot].variable for slot in entry.extra]
    gs = vals[len(roots):]
    if len(leaves) > 1 and len({id(leaf) for leaf in leaves}) < len(leaves):
        sums: dict[int, list] = {}      # a leaf read through two variables: one sum
        for leaf, g in zip(leaves, gs, strict=True):
            prev = sums.get(id(leaf))
            sums[id(leaf)] = [leaf, g if prev is None else prev[1] + g]
        leaves, gs = [s[0] for s in sums.values()], [s[1] for s in sums.values()]
    hooked = None
    for leaf, g in zip(leaves, gs, strict=True):
        if collect is not None:
            collect[id(leaf)] = g
            continue
        x = leaf._x
        if x is None:
            leaf._x = {"grad": Tensor._leaf(g)}
            continue
        old = x.get("grad")
        if old is None:
            x["grad"] = Tensor._leaf(g)
        else:
            assign_(old, old._val() + g)
        if x.get("post_accumulate"):
            hooked = [leaf] if hooked is None else hooked + [leaf]
    if not retain:      # (nothing was packed: grad_walk and walk leave those to the engine)
        for n in order:     # (all differentiable: grad_walk's, or the tape's)
            n.freed = True
    mode.state.clear_tape()
    if hooked is not None:      # last, as the engine does
        for leaf in hooked:
            leaf._post_accumulate()


# (tape key, root) -> (plan, where each input is found, which nodes the plan covers)
_tape_plans = _LRU(CACHE_SIZE)


def tape_walk(tape: list, root: Any) -> tuple | None:
    """The structural key of the graph on `tape` (this thread's differentiable nodes since
    its last backward, in recording order; see tensor_record) ending at tensor `root`; None if
    the tape cannot vouch for what grad_walk would find. Per node: its signature (which fixes
    its IR and number of inputs), then per input a reference to an earlier node of the tape
    (`its position - this node's`, < 0) or to an input slot: _NEW or _NEW_WRT (if gradients
    flow into it) where a variable is first read, its slot later (slots are numbered in the
    order of first reads, with _WRT if gradients flow); then the root's position less the
    tape's length. One pass in recording order, no search or sort. (The references are
    relative so that the keys of a loop's tapes at two lengths differ only in how many times
    the loop's block repeats: see autograd_template.)

    Two tapes with one key hold graphs that grad_walk finds alike and walks alike (a walk
    follows only nodes of the tape, and recording order is creation order), so a backward
    seen before reuses the plan and reads its inputs from the same entries. The key is
    refused where grad_walk's checks could come out otherwise: a node freed, without a
    signature, with a hook, retained grad or unpack hook; an input from a node not on the
    tape (recorded before it began) or not its first output; a no-grad use of a
    differentiable value; a value read both with and without a gradient; an in-place change
    since the first node (so no saved value changed). Two leaves of one variable get a slot
    each, as grad_walk gives them (_own_slot). Leaf hooks and pending values are checked
    when the inputs are read (_tape_inputs)."""
    if not tape or tape[0].epoch != Inplace.epoch:
        return None
    # Each node of the tape gets `w` = this walk's mark (no other walk's mark or number is
    # equal: they are other bases, plus positions) and `tp` = its position, read only where
    # `w` is the mark: no arithmetic on marks per input. The mark is told by identity (a
    # cheaper test than a comparison of large ints): this int object lives till the walk
    # ends, so no other one is it.
    mark = next(_bases) << 32
    key = []
    append = key.append
    # var id -> (slot, the AccumulateGrad it goes to, or None); (var id, id(leaf)) -> the same
    # for a second leaf of one variable (see below)
    slots: dict[Any, tuple] = {}
    for i, n in enumerate(tape):
        sig = n.sig
        if sig is None or n.freed or n.x is not None and not plain_extras(n.x):
            return None
        n.w = mark
        n.tp = i
        append(sig)
        for var, gsrc, vsrc in n.args:
            if type(gsrc) is Node:
                if gsrc.w is mark and gsrc.out_vars[0] is var:
                    append(gsrc.tp - i)     # (an earlier node: marked before this one)
                    continue
                return None
            if gsrc is None:
                if type(vsrc) is Node and vsrc.grad:
                    return None     # a no-grad use of a differentiable value
            elif type(gsrc) is not AccumulateGrad:
                return None
            seen = slots.get(var.id)
            if seen is None:
                if gsrc is None:
                    slots[var.id] = (len(slots), None)
                    append(_NEW)
                else:
                    slots[var.id] = (len(slots) | _WRT, gsrc)
                    append(_NEW_WRT)
            elif seen[1] is gsrc:
                append(seen[0])
            elif gsrc is not None and seen[1] is not None:
                # a second leaf of this variable (`a.data = b`, a detached alias written
                # through): a slot of its own, as grad_walk gives it (_own_slot)
                own = (var.id, id(gsrc))
                seen = slots.get(own)
                if seen is None:
                    slots[own] = (len(slots) | _WRT, gsrc)
                    append(_NEW_OWN)
                else:
                    append(seen[0])
            else:
                return None     # read with and without a gradient
    n = root._fn
    if n.w is not mark or n.out_vars[0] is not root._var:
        return None
    append(n.tp - len(tape))
    return tuple(key)


_bases = itertools.count(1)     # walks number nodes from base = next(_bases) << 32


def _from_template(key: tuple, tape: list, root: Any) -> tuple | None:
    """The _tape_plans entry for a tape not seen before that a plan template writes (a
    loop's tape at another length: see autograd_template), kept there; else None."""
    made = autograd_template.plan_for(key, tape, root)
    if made is None:
        return None
    plan, wrt, where = made
    known = (CachedGraph(None, wrt, optimized=False, plan=plan), where, None)
    _tape_plans.put(key, known)
    return known


def _tape_recipe(tape: list, w: Walk, entry: CachedGraph) -> tuple:
    """Where a grad walk's inputs and nodes are on the tape, to gather them again from a tape
    with the same key: (plan, per input (node position, entry index), node positions, or
    None for all of the tape, the common case: its nodes, in recording order, are the walk's
    order)."""
    # an input is its variable and where its gradient goes: two leaves of one variable are two
    # inputs, and the tape may hold the other's uses first (a graph dropped, another alive)
    need = {(v.id, id(g)): k for k, (v, g) in enumerate(zip(w.in_vars, w.in_gsrc))}
    slots: list = [None] * len(need)
    for i, n in enumerate(tape):
        for j, e in enumerate(n.args):
            k = need.pop((e[0].id, id(e[1])), None)
            if k is not None:
                slots[k] = (i, j)
        if not need:
            break
    order = None
    if len(w.order) != len(tape):
        at = {id(n): i for i, n in enumerate(tape)}
        order = tuple(at[id(n)] for n in w.order)
    return entry, tuple(slots), order


def _tape_inputs(tape: list, recipe: tuple) -> tuple[list, list, list] | None:
    """(input values, where their gradients go, the nodes) for a tape whose key is known, or
    None where grad_walk would not have taken the one-graph backward: a pending value, a hook
    on a leaf."""
    in_vals = []
    in_gsrc = []
    for i, j in recipe[1]:
        var, gsrc, vsrc = tape[i].args[j]
        if type(vsrc) is Node:
            vals = vsrc.values
            vsrc = None if vals is None else vals.get(var.id)
            if vsrc is None:
                return None
        if gsrc is not None and (gsrc.post_hooks or gsrc.pre_hooks or
                                 gsrc.variable._get("hooks")):
            return None
        in_vals.append(vsrc)
        in_gsrc.append(gsrc)
    order = recipe[2]
    return in_vals, in_gsrc, tape if order is None else [tape[i] for i in order]


def _realize_pending_leaves(tape: list, recipe: tuple) -> bool:
    """For a tape whose key is known: compute the pending values of the leaves it reads (an
    optimizer's in-place updates since the last step, as the general walk does before its
    graph) and return True, so that its inputs can be gathered; False, changing nothing,
    when some other input is pending (the general walk computes that one in its graph)."""
    pending = []
    for i, j in recipe[1]:
        var, gsrc, vsrc = tape[i].args[j]
        if type(vsrc) is Node:
            vals = vsrc.values
            if vals is None or vals.get(var.id) is None:
                if type(gsrc) is not AccumulateGrad:
                    return False
                pending.append((var, vsrc))
    if not pending:
        return False
    realize_vars(pending)
    return True


# In a walk's key, an input's first reference is its slot, with this bit if it needs a gradient.
_WRT = 1 << 48
Tensor: Any = None     # tensor.Tensor and tensor.assign_ (tensor imports this module)
assign_: Any = None


def _bind_tensor() -> None:
    global Tensor, assign_
    from .tensor import Tensor, assign_


def grad_walk(roots: list[Node]) -> Walk | None:
    """`walk(roots, grad=True)` for the common case — every node has a signature, nothing
    is pending or recomputed — in one flat loop: nodes are numbered as they are found
    (breadth first from the roots, marked in their `w` slot with base + number, from a base
    no other walk uses), so the key can be written as they are visited. The nodes are then
    put in recording order (a node's output variables are made after all of its inputs'),
    which the key also records, as the plan depends on it. Returns None when the general
    walk is needed."""
    base = next(_bases) << 32
    top = base + (1 << 32)
    nodes: list[Node] = []
    for r in roots:
        if not base <= r.w < top:
            r.w = base + len(nodes)
            nodes.append(r)
    w = Walk()
    slots = w.slots
    in_vars, in_vals, in_gsrc = w.in_vars, w.in_vals, w.in_gsrc
    key = w.key
    append = key.append
    epoch = Inplace.epoch
    suspects = uses = None
    for n in nodes:     # grows while iterating
        sig = n.sig
        if sig is None or n.x is not None and not plain_extras(n.x):
            return None
        append(sig)
        for var, gsrc, vsrc in n.args:
            if type(gsrc) is Node:
                m = gsrc.w
                if not base <= m < top:
                    m = gsrc.w = base + len(nodes)
                    nodes.append(gsrc)
                outs = gsrc.out_vars
                pos = 0 if outs[0] is var else _out_index(gsrc, var)
                if pos < 0 or not gsrc.grad:
                    raise Bail
                append(-1 - ((m - base) << 16 | pos) if pos < 65536 else (m - base, pos))
                continue
            k = slots.get(var.id)
            if k is None:
                if gsrc is None:
                    if type(vsrc) is Node:
                        if vsrc.grad:   # a no-grad use of a value of this walk? (below)
                            if uses is None:
                                uses = []
                            uses.append(vsrc)
                        vsrc = _cached(vsrc, var)
                        if vsrc is None:
                            return None     # computed without grad: the general walk
                elif type(gsrc) is not AccumulateGrad or gsrc.post_hooks or \
                        gsrc.pre_hooks or gsrc.variable._get("hooks"):
                    return None
                elif type(vsrc) is Node:
                    vsrc = _cached(vsrc, var)
                    if vsrc is None:
                        return None     # a pending leaf value
                k = slots[var.id] = len(in_vars)
                in_vars.append(var)
                in_vals.append(vsrc)
                in_gsrc.append(gsrc)
                append(k if gsrc is None else k | _WRT)
                continue
            if gsrc is not in_gsrc[k]:
                if gsrc is None or in_gsrc[k] is None:
                    raise Bail    # read both with and without a gradient
                k = _own_slot(w, n, var, gsrc, in_vals[k])
                if k is None:
                    return None
            append(k)
        if n.grad and n._saved and (n.freed or n.epoch != epoch):
            if suspects is None:
                suspects = set()
            suspects.add(id(n))
    if uses is not None:
        for v in uses:
            if base <= v.w < top:
                raise Bail    # a no-grad use of a differentiable value
    order = sorted(nodes, key=_first_var_id)
    append(tuple([n.w - base for n in order]))
    if suspects is not None:
        for n in order:
            if id(n) in suspects:
                check_saved(n)      # raises if a saved tensor was freed or changed
    w.order = order
    for r in roots:
        w.index[id(r)] = r.w - base
    return w



def _first_var_id(n: Node) -> int:
    return n.out_vars[0].id


def _own_slot(w: Walk, n: Node, var: Var, acc: Any, val: Any) -> int | None:
    """The input slot of leaf `acc` where node `n` reads `var`, a variable an earlier leaf of
    the walk also reads (`a.data = b`, a detached alias written through): each leaf gets its
    own gradient, so each gets its own slot, its value (`val`) read again as another input,
    and `n` reads it through a variable of its own (renamed in `n`, so that the plan, built
    from the nodes' variables, keeps the two apart; see autograd_graph.rename_input). Returns
    the slot, with _WRT on its first use; None if the leaf needs the general engine."""
    if type(acc) is not AccumulateGrad or _hooked_leaf(acc):
        return None
    key = (var.id, id(acc))
    k = w.slots.get(key)
    first = k is None
    if first:
        k = w.slots[key] = len(w.in_vars)
        w.in_vars.append(Var(var.aval))
        w.in_vals.append(val)
        w.in_gsrc.append(acc)
    if val is not None:     # (a pending value: the walk is made again once it is known)
        rename_input(n, var, acc, w.in_vars[k], val)
    return k | _WRT if first else k


def _backward_graph(w: Walk, roots: list) -> CachedGraph:
    # Composing a plan makes thousands of small objects, most kept: the cyclic collector
    # would run several times meanwhile, scanning them and the graph just recorded (15-40% of
    # a new length's compose; the bench's Tensor pass: -4.5%, 13 interleaved fresh processes)
    with collector_paused():
        try:
            plan, wrt = compose(w.order, w.in_vars, w.in_gsrc, roots)
            return CachedGraph(None, wrt, optimized=False, plan=plan)
        except NoTemplate:
            pass
    graph, wrt = compose_graph(w.order, w.in_vars, w.in_gsrc, roots)
    return CachedGraph(graph, wrt, optimized=False)

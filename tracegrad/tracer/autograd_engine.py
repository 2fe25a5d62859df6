"""The backward engine: walks the Node graph from the roots in dependency order, calling each
node's backward and the hooks around it. Gradients flow as lazy Tensors, so the whole backward
is recorded as IR (next to the forward IR it reads) and runs as one graph at the end; with
`create_graph=True` it is recorded with grad_fns, so gradients are differentiable again."""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from ..ir.builder import Traced
from ..ir.core import is_float
from .autograd_compose import vjp_walk
from .autograd_exec import fast_backward, realize
from .autograd_graph import AccumulateGrad, Inplace, Node, check_saved, grad_edges, hook_name
from .grad_mode import mode
from .tensor import Tensor, record


def size_str(shape: Sequence[int]) -> str:
    return f"Size({list(shape)})"


def _as_tensor(g: Any) -> Tensor:
    if isinstance(g, Tensor):
        return g
    from .tensor_factories import tensor
    return tensor(g)


_ONES: dict = {}     # aval -> the (read-only) gradient `backward()` implies for a scalar


def _implicit_grad(aval: Any) -> np.ndarray | None:
    """The ones `loss.backward()` starts from, or None if `loss` is not a float scalar."""
    ones = _ONES.get(aval)
    if ones is None:
        if aval.size != 1 or not is_float(aval.dtype):
            return None
        ones = _ONES[aval] = np.ones(aval.shape, aval.dtype)
        ones.flags.writeable = False
    return ones


def _roots(tensors: Any, grads: Any) -> tuple[list[Tensor], list[Tensor]]:
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grads is None:
        grads = [None] * len(tensors)
    elif isinstance(grads, Tensor) or not isinstance(grads, (list, tuple)):
        grads = [grads]
    if len(grads) != len(tensors):
        raise RuntimeError(f"got {len(grads)} gradients for {len(tensors)} tensors")
    out = []
    for i, (t, g) in enumerate(zip(tensors, grads, strict=False)):
        if not isinstance(t, Tensor):
            raise TypeError(f"backward expects Tensors, got {type(t).__name__}")
        if not t._rg:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not "
                               "have a grad_fn")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if not is_float(t.dtype):
                raise RuntimeError("grad can be implicitly created only for real scalar "
                                   "outputs")
            g = Tensor._leaf(np.ones(t.shape, t.dtype))
        else:
            g = _as_tensor(g)
            if g.shape != t.shape:
                raise RuntimeError(
                    f"Mismatch in shape: grad_output[{i}] has a shape of {size_str(g.shape)} "
                    f"and output[{i}] has a shape of {size_str(t.shape)}.")
            if g.dtype != t.dtype:
                g = g.to(t.dtype)
        out.append(g)
    return tensors, out


def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs: Any = None) -> None:
    """Accumulate the gradients of `tensors` (weighted by `grad_tensors`) into leaves."""
    if grad_tensors is None and not create_graph and inputs is None and \
            type(tensors) is Tensor and type(tensors._fn) is Node:
        ones = _implicit_grad(tensors._var.aval)
        if ones is not None and fast_backward([tensors], [ones], bool(retain_graph)):
            return      # the common `loss.backward()`
    roots, grads = _roots(tensors, grad_tensors)
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    Engine(roots, grads, retain_graph, create_graph, inputs, accumulate=True).run()


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         materialize_grads: bool = False) -> tuple:
    """The gradients of `outputs` w.r.t. `inputs`, as a tuple; `.grad` is left alone."""
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    for t in inputs:
        if not isinstance(t, Tensor) or not t._rg:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    captured = _fast_grad(outputs, inputs, grad_outputs, retain_graph, create_graph)
    if captured is None:
        roots, grads = _roots(outputs, grad_outputs)
        eng = Engine(roots, grads, retain_graph, create_graph, inputs, accumulate=False)
        eng.run()
        captured = eng.captured
    out = []
    for i, t in enumerate(inputs):
        g = captured.get(i)
        if g is None:
            if not (allow_unused or materialize_grads):
                raise RuntimeError(
                    f"The differentiated Tensor at index {i} appears to not have been used in "
                    "the graph. Set allow_unused=True if this is the desired behavior.")
            if materialize_grads:
                g = Tensor._leaf(np.zeros(t.shape, t.dtype))
        out.append(g)
    return tuple(out)


def _fast_grad(outputs: Any, inputs: list, grad_outputs: Any, retain_graph: bool | None,
               create_graph: bool) -> dict | None:
    """`grad`'s common case — one scalar output, gradients of leaves, no create_graph — as
    `backward()`'s one graph (fast_backward), the gradients collected instead of accumulated:
    {input position: gradient}; None where the general engine is needed. The one graph
    checks, runs and frees everything the output reaches, the engine only what leads to
    `inputs`: so only a graph whose every leaf is an input is taken (two leaves of one
    variable are two: see autograd_exec._own_slot), and a check failing on the way goes to
    the engine (the branch may be unneeded)."""
    if not inputs or grad_outputs is not None or create_graph or \
            type(outputs) is not Tensor or type(outputs._fn) is not Node or \
            any(t._fn is not None for t in inputs):
        return None
    wanted = {id(t) for t in inputs}

    def every_leaf_wanted(in_gsrc: list) -> bool:
        return all(g is None or id(g.variable) in wanted for g in in_gsrc)
    ones = _implicit_grad(outputs._var.aval)
    collect: dict[int, Any] = {}
    try:
        if ones is None or not fast_backward([outputs], [ones], bool(retain_graph), collect,
                                             every_leaf_wanted):
            return None
    except RuntimeError:    # a freed or changed node: the engine says whether it is needed
        return None
    out: dict[int, Any] = {}
    made: dict[int, Any] = {}
    for i, t in enumerate(inputs):
        g = collect.get(id(t))
        if g is not None:
            if id(t) not in made:       # an input listed twice: one tensor, as torch
                made[id(t)] = Tensor._leaf(g)
            out[i] = made[id(t)]
    return out


class Engine:
    """One backward call (see the module docstring)."""

    def __init__(self, roots: list[Tensor], grads: list[Tensor], retain_graph: bool | None,
                 create_graph: bool, inputs: list[Tensor] | None, accumulate: bool):
        self.roots = roots
        self.grads = grads
        self.retain = create_graph if retain_graph is None else retain_graph
        self.create = create_graph
        self.inputs = inputs
        self.accumulate = accumulate
        self.captured: dict[int, Tensor] = {}

    # -- the graph
    def _needed(self, nodes: dict[int, Any], targets: set[int]) -> set[int]:
        """Nodes from which an input target is reachable (they have to run)."""
        memo: dict[int, bool] = {}
        for start in nodes.values():
            stack = [(start, False)]
            while stack:
                n, done = stack.pop()
                k = id(n)
                if done:
                    memo[k] = k in targets or any(
                        memo.get(id(g), False) for v, g, _ in getattr(n, "args", ())
                        if g is not None and v is not None)
                    continue
                if k in memo:
                    continue
                stack.append((n, True))
                for v, g, _ in getattr(n, "args", ()):
                    if g is not None and v is not None and id(g) not in memo:
                        stack.append((g, False))
        return {k for k, v in memo.items() if v}

    def run(self) -> None:
        if not self.create and self.inputs is None and fast_backward(
                self.roots, [g._val() for g in self.grads], self.retain):
            return
        starts = [t._gsrc() for t in self.roots]
        deps, nodes = grad_edges(starts)
        acc_targets: dict[int, list[int]] = {}     # id(AccumulateGrad) -> input positions
        capture: dict[tuple[int, int], list[int]] = {}   # (id(node), var id) -> positions
        if self.inputs is not None:
            for i, t in enumerate(self.inputs):
                if t._fn is None:
                    acc_targets.setdefault(id(t._gsrc()), []).append(i)
                else:
                    capture.setdefault((id(t._fn), t._var.id), []).append(i)
            needed = self._needed(nodes, set(acc_targets) | {k for k, _ in capture})
        else:
            needed = set(nodes)
        for n in nodes.values():
            if isinstance(n, Node) and id(n) in needed:
                check_saved(n)
        saved_mode = mode.grad
        mode.grad = self.create
        try:
            leaf_grads = self._walk(starts, deps, nodes, needed, acc_targets, capture)
        finally:
            mode.grad = saved_mode
        self._finish(leaf_grads, nodes, needed)

    def _walk(self, starts: list, deps: dict, nodes: dict, needed: set, acc_targets: dict,
              capture: dict) -> dict[int, tuple[Tensor, Tensor]]:
        buf: dict[int, list] = {}
        for s, t, g in zip(starts, self.roots, self.grads, strict=False):
            _add(buf, s, _index(s, t._var), g)
        ready = [s for s in dict.fromkeys(starts) if deps.get(id(s), 0) == 0]
        leaf_grads: dict[int, tuple] = {}   # id(leaf) -> (leaf, its gradient, its nodes)
        while ready:
            n = ready.pop()
            gouts = buf.pop(id(n), None)
            if isinstance(n, AccumulateGrad):
                if gouts is not None and gouts[0] is not None and id(n) in needed:
                    self._leaf(n, gouts[0], acc_targets, leaf_grads)
                continue
            if gouts is not None and id(n) in needed:
                gins = self._node(n, gouts, capture)
            else:
                gins = None
            for k, (var, gsrc, _) in enumerate(n.args):
                if gsrc is None or var is None:
                    continue
                if gins is not None and gins[k] is not None and id(gsrc) in needed:
                    _add(buf, gsrc, _index(gsrc, var), gins[k])
                key = id(gsrc)
                deps[key] -= 1
                if deps[key] == 0:
                    ready.append(gsrc)
        return leaf_grads

    def _node(self, n: Node, gouts: list, capture: dict) -> list | None:
        for i, v in enumerate(n.out_vars):
            g = gouts[i] if i < len(gouts) else None
            if g is None:
                continue
            if n.tensor_hooks and v.id in n.tensor_hooks:
                for fn in list(n.tensor_hooks[v.id].values()):
                    g = _checked(fn, g, fn(g))
            if n.retains and v.id in n.retains:
                t = n.retains[v.id]()
                if t is not None:
                    old = t._get("grad")
                    new = g if old is None else old + g
                    t._extra()["grad"] = new if self.create else new._plain()
            for pos in capture.get((id(n), v.id), ()):
                self.captured[pos] = g
            gouts[i] = g
        gouts = list(gouts) + [None] * (len(n.out_vars) - len(gouts))
        if n.pre_hooks:
            for fn in list(n.pre_hooks.values()):
                r = fn(tuple(gouts))
                if r is not None:
                    gouts = list(_checked_tuple(fn, tuple(gouts), r))
        if all(g is None for g in gouts):
            return None
        if n.fn_ctx is not None and hasattr(n.fn_ctx, "_apply_backward"):
            gins = n.fn_ctx._apply_backward(gouts)
        else:
            gins = apply_op_backward(n, gouts, self.create)
        if n.post_hooks:
            edges = [k for k, (v, _, _) in enumerate(n.args) if v is not None]
            gi = tuple(gins[k] for k in edges)
            for fn in list(n.post_hooks.values()):
                r = fn(gi, tuple(gouts))
                if r is not None:
                    gi = _checked_tuple(fn, gi, r)
            gins = list(gins)
            for k, g in zip(edges, gi, strict=False):
                gins[k] = g
        return gins

    def _leaf(self, acc: AccumulateGrad, g: Tensor, acc_targets: dict, leaf_grads: dict) -> None:
        t = acc.variable
        hooks = t._get("hooks")
        if hooks:
            for fn in list(hooks.values()):
                g = _checked(fn, g, fn(g))
        for pos in acc_targets.get(id(acc), ()):
            self.captured[pos] = g
        if self.accumulate and (self.inputs is None or id(acc) in acc_targets):
            if acc.pre_hooks:
                g = _accumulate_prehooks(acc, g)
            prev = leaf_grads.get(id(t))
            if prev is None:
                leaf_grads[id(t)] = (t, g, (acc,))
            else:
                total = prev[1] if g is None else g if prev[1] is None else prev[1] + g
                leaf_grads[id(t)] = (t, total, prev[2] if acc in prev[2] else prev[2] + (acc,))

    def _finish(self, leaf_grads: dict, nodes: dict, needed: set) -> None:
        new = []
        saved_mode = mode.grad
        mode.grad = self.create
        try:
            for t, g, _ in leaf_grads.values():
                if g is None:   # dropped by an AccumulateGrad prehook
                    continue
                old = t._get("grad")
                if old is None:
                    g = g if self.create else g._plain()
                    t._extra()["grad"] = g
                    new.append(g)
                elif self.create:
                    t._extra()["grad"] = s = old + g
                    new.append(s)
                else:
                    s = old + g
                    old._var, old._value, old._node = s._var, s._value, s._node
                    Inplace.bump(old._vc)
                    new.append(old)
        finally:
            mode.grad = saved_mode
        if not self.create:
            realize(new + list(self.captured.values()) + self.roots)
        if not self.retain:
            for n in nodes.values():
                if isinstance(n, Node) and id(n) in needed:
                    n.freed = True
                    for s in n.saved or ():
                        s.tensor = s.packed = None
        mode.state.clear_tape()   # (see autograd_exec.tape_walk)
        # last, as torch: after accumulating and freeing (a hook that raises leaves the graph
        # as a finished backward does): per leaf its post-accumulate hooks, then those of its
        # AccumulateGrad, called ((), (grad,)) and returning nothing
        for t, g, accs in leaf_grads.values():
            if t._get("post_accumulate"):
                t._post_accumulate()
            for acc in accs:
                if acc.post_hooks:
                    for fn in list(acc.post_hooks.values()):
                        r = fn((), (g,))
                        if r is not None:
                            _checked_tuple(fn, (), r)


def _accumulate_prehooks(acc: AccumulateGrad, g: Tensor | None) -> Tensor | None:
    """The gradient `acc` accumulates once its prehooks saw it: each is called with
    `(gradient,)` and may return a tuple replacing it, as in torch (`(None,)`: none)."""
    for fn in list(acc.pre_hooks.values()):
        r = fn((g,))
        if r is None:
            continue
        if type(r) is not tuple:
            raise TypeError(f"expected tuple, but hook returned '{type(r).__name__}'")
        if len(r) != 1:
            raise RuntimeError(f"hook '{hook_name(fn)}' has returned an incorrect number of "
                               f"values (got {len(r)}, but expected 1)")
        if r[0] is None:
            g = None
        elif g is None:
            raise RuntimeError("can't replace a None gradient with a non-None value")
        else:
            g = _checked(fn, g, r[0])
    return g


def _index(node: Any, var: Any) -> int:
    if isinstance(node, AccumulateGrad):
        return 0
    for i, v in enumerate(node.out_vars):
        if v is var:
            return i
    return 0


def _add(buf: dict, node: Any, idx: int, g: Tensor) -> None:
    slot = buf.get(id(node))
    if slot is None:
        slot = buf[id(node)] = [None] * max(len(getattr(node, "out_vars", ())), 1)
    prev = slot[idx]
    slot[idx] = g if prev is None else prev + g


def _checked(fn: Any, g: Tensor, r: Any) -> Tensor:
    if r is None:
        return g
    if not isinstance(r, Tensor):
        raise TypeError(f"expected Variable or None (got {type(r).__name__})")
    if r.shape != g.shape:
        raise RuntimeError(f"hook '{hook_name(fn)}' has changed the size of value")
    if r.dtype != g.dtype:
        raise RuntimeError(f"hook '{hook_name(fn)}' has changed the type of value (was "
                           f"{g.dtype} got {r.dtype})")
    return r


def _checked_tuple(fn: Any, gs: tuple, r: Any) -> tuple:
    r = tuple(r) if isinstance(r, (tuple, list)) else (r,)
    if len(r) != len(gs):
        raise RuntimeError(f"hook '{hook_name(fn)}' has returned an incorrect number of values "
                           f"(got {len(r)}, but expected {len(gs)})")
    return tuple(g if x is None and g is None else _checked(fn, g, x) if g is not None else x
                 for g, x in zip(gs, r, strict=False))


# ---- the backward of a recorded op ---------------------------------------------------------------

def apply_op_backward(n: Node, gouts: list, create: bool) -> list:
    """Gradients for each entry of `n.args`, recorded as a Tensor op (with a grad_fn when
    `create`, so that it can be differentiated again)."""
    subst = {}
    for s in n.saved or ():
        if s.unpack is not None:
            t = s.unpacked(n)
            if not isinstance(t, Tensor) or t.shape != s.var.aval.shape:
                raise RuntimeError("saved_tensors_hooks: unpack must return a Tensor of the "
                                   "saved tensor's shape")
            subst[s.var.id] = t
    g_idx = [i for i, g in enumerate(gouts) if g is not None]
    gts = [gouts[i] for i in g_idx]
    sub_ids = list(subst)
    sub_ts = [subst[k] for k in sub_ids]
    arg_vars = [e[0] for e in n.args]
    n_args = len(arg_vars)

    def vjp(*xs: Traced) -> list:
        b = xs[0].builder if xs else None
        if create:
            fwd = xs[:n_args]
            xs = xs[n_args:]
            env = {v.id: t for v, t in zip(arg_vars, fwd, strict=False) if v is not None}
        else:
            env = {}
        gs, subs = xs[:len(gts)], xs[len(gts):]
        return vjp_walk(n.eqns, n.args, n.out_vars, b, env, dict(zip(g_idx, gs, strict=True)),
                        dict(zip(sub_ids, subs, strict=True)), create)

    extra = ()
    if create:
        shadows = tuple(_shadow(e) for e in n.args)
        args = shadows + tuple(gts) + tuple(sub_ts)
    else:
        args = tuple(gts) + tuple(sub_ts)
        extra = ((None, None, n),)
    out = record(vjp, "Grad", args, {}, grad=create, deps=extra)
    if create:
        _name_grads(out)
    return out


# IR op -> PyTorch name stem, for naming the nodes of differentiable gradients
_STEMS = {"mul": "Mul", "add": "Add", "sub": "Sub", "div": "Div", "neg": "Neg", "pow": "Pow",
          "matmul": "Mm", "reduce_sum": "Sum", "broadcast": "Expand", "reshape": "View",
          "transpose": "Permute", "select": "Where", "exp": "Exp", "log": "Log",
          "convert": "ToCopy", "pad_slice": "SliceBackward", "slice": "Slice",
          "update_slice": "CopySlices",
          "concatenate": "Cat", "scatter_add": "IndexPut", "take": "Index", "cos": "Cos",
          "sin": "Sin", "max": "Maximum", "min": "Minimum", "sqrt": "Sqrt", "abs": "Abs"}


def _name_grads(grads: list) -> None:
    """Name a gradient's node after the last primitive computing it, as PyTorch would."""
    for g in grads:
        if g is None or g._fn is None:
            continue
        for e in reversed(g._fn.eqns):
            if g._var in e.outvars:
                stem = _STEMS.get(e.op, e.op.title().replace("_", ""))
                g._fn.name_ = f"{stem}Backward0"
                return


def _shadow(entry: tuple) -> Tensor:
    """A stand-in Tensor for a recorded op input: same variable, value and gradient edge."""
    var, gsrc, vsrc = entry
    t = Tensor._from_var(var, vsrc if isinstance(vsrc, Node) else None,
                         gsrc if isinstance(gsrc, Node) else None)
    if isinstance(vsrc, np.ndarray):
        t._value = vsrc
    if isinstance(gsrc, AccumulateGrad):
        t._rg = True
        t._extra()["acc"] = weakref.ref(gsrc)
    return t

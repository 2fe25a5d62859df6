"""Recording Tensor ops: each op runs its un-dispatched `tg` function on the arguments' IR
values in a recording Builder, and the equations it emitted become a Node. Ops are keyed by a
signature (the function and a description of its arguments), and what one signature emitted is
kept as a template, so an op seen before is recorded without making any IR (the fast path:
`_fast_key` and `_replay`); its equations are copied from the template only when needed."""
from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..ir import core as _core
from ..ir.builder import _CODE_SITES, Builder, Traced, user_source
from ..ir.builder import _state as _trace_state
from ..ir.core import Aval, Lit, Var, remember
from .autograd_graph import SAVED, Inplace, Node, SavedTensor, held
from .grad_mode import ThreadMode, mode, prune_tape
from .tensor import _AVALS, Tensor

_new = object.__new__
_weak = weakref.ref
_getframe = sys._getframe
_var_ids = _core._ids     # (Var.__init__'s counter)


class _Recorder(threading.local):
    def __init__(self) -> None:
        self.builder = Builder("tensor")


_rec = _Recorder()


def _grad_name(name: str, args: tuple, kwargs: dict) -> str:
    """PyTorch's grad_fn name for a `tg` op called with these arguments."""
    if name in ("Sum", "Mean", "Prod"):
        dim = kwargs.get("axis", kwargs.get("dim", args[1] if len(args) > 1 else None))
        return f"{name}Backward{0 if dim is None else 1}"
    if name in ("Max", "Min"):
        dim = kwargs.get("axis", kwargs.get("dim", args[1] if len(args) > 1 else None))
        return f"{name}Backward{1 if dim is None else 0}"
    if name == "Pow":
        if not isinstance(args[0], Tensor):
            return "PowBackward2"
        return "PowBackward1" if isinstance(args[1], Tensor) else "PowBackward0"
    if name == "Sub" and not isinstance(args[0], Tensor):
        return "RsubBackward1"
    if name in ("Square", "Div") and not isinstance(args[0], Tensor) or name == "Dropout":
        return "MulBackward0"
    if name == "Square":
        return "PowBackward0"
    if name == "Mm":
        nd = (np.ndim(args[0]) if not isinstance(args[0], Tensor) else args[0].ndim,
              np.ndim(args[1]) if not isinstance(args[1], Tensor) else args[1].ndim)
        return {(2, 2): "MmBackward0", (1, 1): "DotBackward0", (2, 1): "MvBackward0",
                (1, 2): "SqueezeBackward4"}.get(nd, "UnsafeViewBackward0")
    if name == "Index":
        return _index_name(args[1])
    if name == "Squeeze":
        return "SqueezeBackward1" if len(args) > 1 or kwargs else "SqueezeBackward0"
    if name == "Clamp":
        return "ClampBackward1"
    return f"{name}Backward0"


def _index_name(index: Any) -> str:
    items = index if isinstance(index, tuple) else (index,)
    last = "Alias"
    for i in items:
        if isinstance(i, (Tensor, np.ndarray, list)):
            return "IndexBackward0"
        if i is None:
            last = "Unsqueeze"
        elif isinstance(i, (int, np.integer)):
            last = "Select"
        elif isinstance(i, slice) and i != slice(None):
            last = "Slice"
    return f"{last}Backward0"


def _concrete(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Inside a `jit`/`grad` trace, Tensors are plain values of that trace."""
    def val(a: Any) -> Any:
        if isinstance(a, Tensor):
            return a._val()
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a
    return fn(*[val(a) for a in args], **{k: val(v) for k, v in kwargs.items()})


def record(fn: Callable, name: str, args: tuple, kwargs: dict, grad: bool = True,
           keep_arrays: bool = False, deps: tuple = (), cache: bool = True) -> Any:
    """Run the un-dispatched op `fn` on the arguments' IR values, recording a Node.

    The node's `sig` — `fn` and a description of the arguments (shapes, dtypes, which
    entries they read, Python values) — determines the IR it emitted, so equal signatures
    let whole graphs be recognised without comparing equations (see autograd_graph)."""
    if _trace_state.stack:
        return _concrete(fn, args, kwargs)
    key = None
    if not kwargs and not deps and cache:
        if len(args) == 2 and type(args[0]) is Tensor and type(args[1]) is Tensor:
            a, b = args     # the commonest case, keyed here directly (as _fast_key would)
            va, vb = a._var, b._var
            if va is not vb:
                aa, ab = va.aval, vb.aval
                key, tensors = (fn, name, aa.shape, aa.dtype, ab.shape, ab.dtype), args
            elif _one_source(a, b):
                aval = va.aval
                key, tensors = (fn, name, aval.shape, aval.dtype, 0), (a,)
        else:
            fast = _fast_key(fn, name, args)
            if fast is not None:
                key, tensors = fast
        if key is not None:
            hit = _fast.get(key)
            if hit is not None:
                return _replay(hit, name, args, tensors, grad, 3)
    if name == "Dropout" and kwargs.get("seed") is None:
        from .random import next_seed  # a graph input, so graphs hash alike across steps
        kwargs = dict(kwargs, seed=np.asarray(next_seed(), np.int64))
    b = _rec.builder
    grad_on = mode.state.grad and grad
    entries: list = []
    seen: dict[tuple, Traced] = {}      # (var id, id(gradient source)) -> its IR value
    read: set[int] = set()      # the var ids of entries
    desc: list = [fn]

    def un(a: Any, top: bool) -> Any:
        if isinstance(a, Tensor):
            var = a._var
            gsrc = a._gsrc() if grad_on else None
            tr = seen.get((var.id, id(gsrc)))
            if tr is None:
                val = a._value if a._value is not None else a._node
                if var.id in read:  # a second leaf of this variable (`a.data = b`): its own
                    var, val = Var(var.aval), a._val()    # (see autograd_exec._own_slot)
                read.add(var.id)
                entries.append((var, gsrc, val))
                tr = seen[(a._var.id, id(gsrc))] = Traced(b, var)
            var = tr.atom
            desc.append((var.id, var.aval.shape, var.aval.dtype))
            return tr
        if isinstance(a, np.ndarray):
            if top and not keep_arrays:
                var = Var(Aval(a.shape, a.dtype))
                entries.append((var, None, a))
                desc.append((a.shape, a.dtype))
                return Traced(b, var)
            desc.append(None)       # an array baked into the IR: never cached
            return a
        if isinstance(a, (list, tuple)):
            if hasattr(a, "_fields"):
                desc.append(a)
                return a
            desc.append(len(a))
            return type(a)(un(x, False) for x in a)
        if isinstance(a, Traced):
            raise _MixedTrace
        if isinstance(a, slice):
            desc.append((a.start, a.stop, a.step))
        else:   # 1, 1.0 and True hash alike but emit different IR; so do 0.0 and -0.0
            desc.append(_scalar_key(a))
        return a

    try:
        args2 = [un(a, True) for a in args]
        if kwargs:
            kwargs2 = {}
            for k, v in kwargs.items():
                desc.append(k)
                kwargs2[k] = un(v, True)
        else:
            kwargs2 = kwargs
    except _MixedTrace:
        return _concrete(fn, args, kwargs)
    finally:    # `un` calls itself: a cycle, which held the entries (and their leaves'
        un = None   # AccumulateGrads) until the garbage collector ran
    sig = tpl = None
    if cache and not deps and None not in desc:
        sig = _signature(desc)
        try:
            tpl = _templates.get(sig)
        except TypeError:       # an argument that cannot be hashed: no signature
            sig = None
    source = user_source(1)
    if tpl is not None:     # seen before: copy the recorded IR instead of re-deriving it
        out_vars = _out_vars(tpl[2])
        eqns = None
        multi = tpl[3] is not None
    else:
        b.source_override = source
        _trace_state.stack.append(b)
        try:
            out = fn(*args2, **kwargs2)
            multi = isinstance(out, (list, tuple))
            out_type = type(out) if multi else None
            outs = list(out) if multi else [out]
            out_vars = [_own_var(b, o, entries) for o in outs]
            eqns = b.eqns
            if not eqns:    # nothing to replay: such nodes take the general walks
                sig = None
            if b.constvars:
                entries.extend((v, None, c)
                               for v, c in zip(b.constvars, b.consts, strict=True))
                sig = None
        finally:
            _trace_state.stack.pop()
            b.source_override = None
            b.eqns = []
            if b.constvars:
                b.constvars, b.consts, b._const_ids, b._keepalive = [], [], {}, []
        if sig is not None:
            if len(_templates) > TEMPLATE_LIMIT:
                _templates.clear()
                _names.clear()
                _fast.clear()
            tpl = _templates[sig] = ([e[0].id for e in entries], eqns, out_vars, out_type,
                                     next(_sig_ids))
    if deps:
        entries.extend(deps)
    requires = grad_on and any(e[1] is not None for e in entries)
    node = Node.make(eqns, entries, [v for v in out_vars if v is not None], False, "",
                     None if sig is None else tpl, source)
    results = _results(node, out_vars, requires)
    if sig is not None:
        node.sig = 2 * tpl[4] + node.grad
    if node.grad:
        gname = _names.get((name, sig)) if sig is not None else None
        if gname is None:
            gname = _grad_name(name, args, kwargs)
            if sig is not None:
                _names[(name, sig)] = gname
        node.name_ = gname
        _save(node, name, args, results[0])
        _push(node)
    if key is not None and sig is not None:
        touts = tpl[2]
        single = len(touts) == 1 and touts[0] is not None and tpl[3] is None
        saves = SAVED.get(name)
        _fast[key] = (tpl, _names.get((name, sig)) or _grad_name(name, args, kwargs),
                      _IO if saves == _IO else _RESULT if saves == _RESULT else saves,
                      _leaf_aval(touts[0].aval) if single else None,
                      single and touts[0].aval.dtype.kind == "f", 2 * tpl[4])
    if not multi:
        return results[0]
    out_type = tpl[3] if tpl is not None else out_type
    return out_type(*results) if hasattr(out_type, "_fields") else out_type(results)


def _results(node: Node, out_vars: list, requires: bool) -> list:
    results = []
    for v in out_vars:
        if v is None:
            results.append(None)
            continue
        differentiable = requires and v.aval.dtype.kind == "f"
        if differentiable:
            node.grad = True
        results.append(Tensor._from_var(v, node, node if differentiable else None))
    if mode.state.inference:
        for t in results:
            if t is not None:
                t._x = {"inference": True}
    return results


def _fast_key(fn: Callable, name: str, args: tuple) -> tuple | None:
    """A cheap stand-in for an op's signature when its arguments are only Tensors and Python
    scalars (the common case), as a flat tuple: `fn`, `name`, then per argument either the
    index of the earlier tensor it repeats, a tensor's shape and dtype, or a scalar's (type,
    value). Returns (key, the distinct tensors) or None."""
    if len(args) == 1 and isinstance(args[0], Tensor):
        aval = args[0]._var.aval
        return (fn, name, aval.shape, aval.dtype), args
    key: list = [fn, name]
    tensors: list = []
    for a in args:
        if isinstance(a, Tensor):
            v = a._var
            for i, t in enumerate(tensors):
                if t._var is v:
                    if not _one_source(t, a):
                        return None
                    key.append(i)
                    break
            else:
                tensors.append(a)
                aval = v.aval
                key.append(aval.shape)
                key.append(aval.dtype)
        elif type(a) in _SCALARS and name != "Dropout":
            key.append(_scalar_key(a))
        else:
            return None
    return tuple(key), tensors


_SCALARS = (float, int, bool)


def _scalar_key(a: Any) -> Any:
    """A key telling apart what emits different IR: 1, 1.0 and True (equal, one hash), and
    floats by their bits (0.0 == -0.0; NaN != NaN)."""
    return (type(a), float(a).hex()) if isinstance(a, float) else (type(a), a)


def record_unary(fn: Callable, name: str, a: Tensor, depth: int = 2) -> Any:
    """`record(fn, name, (a,), {})` for a Tensor `a`: an op seen before is replayed at once.
    `depth`: how many frames above this one the user's code may start (2: the caller of the
    method that called this)."""
    st = mode.state
    if not st.traces:
        aval = a._var.aval
        memo = _last_unary.get(fn)     # (as binary_methods' memo)
        if memo is not None and memo[0] is aval and memo[2] is name:
            return _replay1(memo[1], name, a, None, depth + 1, st)
        hit = _fast.get((fn, name, aval.shape, aval.dtype))
        if hit is not None:
            if hit[3] is not None:
                remember(_last_unary, fn, (aval, hit, name), 1024)
                return _replay1(hit, name, a, None, depth + 1, st)
            return _replay(hit, name, (a,), (a,), True, depth + 2)
    return record(fn, name, (a,), {})


_last_unary: dict = {}     # a unary function -> (operand's Aval, hit, name) last replayed


def record_binary(fn: Callable, name: str, a: Any, b: Any, depth: int = 2) -> Any:
    """`record(fn, name, (a, b), {})`, with the commonest case — two Tensors, an op seen
    before — replayed at once."""
    if type(a) is Tensor and type(b) is Tensor:
        st = mode.state
        if not st.traces:
            va, vb = a._var, b._var
            aa = va.aval
            if va is vb:
                if not _one_source(a, b):
                    return record(fn, name, (a, b), {})
                hit = _fast.get((fn, name, aa.shape, aa.dtype, 0))
                tensors = (a,)
            else:
                ab = vb.aval
                hit = _fast.get((fn, name, aa.shape, aa.dtype, ab.shape, ab.dtype))
                tensors = (a, b)
            if hit is not None:
                if hit[3] is not None:
                    return _replay1(hit, name, a, b, depth + 1, st)
                return _replay(hit, name, (a, b), tensors, True, depth + 2)
    return record(fn, name, (a, b), {})


def _replay(hit: tuple, name: str, args: tuple, tensors: tuple, grad: bool,
            depth: int = 4) -> Any:
    """Record an op whose fast key was seen before: no IR is made until it is needed. The
    user's line is looked for from `depth - 1` frames above this function."""
    tpl, gname, saves, aval, float_out, sig = hit
    entries = []
    requires = False
    if grad and mode.state.grad:
        for a in tensors:
            gsrc = a._fn
            if gsrc is None and a._rg:      # a leaf: its AccumulateGrad, while it lives
                x = a._x
                ref = x.get("acc") if x is not None else None
                gsrc = ref() if ref is not None else None
                if gsrc is None or gsrc.hooked:     # (a hooked one: see Tensor._gsrc)
                    gsrc = None
                    gsrc = a._gsrc()
            if gsrc is not None:
                requires = True
            val = a._value
            entries.append((a._var, gsrc, a._node if val is None else val))
    else:
        for a in tensors:
            val = a._value
            entries.append((a._var, None, a._node if val is None else val))
    if aval is None:
        out_vars = _out_vars(tpl[2])
        node = Node.make(None, entries, [v for v in out_vars if v is not None], False, "",
                         tpl, user_source(depth - 1))
        results = _results(node, out_vars, requires)
        node.sig = sig + node.grad
        if node.grad:
            node.name_ = gname
            if saves:
                _save(node, name, args, results[0], saves)
            else:
                node.saved = ()
            _push(node)
        out_type = tpl[3]
        if out_type is None:
            return results[0]
        return out_type(*results) if hasattr(out_type, "_fields") else out_type(results)
    v = _new(Var)     # one output: the variable, node and tensor are made here directly
    v.aval = aval
    v.id = next(_core._ids)
    node = Node()
    node._eqns = None
    node.tpl = tpl
    f = sys._getframe(depth - 1)     # the user's line: user_source's common case inline
    info = _CODE_SITES.get(id(f.f_code))
    line = info[1].get(f.f_lasti) if info else None
    node.src = line if line is not None else user_source(depth - 1)
    node.args = entries
    node.out_vars = [v]
    node.values = None
    node.freed = False
    node.epoch = Inplace.epoch
    node.x = None
    node.w = -1
    t = _new(Tensor)
    t._var = v
    t._value = None
    t._node = node
    t._vc = [0]
    t._x = {"inference": True} if mode.state.inference else None
    if requires and float_out:
        node.grad = True
        node.sig = sig + 1
        node.name_ = gname
        t._fn = node
        t._rg = True
        if not saves:
            node._saved = ()
        elif saves is _IO and not mode.state.saved_hooks:     # (0, 1): matmul, mul, div ...
            a, b = args
            if type(a) is Tensor and type(b) is Tensor and \
                    (a._x is None or not a._x.get("inference")) and \
                    (b._x is None or not b._x.get("inference")):
                va, vb = a._vc, b._vc
                ha = a if a._x is None or "view" not in a._x else _weak(a)
                hb = b if b._x is None or "view" not in b._x else _weak(b)
                keep_a = b._rg or name not in _EITHER and name != "Div"
                keep_b = a._rg or name not in _EITHER
                node._saved = ((ha, a._var, va, va[0], 0) if keep_a else ()) + \
                    ((hb, b._var, vb, vb[0], 1) if keep_b else ())
            else:
                _save(node, name, args, t, saves)
        elif saves is _RESULT and not mode.state.saved_hooks:
            node._saved = (None, v, t._vc, 0, "result")
        else:
            _save(node, name, args, t, saves)
        _push(node)
    else:
        node.grad = False
        node.sig = sig
        node.name_ = ""
        node._saved = None
        t._fn = None
        t._rg = False
    return t


def _leaf_aval(aval: Aval) -> Aval:
    """The one Aval object leaves of this type get (tensor._AVALS): replayed ops' results get
    it too, so that their types can be told apart by identity (binary_methods' memo)."""
    key = (aval.shape, aval.dtype)
    same = _AVALS.get(key)
    return same if same is not None else remember(_AVALS, key, aval)


def binary_methods(fn: Callable, name: str) -> tuple[Callable, Callable]:
    """`Tensor.__op__` and `__rop__` for the binary `tg` function `fn`: `record_binary`, with
    its commonest case (two Tensors, an op seen before) inlined, one call less per op."""
    fast = _fast
    # The last (a's aval, b's aval, hit): a loop records the same op on the same types over
    # and over, and two identity tests cost a quarter of making, hashing and comparing the
    # fast key (its shapes and numpy dtypes). One tuple, read and replaced whole (threads).
    last: list = [(None, None, None)]

    def op(a: Tensor, b: Any) -> Any:
        if type(b) is Tensor and type(a) is Tensor:
            va, vb = a._var, b._var
            if va is not vb:
                st = mode.state
                if not st.traces:
                    aa, ab = va.aval, vb.aval
                    memo = last[0]
                    if memo[0] is aa and memo[1] is ab:
                        return _replay1(memo[2], name, a, b, 2, st)
                    hit = fast.get((fn, name, aa.shape, aa.dtype, ab.shape, ab.dtype))
                    if hit is not None and hit[3] is not None:
                        last[0] = (aa, ab, hit)
                        return _replay1(hit, name, a, b, 2, st)
        return record_binary(fn, name, a, b)

    def rop(b: Tensor, a: Any) -> Any:
        return record_binary(fn, name, a, b)
    return op, rop


def _replay1(hit: tuple, name: str, a: Tensor, b: Tensor | None, depth: int,
             st: ThreadMode) -> Tensor:
    """`_replay` of an op with one output and Tensor arguments `a` and `b` (None: a unary
    op), the common case, written out: its variable, node and tensor are made here directly,
    and a differentiable node goes on this thread's tape (see autograd_exec.tape_walk). The user's
    line is looked for from `depth` frames above this function. `st`: this thread's modes."""
    tpl, gname, saves, aval, float_out, sig = hit
    if st.grad:
        ga = a._fn
        if ga is None and a._rg:    # a leaf: its AccumulateGrad, while it lives (as _gsrc)
            x = a._x
            ref = x.get("acc") if x is not None else None
            ga = ref() if ref is not None else None
            if ga is None or ga.hooked:     # (a hooked one: see Tensor._gsrc)
                ga = None
                ga = a._gsrc()
        val = a._value
        ea = (a._var, ga, a._node if val is None else val)
        if b is None or b._var is a._var:
            entries = (ea,)
            requires = ga is not None
        else:
            gb = b._fn
            if gb is None and b._rg:
                x = b._x
                ref = x.get("acc") if x is not None else None
                gb = ref() if ref is not None else None
                if gb is None or gb.hooked:     # (a hooked one: see Tensor._gsrc)
                    gb = None
                    gb = b._gsrc()
            val = b._value
            entries = (ea, (b._var, gb, b._node if val is None else val))
            requires = ga is not None or gb is not None
    else:
        val = a._value
        entries = ((a._var, None, a._node if val is None else val),)
        if b is not None and b._var is not a._var:
            val = b._value
            entries += ((b._var, None, b._node if val is None else val),)
        requires = False
    v = _new(Var)
    v.aval = aval
    v.id = next(_var_ids)
    node = Node()
    node._eqns = None
    node.tpl = tpl
    f = _getframe(depth)     # the user's line: user_source's common case inline
    code = f.f_code
    last = _last_site      # (one read: another thread may replace it)
    lines = last[1] if last[0] is code else _site(code)
    line = lines.get(f.f_lasti) if lines is not None else None
    node.src = line if line is not None else _new_site(depth + 1)
    node.args = entries
    node.out_vars = (v,)
    node.values = None
    node.freed = False
    node.epoch = Inplace.epoch
    node.x = None
    node.w = -1
    t = _new(Tensor)
    t._var = v
    t._value = None
    t._node = node
    t._vc = [0]
    t._x = {"inference": True} if st.inference else None
    if not (requires and float_out):
        node.grad = False
        node.sig = sig
        node.name_ = ""
        node._saved = None
        t._fn = None
        t._rg = False
        return t
    node.grad = True
    node.sig = sig + 1
    node.name_ = gname
    t._fn = node
    t._rg = True
    if not saves:
        node._saved = ()
    elif saves is _RESULT and not st.saved_hooks:
        node._saved = (None, v, t._vc, 0, "result")
    elif saves is _IO and b is not None and not st.saved_hooks and \
            (a._x is None or not a._x.get("inference")) and \
            (b._x is None or not b._x.get("inference")):    # (0, 1): matmul, mul, div ...
        va, vb = a._vc, b._vc
        ha = a if a._x is None or "view" not in a._x else _weak(a)
        hb = b if b._x is None or "view" not in b._x else _weak(b)
        if a._rg and b._rg:
            node._saved = (ha, a._var, va, va[0], 0, hb, b._var, vb, vb[0], 1)
        else:
            keep_a = b._rg or name not in _EITHER and name != "Div"
            keep_b = a._rg or name not in _EITHER
            node._saved = ((ha, a._var, va, va[0], 0) if keep_a else ()) + \
                ((hb, b._var, vb, vb[0], 1) if keep_b else ())
    else:
        _save(node, name, (a,) if b is None else (a, b), t, saves)
    tape = st.tape
    tape.append(node)
    if len(tape) > st.tape_room:
        prune_tape(st)
    return t


def _push(node: Node) -> None:
    """Put a differentiable node on this thread's tape (see autograd_exec.tape_walk)."""
    st = mode.state
    st.tape.append(node)
    if len(st.tape) > st.tape_room:
        prune_tape(st)


def _site(code: Any) -> dict | None:
    """builder's record of a code object's lines ({instruction offset: "file:line"}; None:
    tracegrad's own or not seen yet), kept as the last one looked up: a loop recording ops
    comes from one function, so most ops skip the lookup."""
    global _last_site
    info = _CODE_SITES.get(id(code))
    if not info:
        return None
    _last_site = (code, info[1])
    return info[1]


_last_site: tuple = (None, None)


def _new_site(depth: int) -> str | None:
    """user_source(depth), for a line not seen before: it may fill a record other than the
    one kept as the last (builder's table is emptied when full), so that one is dropped."""
    global _last_site
    _last_site = (None, None)
    return user_source(depth)


def _out_vars(touts: list) -> list:
    """Fresh variables for a template's outputs (one per distinct template variable)."""
    if len(touts) == 1 and touts[0] is not None:
        return [Var(touts[0].aval)]
    made: dict[int, Var] = {}
    out = []
    for v in touts:
        if v is None:
            out.append(None)
            continue
        o = made.get(v.id)
        if o is None:
            o = made[v.id] = Var(v.aval)
        out.append(o)
    return out


TEMPLATE_LIMIT = 4096
_IO = (0, 1)              # what most binary ops save (see autograd_graph.SAVED), and
_RESULT = ("result",)     # what most unary ones do: replayed without _save
_templates: dict = {}     # signature -> (input var ids, eqns, output vars, output type, sig id)
_names: dict = {}         # (op name, signature) -> grad_fn name
_fast: dict = {}          # fast key (see _fast_key) -> (template, grad_fn name, saves?)
_sig_ids = itertools.count()


def _signature(desc: list) -> tuple | None:
    """A hashable stand-in for the IR an op emits: tensors are named by their position among
    the op's inputs (var ids renumbered), everything else is kept as given."""
    first: dict[int, int] = {}
    sig = []
    for d in desc:
        if type(d) is tuple and len(d) == 3 and type(d[0]) is int and type(d[1]) is tuple:
            sig.append((first.setdefault(d[0], len(first)), d[1], d[2]))
        else:
            sig.append(d)
    return tuple(sig)


class _MixedTrace(Exception):
    pass


def _own_var(b: Builder, o: Any, entries: list) -> Var | None:
    """The variable of op output `o`, copied when the op returned an input unchanged (each
    output needs its own variable so gradients are routed per tensor)."""
    if o is None:
        return None
    if not isinstance(o, Traced):
        from ..ir import emit as E
        arr = np.asarray(o)
        o = E.full(arr.shape, arr.item(), arr.dtype) if arr.ndim == 0 else \
            Traced(b, b.const(arr))
    atom = o.atom
    if isinstance(atom, Lit):
        return b.emit("full", [], {"shape": (), "value": atom.value.item(),
                                   "dtype": atom.aval.dtype})[0]
    eqns = b.eqns
    if eqns and eqns[-1].outvars[0] is atom:
        return atom
    if any(e[0] is atom for e in entries) or any(v is atom for v in b.constvars):
        return b.emit("reshape", [atom], {"shape": atom.aval.shape})[0]
    return atom


def _one_source(a: Tensor, b: Tensor) -> bool:
    """Whether tensors `a` and `b` of one variable send gradients to one place, so an op
    reading both reads one value (`x * x`). Two leaves can hold one variable (`a.data = b`, a
    detached alias written through) and each gets its own gradient, as in torch."""
    return a is b or a._fn is b._fn and (a._fn is not None or not (a._rg or b._rg))


def _needs_grad(a: Any) -> bool:
    return isinstance(a, Tensor) and a._rg


_EITHER = {"Mul", "Mm", "Dot", "Matmul"}    # x's gradient reads only y, y's only x


def _unneeded(name: str, s: int, args: tuple) -> bool:
    """Operand `s` of a binary op is read only by the other operand's gradient, which
    nobody needs: torch does not save it (so it may change in place before backward)."""
    if name in _EITHER and s in (0, 1) and len(args) == 2:
        return not _needs_grad(args[1 - s])
    return name == "Div" and s == 0 and not _needs_grad(args[1])


def _save(node: Node, name: str, args: tuple, result: Tensor | None,
          slots: tuple | None = None) -> None:
    """Keep what the op's backward reads (see autograd_graph.SAVED). Without
    saved_tensors_hooks the values are kept as one flat tuple, five fields per value
    (tensor, var, vc, version, slot), made SavedTensors only if asked for (`Node.saved`)."""
    if slots is None:
        slots = SAVED.get(name)
        if not slots:
            node.saved = ()
            return
    hooks = mode.state.saved_hooks
    hooks = hooks[-1] if hooks else None
    saved = []
    for s in slots:
        if s.__class__ is str:     # "result"
            if result is not None:
                vc = result._vc
                if hooks is not None:
                    saved.append(SavedTensor(None, result._var, vc, s, node, hooks))
                else:
                    saved += (None, result._var, vc, vc[0], s)
        elif s < len(args) and isinstance(args[s], Tensor):
            t = args[s]
            if _unneeded(name, s, args):
                continue    # d(x*c)/dc is not needed: x need not be kept (as torch)
            if t._x is not None and t._x.get("inference"):
                raise RuntimeError(
                    "Inference tensors cannot be saved for backward. Please do not use Tensors "
                    "created in inference mode in computation tracked by autograd. To work "
                    "around this, you can make a clone to get a normal tensor and use it in "
                    "autograd, or use `torch.no_grad()` instead of `torch.inference_mode()`.")
            vc = t._vc
            if hooks is not None:
                saved.append(SavedTensor(t, t._var, vc, s, node, hooks))
            else:
                saved += (held(t), t._var, vc, vc[0], s)
    if name == "Pow" and len(args) > 1 and not isinstance(args[1], Tensor):
        node.fn_ctx = {"exponent": args[1]}
    if hooks is None:
        node._saved = tuple(saved)
        return
    if saved:
        node.hooked = True
    node.saved = saved

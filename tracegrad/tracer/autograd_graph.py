"""The autograd graph behind lazy Tensors: Nodes (a Tensor op's recorded IR, and its `grad_fn`
face), AccumulateGrad for leaves, saved tensors, hook handles, and realisation — collecting
the IR a set of pending values needs into one graph, optimising and executing it.

Every Node records the equations its op emitted and, per input variable, an entry
`(var, gsrc, vsrc)`: where gradients go (a Node, an AccumulateGrad, or None) and where the
value comes from (a numpy array, or the Node that computes it)."""
from __future__ import annotations

import itertools
import re
import weakref
from typing import Any, Callable

from ..ir.core import Eqn, Lit, Var

FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")

# A pending leaf value updated in place this many times in a row is computed right away, so
# chains of optimizer updates never grow without bound.
MAX_LEAF_CHAIN = 16

_handles = itertools.count()
_new = object.__new__


class RemovableHandle:
    """Returned by `register_hook` & co.; `.remove()` unregisters the hook."""
    __slots__ = ("_table", "id")

    def __init__(self, table: dict):
        self._table = table
        self.id = next(_handles)

    def remove(self) -> None:
        self._table.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def add_hook(table: dict, fn: Callable) -> RemovableHandle:
    h = RemovableHandle(table)
    table[h.id] = fn
    return h


def hook_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def held(t: Any) -> Any:
    """How a graph holds a tensor it saved: views (tensor.register_view) weakly, or an in-place
    change of their base would remake every view a graph saved, not just the user's (the
    graph reads the saved variable, not the tensor)."""
    if t is not None and t.__class__ is not weakref.ref and t._x is not None \
            and "view" in t._x:
        return weakref.ref(t)
    return t


class SavedTensor:
    """A value an op keeps for its backward: the tensor, its version when saved, and what a
    `saved_tensors_hooks` pack function made of it. It does not point back at its node (the
    node is passed in when needed), so a recorded graph holds no reference cycle and is freed
    as soon as it is dropped, without waiting for the cyclic garbage collector."""
    __slots__ = ("_tensor", "var", "vc", "version", "slot", "is_output", "packed", "unpack")

    def __init__(self, tensor: Any, var: Var, vc: list, slot: int | str, node: Node,
                 hooks: tuple | None):
        self.var = var
        self.vc = vc
        self.version = vc[0]
        self.slot = slot                       # argument index, or "result"
        is_output = self.is_output = slot == "result"
        self.unpack = None
        self.packed = None
        self._tensor = None if is_output else held(tensor)
        if hooks is not None:
            pack, self.unpack = hooks
            self.packed = pack(tensor if tensor is not None else self.materialize(node))

    @staticmethod
    def plain(tensor: Any, var: Var, vc: list, slot: int | str,
              version: int | None = None) -> SavedTensor:
        """A SavedTensor made without `saved_tensors_hooks` (`tensor` None for a result),
        of the tensor at `version` (by default, its current one)."""
        s = _new(SavedTensor)
        s._tensor = held(tensor)
        s.var = var
        s.vc = vc
        s.version = vc[0] if version is None else version
        s.slot = slot
        s.is_output = tensor is None
        s.packed = s.unpack = None
        return s

    @property
    def tensor(self) -> Any:
        """The tensor saved (None for a result, or a view since dropped)."""
        t = self._tensor
        return t() if isinstance(t, weakref.ref) else t

    @tensor.setter
    def tensor(self, t: Any) -> None:
        self._tensor = held(t)

    def materialize(self, node: Node) -> Any:
        """The saved value as a Tensor (outputs of `node`, the node that saved it, come back
        as a new Tensor, as in PyTorch; so does a view since dropped, without a history)."""
        t = self.tensor
        if t is not None:
            return t
        from .tensor import Tensor
        t = Tensor._from_var(self.var, node, node if node.grad and self.is_output else None)
        t._vc = self.vc
        return t

    def unpacked(self, node: Node) -> Any:
        if self.unpack is not None:
            return self.unpack(self.packed)
        return self.materialize(node)


class _Extras:
    """What few nodes have: hooks, retained gradients, a Function context, a leaf chain,
    values saved through saved_tensors_hooks."""
    __slots__ = ("pre_hooks", "post_hooks", "tensor_hooks", "retains", "fn_ctx", "leaf_chain",
                 "hooked")

    def __init__(self) -> None:
        self.pre_hooks: dict | None = None
        self.post_hooks: dict | None = None
        self.tensor_hooks: dict | None = None   # var id -> {handle id: fn}
        self.retains: dict | None = None        # var id -> Tensor (retain_grad)
        self.fn_ctx: Any = None                 # autograd.Function context
        self.leaf_chain = 0                     # > 0: computes a leaf's value updated in place
        self.hooked = False                     # some saved value has an unpack hook


def _extra(name: str, default: Any) -> property:
    def get(self: Node) -> Any:
        x = self.x
        return default if x is None else getattr(x, name)

    def set(self: Node, value: Any) -> None:
        if self.x is None:
            self.x = _Extras()
        setattr(self.x, name, value)
    return property(get, set)


class Inplace:
    """Counts in-place changes to any tensor (`bump`). A node records the count when it is
    recorded; if it is still the same at backward, no tensor it saved can have changed, and
    the per-tensor version checks are skipped."""
    epoch = 0

    @staticmethod
    def bump(vc: list) -> None:
        vc[0] += 1
        Inplace.epoch += 1


def plain_extras(x: _Extras) -> bool:
    """Whether what a node has beyond the common case leaves it to the one-graph backward: at
    most a Function context kept as a dict (pow's exponent)."""
    return not (x.pre_hooks or x.post_hooks or x.tensor_hooks or x.retains or x.leaf_chain
                or x.hooked or x.fn_ctx is not None and type(x.fn_ctx) is not dict)


class Node:
    """One recorded Tensor op. When it requires grad it is the `grad_fn` of its outputs."""
    __slots__ = ("_eqns", "tpl", "src", "args", "out_vars", "values", "name_", "grad",
                 "_saved", "freed", "sig", "epoch", "x", "w", "tp", "__weakref__")

    # No __init__: `Node()` makes an empty one, a third cheaper than `object.__new__(Node)`
    # (recording's fast path fills the slots itself: tensor_record._replay1); `make` fills it.
    @staticmethod
    def make(eqns: list | None, args: list, out_vars: list, grad: bool, name: str = "",
             tpl: tuple | None = None, src: str | None = None) -> Node:
        self = Node()
        self._eqns = eqns
        self.tpl = tpl          # the template a node was recorded from (tensor_record.record)
        self.src = src          # the user's line that recorded it
        self.args = args
        self.out_vars = out_vars
        self.grad = grad
        self.name_ = name
        self.values: dict[int, Any] | None = None   # var id -> computed value
        self._saved: Any = None     # list of SavedTensor, or their fields (see saved)
        self.freed = False
        self.sig: int | None = None             # what determines the IR (tensor_record.record)
        self.epoch = Inplace.epoch
        self.x: _Extras | None = None
        self.w = -1     # a mark of the last walk that numbered it (autograd_exec)
        # (tp: its reference in the key of the last tape_walk that marked it, set with w)
        return self

    @property
    def saved(self) -> list[SavedTensor] | None:
        """What the op's backward reads. Recording keeps their fields in one flat tuple, five
        per value (see tensor_record._save: fewer objects per op); they become SavedTensors
        when first asked for."""
        raw = self._saved
        if type(raw) is tuple and raw:
            raw = self._saved = [SavedTensor.plain(*raw[i:i + 3], raw[i + 4], raw[i + 3])
                                 for i in range(0, len(raw), 5)]
        return raw

    @saved.setter
    def saved(self, saved: list[SavedTensor] | None) -> None:
        self._saved = saved

    pre_hooks = _extra("pre_hooks", None)
    post_hooks = _extra("post_hooks", None)
    tensor_hooks = _extra("tensor_hooks", None)
    retains = _extra("retains", None)
    fn_ctx = _extra("fn_ctx", None)
    leaf_chain = _extra("leaf_chain", 0)
    hooked = _extra("hooked", False)

    @property
    def eqns(self) -> list:
        """The op's equations. A node recorded from a cached template makes them only when
        asked: a graph recognised by its signatures never needs them."""
        eqns = self._eqns
        if eqns is None:
            eqns = self._eqns = instantiate(self.tpl, self.args, self.out_vars, self.src)
        return eqns

    def has_eqns(self) -> bool:
        eqns = self._eqns
        return bool(eqns) if eqns is not None else bool(self.tpl[1])

    @eqns.setter
    def eqns(self, eqns: list) -> None:
        self._eqns = eqns
        self.tpl = None

    # -- the grad_fn face
    def name(self) -> str:
        return self.name_

    @property
    def next_functions(self) -> tuple:
        out = []
        for var, gsrc, _ in self.args:
            if var is None:
                continue
            if isinstance(gsrc, Node):
                out.append((gsrc, _out_index(gsrc, var)))
            else:
                out.append((gsrc, 0))
        return tuple(out)

    @property
    def requires_grad(self) -> bool:
        return self.grad

    def register_hook(self, fn: Callable) -> RemovableHandle:
        """`fn(grad_inputs, grad_outputs)` after this node computed its gradients."""
        if self.post_hooks is None:
            self.post_hooks = {}
        return add_hook(self.post_hooks, fn)

    def register_prehook(self, fn: Callable) -> RemovableHandle:
        """`fn(grad_outputs)` before this node computes its gradients."""
        if self.pre_hooks is None:
            self.pre_hooks = {}
        return add_hook(self.pre_hooks, fn)

    def __repr__(self) -> str:
        return f"<{self.name_} object at {hex(id(self))}>"


def instantiate(tpl: tuple, entries: list, out_vars: list, source: str | None,
                env: dict | None = None) -> list:
    """Copy a template's equations (see tensor_record.record) onto an op's input entries and output
    variables, with fresh variables for its intermediates; `env` (if given) is filled with
    template variable id -> the copy's variable."""
    in_ids, teqns, touts = tpl[0], tpl[1], tpl[2]
    if env is None:
        env = {}
    for i, e in zip(in_ids, entries, strict=False):
        env[i] = e[0]
    for v, o in zip([v for v in touts if v is not None], out_vars, strict=True):
        env[v.id] = o
    eqns = []
    for e in teqns:
        ins = [a if type(a) is Lit else env[a.id] for a in e.inputs]
        outs = []
        for v in e.outvars:
            o = env.get(v.id)
            if o is None:
                o = env[v.id] = Var(v.aval)
            outs.append(o)
        eqns.append(Eqn(e.op, ins, outs, e.params, source))
    return eqns


def rename_input(node: Node, var: Var, gsrc: Any, new: Var, value: Any) -> None:
    """Make `node` read its input `var` from `gsrc` as variable `new`, holding `value`: a
    second leaf of one variable gets a variable of its own (see autograd_exec._own_slot)."""
    args = list(node.args)
    for j, (v, g, _) in enumerate(args):
        if v is var and g is gsrc:
            args[j] = (new, gsrc, value)
    node.args = tuple(args)
    eqns = node._eqns
    if eqns is not None:    # (else made from the entries when asked for)
        node._eqns = [e if all(a is not var for a in e.inputs) else
                      Eqn(e.op, [new if a is var else a for a in e.inputs], e.outvars, e.params,
                          e.source) for e in eqns]


def _out_index(node: Node, var: Var) -> int:
    for i, v in enumerate(node.out_vars):
        if v is var:
            return i
    return 0


def saved_attribute(node: Node, what: str) -> Any:
    """`grad_fn._saved_self` / `_saved_other` / `_saved_result` / `_saved_exponent` ..."""
    names = SAVED_NAMES.get(node.name_.rsplit("Backward", 1)[0], {})
    if what not in names or node.saved is None:
        raise AttributeError(f"'{node.name_}' object has no attribute '_saved_{what}'")
    slot = names[what]
    if isinstance(slot, tuple):      # a non-tensor attribute, kept in fn_ctx
        return node.fn_ctx.get(slot[1]) if isinstance(node.fn_ctx, dict) else None
    if node.freed:
        raise RuntimeError(FREED_MSG)
    for s in node.saved:
        if s.slot == slot:
            return s.materialize(node)
    raise AttributeError(f"'{node.name_}' object has no attribute '_saved_{what}'")


# op stem -> which values its backward keeps: argument indices, or "result"
SAVED = {
    "Mul": (0, 1), "Div": (0, 1), "Pow": (0,), "Exp": ("result",), "Tanh": ("result",),
    "Sigmoid": ("result",), "Log": (0,), "Log1P": (0,), "Sqrt": ("result",), "Abs": (0,),
    "Relu": ("result",), "Sin": (0,), "Cos": (0,), "Tan": ("result",), "Mm": (0, 1),
    "Dot": (0, 1), "Max": (0, "result"), "Min": (0, "result"), "Maximum": (0, 1),
    "Minimum": (0, 1), "Prod": (0, "result"), "Erf": (0,), "Expm1": ("result",),
    "Softmax": ("result",), "LogSoftmax": ("result",), "Logsumexp": (0, "result"),
    "Where": (0,), "Clamp": (0,), "Square": (0,), "Reciprocal": ("result",), "Gelu": (0,),
    "MseLoss": (0, 1), "NllLoss": (0, 1), "BinaryCrossEntropyWithLogits": (0, 1),
    "Take": (1,), "Rsub": (), "Matmul": (0, 1),
}
SAVED_NAMES = {
    "Mul": {"self": 0, "other": 1}, "Div": {"self": 0, "other": 1},
    "Pow": {"self": 0, "exponent": ("ctx", "exponent")}, "Exp": {"result": "result"},
    "Tanh": {"result": "result"}, "Sigmoid": {"result": "result"}, "Log": {"self": 0},
    "Sqrt": {"result": "result"}, "Abs": {"self": 0}, "Relu": {"result": "result"},
    "Sin": {"self": 0}, "Cos": {"self": 0}, "Mm": {"self": 0, "mat2": 1},
    "Max": {"self": 0, "result": "result"}, "Min": {"self": 0, "result": "result"},
    "Maximum": {"self": 0, "other": 1}, "Minimum": {"self": 0, "other": 1},
    "Prod": {"self": 0, "result": "result"}, "Log1P": {"self": 0}, "Erf": {"self": 0},
    "Softmax": {"result": "result"}, "LogSoftmax": {"result": "result"},
}


def _saved_property(what: str) -> property:
    return property(lambda node: saved_attribute(node, what))


# `grad_fn._saved_self` & co. are properties, not a Node.__getattr__: a class with __getattr__
# has every attribute read go the slow way (CPython does not specialise its loads), and the
# walks and the backward read nodes' attributes many times per node.
for _what in sorted({what for names in SAVED_NAMES.values() for what in names}):
    setattr(Node, f"_saved_{_what}", _saved_property(_what))


def grad_edges(starts: list) -> tuple[dict[int, int], dict[int, Any]]:
    """The gradient graph below `starts` (nodes or AccumulateGrads), following each node's
    differentiable inputs (its `next_functions`): (id -> how many edges lead to it, id ->
    the node or AccumulateGrad)."""
    deps: dict[int, int] = {}
    nodes: dict[int, Any] = {}
    stack = list(starts)
    for s in starts:
        nodes[id(s)] = s
    while stack:
        n = stack.pop()
        if isinstance(n, AccumulateGrad):
            continue
        for var, gsrc, _ in n.args:
            if gsrc is None or var is None:
                continue
            k = id(gsrc)
            deps[k] = deps.get(k, 0) + 1
            if k not in nodes:
                nodes[k] = gsrc
                stack.append(gsrc)
    return deps, nodes


def check_saved(n: Node) -> None:
    if not n.saved:
        return
    if n.freed:
        raise RuntimeError(FREED_MSG)
    for s in n.saved:
        if s.vc[0] != s.version:
            aval = s.var.aval
            kind = _TYPE_NAMES.get(str(aval.dtype), str(aval.dtype))
            owner = ""
            if s.is_output:
                owner = f", which is output 0 of {strip_backward(n.name_)},"
            elif s.tensor is not None and s.tensor._fn is not None:
                owner = f", which is output 0 of {strip_backward(s.tensor._fn.name_)},"
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [tg.{kind}Tensor {list(aval.shape)}]{owner} is at version "
                f"{s.vc[0]}; expected version {s.version} instead. Hint: enable anomaly "
                "detection to find the operation that failed to compute its gradient, with "
                "torch.autograd.set_detect_anomaly(True).")


_TYPE_NAMES = {"float32": "Float", "float64": "Double", "int64": "Long", "int32": "Int",
               "bool": "Bool", "float16": "Half", "int8": "Char", "uint8": "Byte"}


class AccumulateGrad:
    """The node a leaf tensor's gradient flows into; it adds the gradient to `.grad`. A
    leaf's graphs share it while any of them (or the user) holds it (Tensor._gsrc)."""
    __slots__ = ("variable", "pre_hooks", "post_hooks", "hooked", "checked", "__weakref__")

    def __init__(self, variable: Any):
        self.variable = variable
        self.pre_hooks: dict | None = None
        self.post_hooks: dict | None = None
        self.hooked = False     # some hook was registered on it
        self.checked = -1       # the tape it was last found alive on (see Tensor._gsrc)

    def name(self) -> str:
        return "AccumulateGrad"

    next_functions = ()
    requires_grad = True
    grad = True

    def register_hook(self, fn: Callable) -> RemovableHandle:
        """`fn((), (grad,))` after the gradient `grad` of this backward was accumulated."""
        if self.post_hooks is None:
            self.post_hooks = {}
        self.hooked = True
        return add_hook(self.post_hooks, fn)

    def register_prehook(self, fn: Callable) -> RemovableHandle:
        """`fn((grad,))` before `grad` (after the leaf's tensor hooks) is accumulated; it may
        return a tuple replacing it (`(None,)`: nothing is accumulated)."""
        if self.pre_hooks is None:
            self.pre_hooks = {}
        self.hooked = True
        return add_hook(self.pre_hooks, fn)

    def __repr__(self) -> str:
        return f"<AccumulateGrad object at {hex(id(self))}>"


def strip_backward(name: str) -> str:
    return re.sub(r"Backward\d*$", "", name)

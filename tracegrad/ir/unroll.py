"""Unrolling scans for code that has no loops (the native backend's fusion planner).

A scan's stacked outputs (`ys`, the VJP's residuals) are kept as their steps' separate values
for as long as what reads them works step by step: elementwise equations on them run per step,
and a later scan reads its step inputs from them directly. Only a reader that needs the whole
array (a matmul of the stacked steps, an output) gets them concatenated. So the unrolled
forward and reverse loops of a VJP meet value by value, as the trace of a Python loop does,
and fusion sees one chain instead of `length` kernels cut apart by slices and concatenates.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .core import Atom, Aval, Eqn, Graph, Lit, Var
from .ops import OPS

_PER_STEP = {"unary", "binary", "select", "compare"}    # kinds that work element by element


def row_of_slice(e: Eqn) -> int | None:
    """t when `e` is a `slice` of exactly row t (along axis 0, all of the other axes)."""
    if e.op != "slice":
        return None
    index = e.params["index"]
    start, stop, step = index[0]
    if stop != start + 1 or step != 1 or any(
            r != (0, d, 1) for r, d in zip(index[1:], e.inputs[0].aval.shape[1:])):
        return None
    return start


class _Steps:
    """A stacked value as its steps' values: `parts[t]` is row `t` (its aval `aval.shape[1:]`)."""
    __slots__ = ("parts", "aval", "whole", "origin")

    def __init__(self, parts: list[Atom], aval: Aval, origin: Eqn | None = None):
        self.parts = parts
        self.aval = aval
        self.whole: Atom | None = None     # the concatenation, once something needed it
        self.origin = origin               # the concatenate that makes it, if one does


def has_scan(graph: Graph) -> bool:
    return any(e.op == "scan" for e in graph.eqns)


def split_inputs(e: Eqn) -> tuple[list[Atom], list[Atom], list[Atom]]:
    """A scan equation's inputs as (consts, carry, stacked xs)."""
    c, k = e.params["n_consts"], e.params["n_carry"]
    return list(e.inputs[:c]), list(e.inputs[c:c + k]), list(e.inputs[c + k:])


def steps_of(params: dict) -> range:
    """The iterations of a scan in the order they run."""
    n = params["length"]
    return range(n - 1, -1, -1) if params.get("reverse") else range(n)


def unroll_scans(graph: Graph, keep: Callable[[Eqn], bool] | None = None) -> Graph:
    """`graph` with every scan (nested ones too) written out as `length` copies of its body,
    with fresh variables. Step t of a scan reads row t of a stacked input: the value step t of
    an earlier scan made, or a `slice` of an array. `keep`: the scans to leave as they are
    (their bodies too), reading whole arrays, unless one of their xs is known by steps
    (stacked per-step values, such as each layer's weights: unrolled, each step reads its own
    where a loop would read a stacked copy). Returns `graph` itself when it holds no scan."""
    if not has_scan(graph):
        return graph
    return _Unroller(graph, {}, keep).run()


class _Unroller:
    def __init__(self, graph: Graph, flat: dict[int, Graph],
                 keep: Callable[[Eqn], bool] | None = None):
        self.graph = graph
        self.keep = keep
        self.flat = flat        # id(body) -> the body unrolled, for the bodies met in this call
        self.eqns: list[Eqn] = []
        self.constvars, self.consts = list(graph.constvars), list(graph.consts)
        self.env: dict[int, Atom | _Steps] = {}
        self.made: dict[int, Eqn] = {}     # var id -> the copied equation making it

    def run(self) -> Graph:
        for e in self.graph.eqns:
            if e.op == "scan" and (self.keep is None or not self.keep(e) or self.by_steps(e)):
                self.scan(e)
            elif e.op == "concatenate" and self.rows(e):
                pass
            elif not any(type(a) is Var and type(self.env.get(a.id)) is _Steps
                         for a in e.inputs):
                self.copy(e)
            elif not (self.per_step(e) or self.one_row(e)):
                self.copy(e)
        outs = [self.whole(a) for a in self.graph.outvars]
        return Graph(self.graph.invars, self.eqns, outs, self.constvars, self.consts)

    def by_steps(self, e: Eqn) -> bool:
        """Whether a step input of scan `e` is known by steps (a constant or carry so known
        is concatenated once either way)."""
        return any(type(a) is Var and type(self.env.get(a.id)) is _Steps
                   for a in split_inputs(e)[2])

    # -- values ---------------------------------------------------------------------------------

    def whole(self, a: Atom) -> Atom:
        """`a` as one value (its steps concatenated when it is known by steps)."""
        if type(a) is not Var:
            return a
        got = self.env.get(a.id, a)
        if type(got) is not _Steps:
            return got
        if got.whole is None:
            if got.origin is not None:     # the concatenate the steps were read from
                self.copy(got.origin)
                got.whole = got.origin.outvars[0]
            else:
                got.whole = self.concatenate(got)
        return got.whole

    def concatenate(self, s: _Steps) -> Atom:
        a, parts = s.aval, s.parts
        if all(type(o) is Lit and o.key() == parts[0].key() for o in parts):
            return self.emit("full", [], a, {"shape": a.shape, "value": parts[0].value.item(),
                                             "dtype": a.dtype})
        one = Aval((1,) + a.shape[1:], a.dtype)
        rows = [self.emit("reshape", [o], one, {"shape": one.shape}) for o in parts]
        return rows[0] if len(rows) == 1 else self.emit("concatenate", rows, a, {"axis": 0})

    def row(self, x: Atom, t: int, aval: Aval, source: str | None) -> Atom:
        """Row `t` of the stacked value `x` (aval: a row's)."""
        got = self.env.get(x.id) if type(x) is Var else None
        if type(got) is _Steps:
            return got.parts[t]
        x = self.whole(x)
        index = ((t, t + 1, 1),) + tuple((0, d, 1) for d in aval.shape)
        part = self.emit("slice", [x], Aval((1,) + aval.shape, aval.dtype), {"index": index},
                         source)
        return self.emit("reshape", [part], aval, {"shape": aval.shape}, source)

    def emit(self, op: str, ins: list[Atom], aval: Aval, params: dict,
             source: str | None = None) -> Var:
        v = Var(aval)
        self.eqns.append(Eqn(op, ins, [v], params, source))
        return v

    # -- equations ------------------------------------------------------------------------------

    def copy(self, e: Eqn) -> None:
        ins = [self.whole(a) for a in e.inputs]
        same = all(x is y for x, y in zip(ins, e.inputs))
        made = e if same else Eqn(e.op, ins, e.outvars, e.params, e.source)
        self.eqns.append(made)
        for v in e.outvars:
            self.made[v.id] = made      # (with the inputs as written: `rows` reads them)

    def rows(self, e: Eqn) -> bool:
        """A concatenate along axis 0 of one-row values (the per-step inputs a rolled loop
        stacks, e.g. each layer's weights): known by its rows, concatenated only if something
        needs the whole array. False (nothing done) for other concatenates."""
        out = e.outvars[0].aval
        if e.params.get("axis") != 0 or len(e.inputs) < 2 or \
                any(a.aval.shape[:1] != (1,) for a in e.inputs):
            return False
        row = Aval(out.shape[1:], out.dtype)
        parts: list[Atom] = []
        for a in e.inputs:
            a = self.whole(a)
            src = self.made.get(a.id) if type(a) is Var else None
            if src is not None and src.op == "reshape" and src.inputs[0].aval.shape == row.shape:
                parts.append(src.inputs[0])       # reshape(w, (1, ...)) of a row w
            else:
                parts.append(self.emit("reshape", [a], row, {"shape": row.shape}, e.source))
        self.env[e.outvars[0].id] = _Steps(parts, out, e)
        return True

    def one_row(self, e: Eqn) -> bool:
        """`slice` of one row (along axis 0, all of the others) of a value known by steps: that
        step's value, reshaped. False (nothing written) for other equations."""
        t = row_of_slice(e)
        if t is None:
            return False
        part = self.env[e.inputs[0].id].parts[t]
        if type(part) is Lit:
            return False
        self.eqns.append(Eqn("reshape", [part], e.outvars, {"shape": e.outvars[0].aval.shape},
                             e.source))
        return True

    def per_step(self, e: Eqn) -> bool:
        """Write an equation on values known by steps as one equation per step: elementwise
        ones, a transpose, reshape or reduction that keeps the leading (steps') axis, and a
        batch of matrix products. False (nothing written) for others, broadcasting, and
        inputs that are whole arrays."""
        if len(e.outvars) != 1:
            return False
        out = e.outvars[0].aval
        if not out.shape:
            return False
        row = Aval(out.shape[1:], out.dtype)
        n = out.shape[0]
        params = e.params
        if OPS[e.op].kind not in _PER_STEP:
            # batched work on the steps' rows (fission's, e.g. each layer's W.T): per row
            x = e.inputs[0]
            if e.op == "transpose" and params["perm"][0] == 0:
                params = {"perm": tuple(p - 1 for p in params["perm"][1:])}
            elif e.op == "reshape" and x.aval.shape[:1] == (n,):
                params = {"shape": row.shape}
            elif OPS[e.op].kind == "reduce" and "axes" in params and \
                    0 not in params["axes"] and x.aval.shape[:1] == (n,):
                params = {"axes": tuple(a - 1 for a in params["axes"])}
            elif e.op == "matmul" and len(out.shape) == 3 and \
                    all(a.aval.ndim == 3 for a in e.inputs):    # a batch of matrix products
                params = {}
            else:
                return False
        ins: list[_Steps | Lit] = []
        for a in e.inputs:
            if type(a) is Lit:
                if a.aval.shape:
                    return False
                ins.append(a)
                continue
            s = self.env.get(a.id)
            if type(s) is not _Steps or s.aval.shape[:1] != (n,) or \
                    (params is e.params and s.aval.shape != out.shape) or \
                    any(type(o) is Lit for o in s.parts):
                return False
            ins.append(s)
        parts = []
        for t in range(n):
            parts.append(self.emit(e.op, [x if type(x) is Lit else x.parts[t] for x in ins],
                                   row, params, e.source))
        self.env[e.outvars[0].id] = _Steps(parts, out)
        return True

    def scan(self, e: Eqn) -> None:
        p = e.params
        body = p["body"]
        if has_scan(body):
            hit = self.flat.get(id(body))
            if hit is None:
                hit = self.flat[id(body)] = _Unroller(body, self.flat, self.keep).run()
            body = hit
        env: dict[int, Atom] = {}
        for v, c in zip(body.constvars, body.consts):
            env[v.id] = w = Var(v.aval)
            self.constvars.append(w)
            self.consts.append(c)
        const_in, carry, xs = split_inputs(e)
        const_in, carry = [self.whole(a) for a in const_in], [self.whole(a) for a in carry]
        k, n = len(carry), p["length"]
        x_avals = body.in_avals[len(const_in) + k:]
        ys: list[list[Atom]] = [[None] * n for _ in body.outvars[k:]]   # type: ignore
        for t in steps_of(p):
            x_t = [self.row(x, t, a, e.source) for x, a in zip(xs, x_avals)]
            outs = _inline(body, const_in + carry + x_t, env, self.eqns, e.source)
            carry = outs[:k]
            for y, o in zip(ys, outs[k:]):
                y[t] = o
        for v, a in zip(e.outvars[:k], carry):
            self.env[v.id] = a
        for v, parts in zip(e.outvars[k:], ys):
            self.env[v.id] = _Steps(parts, v.aval)


def _inline(body: Graph, args: Sequence[Atom], env: dict[int, Atom], eqns: list[Eqn],
            source: str | None) -> list[Atom]:
    """Append a copy of `body`'s equations reading `args` (and `env`, its constants); return
    the atoms its outputs are."""
    env = dict(env)
    for v, a in zip(body.invars, args):
        env[v.id] = a

    def read(a: Atom) -> Atom:
        return a if type(a) is Lit else env[a.id]

    for e in body.eqns:
        outs = [Var(v.aval) for v in e.outvars]
        for v, o in zip(e.outvars, outs):
            env[v.id] = o
        eqns.append(Eqn(e.op, [read(a) for a in e.inputs], outs, e.params, e.source or source))
    return [read(a) for a in body.outvars]

"""Graph templates: the graph a loop's trace makes at a new length, written from the graphs
made for two other lengths instead of by the passes that made them.

A function traced with a Python loop of T steps gives a graph of T equal blocks. Rolling,
differentiating and preparing that graph (roll_loops, backward_pass, the Program) costs about
a millisecond each new T, though what comes out differs only in a few integers (the scan's
length, the stacked shapes, the bounds of the slice feeding the loop) and in the literals
the trace had outside its loop (a mean's 1/T). Traces of one loop have one form
(ir.loop_form); for graphs made from them, `Template.derive(g1, n1, lits1, g2, n2, lits2)`
writes every integer in which they differ (params and shapes) as a * n + b and every literal
that differs as the trace literal it is; `instantiate(n, lits)` writes the graph for another
count. Derivation refuses anything else that differs (an op, a float param, a body graph, a
wiring), and a loop or shape that shrinks as the count grows, so a template is only made
from graphs equal but for integers linear in the count and the trace's own literals."""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from .core import Eqn, Graph, Lit, Var
from .fission import aval
from .interpret import program, restep, shapeless
from .loops import scans_of


class _Mismatch(Exception):
    pass


class Template:
    """A graph with some integers written as a * n + b and some literals taken from the
    traced function's literals outside its loop (see the module docstring)."""
    __slots__ = ("graph", "ints", "n0", "slots", "lits0", "varied", "changed", "_redo",
                 "_scans", "_bounds", "_retype")

    def __init__(self, graph: Graph, ints: dict, n0: int, slots: dict, lits0: list):
        self.graph = graph          # the graph for count n0
        self.ints = ints            # (equation index, where) -> (a, b); where: see _walk
        self.n0 = n0
        self.slots = slots          # (equation index, ("in", input)) -> which trace literal
        self.lits0 = lits0          # the trace's literals (outside its loop) for graph
        self.varied = set(slots.values())
        # the equations whose params or types change with n, or that read a value whose
        # type does: their interpreter steps are made again for each n
        eqns = graph.eqns
        changed = {at for at, _ in ints}
        retyped = {v.id for (at, where) in ints if where[0] == "out"
                   for v in eqns[at].outvars}
        changed.update(at for at, e in enumerate(eqns)
                       if any(type(a) is Var and a.id in retyped for a in e.inputs))
        self.changed = sorted(changed)
        self._redo: list[tuple] | None = None   # see _prepare
        self._scans: tuple = (0, [])
        self._bounds: list[tuple] = []
        self._retype: list[tuple] = []

    @classmethod
    def derive(cls, g1: Graph, n1: int, lits1: list, g2: Graph, n2: int, lits2: list
               ) -> Template | None:
        """The template of which g1 is the graph for n1 and g2 the graph for n2 (whose
        traces had the literals lits1 and lits2 outside their loops), or None when they
        differ other than in integers a * n + b (integer a and b) and in literals that are,
        in both, one and the same literal of the traces."""
        if n1 == n2 or len(lits1) != len(lits2):
            return None
        diffs: dict = {}
        lit_diffs: dict = {}
        try:
            _compare(g1, g2, diffs, lit_diffs)
        except _Mismatch:
            return None
        ints = {}
        for where, (v1, v2) in diffs.items():
            a, r = divmod(v2 - v1, n2 - n1)
            if r:
                return None
            if a < 0 and (where[1][0] == "out" or where[1][-1] == "length"):
                # a loop or shape shrinking as this one grows: two loops sharing steps (a
                # fixed-length one rolled together with this one's first steps), which a
                # longer count turns into another graph
                return None
            ints[where] = (a, v1 - a * n1)
        _check_lits(lits1, "derive")
        _check_lits(lits2, "derive")
        slots = {}
        for where, (x1, x2) in lit_diffs.items():
            k1, k2 = x1.key(), x2.key()
            js = [j for j, (y1, y2) in enumerate(zip(lits1, lits2))
                  if y1.key() == k1 and y2.key() == k2]
            if len(js) != 1:      # made from literals' values, or which one is unclear
                return None
            slots[where] = js[0]
        return cls(g1, ints, n1, slots, list(lits1))

    def matches(self, graph: Graph, n: int, lits: list) -> bool:
        """Whether `graph` is exactly this template's graph for `n` and literals `lits`."""
        diffs: dict = {}
        lit_diffs: dict = {}
        try:
            _compare(self.graph, graph, diffs, lit_diffs)
        except _Mismatch:
            return False
        if set(diffs) - set(self.ints) or set(lit_diffs) - set(self.slots) or \
                len(lits) != len(self.lits0) or any(
                    j not in self.varied and a.key() != b.key()
                    for j, (a, b) in enumerate(zip(lits, self.lits0))):
            return False
        for where, (a, b) in self.ints.items():
            want = a * n + b
            got = diffs.get(where, (None, a * self.n0 + b))[1]
            if got != want:
                return False
        for where, j in self.slots.items():
            got = lit_diffs[where][1] if where in lit_diffs else self.lits0[j]
            if got.key() != lits[j].key():
                return False
        return True

    def fits(self, lits: list, form: Any) -> bool:
        """Whether the template can write the graph of a trace with literals `lits` (and
        loop form `form`): each literal it did not see change must be as it was (one equal
        in the graphs it was made from may be anywhere in them), and one it saw change
        must not now equal another literal of the trace, nor one of the loop or of a map
        after it (roll_loops tells equations apart by their literals' values: an equal one
        can join a step to the loop or to the map)."""
        if len(lits) != len(self.lits0):
            return False
        keys = [a.key() for a in lits]
        for j, (k, old) in enumerate(zip(keys, self.lits0)):
            if j not in self.varied:
                if k != old.key():
                    return False
            elif keys.count(k) > 1 or any(k == v for _, v in form.inside) or \
                    k in form.valued:
                return False
        return True

    def instantiate(self, n: int, lits: list) -> Graph:
        """The graph for count `n` and literals `lits` (fresh variables; everything else
        shared), with its interpreter Program. The Program is made at once, from the
        template's with the steps that change made again; the graph's equations are written
        when first read (a graph only ever interpreted, as most new lengths are, never needs
        them). Made for counts at least the least one the template was checked with (jit
        keeps to that); a count giving a negative size or a loop of no steps raises."""
        _check_lits(lits, "instantiate", self.lits0)
        if self._redo is None:
            self._prepare()
        for at, where, a, b in self._bounds:
            if a * n + b < (1 if where[-1] == "length" else 0):
                raise ValueError(f"Template.instantiate: count {n} gives {where[-1]} "
                                 f"{a * n + b} in equation {at} ({self.graph.eqns[at].op})")
        retyped = {vid: aval(_resized(shape, dims, n), dtype)     # template variable id ->
                   for vid, shape, dims, dtype in self._retype}   # its new type
        probes: dict[int, Eqn] = {}      # stand-ins for the equations whose steps change
        fns: dict[int, Any] = {}         # or those steps' functions, made directly
        for at, e, fn, changes in self._redo:
            params = e.params
            for path, a, b in changes:
                params = _set(params, path, a * n + b)
            if fn is not None:
                made = restep(e, fn, params, [
                    (retyped[a.id] if a.id in retyped else a.aval).shape if type(a) is Var
                    else a.aval.shape for a in e.inputs] if e.op == "matmul" else None)
                if made is not None:
                    fns[at] = made
                    continue
            ins = [Var(retyped[a.id]) if type(a) is Var and a.id in retyped else a
                   for a in e.inputs]
            outs = [Var(retyped.get(v.id, v.aval)) for v in e.outvars]
            probes[at] = Eqn(e.op, ins, outs, params, e.source)
        literals = [(at, k, lits[j]) for (at, (_, k)), j in self.slots.items()]
        for at, k, lit in literals:
            probe = probes.get(at)
            if probe is not None:
                probe.inputs[k] = lit
        graph = _Written(self, n, list(lits))
        others, scans = self._scans
        graph.__dict__["_scans"] = (others, [(a * n + b, body) for a, b, body in scans])
        graph.__dict__["_program"] = program(self.graph).renewed(
            graph, probes, [(at, k, lit.value) for at, k, lit in literals], fns)
        return graph

    def _values(self, n: int) -> dict[int, list]:
        """Per equation position, its (where, value) integers for count `n` (see `_walk`)."""
        by_eqn: dict[int, list] = {}
        for (at, where), (a, b) in self.ints.items():
            by_eqn.setdefault(at, []).append((where, a * n + b))
        return by_eqn

    def _prepare(self) -> None:
        """What instantiate reads, made once: which changed equations' steps must be made
        again at another count (those whose params change, or whose step depends on the
        shapes: a step that holds at any shape is shared, see interpret.shapeless; every
        equation's types are checked when the graph is written) with their params' integers;
        the types those steps read and make that change with the count; the sizes and
        lengths that must stay positive; its scans' lengths as a * n + b and bodies (what tiering's
        estimate weighs: ir.loops.scans_of)."""
        eqns = self.graph.eqns
        changes: dict[int, list] = {}       # position -> its params' (path, a, b)
        resized: dict[int, dict] = {}       # position -> output -> its shape's (dim, a, b)
        for (at, where), (a, b) in self.ints.items():
            if where[0] == "param":
                changes.setdefault(at, []).append((where[1:], a, b))
            else:
                resized.setdefault(at, {}).setdefault(where[1], []).append((where[2], a, b))
        self._bounds = [(at, where, a, b) for (at, where), (a, b) in self.ints.items()
                        if where[0] == "out" or where[-1] == "length"]
        prog = program(self.graph)
        redo = []
        for at in self.changed:
            e = eqns[at]
            if at in changes or not shapeless(e):
                k = prog.made.get(id(e))
                redo.append((at, e, prog.steps[k][0] if type(k) is int else None,
                             changes.get(at, [])))
        # (those of every equation whose types change, not only the remade ones': a reused
        # step's output feeds a remade one)
        read = {a.id for _, e, _, _ in redo for a in e.inputs if type(a) is Var}
        read.update(v.id for _, e, _, _ in redo for v in e.outvars)
        self._retype = [(v.id, v.aval.shape, tuple(outs[k]), v.aval.dtype)
                        for at, outs in resized.items()
                        for k, v in enumerate(eqns[at].outvars) if k in outs and v.id in read]
        others, _ = scans_of(self.graph)
        self._scans = (others, [
            (*self.ints.get((at, ("param", "length")), (0, e.params["length"])),
             e.params["body"]) for at, e in enumerate(eqns) if e.op == "scan"])
        self._redo = redo       # last: instantiate prepares while it is None (threads may race)

    def _write(self, n: int, lits: list) -> Graph:
        """The graph for count `n` (see `instantiate`), its equations written out."""
        g = self.graph
        by_eqn = self._values(n)
        lits_of: dict[int, list] = {}
        for (at, (_, k)), j in self.slots.items():
            lits_of.setdefault(at, []).append((k, lits[j]))
        new: dict[int, Var] = {}
        invars = []
        for v in g.invars:
            w = new[v.id] = Var(v.aval)
            invars.append(w)
        constvars = []
        for v in g.constvars:
            w = new[v.id] = Var(v.aval)
            constvars.append(w)
        eqns = []
        for at, e in enumerate(g.eqns):
            ins = [new[a.id] if type(a) is Var else a for a in e.inputs]
            for k, lit in lits_of.get(at, ()):
                ins[k] = lit
            changes = by_eqn.get(at)
            if changes is None:
                outs = []
                for v in e.outvars:
                    w = new[v.id] = Var(v.aval)
                    outs.append(w)
                eqns.append(Eqn(e.op, ins, outs, e.params, e.source))
                continue
            shapes = [list(v.aval.shape) for v in e.outvars]
            params = e.params
            for where, value in changes:
                if where[0] == "out":
                    shapes[where[1]][where[2]] = value
                else:
                    params = _set(params, where[1:], value)
            outs = []
            for v, s in zip(e.outvars, shapes):
                w = new[v.id] = Var(aval(tuple(s), v.aval.dtype))
                outs.append(w)
            eqns.append(Eqn(e.op, ins, outs, params, e.source))
        outvars = [new[a.id] if type(a) is Var else a for a in g.outvars]
        return Graph(invars, eqns, outvars, constvars, list(g.consts))

    def give_program(self, graph: Graph) -> None:
        """Give `graph`, this template's graph for some n, its interpreter Program: the
        template's, with the steps that change made again (cheaper than building one)."""
        if "_program" not in graph.__dict__:
            graph.__dict__["_program"] = program(self.graph).respecialized(
                graph, self.changed, sorted((at, k) for at, (_, k) in self.slots))


def _resized(shape: tuple, dims: tuple, n: int) -> tuple:
    """`shape` with each (dim, a, b) of `dims` made a * n + b."""
    out = list(shape)
    for d, a, b in dims:
        out[d] = a * n + b
    return tuple(out)


_FIELDS = frozenset(("invars", "eqns", "outvars", "constvars", "consts"))


class _Written(Graph):
    """A template's graph for one count whose equations are written when first read
    (Template.instantiate): running it on the interpreter reads only its Program."""

    def __init__(self, template: Template, n: int, lits: list) -> None:
        self.__dict__["_source"] = (template, n, lits)

    def __getattr__(self, name: str) -> Any:
        if name not in _FIELDS:
            raise AttributeError(name)
        with _WRITING:      # (one writer: two would mix two sets of variables)
            d = self.__dict__
            if name not in d:
                template, n, lits = d["_source"]
                g = template._write(n, lits)
                for k in _FIELDS:
                    d[k] = getattr(g, k)
                del d["_source"]
            return d[name]


_WRITING = threading.Lock()


def _check_lits(lits: Any, what: str, like: list | None = None) -> None:
    """Raise unless `lits` is a list of Lit (as many as `like`, of the same types)."""
    if not isinstance(lits, (list, tuple)) or any(type(a) is not Lit for a in lits):
        raise TypeError(f"Template.{what}: literals must be a list of ir.Lit (loop_form's "
                        "third result)")
    if like is not None and (len(lits) != len(like) or
                             any(a.aval != b.aval for a, b in zip(lits, like))):
        raise ValueError(f"Template.{what}: expected {len(like)} literals of types "
                         f"{[str(b.aval) for b in like]}, got {[str(a.aval) for a in lits]}")


def _compare(g1: Graph, g2: Graph, diffs: dict, lit_diffs: dict) -> None:
    """Raise _Mismatch unless g2 is g1 with other integers and other literal inputs (of the
    same types); those go in `diffs` as (equation index, where) -> (value in g1, value in
    g2), and in `lit_diffs` as (equation index, ("in", input)) -> (literal in g1, in g2)."""
    if len(g1.eqns) != len(g2.eqns) or len(g1.invars) != len(g2.invars) or \
            len(g1.outvars) != len(g2.outvars) or len(g1.consts) != len(g2.consts):
        raise _Mismatch
    same: dict[int, int] = {}
    for v, w in zip(g1.invars, g2.invars):
        if v.aval != w.aval:
            raise _Mismatch
        same[w.id] = v.id
    for v, w, c1, c2 in zip(g1.constvars, g2.constvars, g1.consts, g2.consts):
        if v.aval != w.aval or not (c1 is c2 or _same_array(c1, c2)):
            raise _Mismatch
        same[w.id] = v.id
    for at, (e1, e2) in enumerate(zip(g1.eqns, g2.eqns)):
        if e1.op != e2.op or len(e1.inputs) != len(e2.inputs) or \
                len(e1.outvars) != len(e2.outvars):
            raise _Mismatch
        for k, (a, b) in enumerate(zip(e1.inputs, e2.inputs)):
            if type(a) is not type(b):
                raise _Mismatch
            if type(a) is Var:
                if same.get(b.id) != a.id:
                    raise _Mismatch
            elif a.key() != b.key():
                if a.aval != b.aval:
                    raise _Mismatch
                lit_diffs[(at, ("in", k))] = (a, b)
        for k, (v, w) in enumerate(zip(e1.outvars, e2.outvars)):
            same[w.id] = v.id
            if v.aval is w.aval:      # (avals are mostly shared: fission.aval, the builder)
                continue
            s1, s2 = v.aval.shape, w.aval.shape
            if v.aval.dtype != w.aval.dtype or len(s1) != len(s2):
                raise _Mismatch
            if s1 != s2:
                for d, (x, y) in enumerate(zip(s1, s2)):
                    if x != y:
                        diffs[(at, ("out", k, d))] = (x, y)
        if e1.params is not e2.params:
            _walk(e1.params, e2.params, (at, ("param",)), diffs)
    for a, b in zip(g1.outvars, g2.outvars):
        if type(a) is not type(b) or (same.get(b.id) != a.id if type(a) is Var
                                      else a.key() != b.key()):
            raise _Mismatch


def _walk(x: Any, y: Any, where: tuple, diffs: dict) -> None:
    if x is y:      # one object (a shared params dict or tuple): nothing differs
        return
    tx = type(x)
    if tx is not type(y):
        raise _Mismatch
    if tx is int:
        if x != y:
            at, path = where
            diffs[(at, path)] = (x, y)
        return
    if tx is dict:
        if x.keys() != y.keys():
            raise _Mismatch
        at, path = where
        for k in x:
            _walk(x[k], y[k], (at, path + (k,)), diffs)
        return
    if tx is tuple or tx is list:
        if len(x) != len(y):
            raise _Mismatch
        at, path = where
        for k, (a, b) in enumerate(zip(x, y)):
            _walk(a, b, (at, path + (k,)), diffs)
        return
    if tx is float or isinstance(x, np.floating):
        if not (x == y and math.copysign(1.0, x) == math.copysign(1.0, y)) and \
                not (x != x and y != y):
            raise _Mismatch
        return
    if isinstance(x, Graph):
        if x is not y:
            raise _Mismatch
        return
    if isinstance(x, np.ndarray):
        if not _same_array(x, y):
            raise _Mismatch
        return
    try:
        equal = bool(x == y)
    except Exception:      # noqa: BLE001 - anything that cannot say: not equal
        raise _Mismatch from None
    if not equal:
        raise _Mismatch


def _same_array(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _set(params: Any, path: tuple, value: int) -> Any:
    """`params` (dicts, tuples and lists) with the integer at `path` replaced."""
    k = path[0]
    if type(params) is dict:
        out = dict(params)
        out[k] = value if len(path) == 1 else _set(params[k], path[1:], value)
        return out
    items = list(params)
    items[k] = value if len(path) == 1 else _set(params[k], path[1:], value)
    return items if type(params) is list else tuple(items)

"""Rows of stacked values: what `roll_loops` does after it has made a loop's scan, when the
program reads the loop's per-step values back as a whole (`tg.stack(hs)`)."""
from __future__ import annotations

from .core import Atom, Eqn, Graph, Var
from .fission import aval
from .passes import dce
from .unroll import row_of_slice


def join_rows(graph: Graph) -> Graph:
    """`stack(hs)` of the per-step values of a rolled loop: the steps were taken out of the
    scan's stacked output one row each (`loops._scan_eqns`), and the user's concatenate of them
    rebuilds that array. Runs of consecutive rows of one array in a concatenate along axis 0
    become one slice of it (the array itself when they are all of it), so the graph stays
    O(1) in the length and the VJP does not pad each row back into a full array."""
    made = {v.id: e for e in graph.eqns for v in e.outvars}
    eqns: list[Eqn] = []
    joined = False
    for e in graph.eqns:
        if e.op != "concatenate" or e.params.get("axis") != 0 or len(e.inputs) < 3:
            eqns.append(e)
            continue
        rows = [_row_of(a, made) for a in e.inputs]
        parts: list[Atom] = []
        k = 0
        while k < len(rows):
            src = rows[k]
            m = 1
            while src is not None and k + m < len(rows) and rows[k + m] is not None and \
                    rows[k + m][0] is src[0] and rows[k + m][1] == src[1] + m:
                m += 1
            if m < 3:
                parts.append(e.inputs[k])
                k += 1
                continue
            x, t0 = src
            row = e.inputs[k].aval      # (1, ...) as the concatenate takes it
            if t0 != 0 or m != x.aval.shape[0]:
                cut = Var(aval((m,) + x.aval.shape[1:], x.aval.dtype))
                index = ((t0, t0 + m, 1),) + tuple((0, d, 1) for d in x.aval.shape[1:])
                eqns.append(Eqn("slice", [x], [cut], {"index": index}, e.source))
                x = cut
            shape = (m,) + row.shape[1:]
            if x.aval.shape != shape:
                w = Var(aval(shape, row.dtype))
                eqns.append(Eqn("reshape", [x], [w], {"shape": shape}, e.source))
                x = w
            parts.append(x)
            joined = True
            k += m
        if len(parts) == len(e.inputs):
            eqns.append(e)
        elif len(parts) == 1:
            eqns.append(Eqn("reshape", parts, e.outvars, {"shape": e.outvars[0].aval.shape},
                            e.source))
        else:
            eqns.append(Eqn("concatenate", parts, e.outvars, e.params, e.source))
    if not joined:
        return graph
    return dce(Graph(graph.invars, eqns, graph.outvars, graph.constvars, graph.consts))


def _row_of(a: Atom, made: dict[int, Eqn]) -> tuple[Var, int] | None:
    """(x, t) when `a` is row t of array x (shape (n, ...)) reshaped to (1, ...): a unit slice
    along axis 0, through reshapes that keep the leading axis, else None."""
    if type(a) is not Var or not a.aval.shape or a.aval.shape[0] != 1:
        return None
    e = made.get(a.id)
    while e is not None and e.op == "reshape" and e.inputs[0].aval.shape[:1] == (1,):
        e = made.get(e.inputs[0].id) if type(e.inputs[0]) is Var else None
    start = row_of_slice(e) if e is not None else None
    if start is None:
        return None
    x = e.inputs[0]
    # rows of a reshape that keeps the leading axis are rows of its input, reshaped
    p = made.get(x.id) if type(x) is Var else None
    while p is not None and p.op == "reshape" and type(p.inputs[0]) is Var and \
            p.inputs[0].aval.shape[:1] == x.aval.shape[:1]:
        x = p.inputs[0]
        p = made.get(x.id)
    return (x, start) if type(x) is Var else None

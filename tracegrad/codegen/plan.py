"""Fusion planning: partition a graph's equations into kernels (groups) and order them.

A loop group is one loop nest over a domain shape. Its roots are the values it writes to
memory (elementwise results of the domain's shape, and reductions whose input has it); every
other member is computed in registers where a root needs it. A producer joins its consumers'
group when all its consumers are in one group of the same element count and it is not a graph
output. When the consumers sit in several loop groups over the same domain with no path
between them, those groups are merged first (multi-output fusion), so a value needed by both
the forward and the backward pass is computed once, in one loop, never stored.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ..ir import OPS, Eqn, Graph, Lit, Var, dce
from ..ir.loops import scans_of, unrolled_size
from ..ir.scan import unroll_scans

# A scan whose body has no matmul is written out step by step when that makes at most this many
# equations: its steps fuse into the kernels around them (an elementwise loop's forward and
# reverse passes become one kernel reading each element once); a longer one, or one with a
# matmul (whose steps cannot fuse), runs as a native loop over its body's kernels, so its
# code and compile time do not grow with its length.
UNROLL_MAX_EQNS = 4096
FUSIBLE = {"unary", "binary", "compare", "select", "shape", "create"} | {"take"}
ELEMENTWISE = {"unary", "binary", "compare", "select"}
REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"}
ARG_REDUCE = {"argmax", "argmin"}
ROWS_APART_LEN = 128        # see _Planner.tiled_apart
ROWS_APART_MATRIX = 1 << 15


def fusible(e: Eqn) -> bool:
    return e.op == "take" or (OPS[e.op].kind in FUSIBLE and e.op != "scatter_add")


@dataclass(eq=False)
class Group:
    kind: str   # loop | argreduce | matmul | scatter_add | scatter | update | scan
    domain: tuple[int, ...]
    eqns: list[Eqn] = field(default_factory=list)
    roots: list[Var] = field(default_factory=list)        # elementwise values it stores
    reductions: list[Eqn] = field(default_factory=list)   # reductions over the domain
    operands: list[tuple] = field(default_factory=list)   # matmul: (atom, transposed)
    # matmul: (w, c, subtract) when it stores w - c * product (w + c * ...; _Planner.accumulate)
    acc: tuple | None = None
    gid: int = 0
    members: int = 0               # bitset of the original group ids merged into this one
    desc: int = 0                  # bitset of group ids downstream of this one

    @property
    def size(self) -> int:
        return math.prod(self.domain)

    def first(self) -> int:
        return min(self.order) if self.order else 0

    order: list[int] = field(default_factory=list)         # eqn positions, for scheduling


@dataclass
class Plan:
    graph: Graph
    groups: list[Group]            # in execution order
    materialised: set[int]         # ids of vars that live in buffers
    deps: list[set[int]] = field(default_factory=list)   # groups each one reads from
    # an update written into its operand's buffer: operand id -> the update's result id
    in_place: dict[int, int] = field(default_factory=dict)


def alias_custom_vjp(graph: Graph) -> Graph:
    """custom_vjp_call's outputs are its last inputs: rename uses, drop the equation."""
    subst: dict[int, object] = {}
    eqns = []

    def read(a):
        while isinstance(a, Var) and a.id in subst:
            a = subst[a.id]
        return a

    for e in graph.eqns:
        ins = [read(a) for a in e.inputs]
        if e.op == "custom_vjp_call":
            k = e.params["n_args"] + e.params["n_res"]
            for v, a in zip(e.outvars, ins[k:], strict=False):
                subst[v.id] = a
            continue
        eqns.append(Eqn(e.op, ins, e.outvars, e.params, e.source))
    return dce(Graph(graph.invars, eqns, [read(a) for a in graph.outvars],
                     graph.constvars, graph.consts))


def _matmul_operands(e: Eqn, producers: dict[int, Eqn]) -> list[tuple]:
    """Read a transpose of the last two axes as a transposed GEMM operand, not a copy."""
    ops = []
    for a in e.inputs:
        t = producers.get(a.id) if isinstance(a, Var) else None
        if t is not None and t.op == "transpose" and len(t.params["perm"]) >= 2:
            perm = t.params["perm"]
            n = len(perm)
            if perm == tuple(range(n - 2)) + (n - 1, n - 2) and isinstance(t.inputs[0], Var):
                ops.append((t.inputs[0], True))
                continue
        ops.append((a, False))
    return ops


class _Planner:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.groups: list[Group] = []
        self.group_of: dict[int, Group] = {}     # id(eqn) -> group
        self.outputs = {a.id for a in graph.outvars if isinstance(a, Var)}
        self.inputs = {v.id for v in graph.invars + graph.constvars}
        self.producers = {v.id: e for e in graph.eqns for v in e.outvars}
        self.matmul_ops = {id(e): _matmul_operands(e, self.producers)
                           for e in graph.eqns if e.op == "matmul"}
        self.in_place: dict[int, int] = {}
        self.uses: dict[int, list[Eqn]] = {}
        for e in graph.eqns:
            atoms = ([a for a, _ in self.matmul_ops[id(e)]] if e.op == "matmul"
                     else e.inputs)
            for a in atoms:
                if isinstance(a, Var):
                    self.uses.setdefault(a.id, []).append(e)

    def new_group(self, kind: str, domain: tuple, consumers: list[Group]) -> Group:
        g = Group(kind, tuple(domain), gid=len(self.groups))
        g.members = 1 << g.gid
        for c in consumers:
            g.desc |= c.members | c.desc
        self.groups.append(g)
        return g

    def add(self, g: Group, e: Eqn, pos: int) -> None:
        g.eqns.append(e)
        g.order.append(pos)
        self.group_of[id(e)] = g

    def merge(self, keep: Group, gone: Group) -> None:
        keep.eqns += gone.eqns
        keep.order += gone.order
        keep.roots += gone.roots
        keep.reductions += gone.reductions
        keep.members |= gone.members
        keep.desc |= gone.desc
        for e in gone.eqns:
            self.group_of[id(e)] = keep
        gone.kind = "dead"
        for other in self.groups:   # whoever reached either now reaches all of the merged
            if other.kind != "dead" and other.desc & keep.members:
                other.desc |= keep.desc | keep.members

    def consumer_groups(self, v: Var) -> list[Group]:
        out: list[Group] = []
        for c in self.uses.get(v.id, []):
            g = self.group_of.get(id(c))   # None: the consumer is dead
            if g is not None and g not in out:
                out.append(g)
        return out

    def fuse_target(self, v: Var, cgs: list[Group]) -> Group | None:
        if v.id in self.outputs or not cgs:
            return None
        if any(g.kind not in ("loop", "argreduce") or g.size != v.aval.size for g in cgs):
            return None
        if len(cgs) == 1:
            return cgs[0]
        if any(g.kind != "loop" or g.domain != cgs[0].domain for g in cgs):
            return None
        for g in cgs:
            for h in cgs:
                if g is not h and g.desc & h.members:
                    return None
        for g in cgs[1:]:
            self.merge(cgs[0], g)
        return cgs[0]

    def tiled_apart(self, e: Eqn, cgs: list[Group]) -> bool:
        """Whether a transposed matrix (the last two axes swapped) is stored rather than read
        in place by the one group using it, because that group sums along its rows: its row
        walk would read the transpose a cache line per element, and a tile walk
        (loops._tiled) would split each row's sum. Stored, the transpose walks in tiles and
        the sums read it row by row (their order unchanged): sum(a.T * b, axis=1) of
        1024x1024 2.50 -> 0.44 ms; 512x256 52 -> 36 us; 8 of 128x256 129 -> 54 us. Only
        where the row walk is slow: both axes at least ROWS_APART_LEN long and matrices of
        ROWS_APART_MATRIX elements or more (stored, rows of 64 took 1.1-1.2x the time, rows
        of 32 up to 1.8x, and 8 matrices of 128x128 up to 1.24x: their rows stay cached)."""
        from .loops import TILE_MIN_SIZE
        if e.op != "transpose" or len(cgs) != 1 or cgs[0].kind != "loop":
            return False
        perm = e.params["perm"]
        d = cgs[0].domain
        n = len(d)
        return (n >= 2 and perm == tuple(range(n - 2)) + (n - 1, n - 2)
                and e.out.aval.shape == d and min(d[-2:]) >= ROWS_APART_LEN
                and d[-1] * d[-2] >= ROWS_APART_MATRIX and math.prod(d) >= TILE_MIN_SIZE
                and any(n - 1 in r.params["axes"] and len(r.params["axes"]) < n
                        for r in cgs[0].reductions))

    def may_update_in_place(self, e: Eqn) -> bool:
        """Whether update `e` is made a group of its own, which may write its slice into its
        operand's buffer (see `in_place_updates`): the operand is made by an equation (not an
        input or a constant) and is not an output. (Its producer then stores it: an update
        group is no fusion target.)"""
        x = e.inputs[0]
        return type(x) is Var and x.id in self.producers and x.id not in self.outputs

    def in_place_updates(self, live: list[Group], deps: dict) -> None:
        """The update groups that write into their operand's buffer, the rest copying it
        first: those whose operand's other readers may all run before the update (none of
        them downstream of it); each then waits for them (an edge in `deps`)."""
        for u in live:
            if u.kind != "update":
                continue
            e = u.eqns[0]
            x = e.inputs[0]
            if x.id in self.in_place or e.inputs[1] is x:   # (one update per buffer)
                continue
            made = self.group_of.get(id(self.producers[x.id]))
            readers = {id(g): g for r in self.uses.get(x.id, ()) if r is not e
                       for g in [self.group_of.get(id(r))] if g is not None and g is not made}
            if any(g.members & u.desc for g in readers.values()):
                continue
            self.in_place[x.id] = e.out.id
            deps[id(u)].update(readers)

    def run(self) -> Plan:
        eqns = self.graph.eqns
        for pos in range(len(eqns) - 1, -1, -1):
            e = eqns[pos]
            cgs = [g for v in e.outvars for g in self.consumer_groups(v)]
            if not cgs and not any(v.id in self.outputs for v in e.outvars):
                continue
            if e.op in REDUCE:
                g = self.new_group("loop", e.inputs[0].aval.shape, cgs)
                g.reductions.append(e)
            elif e.op in ARG_REDUCE:
                g = self.new_group("argreduce", e.inputs[0].aval.shape, cgs)
                g.reductions.append(e)
            elif e.op in ("matmul", "scatter_add", "scatter"):
                g = self.new_group(e.op, e.out.aval.shape, cgs)
                g.operands = self.matmul_ops.get(id(e), [])
            elif e.op == "scan":
                g = self.new_group("scan", (), cgs)
            elif e.op == "update_slice" and self.may_update_in_place(e):
                g = self.new_group("update", e.inputs[1].aval.shape, cgs)
            elif fusible(e):
                # an update is stored, not computed where it is read: n updates fused in a
                # chain make each element of the last a select over all n (and recursion
                # n deep when lowering it)
                g = None if self.tiled_apart(e, cgs) or e.op == "update_slice" else \
                    self.fuse_target(e.out, cgs)
                if g is None:
                    g = self.new_group("loop", e.out.aval.shape, cgs)
                    g.roots.append(e.out)
            else:
                raise NotImplementedError(f"native backend cannot lower {e.op}")
            self.add(g, e, pos)
        return self.schedule()

    def accumulate(self, m: Group) -> None:
        """Fold a loop storing `w - c * p` or `w + c * p` (c a scalar: a literal or an input;
        w a buffer of p's type), where matmul `m` makes p and nothing else reads it, into `m`:
        it then stores that result, ?gemm adding alpha = -c (or c) times the product to a
        copy of w (beta = 1: no pass zeroing the product first, none reading it back; an SGD
        update `W - lr * x.T @ g`). Generated products apply `w - c * p` to their block, the
        loop's own operations. Only 2-d products (no batch) of floats."""
        (e,) = m.eqns
        p = e.out
        if p.id in self.outputs or len(m.domain) != 2 or p.aval.dtype.kind != "f" or \
                any(len(a.aval.shape) != 2 for a, _ in m.operands) or 0 in m.domain:
            return
        users = self.uses.get(p.id, [])
        scale = users[0] if len(users) == 1 else None
        if scale is None or scale.op != "mul" or scale.inputs[0] is scale.inputs[1]:
            return
        loop = self.group_of.get(id(scale))
        if loop is None or loop.kind != "loop" or loop.reductions or len(loop.eqns) != 2 or \
                loop.domain != m.domain:
            return
        c = scale.inputs[1] if scale.inputs[0] is p else scale.inputs[0]
        if c.aval.shape != () or c.aval.dtype != p.aval.dtype or \
                type(c) is Var and c.id not in self.inputs:
            return
        t = scale.out
        users = self.uses.get(t.id, [])
        combine = users[0] if len(users) == 1 and t.id not in self.outputs else None
        if combine is None or self.group_of.get(id(combine)) is not loop or \
                loop.roots != [combine.out] or combine.out.aval != p.aval:
            return
        if combine.op == "sub" and combine.inputs[1] is t:
            w = combine.inputs[0]
        elif combine.op == "add":
            w = combine.inputs[1] if combine.inputs[0] is t else combine.inputs[0]
        else:
            return
        if type(w) is not Var or w is t or w.aval != p.aval:
            return
        m.eqns[0] = Eqn("matmul", e.inputs, [combine.out], e.params, e.source)
        m.acc = (w, c, combine.op == "sub")
        loop.kind = "dead"
        for x in loop.eqns:
            self.group_of[id(x)] = m

    def schedule(self) -> Plan:
        for g in self.groups:
            if g.kind == "matmul":
                self.accumulate(g)
        live = [g for g in self.groups if g.kind != "dead"]
        materialised = {v.id for v in self.graph.invars} | {v.id for v in self.graph.constvars}
        for g in live:
            g.eqns = [e for _, e in sorted(zip(g.order, g.eqns, strict=False), key=lambda t: t[0])]
            g.order.sort()
            if g.kind != "loop":
                materialised.update(v.id for e in g.eqns for v in e.outvars)
            materialised.update(v.id for v in g.roots)
            materialised.update(e.out.id for e in g.reductions)
        # Kahn's algorithm, taking the group whose first equation comes first
        writer = {}
        for g in live:
            for e in g.eqns:
                for v in e.outvars:
                    if v.id in materialised:
                        writer[v.id] = g
        deps = {id(g): set() for g in live}
        for g in live:
            for e in g.eqns:
                for a in reads(g, e):
                    w = writer.get(a.id) if isinstance(a, Var) else None
                    if w is not None and w is not g:
                        deps[id(g)].add(id(w))
        self.in_place_updates(live, deps)
        by_id = {id(g): g for g in live}
        users: dict[int, list[int]] = {id(g): [] for g in live}
        for k, ds in deps.items():
            for d in ds:
                users[d].append(k)
        count = {k: len(ds) for k, ds in deps.items()}
        ready = [(by_id[k].first(), k) for k, c in count.items() if c == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, k = heapq.heappop(ready)
            order.append(by_id[k])
            for u in users[k]:
                count[u] -= 1
                if count[u] == 0:
                    heapq.heappush(ready, (by_id[u].first(), u))
        if len(order) != len(live):
            raise AssertionError("fusion produced a cyclic schedule")
        index = {id(g): i for i, g in enumerate(order)}
        return Plan(self.graph, order, materialised,
                    [{index[d] for d in deps[id(g)]} for g in order], self.in_place)


def reads(group: Group, e: Eqn) -> list:
    """The atoms equation `e` of `group` reads: a matmul's operands (transposes read in
    place) and what it accumulates onto, else its inputs."""
    if e.op != "matmul":
        return e.inputs
    return [a for a, _ in group.operands] + ([*group.acc[:2]] if group.acc else [])


def _levels(deps: list[set[int]]) -> list[int]:
    level: list[int] = []
    for ds in deps:
        level.append(1 + max((level[d] for d in ds), default=-1))
    return level


def _index_preserving(group: Group, v: Var) -> bool:
    """Whether every value of `group` computed from `v` is elementwise over the domain, so a
    task that covers part of the domain reads `v` only inside that part."""
    derived = {v.id}
    for e in group.eqns:
        if any(isinstance(a, Var) and a.id in derived for a in e.inputs):
            if not (OPS[e.op].kind in ELEMENTWISE or e.op == "convert"):
                return False
            if e.out.aval.shape != group.domain:
                return False
            derived.update(o.id for o in e.outvars)
    return True


def epilogues(plan: Plan) -> dict[int, int]:
    """matmul group -> a loop group that may run inside the matmul's tasks, each task on the
    block of the product it just computed (hot in cache): a loop without reductions over the
    product's 2-d shape that reads it only elementwise and reads nothing else that is written
    after the matmul could start."""
    level = _levels(plan.deps)
    users: dict[int, list[int]] = {}
    for i, ds in enumerate(plan.deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    out: dict[int, int] = {}
    taken: set[int] = set()
    for mi, m in enumerate(plan.groups):
        if m.kind != "matmul" or len(m.domain) != 2:
            continue
        for li in users.get(mi, []):
            g = plan.groups[li]
            if (li in taken or g.kind != "loop" or g.reductions or g.domain != m.domain
                    or any(level[d] >= level[mi] for d in plan.deps[li] if d != mi)
                    or not _index_preserving(g, m.eqns[0].out)):
                continue
            out[mi] = li
            taken.add(li)
            break
    return out


def stages(plan: Plan, fused: dict[int, int] | None = None) -> list[list[int]]:
    """Groups (indices into `plan.groups`) in stages that may run concurrently: each group
    goes to the stage after the last one it reads from, as soon as possible. Stages run in
    order; within one, no group reads what another writes. `fused`: epilogue -> its matmul;
    an epilogue runs inside its matmul and is left out of the stages."""
    fused = fused or {}
    deps = [{fused.get(d, d) for d in ds} for ds in plan.deps]
    for li, mi in fused.items():
        deps[mi] |= deps[li] - {mi}
    # in the order of unfused levels, every group's (merged) deps come before it
    unfused = _levels(plan.deps)
    level = [-1] * len(deps)
    for i in sorted(range(len(deps)), key=unfused.__getitem__):
        if i not in fused:
            level[i] = 1 + max((level[d] for d in deps[i]), default=-1)
    out: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for i, lv in enumerate(level):
        if i not in fused:
            out[lv].append(i)
    return [s for s in out if s]


def group_signature(group: Group | None, keys: list, avals: dict, extra: tuple) -> str:
    """Text equal for two groups exactly when they lower to the same code given their buffer
    lists `keys` in order: ops, params, shapes and dtypes, with variables renamed."""
    names: dict[int, str] = {}

    def by_id(i: int, aval) -> str:
        n = names.get(i)
        if n is None:
            n = names[i] = f"%{len(names)}:{aval}"
        return n

    def name(a) -> str:
        if isinstance(a, Lit):
            return f"{a.value.item()!r}:{a.aval}"
        return by_id(a.id, a.aval)

    parts = [repr(extra)]
    for k in keys:
        if isinstance(k, int):
            parts.append(by_id(k, avals[k]))
        elif isinstance(k, tuple):   # ("partial", var id)
            parts.append(f"{k[0]}({by_id(k[1], avals[k[1]])})")
        else:
            parts.append(str(k))
    if group is not None:
        parts += [group.kind, str(group.domain)]
        for e in group.eqns:
            params = ",".join(f"{k}={v!r}" for k, v in sorted(e.params.items()))
            ins = ",".join(name(a) for a in e.inputs)
            parts.append(f"{e.op}[{params}]({ins})->" + ",".join(name(v) for v in e.outvars))
        parts.append("roots:" + ",".join(name(v) for v in group.roots))
        parts.append("red:" + ",".join(name(e.out) for e in group.reductions))
        parts.append("ops:" + ",".join(f"{name(a)}{t}" for a, t in group.operands))
        if group.acc is not None:
            parts.append(f"acc:{name(group.acc[0])},{name(group.acc[1])},{group.acc[2]}")
    return "\n".join(parts)


def plan_graph(graph: Graph, body: bool = False) -> Plan:
    """Unroll the scans not kept as loops, alias custom_vjp outputs, drop dead code, and
    partition into ordered groups. `body`: `graph` is a scan's body run as a loop: its
    outputs are then made distinct (`loop_body`), after the rest, which may make one an
    input or another output again."""
    flat = unroll_scans(graph, keep=native_loop)
    if len(flat.constvars) != len(graph.constvars):
        # the buffer layout finds constants among the compiled graph's own
        raise NotImplementedError("native backend cannot lower a scan whose body holds "
                                  "constants; ir.optimize moves them out to the graph's")
    flat = _literal_outputs(alias_custom_vjp(flat), graph)
    return _Planner(_scan_inputs_in_buffers(loop_body(flat) if body else flat)).run()


def native_loop(e: Eqn) -> bool:
    """Whether scan `e` runs as a loop in native code rather than unrolled (see
    UNROLL_MAX_EQNS). A body holding constants is not (its unrolled constants would join the
    graph's, which plan_graph refuses: ir.optimize moves them out first)."""
    return _loops(e.params["length"], e.params["body"])


def _loops(length: int, body: Graph) -> bool:
    if body.constvars:
        return False
    return has_matmul(body) or length * unrolled_size(body) > UNROLL_MAX_EQNS


def compiled_size(graph: Graph) -> int:
    """The equations native code is made of for `graph`: a scan run as a loop counts its
    body once, an unrolled one `length` times (before `by_steps` unrolls some more: an
    estimate, what the cost of compiling scales with); remembered on the graph. Counted from
    `scans_of`: a graph a template wrote for a new length is not written out for it."""
    n = graph.__dict__.get("_compiled_size")
    if n is None:
        n, scans = scans_of(graph)
        for length, body in scans:
            size = compiled_size(body)
            n += 1 + size if _loops(length, body) else length * size
        graph.__dict__["_compiled_size"] = n
    return n


def has_matmul(graph: Graph) -> bool:
    return any(e.op == "matmul" or (e.op == "scan" and has_matmul(e.params["body"]))
               for e in graph.eqns)


def _scan_inputs_in_buffers(graph: Graph) -> Graph:
    """A scan's literal inputs made by `full` equations: a loop reads each input from a
    buffer."""
    if not any(e.op == "scan" and any(type(a) is Lit for a in e.inputs) for e in graph.eqns):
        return graph
    eqns = []
    for e in graph.eqns:
        if e.op == "scan" and any(type(a) is Lit for a in e.inputs):
            ins = [_made(a, eqns) if type(a) is Lit else a for a in e.inputs]
            e = Eqn(e.op, ins, e.outvars, e.params, e.source)
        eqns.append(e)
    return Graph(graph.invars, eqns, graph.outvars, graph.constvars, graph.consts)


def loop_body(body: Graph) -> Graph:
    """A scan body as a native loop runs it: every output its own buffer, made by an equation
    of the body (the loop points each output at where that step's result goes), so an
    output that is a literal, an input or another output's value is made by a `full` or a
    copy (`convert` to its own dtype)."""
    made = {v.id for e in body.eqns for v in e.outvars}
    eqns, outs, seen = list(body.eqns), [], set()
    for a in body.outvars:
        if type(a) is Lit:
            a = _made(a, eqns)
        elif a.id not in made or a.id in seen:
            v = Var(a.aval)
            eqns.append(Eqn("convert", [a], [v], {"dtype": a.aval.dtype}))
            a = v
        seen.add(a.id)
        outs.append(a)
    return Graph(body.invars, eqns, outs, body.constvars, body.consts)


def _literal_outputs(flat: Graph, graph: Graph) -> Graph:
    """An output that became a literal (a scan body's, an aliased custom_vjp input) is
    computed by a `full`: the executable knows only `graph`'s own literal outputs."""
    outs = list(flat.outvars)
    eqns = list(flat.eqns)
    for k, (a, was) in enumerate(zip(outs, graph.outvars, strict=True)):
        if isinstance(a, Lit) and not isinstance(was, Lit):
            outs[k] = _made(a, eqns)
    if len(eqns) == len(flat.eqns):
        return flat
    return Graph(flat.invars, eqns, outs, flat.constvars, flat.consts)


def _made(lit: Lit, eqns: list[Eqn]) -> Var:
    """A variable holding `lit`, made by a `full` appended to `eqns`."""
    v = Var(lit.aval)
    eqns.append(Eqn("full", [], [v], {"shape": lit.aval.shape, "value": lit.value.item(),
                                      "dtype": lit.aval.dtype}))
    return v


__all__ = ["ARG_REDUCE", "REDUCE", "Group", "Plan", "epilogues", "fusible", "group_signature",
           "compiled_size", "has_matmul", "loop_body", "native_loop", "plan_graph", "reads",
           "stages"]

"""Graph -> one LLVM module with one entry, `i32 tg_entry(i8** bufs, list* args, list* outs)`,
plus its buffer layout.

The table `bufs` holds, by slot: the thread-pool callback, the BLAS entry points and thread
setter (slots 0-3) and the address of `numpy.ndarray` (slot 4), then the graph's inputs,
constants, outputs and intermediates. The entry checks the arrays in the Python lists `args`
and `outs` and stores their data pointers in their slots (see unbox.py). Intermediates and
per-task partial reductions live in one workspace whose offsets are part of the layout, so
the object code is independent of any address and can be cached on disk."""
from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import Any

import numpy as np
from llvmlite import ir

from ..ir import Graph, Lit, Var
from ..ir.unroll import split_inputs
from .dtypes import I32, I64, PTR, VOID, i64
from .kernel import KERNEL_TYPE, Kernel
from .elements import row_major_strides, slice_range
from .linalg import (SLOT_BLAS_THREADS, emit_copy, emit_matmul, emit_scatter, emit_scatter_add,
                     emit_update, gemm_dims, gemm_slot, gemm_tasks, loop_tasks, packs,
                     uses_blas)
from .loops import emit_argreduce, emit_combine, emit_loop_group, reductions, split
from .plan import Group, epilogues, group_signature, plan_graph, reads, stages
from .scalar import OUTLINE_MATH, TRANSCENDENTAL
from .unbox import SLOT_NDARRAY, emit_unbox

ENTRY = "tg_entry"
# Inlined math vectorises but costs compile time per copy: loops smaller than this call one
# out-of-line copy of each function, unless the whole graph has only a few math calls.
INLINE_MATH_MIN_SIZE = 4096
INLINE_MATH_MAX_SITES = 48
FIRST_SLOT = SLOT_NDARRAY + 1
ALIGN = 64
# Independent kernels of at least this much work (multiply-adds, loop elements) share one pool
# job; smaller ones run on the calling thread before it.
CONCURRENT_MIN_WORK = 1 << 14
PAR_TYPE = ir.FunctionType(VOID, [KERNEL_TYPE.as_pointer(), PTR.as_pointer(), I64])


@dataclass
class Layout:
    """Where every buffer of a compiled graph goes; plain data, stored with cached code."""
    n_slots: int
    input_slots: list[int]
    const_slots: list[tuple[int, int]]        # (slot, index into graph.consts)
    outputs: list[tuple]                      # ("slot", s) ("arg", i) ("const", j) ("lit",)
    workspace: list[tuple[int, int]] = field(default_factory=list)   # (slot, byte offset)
    workspace_size: int = 0
    n_kernels: int = 0
    n_parallel: int = 0
    blas: bool = False                         # calls BLAS through slots 1-3

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: dict) -> Layout:
        d = dict(d)
        for k in ("const_slots", "outputs", "workspace"):
            d[k] = [tuple(x) for x in d[k]]
        return cls(**d)


@dataclass
class Lowered:
    module: ir.Module
    layout: Layout
    graph: Graph


class _Lowering:
    def __init__(self, graph: Graph, use_blas: bool, threads: int, blas_int_bits: int = 32,
                 parent: _Lowering | None = None, prefix: str = "", vector_bits: int = 256):
        """`parent`: the lowering of the graph whose scan has `graph` as its body (see
        `lower_scan`); the two share the module, the slot table and kernel bodies."""
        self.graph = graph
        self.use_blas = use_blas
        self.threads = threads
        self.blas_int_bits = blas_int_bits
        self.vector_bits = vector_bits
        self.prefix = prefix
        self.plan = plan_graph(graph, body=parent is not None)
        self.math_sites = sum(e.op in TRANSCENDENTAL for e in self.plan.graph.eqns)
        self.root: _Lowering = self if parent is None else parent.root
        if parent is None:
            self.module = ir.Module(name="tracegrad")
            self.next_slot = FIRST_SLOT
            self.bodies: dict[str, ir.Function] = {}
            self.body_uses: dict[str, int] = {}
            self.direct: set[str] = set()       # bodies some code calls without a wrapper
        else:
            self.module, self.bodies = parent.module, parent.bodies
            self.body_uses, self.direct = parent.body_uses, parent.direct
        self.slot: dict[Any, int] = {}
        self.dtype: dict[Any, np.dtype] = {}
        self.ws_req: list[tuple[int, int, Any]] = []   # (slot, bytes, key)
        self.stage_of: dict[int, int] = {}
        self.regions: dict[int, list[tuple[int, int]]] = {}  # a loop body's workspace, by slot
        self.loop_keys: dict[int, list] = {}    # scan group -> the workspace its loop uses
        self.n_parallel = 0
        self.layout_blas = False
        self.group_index = {id(g): i for i, g in enumerate(self.plan.groups)}
        # an operand an update writes into -> the last update of its chain, whose buffer the
        # whole chain shares (plan.in_place: each link the only reader of the one before)
        self.shares: dict[int, int] = {}
        for x in self.plan.in_place:
            root = x
            while root in self.plan.in_place:
                root = self.plan.in_place[root]
            self.shares[x] = root
        g = self.plan.graph
        self.avals = {v.id: v.aval for v in g.invars + g.constvars}
        self.avals.update((v.id, v.aval) for e in g.eqns for v in e.outvars)

    def new_slot(self, key, dtype: np.dtype, nbytes: int | None = None) -> int:
        root = self.root
        s = self.slot[key] = root.next_slot
        self.dtype[key] = np.dtype(dtype)
        root.next_slot += 1
        if nbytes is not None:
            self.ws_req.append((s, -(-max(nbytes, 1) // ALIGN) * ALIGN, key))
        return s

    def lifetimes(self) -> dict[Any, tuple[int, int]]:
        """(first, last) stage at which each workspace buffer is written or read."""
        span: dict[Any, tuple[int, int]] = {}

        def touch(key, si):
            # groups are visited in plan order, which stages may reorder: take the extremes
            key = self.shares.get(key, key)     # (an updated operand: its update's buffer)
            first, last = span.get(key, (si, si))
            span[key] = (min(first, si), max(last, si))

        for gi, group in enumerate(self.plan.groups):
            si = self.stage_of[gi]   # groups of one stage may run at the same time
            for e in group.eqns:
                for a in reads(group, e):
                    if isinstance(a, Var):
                        touch(a.id, si)
                for v in e.outvars:
                    touch(v.id, si)
            for e in group.reductions:
                touch(("partial", e.out.id), si)
            for key in self.loop_keys.get(gi, ()):
                touch(key, si)
        return span

    def pack_workspace(self) -> tuple[list[tuple[int, int]], int]:
        """Offsets for the workspace buffers: two share memory when no stage touches both
        (stages run one after another), placed first-fit by size, largest first."""
        span = self.lifetimes()
        placed: list[tuple[int, int, int, int]] = []   # (offset, size, first, last)
        out, top = [], 0
        for slot, size, key in sorted(self.ws_req, key=lambda r: -r[1]):
            first, last = span.get(key, (0, len(self.plan.groups)))
            busy = sorted((o, o + n) for o, n, f, la in placed if f <= last and first <= la)
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
            placed.append((off, size, first, last))
            out.append((slot, off))
            out += [(s, off + o) for s, o in self.regions.get(slot, ())]
            top = max(top, off + size)
        return sorted(out), top

    def layout_buffers(self) -> Layout:
        g = self.graph
        const_index = {v.id: j for j, v in enumerate(g.constvars)}
        input_slots = [self.new_slot(v.id, v.aval.dtype) for v in g.invars]
        const_slots = []
        for v in self.plan.graph.constvars:
            if v.id not in self.slot:
                const_slots.append((self.new_slot(v.id, v.aval.dtype), const_index[v.id]))
        outputs = []
        inputs = {v.id: i for i, v in enumerate(g.invars)}
        seen: dict[int, int] = {}
        for k, a in enumerate(self.plan.graph.outvars):
            if isinstance(a, Lit):
                outputs.append(("lit",))
            elif a.id in inputs:
                outputs.append(("arg", inputs[a.id]))
            elif a.id in const_index:
                outputs.append(("const", const_index[a.id]))
            elif a.id in seen:
                outputs.append(("dup", seen[a.id]))
            else:
                seen[a.id] = k
                outputs.append(("slot", self.new_slot(a.id, a.aval.dtype)))
        for v_id in sorted(self.plan.materialised - set(self.slot) - set(self.shares)):
            v = self._var(v_id)
            if v is not None:
                self.new_slot(v_id, v.aval.dtype, v.aval.size * v.aval.dtype.itemsize)
        for x, root in self.shares.items():     # an updated operand lives in its update's
            self.slot[x], self.dtype[x] = self.slot[root], self.dtype[root]     # buffer
        return Layout(0, input_slots, const_slots, outputs)

    def _var(self, v_id: int) -> Var | None:
        if not hasattr(self, "_vars"):
            self._vars = {v.id: v for e in self.plan.graph.eqns for v in e.outvars}
        return self._vars.get(v_id)

    def kernel(self, name: str, keys: list, group: Group | None, extra: tuple = (),
               offsets: dict | None = None) -> Kernel:
        """A kernel for `group`; groups identical up to their buffers share one body (an RNN
        unrolled 15 steps has 44 identical matmuls), which cuts compile time. `offsets`: see
        Kernel (not part of the body: `extra` names what the body depends on)."""
        keys = list(dict.fromkeys(keys))
        sig = group_signature(group, keys, self.avals, extra)
        body = self.bodies.get(sig)
        k = Kernel(self.module, name, [(k, self.slot[k], self.dtype[k]) for k in keys], body,
                   offsets)
        if body is None:
            self.bodies[sig] = k.body_fn
        self.body_uses[k.body_fn.name] = self.body_uses.get(k.body_fn.name, 0) + 1
        return k

    def lower(self) -> Lowered:
        layout = self.layout_buffers()
        steps = self.lower_stages()
        entry = ir.Function(self.module, ir.FunctionType(I32, [PTR.as_pointer(), PTR, PTR]),
                            ENTRY)
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        table, args, outs = entry.args
        inputs = [(s, v.aval.shape, v.aval.dtype)
                  for s, v in zip(layout.input_slots, self.graph.invars, strict=True)]
        emit_unbox(b, table, args, outs, inputs, [o[1] for o in layout.outputs if o[0] == "slot"])
        self.emit_steps(b, table, steps)
        b.ret(ir.Constant(I32, 0))
        for fn in self.bodies.values():   # a body used once by a wrapper melts into it
            once = self.body_uses[fn.name] == 1 and fn.name not in self.direct
            fn.attributes.add("alwaysinline" if once else "noinline")
        layout.n_slots = self.next_slot
        layout.workspace, layout.workspace_size = self.pack_workspace()
        layout.n_kernels = self.n_kernels
        layout.n_parallel = self.n_parallel
        layout.blas = self.layout_blas
        return Lowered(self.module, layout, self.graph)

    def emit_steps(self, b: ir.IRBuilder, table: ir.Value,
                   steps: list[tuple[Kernel | ir.Function, int]]) -> None:
        """Call `steps` (see `lower_stages`) in order from `b`."""
        par = None
        for k, tasks in steps:
            if tasks == 1 and isinstance(k, ir.Function):
                b.call(k, [table, i64(0)])
                continue
            if tasks == 1:   # no wrapper: fewer functions to compile
                k.call_body(b, table)
                self.root.direct.add(k.body_fn.name)
                continue
            if par is None:
                par = b.bitcast(b.load(b.gep(table, [i64(0)], inbounds=True)),
                                PAR_TYPE.as_pointer())
            b.call(par, [k if isinstance(k, ir.Function) else k.fn, table, i64(tasks)])
        self.n_parallel += sum(t > 1 for _, t in steps)

    def lower_stages(self) -> list[tuple[Kernel | ir.Function, int]]:
        """What the entry calls, in order: a kernel (run by the pool when it has several
        tasks) or a region, one wrapper running the tasks of several independent kernels as
        one pool job, so a thread that finishes its share of one takes tasks of another.
        A matmul's epilogue loop runs in the matmul's tasks, right after its block."""
        groups = self.plan.groups
        self.plan_gemms(stages(self.plan))
        fused = {}
        for mi, li in epilogues(self.plan).items():
            # an epilogue runs on the threads its matmul runs on: not one big loop on one
            if self.gemm_plan[mi][0] > 1 or mi in self.members or split(groups[li])[1] == 1:
                fused[li] = mi
        epi = {mi: li for li, mi in fused.items()}
        final = stages(self.plan, fused)
        self.plan_gemms(final)   # fusion may have changed who shares a stage
        steps: list[tuple[Kernel | ir.Function, int]] = []
        self.n_kernels = 0
        for si, stage in enumerate(final):
            region, after = [], []
            members = self.concurrent(stage)
            for gi in stage:
                self.stage_of[gi] = si
                calls = self.lower_group(f"{self.prefix}k{gi}", groups[gi])
                if gi in epi:
                    li, gsplit = epi[gi], self.gemm_plan[gi]
                    self.stage_of[li] = si
                    (k, _), = self.lower_group(f"{self.prefix}k{li}", groups[li], gsplit)
                    calls = [(self.sequence(f"{self.prefix}k{gi}_{li}", [calls[0][0], k]),
                              gsplit[0])]
                    self.n_kernels += 1
                self.n_kernels += len(calls)
                (region if gi in members else steps).append(calls[0])
                after += calls[1:]   # combines of partial reductions
            if len(region) > 1:
                steps.append((self.region(f"{self.prefix}r{si}", region),
                              sum(t for _, t in region)))
            else:
                steps += region
            steps += after
        return steps

    def concurrent(self, stage: list[int]) -> list[int]:
        """The groups of `stage` worth running as one region (not tiny)."""
        out = [gi for gi in stage if group_work(self.plan.groups[gi]) >= CONCURRENT_MIN_WORK]
        return out if len(out) > 1 else []

    def plan_gemms(self, plain: list[list[int]]) -> None:
        """The (tasks, chunk, columns?) split of each matmul: one that shares its stage with
        other work is split for its share of the threads, others for all of them."""
        groups = self.plan.groups
        self.gemm_plan: dict[int, tuple[int, int, bool]] = {}
        self.members: set[int] = set()
        for stage in plain:
            members = self.concurrent(stage)
            self.members.update(members)
            gemms = [gi for gi in members if groups[gi].kind == "matmul"]
            share = max(1, self.threads // max(1, len(gemms)))
            for gi in stage:
                g = groups[gi]
                if g.kind != "matmul":
                    continue
                if not self.is_blas(g):
                    self.gemm_plan[gi] = loop_tasks(g, share if gi in members else self.threads)
                else:
                    self.gemm_plan[gi] = gemm_tasks(g, share if gi in members else self.threads)

    def is_blas(self, group: Group) -> bool:
        """Whether `group` runs as ?gemm or as `_panels` (split alike)."""
        return (self.use_blas or packs(group, self.vector_bits)) and uses_blas(group)

    def sequence(self, name: str, kernels: list[Kernel]) -> ir.Function:
        """`void name(i8** table, i64 task)`: task t of each kernel in turn."""
        fn = ir.Function(self.module, KERNEL_TYPE, name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        for k in kernels:
            b.call(k.fn, list(fn.args))
        b.ret_void()
        return fn

    def region(self, name: str, members: list[tuple[Kernel | ir.Function, int]]) -> ir.Function:
        """`void name(i8** table, i64 task)`: task t runs task t - (tasks before it) of the
        member it falls in; which thread runs which task does not change results."""
        fn = ir.Function(self.module, KERNEL_TYPE, name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        table, task = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        base = 0
        for j, (k, tasks) in enumerate(members):
            if j + 1 < len(members):
                run, rest = fn.append_basic_block(f"m{j}"), fn.append_basic_block(f"n{j}")
                b.cbranch(b.icmp_signed("<", task, i64(base + tasks)), run, rest)
                b.position_at_end(run)
            b.call(k if isinstance(k, ir.Function) else k.fn, [table, b.sub(task, i64(base))])
            b.ret_void()
            if j + 1 < len(members):
                b.position_at_end(rest)
            base += tasks
        return fn

    def lower_update(self, name: str, e: Any) -> list[tuple[Kernel, int]]:
        """An update group: written into its operand's buffer (the update's own: see
        `shares`), only the slice is written, the rest left as the operand's producer wrote
        it; else the operand is copied first. The slice's body starts at its first element,
        so the updates of a loop writing row after row share one body."""
        x, v = e.inputs
        calls = []
        if self.plan.in_place.get(x.id) != e.out.id:
            k = self.kernel(name + "_copy", [x.id, e.out.id], None, ("copy", x.aval))
            if k.fresh:
                emit_copy(k, x.id, e.out.id, x.aval)
            calls.append(k.finish())
        shape = x.aval.shape
        ranges = [slice_range(d, s) for d, s in zip(shape, e.params["index"], strict=True)]
        strides = row_major_strides(shape)
        start = sum(r.start * st for r, st in zip(ranges, strides, strict=True)) \
            if all(len(r) for r in ranges) else 0
        steps = tuple(r.step * st for r, st in zip(ranges, strides, strict=True))
        keys = [e.out.id] + ([v.id] if isinstance(v, Var) else [])
        lit = None if isinstance(v, Var) else v.value.item()
        k = self.kernel(name if not calls else name + "_set", keys, None,
                        ("update", v.aval.shape, steps, lit), {e.out.id: start})
        if k.fresh:
            emit_update(k, e, steps)
        calls.append(k.finish())
        return [(calls[0] if len(calls) == 1 else self.sequence(name, calls), 1)]

    def lower_scan(self, name: str, group: Group) -> list[tuple[ir.Function, int]]:
        """A scan as a loop: `void name(i8** table, i64)` runs its body's kernels (lowered
        once, by a child lowering with slots of its own) `length` times, pointing the body's
        input and output slots at step t's rows of the stacked xs and ys before each step.
        A carry's steps alternate between the scan's final-carry buffer and a spare, chosen so
        the last step writes the final one; step 0 reads the initial carry in place. The
        body's intermediates take one region of this graph's workspace."""
        e = group.eqns[0]
        p = e.params
        length, nc, nk = p["length"], p["n_consts"], p["n_carry"]
        child = _Lowering(p["body"], self.use_blas, self.threads,
                          self.blas_int_bits, parent=self, prefix=name + "_",
                          vector_bits=self.vector_bits)
        lay = child.layout_buffers()
        body_outs = [o[1] for o in lay.outputs]
        assert all(o[0] == "slot" for o in lay.outputs), lay.outputs   # (plan: loop_body)
        steps = child.lower_stages()
        work, size = child.pack_workspace()
        self.n_kernels += child.n_kernels
        self.layout_blas = self.layout_blas or child.layout_blas
        keys = self.loop_keys[self.group_index[id(group)]] = []
        if size:
            keys.append(("body", e.outvars[0].id))
            self.regions[self.new_slot(keys[-1], np.int8, size)] = work
        spare = []
        for v in e.outvars[:nk]:
            keys.append(("carry", v.id))
            spare.append(self.new_slot(keys[-1], v.aval.dtype,
                                       v.aval.size * v.aval.dtype.itemsize))
        fn = ir.Function(self.module, KERNEL_TYPE, name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")
        table = fn.args[0]
        b = ir.IRBuilder(fn.append_basic_block("entry"))

        def at(slot: int) -> ir.Value:
            return b.gep(table, [i64(slot)], inbounds=True)

        def read(a) -> ir.Value:
            return b.load(at(self.slot[a.id]))

        consts, carry, xs = split_inputs(e)
        for s, a in zip(lay.input_slots[:nc], consts, strict=True):
            b.store(read(a), at(s))
        init = [read(a) for a in carry]
        final = [read(v) for v in e.outvars[:nk]]
        spares = [b.load(at(s)) for s in spare]
        rows = [(s, read(a), a.aval.size // length * a.aval.dtype.itemsize)
                for s, a in zip(lay.input_slots[nc + nk:], xs, strict=True)]
        rows += [(s, read(v), v.aval.size // length * v.aval.dtype.itemsize)
                 for s, v in zip(body_outs[nk:], e.outvars[nk:], strict=True)]
        pre = b.block
        step, done = fn.append_basic_block("step"), fn.append_basic_block("done")
        b.branch(step)
        b.position_at_end(step)
        t = b.phi(I64)
        t.add_incoming(i64(0), pre)
        ins = []
        for p0 in init:
            ins.append(b.phi(PTR))
            ins[-1].add_incoming(p0, pre)
        # the step writing the final buffer: the last one and every second one before it
        last = b.icmp_unsigned("==", b.and_(t, i64(1)), i64((length - 1) & 1))
        outs = [b.select(last, f, o) for f, o in zip(final, spares, strict=True)]
        for s, ptr in zip(lay.input_slots[nc:nc + nk] + body_outs[:nk], ins + outs,
                          strict=True):
            b.store(ptr, at(s))
        row = b.sub(i64(length - 1), t) if p.get("reverse") else t
        for s, base, nbytes in rows:
            b.store(b.gep(base, [b.mul(row, i64(nbytes))], inbounds=True), at(s))
        child.emit_steps(b, table, steps)
        self.n_parallel += child.n_parallel
        nxt = b.add(t, i64(1))
        t.add_incoming(nxt, b.block)
        for phi, o in zip(ins, outs, strict=True):
            phi.add_incoming(o, b.block)
        b.cbranch(b.icmp_signed("<", nxt, i64(length)), step, done)
        b.position_at_end(done)
        b.ret_void()
        return [(fn, 1)]

    def lower_group(self, name: str, group: Group,
                    block: tuple[int, int, bool] | None = None) -> list[tuple[Kernel, int]]:
        """`block`: the (tasks, chunk, columns?) split of the matmul this loop is the epilogue
        of."""
        produced = {v.id: e for e in group.eqns for v in e.outvars}
        if group.kind == "matmul":
            keys = [a.id for a, _ in group.operands] + [group.eqns[0].out.id]
            keys += [a.id for a in group.acc[:2] if type(a) is Var] if group.acc else []
            own = packs(group, self.vector_bits)
            blas = self.use_blas and uses_blas(group) and not own
            if blas:
                keys += ["gemm", "blas_threads"]
                self.slot["gemm"], self.dtype["gemm"] = gemm_slot(group), np.dtype(np.int8)
                self.slot["blas_threads"] = SLOT_BLAS_THREADS
                self.dtype["blas_threads"] = np.dtype(np.int8)
            gsplit = self.gemm_plan[self.group_index[id(group)]]
            k = self.kernel(name, keys, group, ("blas", blas, own, gsplit, self.blas_int_bits))
            if k.fresh:
                emit_matmul(k, group, blas, gsplit, self.blas_int_bits, own)
            self.layout_blas = self.layout_blas or blas
            return [(k.finish(), gsplit[0])]
        if group.kind == "update":
            return self.lower_update(name, group.eqns[0])
        if group.kind == "scan":
            return self.lower_scan(name, group)
        reads = [a.id for e in group.eqns for a in e.inputs
                 if isinstance(a, Var) and a.id not in produced]
        if group.kind in ("scatter_add", "scatter"):
            k = self.kernel(name, reads + [group.eqns[0].out.id], group)
            if k.fresh:
                (emit_scatter if group.kind == "scatter" else emit_scatter_add)(k, group)
            return [(k.finish(), 1)]
        writes = [v.id for v in group.roots] + [e.out.id for e in group.reductions]
        if group.kind == "argreduce":
            k = self.kernel(name, reads + writes, group)
            if k.fresh:
                emit_argreduce(k, group, produced)
            return [(k.finish(), 1)]
        p, tasks = split(group) if block is None else (1, block[0])
        reds = reductions(group, p, tasks)
        partial_keys = {}
        for r in reds:
            if r.partial:
                key = ("partial", r.eqn.out.id)
                dt = r.eqn.out.aval.dtype
                self.new_slot(key, dt, tasks * r.out_size * dt.itemsize)
                partial_keys[id(r.eqn)] = key
        outline = (group.size < INLINE_MATH_MIN_SIZE
                   and self.math_sites > INLINE_MATH_MAX_SITES)
        k = self.kernel(name, reads + writes + list(partial_keys.values()), group,
                        (p, tasks, outline, block))
        token = OUTLINE_MATH.set(outline)
        try:
            if k.fresh:
                emit_loop_group(k, group, produced, p, tasks, partial_keys,
                                None if block is None else block[1:])
        finally:
            OUTLINE_MATH.reset(token)
        calls = [(k.finish(), tasks)]
        for j, r in enumerate(reds):
            if r.partial:
                key = partial_keys[id(r.eqn)]
                c = self.kernel(f"{name}_c{j}", [key, r.eqn.out.id], None,
                                ("combine", r.eqn.op, r.out_size, tasks))
                if c.fresh:
                    emit_combine(c, r, tasks, key)
                calls.append((c.finish(), 1))
        return calls


def group_work(group: Group) -> int:
    if group.kind == "scan":
        return 0            # run from the entry (or its loop), never a region's member
    if group.kind == "matmul":
        return math.prod(gemm_dims(group))
    return group.size


def lower_graph(graph: Graph, use_blas: bool = True, threads: int = 1,
                blas_int_bits: int = 32, vector_bits: int = 256) -> Lowered:
    """Plan fusion groups and emit the LLVM module and buffer layout for `graph`.
    `use_blas`: large float matmuls call the ?gemm whose address is in slots 1-2, whose
    integer arguments are `blas_int_bits` wide.
    `threads`: the pool size GEMMs are split for (results do not depend on it).
    `vector_bits`: the target's vector width; at 512, the float matmuls that would call
    ?gemm run as our own packed GEMM (`linalg.packs`) instead."""
    return _Lowering(graph, use_blas, threads, blas_int_bits,
                     vector_bits=vector_bits).lower()

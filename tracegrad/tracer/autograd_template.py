"""Plan templates: the backward plan of a loop's tape at a length not composed before,
written from the plans composed for two other lengths instead of by grad_walk and compose.

A Python loop recording the same ops each step leaves a tape whose key (autograd_exec.
tape_walk, whose references are relative) is a prefix, a block repeated n times and a suffix:
its form. Composing the tapes of one form at two lengths n1 < n2 gives two plans whose steps
differ only in integers and in how often some runs of steps repeat: the forward's blocks, the
reverse pass's, the operands of a weight's merged gradient (one matmul of concatenations).
`derive` aligns the two plans' steps (by everything but their integers) into fixed steps and
runs of blocks, writes every slot number as a * n + b (a run's k-th block adding k * stride),
and refuses anything else: a step type that differs, an integer not linear in n, a stride
that differs, a template that does not give back the second plan. For another length
n >= n1 of the form, `Template.plan` writes the plan step for step as compose would (the
same functions over the same slots, so the same bits), the composer's own concatenations,
transposes and products made again by autograd_compose._synth at their new types. That
compose makes plans alike at lengths beyond n2 is what a template assumes, and two counts fit
a line whatever they are, so a template writes nothing until the plan composed at a third
count n >= n1 is what it writes there (as jit's loop templates are checked); one that is not
is dropped, and the form's plans are composed from then on. `check` composes at every count
and compares (the tests run it over loop programs at many lengths). Not templated: a
step reading a value made before the loop (its reference in the key grows with the step),
a plan whose walk order is not the tape's, a second leaf of one variable.

A form with n fixes the tape's key, so a template is used exactly where _tape_plans would be
asked (after tape_walk vouched for the tape). Inputs are numbered in tape order (where the
key reads them first), not in the walk's order: plans equal up to that renumbering."""
from __future__ import annotations

import itertools
from itertools import chain, repeat
from typing import Any

from ..ir.core import Aval, Var
from .autograd_compose import Plan, _dot, _ndot, _synth, _synthetic
from .executor import collector_paused

# In a tape's key (autograd_exec.tape_walk), an input's first reference, without and with a
# gradient (its slot is the number of inputs read before), and a second leaf's.
NEW, NEW_WRT, NEW_OWN = -1 << 50, -(1 << 50) - 1, -(1 << 50) - 2
MIN_REPS = 3        # a form's block repeats at least this often
PREFIX = 256        # entries of a key before its block, at most
ATTEMPTS = 2        # derivations tried per form before it is left to compose
# blocks of a run at the larger count, at least: its stride seen twice. Taken from two blocks
# a stride fits anything, e.g. a chain of adds whose first block is unlike the rest, cut as
# one block at n1 and two at n2 with the later ones fixed (it wrote wrong slots at every
# other count)
STRIDE_BLOCKS = 3
FORMS = 256         # forms remembered (their samples and templates)
check = False       # compose anyway and compare with the template (tests, debugging)


class _Refused(Exception):
    """The plans differ other than a template allows."""


class Template:
    """The plans of one tape form at every count n >= lo (see the module docstring)."""
    __slots__ = ("n0", "lo", "segs", "n_slots", "n_in", "consts", "outs", "extra", "recipe",
                 "dots", "counts", "checked")

    def plan(self, n: int, tape: list, root: Any) -> tuple:
        """(plan, the inputs with gradients, where each input is on `tape`) for count n: what
        compose would make for this tape, inputs in tape order."""
        steps, meta, n_slots, n_in, consts, outs, extra, where = self.write(n)
        p = Plan()
        init = [None] * n_slots
        for k, c in consts:
            init[k] = c[1]
        p.init = init
        p.steps = steps
        p.meta = meta
        p.n_in = n_in
        p.in_vars = [tape[i].args[j][0] for i, j in where] + [Var(root._var.aval)]
        p.consts = dict(consts)
        p._graph = None
        p.outs = outs
        p.dots = self.dots      # (the steps' functions are the samples')
        return p, extra, where

    def write(self, n: int) -> tuple:
        """The plan's parts at count n: steps, meta, number of slots, of inputs, constants
        (slot, constant), outputs, inputs with gradients, where the inputs are."""
        dn = n - self.n0
        steps: list = []
        meta: list = []
        made: dict = {}
        for seg in self.segs:
            if seg[0] == 0:
                _fixed(seg[1], dn, steps, meta, made)
            else:
                _run(seg, dn, steps, meta)
        return (steps, meta, self.n_slots[0] + self.n_slots[1] * dn,
                self.n_in[0] + self.n_in[1] * dn,
                [(b + a * dn, c) for b, a, c in self.consts],
                [(b + a * dn, fresh) for b, a, fresh in self.outs],
                [b + a * dn for b, a in self.extra], _recipe(self.recipe, dn))


# ---- writing a plan ----------------------------------------------------------------------------

def _fixed(specs: list, dn: int, steps: list, meta: list, made: dict) -> None:
    """Append fixed steps. A spec: (0, step, meta) taken as it is; (1, fn, ins (base, a)...,
    out, arity, meta) with out as _out reads it; (2, ...) a step of the composer's own (see
    _synth_spec; `made`: the types of their results so far, by shape and dtype); the
    commonest, one output of two inputs or of one, written out: (3, fn, base, a, base, a,
    out's base, a, meta), (4, fn, base, a, out's base, a, meta)."""
    for s in specs:
        kind = s[0]
        if kind == 3:
            _, fn, b0, a0, b1, a1, b, a, m = s
            steps.append((fn, (b0 + a0 * dn, b1 + a1 * dn), b + a * dn, 2))
            meta.append(m)
        elif kind == 0:
            steps.append(s[1])
            meta.append(s[2])
        elif kind == 4:
            _, fn, b0, a0, b, a, m = s
            steps.append((fn, (b0 + a0 * dn,), b + a * dn, 1))
            meta.append(m)
        elif kind == 1:
            _, fn, ins, out, arity, m = s
            steps.append((fn, tuple([b + a * dn for b, a in ins]), _out(out, dn), arity))
            meta.append(m)
        else:
            _synth_step(s, dn, steps, meta, made)


def _out(out: tuple, dn: int) -> Any:
    """An output slot (base, a), or several consecutive ones (base, a, count, a)."""
    if len(out) == 2:
        return out[0] + out[1] * dn
    k = out[0] + out[1] * dn
    return tuple(range(k, k + out[2] + out[3] * dn))


def _run(seg: tuple, dn: int, steps: list, meta: list) -> None:
    """Append a run: its blocks' steps, block by block; every integer of block k is its
    first block's plus k * stride. (The steps are made by zip, a column per block step.)"""
    _, reps0, reps_a, block, block_meta = seg
    reps = reps0 + reps_a * dn
    columns = []
    for fn, ins, out, arity in block:
        if ins:
            picks = zip(*[range(b + a * dn, b + a * dn + s * reps, s) if s else
                          repeat(b + a * dn, reps) for b, a, s in ins])
        else:
            picks = repeat((), reps)
        b, a, s = out
        k = b + a * dn
        columns.append(zip(repeat(fn, reps), picks, range(k, k + s * reps, s),
                           repeat(arity, reps)))
    steps.extend(chain.from_iterable(zip(*columns)))
    meta.extend(block_meta * reps)


def _synth_step(s: tuple, dn: int, steps: list, meta: list, made: dict) -> None:
    """Append a composer-made step at its types for this count (autograd_compose._synth's:
    looked up by its key first, as _synth would; its operand types, when it makes them, are
    those of earlier such steps' results, as the composer's are, or of the plan it was
    derived from if they do not change with the count)."""
    _, op, axis, avals, ins, out, src, of, ndot = s
    if len(ins) == 1 and len(ins[0]) == 5:      # (the common case: one run of operands)
        b, a, st, c, ca = ins[0]
        k = b + a * dn
        args = tuple(range(k, k + st * (c + ca * dn), st) if st else repeat(k, c + ca * dn))
    else:
        args = []
        for part in ins:
            if len(part) == 2:
                args.append(part[0] + part[1] * dn)
            else:       # a run of operands: (base, a, stride, count, count's a)
                b, a, st, c, ca = part
                k = b + a * dn
                args.extend(range(k, k + st * (c + ca * dn), st) if st else
                            repeat(k, c + ca * dn))
        args = tuple(args)
    if avals[0] == "all":   # one type, once per operand (a concatenation's)
        shape = _shape(avals[1], dn)
        hit = _synthetic.get((op, axis, len(args), shape, avals[2], shape))
        if hit is None:
            hit = _synth(op, (_aval(shape, avals[2], avals[3], made),) * len(args), axis)
    else:
        first = _shape(avals[0][0], dn)
        last = first if len(avals) == 1 else _shape(avals[-1][0], dn)
        hit = _synthetic.get((op, axis, len(avals), first, avals[0][1], last))
        if hit is None:
            hit = _synth(op, tuple([_aval(_shape(dims, dn), dtype, same, made)
                                    for dims, dtype, same in avals]), axis)
    te = hit[1]
    v = te.outvars[0].aval
    made[(v.shape, v.dtype)] = v
    steps.append((_ndot if ndot and hit[0] is _dot else hit[0], args, _out(out, dn),
                  len(args) if len(out) == 2 else -1))
    meta.append((te, src, of))


def _shape(dims: tuple, dn: int) -> tuple:
    if len(dims) == 2:
        (b0, a0), (b1, a1) = dims
        return (b0 + a0 * dn, b1 + a1 * dn)
    return tuple([b + a * dn for b, a in dims])


def _aval(shape: tuple, dtype: Any, same: Aval | None, made: dict) -> Aval:
    if same is not None:
        return same
    aval = made.get((shape, dtype))
    return aval if aval is not None else Aval(shape, dtype)


def _recipe(spec: tuple, dn: int) -> tuple:
    """Where each input is on the tape: (node position, entry) per input, in tape order."""
    before, body, reps0, nodes, after = spec
    reps = reps0 + dn
    out = list(before)
    if len(body) == 1:
        (i, j), = body
        out += zip(range(i, i + nodes * reps, nodes), repeat(j, reps))
    else:
        for k in range(reps):
            shift = k * nodes
            out += [(i + shift, j) for i, j in body]
    shift = dn * nodes
    out += [(i + shift, j) for i, j in after]
    return tuple(out)


# ---- forms and samples -------------------------------------------------------------------------

_forms: dict = {}       # form -> [sample or None, Template or None, attempts]
_shapes: list = []      # (prefix length, block length, suffix length) of the forms with templates


def find_form(key: tuple) -> tuple | None:
    """(form, n): the key's first run of >= MIN_REPS equal blocks, as (prefix, block, suffix)
    and how often the block repeats; None if it has none starting in its first PREFIX
    entries (a bound on the search, which every backward composed makes)."""
    size = len(key)
    for i in range(min(size, PREFIX)):
        try:
            j = key.index(key[i], i + 1, i + 1 + (size - i) // MIN_REPS)
        except ValueError:
            continue
        p = j - i
        block = key[i:j]
        reps = 1
        while key[i + reps * p:i + (reps + 1) * p] == block:
            reps += 1
        if reps >= MIN_REPS:
            end = i + reps * p
            return (key[:i], block, key[end:]), reps
    return None


def plan_for(key: tuple, tape: list, root: Any) -> tuple | None:
    """Template.plan for a tape of `key`, or None if no template writes it."""
    if check:
        return None
    size = len(key)
    for plen, p, slen in _shapes:
        middle = size - plen - slen
        if middle <= 0 or middle % p:
            continue
        block = key[plen:plen + p]
        entry = _forms.get((key[:plen], block, key[size - slen:]))
        if entry is None or entry[1] is None:
            continue
        n = middle // p
        t = entry[1]
        if not t.checked or n < t.lo or key[plen:size - slen] != block * n:
            continue
        return t.plan(n, tape, root)
    return None


def learn(key: tuple, tape: list, root: Any, recipe: tuple) -> None:
    """File the plan just composed for a tape of `key` (recipe: as _tape_plans holds it) as a
    sample of its form; with a sample of another length, derive the form's template; with
    one of a third length, check it (keep it for good or drop it). (With `check`, compare
    every later one with what the template writes.)"""
    if recipe[2] is not None or recipe[0].plan is None or NEW_OWN in key:
        return
    found = find_form(key)
    if found is None:
        return
    form, n = found
    entry = _forms.get(form)
    if entry is None:
        if len(_forms) >= FORMS:
            _forms.clear()
            _shapes.clear()
        entry = _forms[form] = [None, None, 0]
    t = entry[1]
    if t is not None:
        if (check or not t.checked) and n >= t.lo and n not in t.counts:
            sample = _sample(n, len(tape), recipe)
            made = t.plan(n, tape, root)
            if sample is None or not _same_parts(_parts(*made), sample[2]):
                if check:
                    raise AssertionError(f"a plan template differs from compose at n={n}")
                entry[1] = None
                entry[2] = ATTEMPTS      # (given up: compose every length of this form)
                return
            t.checked = True
        return
    sample = (n, len(tape), recipe)
    old = entry[0]
    if old is None or old[0] == n or entry[2] >= ATTEMPTS:
        entry[0] = old or sample
        return
    entry[2] += 1
    a, b = (old, sample) if old[0] < n else (sample, old)
    try:
        with collector_paused():    # (as autograd_exec._backward_graph, for the same reason)
            a, b = _sample(*a), _sample(*b)
            if a is None or b is None:
                raise _Refused
            t = derive(form, a, b)
    except _Refused:
        entry[0] = sample       # (try the next length with this one)
        return
    entry[1] = t
    entry[0] = None
    shape = (len(form[0]), len(form[1]), len(form[2]))
    if shape not in _shapes:
        _shapes.append(shape)


def _sample(n: int, length: int, recipe: tuple) -> tuple | None:
    """(n, tape length, the plan's parts as Template.write gives them: inputs in tape
    order); None for a plan with other than one cotangent input."""
    entry, where, _ = recipe
    p = entry.plan
    n_args = len(where)
    if p.n_in != n_args + 1:
        return None
    order = sorted(range(n_args), key=where.__getitem__)
    new = {old: k for k, old in enumerate(order)}
    get = new.get
    steps = [(fn, tuple([get(k, k) for k in ins]), out, arity)
             for fn, ins, out, arity in p.steps]
    parts = (steps, list(p.meta), len(p.init), p.n_in, sorted(p.consts.items()),
             [(get(k, k), fresh) for k, fresh in p.outs], [get(k, k) for k in entry.extra],
             tuple([where[k] for k in order]))
    return n, length, parts


def _parts(p: Plan, extra: list, where: tuple) -> tuple:
    """A plan's parts as Template.write gives them (its inputs in tape order)."""
    return (list(p.steps), list(p.meta), len(p.init), p.n_in, sorted(p.consts.items()),
            list(p.outs), list(extra), tuple(where))


def _same_parts(x: tuple, y: tuple) -> bool:
    """Whether two plans' parts are equal: steps and meta (functions and equations by
    identity), constants by key."""
    return x[:4] == y[:4] and x[5:] == y[5:] and \
        [(k, c[0]) for k, c in x[4]] == [(k, c[0]) for k, c in y[4]]


# ---- deriving a template -----------------------------------------------------------------------

def derive(form: tuple, a: tuple, b: tuple) -> Template:
    """The template of a form from samples at two counts (a's the smaller); raises _Refused
    when the plans differ other than the module docstring allows."""
    n1, n2 = a[0], b[0]
    d = n2 - n1
    sa, ma, slots_a, in_a, consts_a, outs_a, extra_a, _ = a[2]
    sb, mb, slots_b, in_b, consts_b, outs_b, extra_b, _ = b[2]
    t = Template()
    t.n0 = t.lo = n1
    t.counts = (n1, n2)
    t.checked = False
    t.n_slots = _affine(slots_a, slots_b, d)
    t.n_in = _affine(in_a, in_b, d)
    if len(consts_a) != len(consts_b) or len(outs_a) != len(outs_b) or \
            len(extra_a) != len(extra_b):
        raise _Refused
    t.consts = []
    for (ka, ca), (kb, cb) in zip(consts_a, consts_b):
        if ca[0] != cb[0]:
            raise _Refused
        t.consts.append((*_affine(ka, kb, d), ca))
    t.outs = []
    for (ka, fa), (kb, fb) in zip(outs_a, outs_b):
        if fa != fb:
            raise _Refused
        t.outs.append((*_affine(ka, kb, d), fa))
    t.extra = [_affine(ka, kb, d) for ka, kb in zip(extra_a, extra_b)]
    t.recipe = _recipe_spec(form, a, b)
    t.dots = any(s[0] is _ndot for s in sb)
    synthetic = {id(e) for _, e in _synthetic.values()}
    pa, pb = (sa, ma), (sb, mb)
    segs = _align([_token(m, s, synthetic) for s, m in zip(sa, ma)],
                  [_token(m, s, synthetic) for s, m in zip(sb, mb)], d)
    if segs is None:
        raise _Refused
    t.segs = []
    for seg in segs:
        if seg[0] == "fix":
            _, ia, ib, length = seg
            t.segs.append((0, [_fixed_spec(pa, pb, ia + q, ib + q, d, synthetic)
                               for q in range(length)]))
        else:
            t.segs.extend(_run_specs(pa, pb, seg, d, synthetic))
    if not _same_parts(t.write(n2), b[2]):     # (a's integers are its bases)
        raise _Refused
    return t


def _affine(va: int, vb: int, d: int) -> tuple[int, int]:
    """(base, a): va at the first count, vb d later, as base + a * (n - n1)."""
    a, r = divmod(vb - va, d)
    if r:
        raise _Refused
    return va, a


def _token(m: tuple, s: tuple, synthetic: set) -> tuple:
    """What two steps must share to be aligned: all but their integers (a composer-made
    step's type and arity change with the length; they are made again)."""
    te, src, op = m
    if id(te) in synthetic:
        return ("synth", te.op, te.params.get("axis"), src, op, s[3] < 0)
    return (s[0], id(te), src, op, s[3], len(s[1]))


def _align(ta: list, tb: list, d: int) -> list | None:
    """Steps a (count n1) and b (n1 + d) as fixed stretches and runs: ("fix", at in a, at in
    b, length) and ("run", at in a, at in b, block length, blocks in a, blocks in b). Where
    they first differ, b must go on repeating the block it just matched, d * c times over
    (a run growing by c blocks per count), then go on as a does."""
    segs: list = []
    i = j = 0
    si = sj = 0     # where the current fixed stretch began
    na, nb = len(ta), len(tb)
    while True:
        while i < na and j < nb and ta[i] == tb[j]:
            i += 1
            j += 1
        if i == na and j == nb:
            if i > si:
                segs.append(("fix", si, sj, i - si))
            return segs
        found = None
        for m in range(1, i - si + 1):
            block = tb[j - m:j]
            for c in itertools.count(1):
                size = c * d * m
                if j + size > nb or tb[j:j + size] != block * (c * d):
                    break
                if (i == na and j + size == nb) or \
                        (i < na and j + size < nb and ta[i] == tb[j + size]):
                    found = m, c
                    break
            if found:
                break
        if found is None:
            return None
        m, c = found
        reps = 1
        while i - (reps + 1) * m >= si and ta[i - (reps + 1) * m:i - reps * m] == block:
            reps += 1
        start = i - reps * m
        if start > si:
            segs.append(("fix", si, sj, start - si))
        segs.append(("run", start, sj + start - si, m, reps, reps + c * d))
        j += c * d * m
        si, sj = i, j


def _fixed_spec(pa: tuple, pb: tuple, ia: int, ib: int, d: int, synthetic: set) -> tuple:
    """The spec of step ia of plan a (steps, meta), step ib of plan b."""
    sa, sb = pa[0][ia], pb[0][ib]
    ma, mb = pa[1][ia], pb[1][ib]
    if id(ma[0]) in synthetic and ma[0] is not mb[0]:
        return _synth_spec(sa, sb, ma, mb, d)
    if sa[0] is not sb[0] or not _same(ma, mb) or len(sa[1]) != len(sb[1]) or sa[3] != sb[3]:
        raise _Refused
    ins = tuple([_affine(x, y, d) for x, y in zip(sa[1], sb[1])])
    out = _out_spec(sa[2], sb[2], d)
    if all(a == 0 for _, a in ins) and all(a == 0 for a in out[1::2]):
        return (0, sa, ma)
    if len(out) == 2 and sa[3] == len(ins) == 2:
        return (3, sa[0], *ins[0], *ins[1], *out, ma)
    if len(out) == 2 and sa[3] == len(ins) == 1:
        return (4, sa[0], *ins[0], *out, ma)
    return (1, sa[0], ins, out, sa[3], ma)


def _out_spec(oa: Any, ob: Any, d: int) -> tuple:
    if type(oa) is int:
        if type(ob) is not int:
            raise _Refused
        return _affine(oa, ob, d)
    if type(ob) is int or not oa or not ob or list(oa) != list(range(oa[0], oa[0] + len(oa))) \
            or list(ob) != list(range(ob[0], ob[0] + len(ob))):
        raise _Refused
    return (*_affine(oa[0], ob[0], d), *_affine(len(oa), len(ob), d))


def _synth_spec(sa: tuple, sb: tuple, ma: tuple, mb: tuple, d: int) -> tuple:
    """A composer-made step whose type changes with the count (a concatenation of one
    operand per block, the matmul and transpose reading it): its operands as runs, its
    operand types' dimensions as base + a * (n - n1)."""
    ea, eb = ma[0], mb[0]
    axis = ea.params.get("axis") if ea.op == "concatenate" else None
    ta, tb = [v.aval for v in ea.inputs], [v.aval for v in eb.inputs]
    if ea.op == "concatenate":
        if len(set(ta)) != 1 or len(set(tb)) != 1 or len(ta) != len(sa[1]) or \
                len(tb) != len(sb[1]):
            raise _Refused
        avals = ("all", *_type(ta[0], tb[0], d))
    else:
        if len(ta) != len(tb) or len(sa[1]) != len(sb[1]):
            raise _Refused
        avals = tuple([_type(x, y, d) for x, y in zip(ta, tb)])
    return (2, ea.op, axis, avals, _operands(sa[1], sb[1], d), _out_spec(sa[2], sb[2], d),
            ma[1], ma[2], sa[0] is _ndot)   # (a matmul the composer made _ndot: as it was)


def _type(x: Aval, y: Aval, d: int) -> tuple:
    """(dimensions as (base, a), dtype, the type itself if it does not change)."""
    if x.dtype != y.dtype or len(x.shape) != len(y.shape):
        raise _Refused
    dims = tuple([_affine(p, q, d) for p, q in zip(x.shape, y.shape)])
    return dims, x.dtype, x if x.shape == y.shape else None


def _operands(la: tuple, lb: tuple, d: int) -> tuple:
    """Operand lists at two counts as parts: (base, a) one operand, (base, a, stride, count,
    count's a) a run of them; the longest run first, found where both are one."""
    if len(la) == len(lb):
        return tuple([_affine(x, y, d) for x, y in zip(la, lb)])
    grow = len(lb) - len(la)
    if grow < 0 or grow % d:
        raise _Refused
    for size in range(len(la), 0, -1):
        for head in range(len(la) - size + 1):
            tail = len(la) - head - size
            ra, rb = la[head:head + size], lb[head:head + size + grow]
            stride = rb[1] - rb[0]
            if any(ra[k] != ra[0] + k * stride for k in range(size)) or \
                    any(rb[k] != rb[0] + k * stride for k in range(len(rb))):
                continue
            try:
                parts = [_affine(x, y, d) for x, y in zip(la[:head], lb[:head])]
                base, a = _affine(ra[0], rb[0], d)
                parts.append((base, a, stride, size, grow // d))
                parts += [_affine(x, y, d) for x, y in zip(la[len(la) - tail:],
                                                            lb[len(lb) - tail:])]
            except _Refused:
                continue
            return tuple(parts)
    raise _Refused


def _run_specs(pa: tuple, pb: tuple, seg: tuple, d: int, synthetic: set) -> list:
    """A run's segments: the run, with its first or last blocks kept apart as fixed steps
    where their integers do not follow the others' strides (the first block of a reverse
    pass also makes what all the others read)."""
    _, ia, ib, m, ra, rb = seg
    for q in range(m):      # (the alignment compared all else but a composer-made step's)
        ma = pa[1][ia + q]
        if id(ma[0]) in synthetic and (
                any(pa[1][ia + k * m + q][0] is not ma[0] for k in range(ra)) or
                any(pb[1][ib + k * m + q][0] is not ma[0] for k in range(rb))):
            raise _Refused
        if pa[0][ia + q][3] < 0:
            raise _Refused      # (several outputs: not in a run)
    ints_a = [_block_ints(pa[0], ia + k * m, m) for k in range(ra)]
    ints_b = [_block_ints(pb[0], ib + k * m, m) for k in range(rb)]
    for peel in range(min(ra, 3)):
        for cut in range(min(ra - peel, 3)):
            found = _strides(ints_a[peel:ra - cut], ints_b[peel:rb - cut], d)
            if found is None:
                continue
            base, stride = found
            block = []
            x = 0
            for q in range(m):
                fn, ins, _, arity = pa[0][ia + peel * m + q]
                at = base[x:x + len(ins) + 1]
                by = stride[x:x + len(ins) + 1]
                if by[-1] == 0:
                    break   # (outputs must differ)
                spec = [(*b, s) for b, s in zip(at, by)]
                block.append((fn, tuple(spec[:-1]), spec[-1], arity))
                x += len(ins) + 1
            else:
                out = []
                if peel:
                    out.append((0, [_fixed_spec(pa, pb, ia + q, ib + q, d, synthetic)
                                    for q in range(peel * m)]))
                start = ia + peel * m
                out.append((1, ra - peel - cut, (rb - ra) // d, tuple(block),
                            pa[1][start:start + m]))
                if cut:
                    ea, eb = ia + ra * m, ib + rb * m
                    out.append((0, [_fixed_spec(pa, pb, ea - cut * m + q, eb - cut * m + q,
                                                d, synthetic) for q in range(cut * m)]))
                return out
    raise _Refused


def _block_ints(steps: list, at: int, m: int) -> list:
    """The integers of steps at..at+m-1: per step its inputs, then its output."""
    out = []
    for q in range(at, at + m):
        s = steps[q]
        out += s[1]
        out.append(s[2])
    return out


def _strides(blocks_a: list, blocks_b: list, d: int) -> tuple | None:
    """(base as (b, a) per integer, stride per integer) when every integer of block k is
    base + k * stride in both lists of blocks, its base linear in the count; else None.
    The stride must be seen twice (STRIDE_BLOCKS)."""
    if not blocks_a or len(blocks_b) < STRIDE_BLOCKS or (len(blocks_b) - len(blocks_a)) % d:
        return None
    first_a, first_b = blocks_a[0], blocks_b[0]
    stride = [y - x for x, y in zip(first_b, blocks_b[1])]
    for blocks, first in ((blocks_a, first_a), (blocks_b, first_b)):
        for k in range(1, len(blocks)):
            if [x - k * s for x, s in zip(blocks[k], stride)] != first:
                return None
    base = []
    for x, y in zip(first_a, first_b):
        a, r = divmod(y - x, d)
        if r:
            return None
        base.append((x, a))
    return base, stride


def _same(m1: tuple, m2: tuple) -> bool:
    return m1[0] is m2[0] and m1[1] == m2[1] and m1[2] == m2[2]


def _recipe_spec(form: tuple, a: tuple, b: tuple) -> tuple:
    """Where the inputs are on the tape, as (the prefix's, the first block's, blocks at n1,
    nodes per block, the suffix's at n1): inputs are first read where the key has _NEW or
    _NEW_WRT, in order."""
    before, block, after = form
    n1, n2 = a[0], b[0]
    nodes, r = divmod(b[1] - a[1], n2 - n1)
    if r:
        raise _Refused
    cp, cb, cs = (sum(1 for x in part if x == NEW or x == NEW_WRT)
                  for part in (before, block, after))
    where = a[2][7]
    if len(where) != cp + n1 * cb + cs:
        raise _Refused
    body = where[cp:cp + cb]
    spec = (where[:cp], body, n1, nodes, where[cp + n1 * cb:])
    if _recipe(spec, 0) != where or _recipe(spec, n2 - n1) != b[2][7]:
        raise _Refused
    return spec


"""The functional transforms: grad, value_and_grad, vjp, jvp, jacrev, jacfwd, hessian,
make_ir. Each traces the function, transforms the graph, then runs it (or, inside an outer
trace, inlines it) so transforms compose in any order."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .. import ir
from ..ir import emit as E
from ..config import config
from ..ir.builder import Builder, Traced, current_builder
from .pytree import TreeDef, tree_flatten, tree_unflatten
from .trace import aval_of_leaf, call_graph, flatten_args, trace


def _argnums(argnums: int | Sequence[int], nargs: int, fname: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise ValueError(f"{fname}: argnums must name at least one argument")
    for n in nums:
        if not isinstance(n, int):
            raise TypeError(f"{fname}: argnums must be ints, got {n!r}")
        if not -nargs <= n < nargs:
            raise ValueError(f"{fname}: argnums {n} is out of range for a function called "
                             f"with {nargs} positional argument(s)")
    return tuple(n % nargs for n in nums)


def _static_args(args: Sequence[Any], nums: Sequence[int]) -> tuple[int, ...]:
    """Positions of the arguments not differentiated that the function sees as Python
    values, as under JAX's grad: Python scalars (so `range(n)` and `if k > 0.5:` work), and
    arguments holding no array at all (a string, a tuple of ints, an option object)."""
    return tuple(i for i, a in enumerate(args) if i not in nums and _python_value(a))


def _python_value(a: Any) -> bool:
    if isinstance(a, (int, float)):      # (bool is an int)
        return not isinstance(a, np.generic)
    if type(a) is np.ndarray or type(a) is Traced:
        return False
    return not any(isinstance(x, (np.ndarray, np.generic, Traced)) or
                   hasattr(x, "__tg_array__") for x in tree_flatten(a)[0])


def _leaf_ranges(args: Sequence[Any], static: Sequence[int] = ()) -> list[range]:
    """The flat leaf indices of each positional argument (static ones have none)."""
    out, start = [], 0
    for i, a in enumerate(args):
        n = 0 if i in static else 1 if type(a) is np.ndarray else len(tree_flatten(a)[0])
        out.append(range(start, start + n))
        start += n
    return out


def _check_float(leaves: Sequence[Any], idx: Sequence[int], fname: str,
                 ranges: Sequence[range] | None = None) -> None:
    """TypeError unless the leaves `idx` are floats. `ranges` (each argument's leaves) names
    a leaf of a pytree argument by its argument instead of its flat position."""
    for i in idx:
        dtype = ir.emit.dtype_of(leaves[i])
        if not ir.is_float(dtype):
            what = f"input {i}"
            for n, r in enumerate(ranges or ()):
                if i in r:
                    what = f"argument {n}" + (f" (its leaf {i - r.start})" if len(r) > 1
                                              else "")
                    break
            raise TypeError(f"{fname} requires real-valued floating point inputs, but "
                            f"{what} has dtype {dtype}; only float arguments can be "
                            "differentiated (cast with tg.astype(x, tg.float32), or exclude "
                            "it with argnums)")


def _run(graph: ir.Graph, captured: list, leaves: list) -> list[Any]:
    args = list(leaves) + list(captured)
    outer = current_builder()
    if outer is not None and outer.optimized_later:   # jit optimises the whole graph anyway
        return call_graph(graph, args)
    return call_graph(ir.optimize(graph), args)


def _positional(f: Callable, n: int, keys: tuple[str, ...]) -> Callable:
    """`f` taking its keyword arguments `keys` as positional arguments after the first `n`."""
    def g(*a: Any) -> Any:
        return f(*a[:n], **dict(zip(keys, a[n:])))
    g.__name__ = getattr(f, "__name__", "f")
    return g


def _with_keywords(transform: Callable, f: Callable, argnums: int | Sequence[int],
                   fname: str, args: tuple, kwargs: dict, *options: Any) -> Any:
    """`transform(f, argnums, *options)(*args, **kwargs)` for a transform taking positional
    arguments only: as in JAX, keyword arguments are traced like positional ones and never
    differentiated (they go after `args`; `argnums` keeps naming the same ones)."""
    nums = _argnums(argnums, len(args), fname)
    return transform(_positional(f, len(args), tuple(kwargs)),
                     nums[0] if isinstance(argnums, int) else nums,
                     *options)(*args, *kwargs.values())


class Started(NamedTuple):
    """What `value_and_grad`'s trace of f hands to its differentiation (see jit)."""
    nums: tuple       # the differentiated arguments
    static: tuple     # the arguments f saw as Python values (see _static_args)
    ranges: list      # each argument's flat leaf indices
    wrt: list         # the flat leaves differentiated


def _main_leaves(out_tree: TreeDef, has_aux: bool, fname: str) -> int:
    """How many of f's output leaves a transform differentiates: all, or with `has_aux` those
    of the first of the pair (out, aux) f must return."""
    if not has_aux:
        return out_tree.num_leaves
    if out_tree.kind not in ("tuple", "list") or len(out_tree.children) != 2:
        raise TypeError(f"{fname} with has_aux=True needs f to return a pair (out, aux), "
                        f"got {out_tree}")
    return out_tree.children[0].num_leaves


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable:
    """`(value, grad)` of a scalar function; grad is for the args named by `argnums`."""
    fname = getattr(f, "__name__", "f")

    def start(args: tuple) -> tuple:
        """Trace f: (its traced function, its flat leaves, what finish needs)."""
        nums = _argnums(argnums, len(args), "grad")
        static = _static_args(args, nums)
        ranges = _leaf_ranges(args, static)
        wrt = [i for n in nums for i in ranges[n]]
        dyn = [a for i, a in enumerate(args) if i not in static]
        for a in dyn:
            if type(a) is not np.ndarray or a.dtype.kind == "O":
                dyn = flatten_args(dyn)[0]
                break
        _check_float(dyn, wrt, "grad", ranges)     # (numeric arrays only: each its own leaf)
        tf, leaves = trace(f, args, static)
        return tf, leaves, Started(nums, static, ranges, wrt)

    @functools.wraps(f)
    def vg(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return _with_keywords(value_and_grad, f, argnums, "grad", args, kwargs, has_aux)
        return finish(args, *start(args))

    def finish(args: tuple, tf: Any, leaves: list, meta: Started) -> Any:
        """Differentiate f's trace `tf` (its inputs: `leaves`) into the value and gradient."""
        nums, ranges, wrt = meta.nums, meta.ranges, meta.wrt
        g = ir.roll_loops(tf.graph) if config.roll_loops else tf.graph
        n_out = len(g.outvars)
        n_main = _main_leaves(tf.out_tree, has_aux, "grad")
        if n_main != 1 or g.outvars[0].aval.shape != ():
            shape = g.outvars[0].aval.shape if n_main == 1 else f"{n_main} values"
            raise TypeError(f"grad of {fname}: the function must return a scalar (shape ()), "
                            f"got {shape}; use tg.vjp or tg.jacrev for non-scalar outputs")
        out_dtype = g.outvars[0].aval.dtype
        if not ir.is_float(out_dtype):
            raise TypeError(f"grad of {fname}: the output must be a float scalar, got "
                            f"{out_dtype}")
        cts = [ir.Lit(1.0, out_dtype)] + [None] * (n_out - 1)
        outer = current_builder()
        if outer is not None and outer.optimized_later:
            # under jit: emit straight into its graph (optimised as a whole afterwards)
            ins = [ir.Traced(outer, outer.atom(x)) for x in list(leaves) + tf.captured]
            outs, grads = ir.backward_pass(outer, g, ins, cts, wrt)
            res = outs + grads
        else:
            b = Builder("grad")
            ins = [b.new_input(v.aval) for v in g.invars]
            outs, grads = ir.backward_pass(b, g, ins, cts, wrt)
            res = _run(b.build(outs + grads), tf.captured, leaves)
        out_vals, grad_vals = res[:n_out], res[n_out:]
        value = tree_unflatten(tf.out_tree, out_vals)
        per_arg, k = [], 0
        for n in nums:
            count = len(ranges[n])
            per_arg.append(tree_unflatten(tree_flatten(args[n])[1], grad_vals[k:k + count]))
            k += count
        grad_tree = per_arg[0] if isinstance(argnums, int) else tuple(per_arg)
        return value, grad_tree

    def finish_traced(args: tuple, started: tuple) -> Any:
        """`finish` of what `start` traced, inside another trace whose inputs are `args`."""
        tf, _, meta = started
        leaves = flatten_args([a for i, a in enumerate(args) if i not in meta.static])[0]
        return finish(args, tf, leaves, meta)

    # for jit: trace f first, then decide (jit._compile_loop). The attribute names its owner:
    # functools.wraps copies it onto wrappers (jacfwd, a user's), which must not use it.
    vg._tg_traced = (vg, start, finish_traced)
    return vg


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a scalar function (JAX's `grad`)."""
    vg = value_and_grad(f, argnums, has_aux)

    def pick(value_grads: tuple) -> Any:
        value, grads = value_grads
        return (grads, value[1]) if has_aux else grads

    @functools.wraps(f)
    def g(*args: Any, **kwargs: Any) -> Any:
        return pick(vg(*args, **kwargs))
    _, start, finish_traced = vg._tg_traced
    g._tg_traced = (g, start, lambda args, started: pick(finish_traced(args, started)))
    return g


def vjp(f: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """`(out, vjp_fn)`; `vjp_fn(cotangent)` returns one gradient per primal (a tuple)."""
    tf, leaves = trace(f, primals)
    g = ir.roll_loops(tf.graph) if config.roll_loops else tf.graph
    out_tree = tf.out_tree
    outs = _run(g, tf.captured, leaves)
    out = tree_unflatten(out_tree, outs)
    aux = None
    if has_aux:
        out, aux = out
    ranges = _leaf_ranges(primals)

    def vjp_fn(cotangent: Any) -> tuple:
        ct_leaves, ct_tree = tree_flatten(cotangent)
        main_tree = out_tree.children[0] if has_aux else out_tree
        if ct_tree != main_tree:
            raise ValueError(f"vjp: cotangent structure {ct_tree} does not match the output "
                             f"structure {main_tree}")
        ct_vals = flatten_args(ct_leaves, "cotangent")[0]
        for c, o in zip(ct_vals, g.outvars):
            if tuple(np.shape(c) if not hasattr(c, "shape") else c.shape) != o.aval.shape:
                raise ValueError(f"vjp: cotangent shape {tuple(c.shape)} does not match the "
                                 f"output shape {o.aval.shape}")
        b = Builder("vjp")
        ins = [b.new_input(v.aval) for v in g.invars]
        cts = [b.new_input(aval_of_leaf(c)) for c in ct_vals]   # converted to the outputs' dtypes
        with b.active():
            cts = [E.convert(c, o.aval.dtype) for c, o in zip(cts, g.outvars)]
        wrt = [i for r in ranges for i in r if ir.is_float(ir.emit.dtype_of(leaves[i]))]
        _, grads = ir.backward_pass(b, g, ins, cts + [None] * (len(g.outvars) - len(cts)), wrt)
        vb_graph = b.build(grads)
        # the builder's inputs: primal leaves, captured outer values, then cotangents
        res = call_graph(ir.optimize(vb_graph), list(leaves) + list(tf.captured) + ct_vals)
        by_leaf = dict(zip(wrt, res))
        out_grads = []
        for a, r in zip(primals, ranges):
            vals = [by_leaf.get(i) for i in r]
            vals = [v if v is not None else np.zeros_like(np.asarray(leaves[i]))
                    for v, i in zip(vals, r)]
            out_grads.append(tree_unflatten(tree_flatten(a)[1], vals))
        return tuple(out_grads)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def jvp(f: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple:
    """`(out, tangent_out)`: forward-mode derivative of `f` at `primals` along `tangents`."""
    for what, xs in (("primal", primals), ("tangent", tangents)):
        if type(xs) not in (tuple, list):   # (tuple(array) would split it into its rows)
            raise TypeError(f"jvp: the {what}s must be a tuple or list with one entry per "
                            f"argument of the function, got {type(xs).__name__}")
    primals, tangents = tuple(primals), tuple(tangents)
    tf, leaves = trace(f, primals)
    t_leaves, t_tree = flatten_args(tangents, "tangent")
    p_tree = tree_flatten(primals)[1]
    if t_tree != p_tree:
        raise ValueError(f"jvp: tangent structure {t_tree} does not match primals {p_tree}")
    for i, (p, t) in enumerate(zip(leaves, t_leaves)):
        if tuple(np.shape(p)) != tuple(np.shape(t) if not hasattr(t, "shape") else t.shape):
            raise ValueError(f"jvp: tangent {i} has shape {np.shape(t)} but its primal has "
                             f"shape {np.shape(p)}")
        # as JAX: a float primal's tangent has its dtype (a Python number takes it)
        pd = ir.emit.dtype_of(p)
        if ir.is_float(pd) and not isinstance(t, (int, float)) and \
                ir.emit.dtype_of(t) != pd:
            raise TypeError(f"jvp: tangent {i} has dtype {ir.emit.dtype_of(t)} but its primal "
                            f"has dtype {pd}; tangents must have their primals' dtypes")
    g = tf.graph
    b = Builder("jvp")
    ins = [b.new_input(v.aval) for v in g.invars]
    n_primal = len(leaves)
    tans = [b.new_input(v.aval) for v in g.invars[:n_primal]]
    outs, touts = ir.forward_pass(b, g, ins, tans + [None] * (len(g.invars) - n_primal))
    with b.active():
        touts = [t if t is not None else E.full(o.shape, 0, o.dtype)
                 for t, o in zip(touts, outs)]
    jg = b.build(outs + touts)
    # the builder's inputs: primal leaves, captured outer values, then tangents
    t_vals = [ir.emit.asdtype(t, ir.emit.dtype_of(p)) for t, p in zip(t_leaves, leaves)]
    n = len(g.outvars)
    res = call_graph(ir.optimize(jg), list(leaves) + list(tf.captured) + t_vals)
    return tree_unflatten(tf.out_tree, res[:n]), tree_unflatten(tf.out_tree, res[n:])


def _jacobian_io(f: Callable, args: Sequence[Any], argnums: int | Sequence[int], fname: str,
                 float_outputs: bool, has_aux: bool):
    """Trace `f` for a Jacobian by the arguments `argnums`: (traced function, its flat
    leaves, its graph, the flat indices of the differentiated leaves, what they make up: the
    argument, or a tuple of the arguments for a sequence `argnums`, and how many of the
    graph's outputs are differentiated: all, or with `has_aux` those of the first of the pair
    f returns). `float_outputs`: an integer output is a TypeError (jacrev; jacfwd gives it
    zeros, as JAX)."""
    nums = _argnums(argnums, len(args), fname)
    static = _static_args(args, nums)
    tf, leaves = trace(f, args, static)
    ranges = _leaf_ranges(args, static)
    wrt = [i for n in nums for i in ranges[n]]
    _check_float(leaves, wrt, fname, ranges)
    n_main = _main_leaves(tf.out_tree, has_aux, fname)
    for k, o in enumerate(tf.graph.outvars[:n_main]):
        if float_outputs and not ir.is_float(o.aval.dtype):
            raise TypeError(f"{fname} requires real-valued floating point outputs, but output "
                            f"leaf {k} has dtype {o.aval.dtype}")
    arg = args[nums[0]] if isinstance(argnums, int) else tuple(args[n] for n in nums)
    return tf, leaves, tf.graph, wrt, arg, n_main


def _jacobian_tree(b: Builder, ins: list, tf: Any, arg: Any, blocks: list[list[Any]],
                   leaves: list, has_aux: bool) -> Any:
    """Run the Jacobian blocks `blocks[output leaf][argument leaf]` built in `b` and nest
    them as JAX does: the output's structure, each leaf replaced by the argument's. With
    `has_aux`: (that, aux), aux the second of the pair f returns, as f returns it (`ins`:
    b's stand-ins for the graph's inputs, to compute it from)."""
    aux_outs: list[Any] = []
    if has_aux:     # the forward's values, once more in b (optimising merges the copies)
        outs, _ = ir.forward_pass(b, tf.graph, ins, [None] * len(ins))
        aux_outs = outs[len(outs) - tf.out_tree.children[1].num_leaves:]
    flat = _run(b.build([j for row in blocks for j in row] + aux_outs), tf.captured, leaves)
    it = iter(flat)
    arg_tree = tree_flatten(arg)[1]
    main_tree = tf.out_tree.children[0] if has_aux else tf.out_tree
    jac = tree_unflatten(main_tree, [tree_unflatten(arg_tree, [next(it) for _ in row])
                                     for row in blocks])
    if not has_aux:
        return jac
    return jac, tree_unflatten(tf.out_tree.children[1], list(it))


def jacrev(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False
           ) -> Callable:
    """The Jacobian by reverse mode: one backward pass per output element, in one graph. As
    in JAX, the argument and the output may be pytrees: the result has the output's
    structure, each leaf replaced by the argument's structure of blocks of shape
    `out_leaf.shape + arg_leaf.shape`; for a tuple `argnums`, by a tuple of those, one per
    argument. `has_aux`: f returns a pair (out, aux); the result is (the Jacobian of out,
    aux), aux not differentiated."""
    @functools.wraps(f)
    def jac(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return _with_keywords(jacrev, f, argnums, "jacrev", args, kwargs, has_aux)
        tf, leaves, g, wrt, arg, n_main = _jacobian_io(f, args, argnums, "jacrev", True,
                                                       has_aux)
        b = Builder("jacrev")
        ins = [b.new_input(v.aval) for v in g.invars]
        xs = [g.invars[i].aval for i in wrt]
        blocks = []
        for k, o in enumerate(g.outvars[:n_main]):
            out = o.aval
            rows: list[list[Any]] = [[] for _ in wrt]
            for e in range(out.size):
                basis = np.zeros(out.size, out.dtype)
                basis[e] = 1
                cts: list[Any] = [None] * len(g.outvars)
                cts[k] = basis.reshape(out.shape)
                _, grads = ir.backward_pass(b, g, ins, cts, wrt)
                for r, gr, x in zip(rows, grads, xs, strict=True):
                    r.append(gr if gr is not None else np.zeros(x.shape, x.dtype))
            with b.active():
                blocks.append([_stacked(r, 0, out, x) for r, x in zip(rows, xs, strict=True)])
        return _jacobian_tree(b, ins, tf, arg, blocks, leaves, has_aux)
    return jac


def _stacked(parts: list, axis: int, out: Any, x: Any) -> Traced:
    """One Jacobian block of shape out.shape + x.shape from its rows (axis 0: one per
    output element, each of x's shape) or columns (axis 1: one per element of x)."""
    if axis == 0:
        flat = E.concatenate([E.reshape(p, (1, x.size)) for p in parts], 0) if parts else \
            E.full((0, x.size), 0, x.dtype)
    else:
        flat = E.concatenate([E.reshape(p, (out.size, 1)) for p in parts], 1) if parts else \
            E.full((out.size, 0), 0, out.dtype)
    return E.reshape(flat, out.shape + x.shape)


def jacfwd(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False
           ) -> Callable:
    """The Jacobian by forward mode: one tangent per input element, in one graph. Pytree
    arguments and outputs, a tuple `argnums` and `has_aux`, as `jacrev`."""
    @functools.wraps(f)
    def jac(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return _with_keywords(jacfwd, f, argnums, "jacfwd", args, kwargs, has_aux)
        tf, leaves, g, wrt, arg, n_main = _jacobian_io(f, args, argnums, "jacfwd", False,
                                                       has_aux)
        b = Builder("jacfwd")
        ins = [b.new_input(v.aval) for v in g.invars]
        outs = [o.aval for o in g.outvars[:n_main]]
        cols: list[list[list[Any]]] = [[[] for _ in wrt] for _ in outs]
        for j, i in enumerate(wrt):
            x = g.invars[i].aval
            for e in range(x.size):
                basis = np.zeros(x.size, x.dtype)
                basis[e] = 1
                tans: list[Any] = [None] * len(g.invars)
                tans[i] = basis.reshape(x.shape)
                _, touts = ir.forward_pass(b, g, ins, tans)
                with b.active():
                    for k, (t, out) in enumerate(zip(touts[:n_main], outs, strict=True)):
                        cols[k][j].append(t if t is not None
                                          else E.full(out.shape, 0, out.dtype))
        with b.active():
            blocks = [[_stacked(cols[k][j], 1, out, g.invars[i].aval)
                       for j, i in enumerate(wrt)] for k, out in enumerate(outs)]
        return _jacobian_tree(b, ins, tf, arg, blocks, leaves, has_aux)
    return jac


def hessian(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False
            ) -> Callable:
    """Second derivatives: forward over reverse, `jacfwd(jacrev(f, argnums), argnums)`. A
    tuple `argnums` gives nested tuples, `h[i][j]` the derivative by argument argnums[j] of
    the gradient by argnums[i] (JAX's layout). `has_aux`: (the Hessian, aux), as `jacrev`."""
    return jacfwd(jacrev(f, argnums, has_aux), argnums, has_aux)


def make_ir(f: Callable, static_argnums: Sequence[int] = ()) -> Callable[..., ir.Graph]:
    """`make_ir(f)(*args)` is the Graph `f` traces to (transforms inside appear expanded)."""
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    @functools.wraps(f)
    def make(*args: Any, **kwargs: Any) -> ir.Graph:
        if kwargs:      # (traced like positional arguments after args, as JAX's make_jaxpr)
            return make_ir(_positional(f, len(args), tuple(kwargs)), static)(
                *args, *kwargs.values())
        tf, _ = trace(f, args, static)
        return ir.dce(tf.graph)
    return make

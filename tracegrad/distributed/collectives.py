"""Collectives over pytrees: every leaf of one dtype travels in ONE contiguous buffer per
call (one MPI message per dtype, not one per parameter), and leaves come back as views of
that buffer, in the tree's structure and leaf types (numpy arrays or Tensors)."""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..tracer.pytree import TreeDef, tree_flatten, tree_unflatten
from ..tracer.tensor import Tensor
from .failures import wait
from .world import World, get_world


def allreduce_sum(tree: Any) -> Any:
    """The elementwise sum of `tree` over all ranks, on every rank. In a world of one
    process the tree itself comes back (no copy)."""
    return _allreduce(tree, mean=False, what="allreduce_sum")


def allreduce_mean(tree: Any) -> Any:
    """The elementwise mean of `tree` over all ranks, on every rank (integer leaves give
    float64 means, as `np.mean`)."""
    return _allreduce(tree, mean=True, what="allreduce_mean")


def allreduce_grads(grads: Any) -> Any:
    """Average a gradient pytree across ranks: the pure step of data parallelism. Call it on
    the numpy gradients a jitted function returned, between the jitted gradient and the
    jitted update (collectives cannot run inside a compiled graph):

        loss, grads = grad_step(params, x_local, y_local)     # tg.jit(tg.value_and_grad(f))
        grads = dist.allreduce_grads(grads)
        params, state = update(params, grads, state)          # tg.jit(optim.adam_update)

    With equal local batches the mean of local-mean gradients is the global-batch gradient,
    so every rank takes the step single-process training on the global batch would."""
    return allreduce_mean(grads)


def broadcast(tree: Any, root: int = 0) -> Any:
    """`root`'s values of `tree` on every rank (initial parameters, say). First checks that
    every rank holds the same structure, shapes and dtypes, raising on every rank an error
    that names the mismatching leaf, the ranks and both shapes, instead of garbling
    parameters or hanging."""
    world = get_world()
    leaves, td = tree_flatten(tree)
    arrays = [_array(x) for x in leaves]
    if world.size == 1:
        return _rebuild(td, leaves, [a.copy() for a in arrays])
    signature = (repr(td), leaf_paths(td), [(a.shape, a.dtype.str) for a in arrays])
    _check_same(_allgather_object(world, signature, "broadcast"), root)
    groups = _by_dtype(arrays)
    out: list[np.ndarray | None] = [None] * len(arrays)
    for dtype, idx in groups.items():
        buf = _pack(arrays, idx, dtype) if world.rank == root else _empty(arrays, idx, dtype)
        wait(world.comm.Ibcast(buf, root=root), "broadcast")
        _unpack(buf, arrays, idx, out)
    return _rebuild(td, leaves, out)


def leaf_paths(td: TreeDef, prefix: str = "") -> list[str]:
    """A readable path per leaf of `td`, in flatten order: `['fc1.weight']`, `[0][1]`."""
    if td.kind == "leaf":
        return [prefix or "<the tree itself>"]
    out: list[str] = []
    for i, child in enumerate(td.children):
        key = td.meta[i] if td.kind == "dict" else i
        out += leaf_paths(child, f"{prefix}[{key!r}]")
    return out


# -- the fused buffer ----------------------------------------------------------------------

def _allreduce(tree: Any, mean: bool, what: str) -> Any:
    world = get_world()
    leaves, td = tree_flatten(tree)
    arrays = [_array(x) for x in leaves]
    for path, a in zip(leaf_paths(td), arrays, strict=True):
        if a.dtype == np.bool_ or a.dtype.kind not in "fiuc":
            raise TypeError(f"allreduce: leaf {path} has dtype {a.dtype}, which cannot be "
                            "summed; cast it to a number type first")
    if world.size == 1 and all(a.dtype.kind in "fc" or not mean for a in arrays):
        return tree          # a world of one: the values themselves (no packing copies)
    out: list[np.ndarray | None] = [None] * len(arrays)
    for dtype, idx in _by_dtype(arrays).items():
        buf = _pack(arrays, idx, dtype)
        if world.size > 1:
            wait(world.comm.Iallreduce(world.MPI.IN_PLACE, buf, op=world.MPI.SUM), what)
        if mean:
            if dtype.kind in "fc":
                buf /= world.size
            else:
                buf = buf / world.size
        _unpack(buf, arrays, idx, out)
    return _rebuild(td, leaves, out)


def _allgather_object(world: World, obj: Any, what: str) -> list[Any]:
    """Every rank's `obj`, in rank order (mpi4py's `allgather` blocks where `wait` cannot
    watch it: this is the same in two nonblocking steps, sizes then bytes)."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.zeros(world.size, np.int64)
    wait(world.comm.Iallgather(np.array([data.size], np.int64), sizes), what)
    gathered = np.empty(int(sizes.sum()), np.uint8)
    wait(world.comm.Iallgatherv(data, [gathered, sizes.tolist()]), what)
    ends = np.cumsum(sizes)
    return [pickle.loads(gathered[end - n:end].tobytes())
            for n, end in zip(sizes.tolist(), ends.tolist(), strict=True)]


def _array(x: Any) -> np.ndarray:
    if isinstance(x, Tensor):
        return np.asarray(x.detach().numpy())
    return np.asarray(x)


def _by_dtype(arrays: list[np.ndarray]) -> dict[np.dtype, list[int]]:
    groups: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(i)
    return groups


def _pack(arrays: list[np.ndarray], idx: list[int], dtype: np.dtype) -> np.ndarray:
    buf = _empty(arrays, idx, dtype)
    offset = 0
    for i in idx:
        n = arrays[i].size
        buf[offset:offset + n] = arrays[i].reshape(-1)
        offset += n
    return buf


def _empty(arrays: list[np.ndarray], idx: list[int], dtype: np.dtype) -> np.ndarray:
    return np.empty(sum(arrays[i].size for i in idx), dtype)


def _unpack(buf: np.ndarray, arrays: list[np.ndarray], idx: list[int],
            out: list[np.ndarray | None]) -> None:
    offset = 0
    for i in idx:
        n = arrays[i].size
        out[i] = buf[offset:offset + n].reshape(arrays[i].shape)
        offset += n


def _rebuild(td: TreeDef, leaves: list[Any], arrays: list[Any]) -> Any:
    """Put results back in the tree; Tensor leaves come back as Tensors (new leaves, with
    the input's requires_grad)."""
    out = []
    for leaf, a in zip(leaves, arrays, strict=True):
        if isinstance(leaf, Tensor):
            out.append(Tensor._leaf(a, requires_grad=leaf.requires_grad))
        else:
            out.append(a)
    return tree_unflatten(td, out)


def _check_same(signatures: list[tuple[str, list, list]], root: int) -> None:
    root_tree, paths, root_leaves = signatures[root]
    for rank, (tree, _, leaves) in enumerate(signatures):
        if tree != root_tree:
            raise ValueError(f"broadcast: the tree on rank {rank} has a different structure "
                             f"from the root (rank {root}):\n  rank {rank}: {tree}\n  rank "
                             f"{root}: {root_tree}\nevery rank must pass the same pytree")
        for i, ((shape, dt), (rshape, rdt)) in enumerate(zip(leaves, root_leaves,
                                                             strict=True)):
            if (shape, dt) == (rshape, rdt):
                continue
            where = paths[i]
            kind = ValueError if shape != rshape else TypeError
            raise kind(f"broadcast: leaf {where} is {_fmt(shape, dt)} on rank {rank} but "
                       f"{_fmt(rshape, rdt)} on the root (rank {root}); every rank must "
                       "build the same model (check the sizes and dtypes it is built with)")


def _fmt(shape: tuple, dtype_str: str) -> str:
    return f"{np.dtype(dtype_str).name}{list(shape)}"

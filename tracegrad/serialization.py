"""`tg.save` / `tg.load`: nested containers of arrays and Tensors to a `.npz` file.

The arrays go into the archive as ordinary members; the structure (dicts with str/int keys,
lists, tuples, Python scalars, strings, None, which leaves are Tensors) is a JSON string in
the member `__tracegrad__`. Nothing is pickled, so loading a file cannot run code, and any
`.npz` written by `np.savez` loads as a dict of arrays.
"""
from __future__ import annotations

import json
import os
from typing import IO, Any

import numpy as np

from .nn import parameter as P
from .tracer.tensor import tensor

_META = "__tracegrad__"
_VERSION = 1


def _encode(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"tg.save: dict keys must be str or int, got {k!r}")
        return {"dict": [[k, _encode(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"tuple": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, arrays) for v in obj]
    key = f"a{len(arrays)}"
    if P.is_tensor(obj):
        arrays[key] = P.to_numpy(obj)
        return {"tensor": key, "requires_grad": bool(obj.requires_grad)}
    if isinstance(obj, np.generic):
        arrays[key] = np.asarray(obj)
        return {"scalar": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("tg.save: object arrays cannot be saved (no pickling)")
        arrays[key] = obj
        return {"array": key}
    raise TypeError(f"tg.save: cannot save a {type(obj).__name__}; save arrays, Tensors, "
                    "Python scalars, strings and dicts/lists/tuples of them")


def _decode(node: Any, arrays: Any) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "dict" in node:
        return {k: _decode(v, arrays) for k, v in node["dict"]}
    if "tuple" in node:
        return tuple(_decode(v, arrays) for v in node["tuple"])
    if "array" in node:
        return arrays[node["array"]]
    if "scalar" in node:
        return arrays[node["scalar"]][()]
    if "tensor" in node:
        return tensor(arrays[node["tensor"]], requires_grad=node["requires_grad"])
    raise ValueError(f"tg.load: unknown entry {node!r} in the file's structure")


def save(obj: Any, f: str | os.PathLike | IO[bytes]) -> None:
    """Write `obj` (e.g. `model.state_dict()`, `optimizer.state_dict()`, a params pytree)
    to `f`, a path (used as given, no suffix added) or a binary file object."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"version": _VERSION, "tree": _encode(obj, arrays)}
    members = {_META: np.array(json.dumps(meta)), **arrays}
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            np.savez(fh, **members)
    else:
        np.savez(f, **members)


def load(f: str | os.PathLike | IO[bytes]) -> Any:
    """Read what `tg.save` wrote: the same structure, with numpy arrays for arrays and
    Tensors for Tensors. A plain `.npz` comes back as a dict of arrays."""
    with np.load(f, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = arrays.pop(_META, None)
    if meta is None:
        return arrays
    meta = json.loads(str(meta))
    if meta.get("version", 0) > _VERSION:
        raise ValueError(f"tg.load: file format version {meta['version']} is newer than "
                         f"this tracegrad understands ({_VERSION})")
    return _decode(meta["tree"], arrays)

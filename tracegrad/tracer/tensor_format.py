"""`repr(tensor)` as PyTorch prints it: `tensor([1., 2.], requires_grad=True)`, 4 decimals,
scientific notation for wide ranges, summarised with `...` above 1000 elements."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80

_DEFAULT_DTYPES = (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.bool_))


class _Formatter:
    def __init__(self, values: np.ndarray):
        self.floating = np.issubdtype(values.dtype, np.floating)
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = values.reshape(-1)
        if not self.floating:
            for v in flat.tolist():
                self.max_width = max(self.max_width, len(_plain(v)))
            return
        finite = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if finite.size == 0:
            return
        absv = np.abs(finite)
        lo, hi = absv.min(), absv.max()
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        self.sci_mode = bool(hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4)
        for v in finite.tolist():
            if self.sci_mode:
                s = f"{v:.{PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}" + " "
            else:
                s = f"{v:.{PRECISION}f}"
            self.max_width = max(self.max_width, len(s))

    def format(self, v: Any) -> str:
        if self.floating:
            if self.sci_mode:
                s = f"{v:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                s = f"{v:.0f}"
                if not (math.isinf(v) or math.isnan(v)):
                    s += "."
            else:
                s = f"{v:.{PRECISION}f}"
        else:
            s = _plain(v)
        return " " * (self.max_width - len(s)) + s


def _plain(v: Any) -> str:
    return str(v)


def _summarized(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a
    if a.shape[0] > 2 * EDGEITEMS:
        a = np.concatenate([a[:EDGEITEMS], a[-EDGEITEMS:]])
    return np.stack([_summarized(x) for x in a]) if a.ndim > 1 else a


def _vector(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    per_line = max(1, math.floor((LINEWIDTH - indent) / (fmt.max_width + 2)))
    if summarize and a.shape[0] > 2 * EDGEITEMS:
        data = [fmt.format(v) for v in a[:EDGEITEMS].tolist()] + [" ..."] + \
            [fmt.format(v) for v in a[-EDGEITEMS:].tolist()]
    else:
        data = [fmt.format(v) for v in a.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _body(a: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector(a, indent, summarize, fmt)
    if summarize and a.shape[0] > 2 * EDGEITEMS:
        rows = [_body(a[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)] + ["..."] + \
            [_body(a[i], indent + 1, summarize, fmt)
             for i in range(a.shape[0] - EDGEITEMS, a.shape[0])]
    else:
        rows = [_body(a[i], indent + 1, summarize, fmt) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def array_str(a: np.ndarray, indent: int = 7) -> str:
    if a.size == 0:
        return "[]"
    summarize = a.size > THRESHOLD
    fmt = _Formatter(_summarized(a) if summarize else a)
    return _body(a, indent, summarize, fmt)


def tensor_repr(t: Any) -> str:
    a = t._val()
    suffixes = []
    if a.size == 0 and a.shape != (0,):
        suffixes.append(f"size={tuple(a.shape)}")
    if a.dtype not in _DEFAULT_DTYPES:
        suffixes.append(f"dtype=tg.{a.dtype}")
    if t._fn is not None:
        suffixes.append(f"grad_fn=<{t._fn.name()}>")
    elif t._rg:
        suffixes.append("requires_grad=True")
    body = array_str(a)
    return "tensor(" + ", ".join([body] + suffixes) + ")"

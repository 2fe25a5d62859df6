"""`python -m tracegrad dump SCRIPT.py:FUNC --arg f32[128,784] ...`: print the IR, gradient
IR, LLVM IR, assembly or Graphviz source of a function, as `tg.jit(f).lower(...)` sees it."""
from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
from typing import Any, Callable, Sequence

import numpy as np

_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8,
           "i32": np.int32, "i64": np.int64, "u8": np.uint8, "bool": np.bool_}
_SPEC = re.compile(r"^(?P<dtype>[a-z]+\d*)(\[(?P<shape>[\d,\s]*)\])?$")


def parse_spec(spec: str) -> np.ndarray:
    """`f32[128,784]` -> an array of that type (normal noise for floats, zeros otherwise);
    `f32` or `f32[]` is a scalar."""
    m = _SPEC.match(spec.strip())
    if m is None or m["dtype"] not in _DTYPES:
        raise argparse.ArgumentTypeError(
            f"bad --arg {spec!r}: expected DTYPE[d0,d1,...] with DTYPE one of "
            f"{', '.join(_DTYPES)} (e.g. f32[128,784], i64[128], f32[])")
    shape = tuple(int(d) for d in (m["shape"] or "").replace(" ", "").split(",") if d)
    dtype = np.dtype(_DTYPES[m["dtype"]])
    if dtype.kind == "f":
        return np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def load_function(target: str) -> Callable:
    """`path/to/script.py:name` (or `package.module:name`) -> the function."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise SystemExit(f"error: expected SCRIPT.py:FUNC, got {target!r}")
    if where.endswith(".py") or os.path.exists(where):
        if not os.path.exists(where):
            raise SystemExit(f"error: no such file: {where}")
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        namespace = runpy.run_path(where, run_name="__tracegrad_dump__")
    else:
        import importlib
        namespace = vars(importlib.import_module(where))
    obj: Any = namespace.get(name.split(".")[0])
    for part in name.split(".")[1:]:
        obj = getattr(obj, part, None)
    if obj is None:
        raise SystemExit(f"error: {where} defines no {name!r}")
    return getattr(obj, "f", obj)    # a @tg.jit function: dump what it wraps


def dump(args: argparse.Namespace) -> str:
    import tracegrad as tg
    try:
        import tracegrad.runtime  # noqa: F401 - registers the native backend for --llvm/--asm
    except ImportError:
        pass
    fn = load_function(args.target)
    values = [parse_spec(s) for s in args.arg]
    if args.grad:
        nums = tuple(int(n) for n in args.argnums.split(","))
        fn = tg.grad(fn, argnums=nums[0] if len(nums) == 1 else nums)
    lowered = tg.jit(fn).lower(*values)
    if args.llvm:
        return lowered.llvm_ir
    if args.asm:
        return lowered.asm
    if args.dot:
        return lowered.ir.to_dot()
    return lowered.ir.pretty(source=args.source)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracegrad",
                                     description="tracegrad command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="print the IR (or gradient IR, LLVM IR, assembly) of a "
                       "function", description=__doc__)
    d.add_argument("target", help="SCRIPT.py:FUNC (or package.module:FUNC)")
    d.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="one per positional argument, e.g. f32[128,784] or i64[128]")
    d.add_argument("--grad", action="store_true", help="the gradient of the (scalar) function")
    d.add_argument("--argnums", default="0", help="with --grad: which arguments, e.g. 0,1")
    what = d.add_mutually_exclusive_group()
    what.add_argument("--llvm", action="store_true", help="the optimised LLVM IR")
    what.add_argument("--asm", action="store_true", help="the native assembly")
    what.add_argument("--dot", action="store_true", help="Graphviz source of the IR")
    d.add_argument("--source", action="store_true", help="annotate equations with file:line")
    args = parser.parse_args(argv)
    text = dump(args)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:   # `... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())

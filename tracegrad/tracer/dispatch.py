"""How `tg.*` functions reach Tensors: a function whose arguments include a Tensor is handed
to the Tensor type's `__tg_function__(fn, name, args, kwargs)`, which records it lazily."""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ..ir.builder import Traced

_tensor_types: list[type] = []
_unary: dict[type, Callable] = {}     # a tensor type -> what records `fn(x)` of one such x
# Types that neither are nor hold a Tensor: arguments of only these types skip the search
_PLAIN = frozenset({Traced, np.ndarray, float, int, bool, str, slice, type(None), np.dtype,
                    type(Ellipsis)})


def register_tensor_type(t: type, unary: Callable | None = None) -> None:
    """`t.__tg_function__` records the `tg` functions called with a `t` among the arguments;
    `unary(fn, name, x)`, if given, does what it would for `fn(x)` with no keywords."""
    _tensor_types.append(t)
    if unary is not None:
        _unary[t] = unary


def _find_tensor(args: Any) -> type | None:
    for a in args:
        for t in _tensor_types:
            if isinstance(a, t):
                return t
        if isinstance(a, (list, tuple)):
            found = _find_tensor(a)
            if found is not None:
                return found
    return None


def op(name: str, traced: Callable | None = None,
       unary: bool = False) -> Callable[[Callable], Callable]:
    """Mark a `tg` function; `name` is its PyTorch backward name stem (e.g. "Add").
    `traced`: what to call instead when every argument is a traced value (it needs none of
    the function's conversions), e.g. the IR-level op. `unary`: the function is `f(x)`, and
    its wrapper takes `x` alone (no argument tuple and keyword dict made per call)."""
    def wrap(fn: Callable) -> Callable:
        fast = fn if traced is None else traced

        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and not kwargs:     # the commonest calls: one value
                a = args[0]
                if type(a) is Traced:
                    return fast(a)
                unary = _unary.get(type(a))
                if unary is not None:
                    return unary(fn, name, a)
            for a in args:
                if type(a) is not Traced:
                    break
            else:
                if not kwargs:
                    return fast(*args)
            if _tensor_types:
                plain = _PLAIN
                for a in args:
                    if type(a) not in plain:
                        break
                else:
                    if not kwargs:
                        return fn(*args)
                t = _find_tensor(args) or _find_tensor(kwargs.values())
                if t is not None:
                    return t.__tg_function__(fn, name, args, kwargs)
            return fn(*args, **kwargs)
        wrapper = inner
        if unary:
            @functools.wraps(fn)
            def wrapper(x: Any) -> Any:
                if type(x) is Traced:
                    return fast(x)
                record = _unary.get(type(x))
                if record is not None:
                    return record(fn, name, x)
                return inner(x)
        wrapper.grad_name = name
        wrapper.raw = fn
        return wrapper
    return wrap

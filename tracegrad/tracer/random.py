"""The global random generator behind `tg.manual_seed`, `tg.randn` and dropout masks."""
from __future__ import annotations

import threading

import numpy as np


class _Gen(threading.local):
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)


_gen = _Gen()


def manual_seed(seed: int) -> None:
    _gen.rng = np.random.default_rng(seed)


def next_seed() -> int:
    return int(_gen.rng.integers(0, 2**62))


def numpy_rng() -> np.random.Generator:
    return _gen.rng

"""Splitting data by rank: `shard` gives a rank its contiguous part of n items, and
`DistributedSampler` turns one shuffled order of a data set (the same on every rank) into
global batches and hands each rank its equal share of every batch, so N ranks together
see exactly what one process training on the global batch would."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .world import get_world


def shard(n: int, rank: int | None = None, world_size: int | None = None) -> slice:
    """Rank `rank`'s part of `range(n)` as a slice: contiguous, sizes differing by at most
    one (the first n % world_size ranks get one more). Defaults to this process's rank."""
    w = None if rank is not None and world_size is not None else get_world()
    rank = w.rank if rank is None else rank
    world_size = w.size if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is outside a world of {world_size} ranks")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


class DistributedSampler:
    """Index batches for this rank: each epoch, one permutation of `range(n)` drawn from
    `seed + epoch` (identical on every rank), cut into global batches of `batch_size`
    (a trailing partial batch is dropped), each split evenly by `shard`.

        sampler = DistributedSampler(len(x), batch_size=128, seed=0)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for idx in sampler:          # this rank's 128 / world_size indices
                step(x[idx], y[idx])
    """

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None):
        w = None if rank is not None and world_size is not None else get_world()
        self.rank = w.rank if rank is None else rank
        self.world_size = w.size if world_size is None else world_size
        if batch_size % self.world_size:
            raise ValueError(
                f"DistributedSampler: the global batch size {batch_size} is not divisible by "
                f"the {self.world_size} ranks; unequal local batches would make the averaged "
                "gradient differ from the global-batch gradient. Choose a batch size that "
                "is a multiple of the number of ranks")
        if batch_size > n:
            raise ValueError(f"DistributedSampler: batch size {batch_size} is larger than the "
                             f"data set ({n} items)")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch`'s order (call it at the start of every epoch, on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size

    def __iter__(self) -> Iterator[np.ndarray]:
        order = (np.random.default_rng(self.seed + self.epoch).permutation(self.n)
                 if self.shuffle else np.arange(self.n))
        part = shard(self.batch_size, self.rank, self.world_size)
        for b in range(len(self)):
            yield order[b * self.batch_size:(b + 1) * self.batch_size][part]

"""Samplers whose order is a pure function of (seed, epoch), so a run resumed at an epoch boundary draws
exactly the batches an uninterrupted run would have drawn (Lightning calls `set_epoch` on samplers).

Under DDP every rank draws the same global permutation and keeps its slice of each *global* batch: global
batch k is `perm[k*G:(k+1)*G]` with G = batch_size x world_size, and rank r trains on
`perm[k*G + r*B : k*G + (r+1)*B]`. So 2 ranks x B see exactly the images of 1 rank x 2B, in the same order
(rank 0's half first), which is what makes a DDP run reproduce a single-process one (`tests/test_ddp.py`).
Lightning's own `DistributedSampler` wrapping is turned off (`use_distributed_sampler=False` in `scfs.train`):
it would interleave ranks (`perm[r::world]`) and not forward `set_epoch` to a custom sampler.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochSeededRandomSampler(Sampler[int]):
    """A random permutation per epoch, seeded by `seed + epoch` instead of the global RNG.

    With `batch_size` and `num_replicas > 1`, yields this rank's share of every full global batch (the
    incomplete last global batch is dropped, as `drop_last=True` does for one process); without, the whole
    permutation (the single-process behaviour, unchanged)."""

    def __init__(self, n: int, seed: int = 0, batch_size: int | None = None, num_replicas: int = 1,
                 rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} is not in [0, num_replicas={num_replicas})")
        if num_replicas > 1 and not batch_size:
            raise ValueError("sharding over ranks needs the per-rank batch_size")
        self.n, self.seed, self.epoch = n, seed, 0
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def permutation(self) -> torch.Tensor:
        """The epoch's global permutation (identical on every rank)."""
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return torch.randperm(self.n, generator=g)

    def indices(self) -> torch.Tensor:
        """This rank's indices of the epoch, in training order."""
        perm = self.permutation()
        if self.num_replicas == 1:
            return perm
        b = int(self.batch_size)
        g = b * self.num_replicas
        steps = self.n // g
        return perm[: steps * g].view(steps, self.num_replicas, b)[:, self.rank].reshape(-1)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        if self.num_replicas == 1:
            return self.n
        return (self.n // (int(self.batch_size) * self.num_replicas)) * int(self.batch_size)

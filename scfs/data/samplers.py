"""Samplers whose order is a pure function of (seed, epoch), so a run resumed at an epoch boundary draws
exactly the batches an uninterrupted run would have drawn (Lightning calls `set_epoch` on samplers)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochSeededRandomSampler(Sampler[int]):
    """A random permutation per epoch, seeded by `seed + epoch` instead of the global RNG."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n

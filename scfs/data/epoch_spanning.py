"""DataLoader workers that run on into the next epoch, so an epoch's first batch is ready when it starts.

A DataLoader with persistent workers still stops feeding them at each epoch's end: the next `iter()` hands the
workers the new epoch's indices only then, and the first batch waits for one worker to make a whole batch
(1-2.5 s for 256 ImageNet JPEGs and their multi-crop views, 3-5 % of an epoch of 117 steps). Because the samplers
here are pure functions of (seed, epoch) (`scfs.data.samplers`), the indices of epoch e+1 are known before epoch e
ends: one worker iterator fed by a batch stream over all epochs keeps its `prefetch_factor x num_workers` batches
in flight across every epoch boundary.

`EpochSpanningLoader` hands out one epoch at a time as a view of that stream. Each epoch's batches are
exactly those of `BatchSampler(sampler at that epoch, batch_size, drop_last)`, the order a plain loader draws;
which worker makes which batch, and so the per-sample augmentations' random streams, follow the stream instead of
restarting at worker 0 each epoch. A request that is not where the stream stands (a jump in epochs, an epoch left
unfinished, a resume) resets the stream there, as a plain loader does at every epoch.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader


class BatchesAcrossEpochs:
    """Index batches of epoch `first` (less its first `skip` batches), then of every later epoch up to `last`
    (inclusive; None = no end), each drawn by a copy of `sampler` set to that epoch, so the loader's own sampler
    is never moved."""

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool, first: int, skip: int = 0,
                 last: int | None = None) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.first, self.skip, self.last = first, skip, last

    def epoch_batches(self, epoch: int) -> BatchSampler:
        sampler = copy.copy(self.sampler)
        sampler.set_epoch(epoch)
        return BatchSampler(sampler, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        epochs = itertools.count(self.first) if self.last is None else range(self.first, self.last + 1)
        for epoch in epochs:
            batches = iter(self.epoch_batches(epoch))
            if epoch == self.first:
                batches = itertools.islice(batches, self.skip, None)
            yield from batches

    def __len__(self) -> int:  # one epoch's; DataLoader iterators only report it
        return len(self.epoch_batches(self.first))


def why_not_spanning(loader: DataLoader) -> str | None:
    """Why `loader` cannot run its workers on across epochs, or None when it can."""
    if loader.num_workers <= 0 or not loader.persistent_workers:
        return "no persistent workers"
    if type(loader.batch_sampler) is not BatchSampler or loader.batch_size is None:
        return "a custom batch sampler"
    if not callable(getattr(loader.sampler, "set_epoch", None)):
        return "a sampler without set_epoch"
    return None


class _EpochView:
    """One epoch of an `EpochSpanningLoader`'s stream: its remaining batches, then StopIteration."""

    def __init__(self, loader: EpochSpanningLoader, n: int) -> None:
        self.loader, self.remaining = loader, n

    def __iter__(self) -> _EpochView:
        return self

    def __next__(self) -> Any:
        if self.remaining <= 0:
            raise StopIteration
        batch = self.loader._take()
        self.remaining -= 1
        return batch

    def __len__(self) -> int:
        return self.remaining


class EpochSpanningLoader(DataLoader):
    """A DataLoader whose persistent workers run on into the next epoch once `span_epochs()` has turned it on
    (otherwise a plain DataLoader).

    Its worker iterator is fed by `BatchesAcrossEpochs` and kept in `_iterator`, where a persistent-worker loader
    keeps its own, so Lightning's teardown stops the workers as it does a plain loader's. `_span_position` is the
    (epoch, batch) of the next batch the stream yields; `iter()` continues the stream when it stands at the
    sampler's epoch, and resets it there otherwise (the workers finish what they hold, as a plain loader's reset
    at every epoch does)."""

    _index_override: Any = None  # the index sampler an iterator made now reads instead of the batch sampler
    _spanning: bool = False
    _span_last_epoch: int | None = None
    _span_position: tuple[int, int] | None = None
    restarts: int = 0  # times the stream was started or reset (once per run when every epoch runs whole)

    @property
    def _index_sampler(self) -> Any:
        return self._index_override if self._index_override is not None else super()._index_sampler

    def span_epochs(self, last_epoch: int | None = None) -> str | None:
        """Run the workers on across epochs up to `last_epoch` (inclusive; None = no end), so none is prefetched
        that training never reaches. Returns why not (and leaves the loader plain) when it cannot."""
        why = why_not_spanning(self)
        if why is None:
            self._spanning, self._span_last_epoch = True, last_epoch
        return why

    @property
    def spanning(self) -> bool:
        return self._spanning

    @property
    def span_last_epoch(self) -> int | None:
        """The last epoch the workers run on into (None = no end); what a copy of this loader spans to."""
        return self._span_last_epoch

    def __iter__(self) -> Any:
        if not self._spanning:
            return super().__iter__()
        return self.epoch_iter(int(getattr(self.sampler, "epoch", 0) or 0))

    def epoch_iter(self, epoch: int, skip: int = 0) -> _EpochView:
        """Epoch `epoch`'s batches after its first `skip`, from the stream across epochs."""
        per_epoch = len(self.batch_sampler)
        skip = max(0, min(int(skip), per_epoch))
        if self._iterator is None:
            self._span_position = None
        if self._span_position != (epoch, skip):
            batches = BatchesAcrossEpochs(self.sampler, int(self.batch_size), bool(self.drop_last), epoch, skip,
                                          self._span_last_epoch)
            self._index_override = batches
            try:
                if self._iterator is None:
                    self._iterator = self._get_iterator()
                else:  # the iterator re-reads the index sampler it was made with
                    self._iterator._index_sampler = batches
                    self._iterator._reset(self)
            finally:
                self._index_override = None
            self._span_position = (epoch, skip)
            self.restarts += 1
        return _EpochView(self, per_epoch - skip)

    def _take(self) -> Any:
        batch = next(self._iterator)
        epoch, b = self._span_position  # type: ignore[misc]
        self._span_position = (epoch + 1, 0) if b + 1 >= len(self.batch_sampler) else (epoch, b + 1)
        return batch

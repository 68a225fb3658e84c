"""Training checkpoints as resume points: what goes into them besides the weights, when `last.ckpt` is written,
how the train loader continues mid-epoch, and the checks a resume file passes before a run starts from it.

* `LastCheckpoint`: `last.ckpt` every k optimizer steps, at epoch ends and when training ends (Lightning's
  `ModelCheckpoint(save_last=True)` only refreshes it when a numbered checkpoint is written), so a crash or
  `kill -9` loses little; an epoch-end write waits until the last one is a minimum age, so seconds-long epochs
  do not spend a tenth of their time writing resume points.
* `ResumeState` + `ResumableDataLoader`: exact mid-epoch resume. Lightning restores the loops' progress from a
  checkpoint, but a plain DataLoader restarts its epoch from the first batch; this loader is stateful (Lightning
  saves and restores `state_dict()` of stateful train loaders) and skips, at the index level (nothing is
  decoded), the batches the resumed epoch had already trained on. `ResumeState` keeps its count current and also
  carries the global RNG states, which the per-sample augmentation draws from.
* `check_resume_checkpoint`, `check_not_complete`, `check_resume_matches`: a wrong resume file fails in one clear
  line before anything is built or written, not deep inside Lightning.

The files themselves are written by `scfs.models.checkpoint_io.AtomicCheckpointIO` (temp file, fsync, rename;
NaN refused) and read back weights-only: evaluation runs that save checkpoints write with it too, and evaluation
sits below training, so the writer lives below both.
"""

from __future__ import annotations

import logging
import os
import random
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint
from torch.utils.data import BatchSampler, DataLoader

from scfs.data.epoch_spanning import EpochSpanningLoader
from scfs.errors import ReportedError

log = logging.getLogger("scfs.train")  # the run's messages, whichever module says them


# ---- the train loader that continues mid-epoch --------------------------------------------------------------------
def _sampler_epoch(loader: DataLoader) -> int | None:
    sampler = loader.sampler if loader.batch_sampler is None else getattr(loader.batch_sampler, "sampler", None)
    epoch = getattr(sampler, "epoch", None)
    return int(epoch) if isinstance(epoch, int) else None


def _set_sampler_epoch(loader: DataLoader, epoch: int) -> None:
    for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if hasattr(s, "set_epoch"):
            s.set_epoch(epoch)


class _SkipFirst:
    """Index sampler that drops its first `n` batches of indices, once.

    `__iter__` is a generator, so the skip is decided at the first `next()`: after Lightning's `set_epoch`, and
    only if the epoch is still the one the checkpoint was taken in (a checkpoint written on the last batch of an
    epoch resumes at the start of the next one, which must not be skipped).
    """

    def __init__(self, base: Any, n: int, epoch: int | None, loader: DataLoader) -> None:
        self.base, self.n, self.epoch, self.loader = base, n, epoch, loader

    def __iter__(self) -> Iterator[Any]:
        n, self.n = self.n, 0  # one-shot: persistent workers iterate this object again every epoch
        if self.epoch is not None and _sampler_epoch(self.loader) not in (None, self.epoch):
            n = 0
        it = iter(self.base)
        for _ in range(n):
            if next(it, None) is None:
                return
        yield from it

    def __len__(self) -> int:
        return len(self.base)


class ResumableDataLoader(EpochSpanningLoader):
    """A DataLoader that Lightning treats as stateful, so a run resumed mid-epoch continues with the batch after
    the last one it trained on instead of restarting the epoch.

    `batches_done` (batches of the current epoch already trained on) is kept up to date by the `ResumeState`
    callback; `state_dict()` saves it with the sampler's epoch, `load_state_dict()` arms a one-shot skip of that
    many batches of indices for the next iteration. The global RNG is left untouched by creating the resumed
    iterator (an uninterrupted run created it before the checkpoint), so per-sample augmentations match too.
    Exact with `num_workers=0`; with workers the skip is still right but worker RNG streams are not restored.
    A loader whose workers run on across epochs (`EpochSpanningLoader.span_epochs`) resumes its stream at the
    skipped batch instead.
    """

    batches_done: int = 0
    _pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": _sampler_epoch(self), "batches": int(self.batches_done), "batch_size": self.batch_size}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._pending = dict(state_dict)
        self.batches_done = int(state_dict.get("batches", 0) or 0)
        if state_dict.get("epoch") is not None:  # workers draw indices when the iterator is created
            _set_sampler_epoch(self, int(state_dict["epoch"]))

    def __iter__(self) -> Any:
        pending, self._pending = self._pending, None
        n = int((pending or {}).get("batches", 0) or 0)
        if n <= 0:
            return super().__iter__()
        old_bs = pending.get("batch_size")
        if old_bs and self.batch_size and old_bs != self.batch_size:
            n = (n * old_bs) // self.batch_size
            warnings.warn(f"resumed with batch_size={self.batch_size} instead of {old_bs}: skipping {n} batches "
                          "of the interrupted epoch; the rest of that epoch is approximate", RuntimeWarning,
                          stacklevel=2)
        rng = torch.get_rng_state()
        if self.spanning:
            epoch = _sampler_epoch(self) or 0
            if pending.get("epoch") is not None and epoch != int(pending["epoch"]):
                n = 0  # the checkpoint's epoch had ended: the next one starts whole
            try:
                return self.epoch_iter(epoch, n)
            finally:
                torch.set_rng_state(rng)
        self._index_override = _SkipFirst(self._index_sampler, n, pending.get("epoch"), self)
        try:
            return super().__iter__()
        finally:
            self._index_override = None
            torch.set_rng_state(rng)


def make_resumable(loader: DataLoader) -> DataLoader:
    """The same loader as a `ResumableDataLoader` (same dataset, sampler, batch size, workers, collate)."""
    if isinstance(loader, ResumableDataLoader) or not isinstance(loader, DataLoader):
        return loader
    if loader.batch_size is None and not isinstance(loader.batch_sampler, BatchSampler):
        log.warning("custom batch sampler: mid-epoch resume restarts the epoch")
        return loader
    kw: dict[str, Any] = {
        "num_workers": loader.num_workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
        "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn, "generator": loader.generator,
        "persistent_workers": loader.persistent_workers, "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kw.update(multiprocessing_context=loader.multiprocessing_context, prefetch_factor=loader.prefetch_factor)
    if hasattr(loader, "in_order"):
        kw["in_order"] = loader.in_order
    if loader.batch_size is None:
        kw["batch_sampler"] = loader.batch_sampler
    else:
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler)
    resumable = ResumableDataLoader(loader.dataset, **kw)
    if isinstance(loader, EpochSpanningLoader) and loader.spanning:
        resumable.span_epochs(loader.span_last_epoch)
    return resumable


def make_train_loader_resumable(datamodule: L.LightningDataModule) -> None:
    """Wrap `datamodule.train_dataloader` so it returns a `ResumableDataLoader`."""
    original = datamodule.train_dataloader

    def train_dataloader() -> DataLoader:
        return make_resumable(original())

    train_dataloader.__doc__ = original.__doc__
    datamodule.train_dataloader = train_dataloader  # type: ignore[method-assign]


def resumable_train_loaders(trainer: L.Trainer) -> list[Any]:
    """Train loaders that follow the resume protocol: `ResumableDataLoader` or anything with `batches_done` and
    `state_dict` (`scfs.data.datamodule.DeviceBatchLoader`)."""
    loaders = trainer.train_dataloader
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    if not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    return [dl for dl in loaders if isinstance(dl, ResumableDataLoader)
            or (hasattr(dl, "batches_done") and hasattr(dl, "load_state_dict"))]


# ---- what a checkpoint holds besides the weights, and when last.ckpt is written -----------------------------------
def rng_state() -> dict[str, Any]:
    """Global RNG states as tensors / plain lists (loadable with `torch.load(weights_only=True)`)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ResumeState(L.Callback):
    """Keeps `ResumableDataLoader.batches_done` current and checkpoints the global RNG states.

    Runs before the checkpoint callbacks (Lightning orders `Checkpoint` callbacks last), so a checkpoint written
    on a batch end already counts that batch; at the last batch and at the epoch end the count is 0: the next
    resume starts a fresh epoch.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        last = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        for dl in resumable_train_loaders(trainer):
            dl.batches_done = 0 if last else batch_idx + 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for dl in resumable_train_loaders(trainer):
            dl.batches_done = 0

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            set_rng_state(state_dict["rng"])


class LastCheckpoint(Checkpoint):
    """Write `<dirpath>/last.ckpt` every `every_n_train_steps` optimizer steps (0 = off), at epoch ends and when
    training ends, so a crash or `kill -9` loses at most the steps since the last write.

    An epoch-end write is skipped while the last write is younger than `min_interval_s` seconds (0 = at every
    epoch end): a 4 s CIFAR-10 epoch spent 0.5 s writing its ResNet-18 state, and resuming from a minute ago
    loses no more than the step saves already allow. The last epoch, a step save due at an epoch's last step, a
    stopping run (a callback's `should_stop`, `max_steps`) and the end of training always write. Under DDP rank
    0's clock decides for every rank: a save is collective, and ranks that disagreed would wait for each other
    forever.

    A `Checkpoint` subclass: Lightning runs it after every other callback (after the monitors have updated their
    state). Writes go through the trainer's CheckpointIO (`AtomicCheckpointIO`: never a torn file, never NaN).
    """

    def __init__(self, dirpath: str | os.PathLike, every_n_train_steps: int = 0, min_interval_s: float = 0.0) -> None:
        self.dirpath, self.every = Path(dirpath), int(every_n_train_steps or 0)
        self.min_interval_s = float(min_interval_s or 0.0)  # checked with the config (`validate_config`)
        self._saved_step = -1
        self._saved_at = time.monotonic()

    @property
    def path(self) -> Path:
        return self.dirpath / "last.ckpt"

    def _save(self, trainer: L.Trainer) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.global_step == self._saved_step:
            return
        trainer.save_checkpoint(self.path, weights_only=False)  # full state: a resume point
        self._saved_step, self._saved_at = trainer.global_step, time.monotonic()

    @staticmethod
    def _stopping(trainer: L.Trainer) -> bool:
        return bool(trainer.should_stop) or 0 < trainer.max_steps <= trainer.global_step

    def _epoch_end_due(self, trainer: L.Trainer) -> bool:
        """Whether this epoch end writes: the interval has passed, the run ends here, or the epoch's last step was
        a step save's (deferred to here, after the epoch-end hooks). Rank 0 decides."""
        max_epochs = trainer.max_epochs
        last_epoch = max_epochs is not None and max_epochs >= 0 and trainer.current_epoch + 1 >= max_epochs
        step_save = self.every > 0 and trainer.global_step % self.every == 0
        due = (self.min_interval_s <= 0 or last_epoch or step_save or self._stopping(trainer)
               or time.monotonic() - self._saved_at >= self.min_interval_s)
        return bool(trainer.strategy.broadcast(due, src=0))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = time.monotonic()  # the interval counts from here (a resumed run's file is this fresh)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # a run about to stop mid-epoch (should_stop from a callback: chunk budget, max_time; or max_steps) is saved
        # here, as a step save: the state Lightning holds at on_train_end resumes one batch too far
        stopping = self._stopping(trainer)
        if not stopping and (self.every <= 0 or trainer.global_step % self.every):
            return
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return  # the epoch-end save follows, after the epoch-end hooks (monitors, numbered checkpoints)
        if (batch_idx + 1) % max(int(trainer.accumulate_grad_batches), 1):
            return  # mid-accumulation: the accumulated gradients are not in a checkpoint
        self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_end_due(trainer):
            self._save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)


# ---- the resume file, checked before anything is built -----------------------------------------------------------
def check_resume_checkpoint(path: str, model: Any | None = None) -> dict[str, Any]:
    """Read a resume file the safe way (weights only: a file that needs pickle code is refused with
    `UnsafeCheckpointError`) and check that it is a training checkpoint, before anything is built or written, so
    a wrong file fails in one clear line instead of deep inside Lightning. Returns its global_step, epoch and
    tensor shapes; with `model`, also checks that the architecture matches (`check_resume_matches`)."""
    from scfs.models.checkpoint import NonFiniteWeightsError, NotACheckpointError, safe_load
    from scfs.reliability import check_finite

    ckpt = safe_load(path)
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("state_dict"), dict) and "loops" in ckpt
            and "optimizer_states" in ckpt):
        raise NotACheckpointError(f"resume={path}: not a training checkpoint of scfs.train (no loop / optimizer "
                                  "state); to start from its weights use backbone.pretrained_path=<file> instead")
    bad = check_finite(ckpt)
    if bad:  # our writer never saves these; a file from elsewhere (or edited) would only reproduce the divergence
        raise NonFiniteWeightsError(
            f"resume={path} holds non-finite values (NaN/Inf) in {', '.join(bad)}: it is no resume point; resume "
            f"from an earlier checkpoint of that run ({_other_checkpoints(Path(path))})")
    progress = ((ckpt.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    info = {"path": str(path), "global_step": int(ckpt.get("global_step", 0)), "epoch": int(ckpt.get("epoch", 0)),
            # epochs whose batches were all trained (Lightning counts an epoch as processed before its end hooks,
            # where the epoch-end last.ckpt is written)
            "epochs_done": int(((progress.get("current") or {}).get("processed")) or 0),
            "shapes": {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}}
    if model is not None:
        check_resume_matches(info, model)
    return info


def _other_checkpoints(path: Path) -> str:
    found = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
    return f"e.g. resume={found[-1]}" if found else f"there is no other .ckpt in {path.parent}; start afresh"


class RunAlreadyCompleteError(ReportedError, ValueError):
    """`resume=` names a checkpoint whose run already trained its whole schedule: nothing would be trained."""


def check_not_complete(info: dict[str, Any], trainer_cfg: Any) -> None:
    """Refuse to resume a run that has finished its schedule (`trainer.max_epochs` / `trainer.max_steps`):
    Lightning would return at once, and the summary would report a loss of nan and a last.ckpt never written."""
    max_epochs = trainer_cfg.get("max_epochs")
    max_steps = int(trainer_cfg.get("max_steps", -1) or -1)
    step, epochs = info["global_step"], info["epochs_done"]
    if 0 < max_steps <= step:
        reason, fix = f"trainer.max_steps={max_steps}", f"raise trainer.max_steps (e.g. trainer.max_steps={2 * step})"
    elif max_epochs not in (None, -1) and epochs >= int(max_epochs):
        reason, fix = (f"trainer.max_epochs={max_epochs}",
                       f"raise trainer.max_epochs (e.g. trainer.max_epochs={epochs + max(int(max_epochs), 1)})")
    else:
        return
    raise RunAlreadyCompleteError(
        f"resume={info['path']}: that run is already complete at epoch {epochs} / step {step} ({reason}); to "
        f"train further {fix} and resume again; to evaluate it: python -m scfs.eval.knn ckpt={info['path']}")


def check_resume_matches(info: dict[str, Any], model: Any) -> None:
    """Missing / unexpected / mis-shaped weights of the resume file against the configured model, listed."""
    from scfs.models.checkpoint import CheckpointMismatchError

    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = info["shapes"]
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    shapes = sorted(f"{k}: {theirs[k]} vs {ours[k]}" for k in set(ours) & set(theirs) if ours[k] != theirs[k])
    if missing or unexpected or shapes:
        parts = [f"resume={info['path']} does not match the configured model"]
        for name, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                           ("shape mismatches (checkpoint vs model)", shapes)):
            if keys:
                parts.append(f"{name}: {len(keys)} ({', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''})")
        parts.append("resume with the same backbone / method / search config as the interrupted run")
        raise CheckpointMismatchError("; ".join(parts))

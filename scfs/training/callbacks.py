"""Lightning callbacks of the method: the online kNN monitor, the wall-clock budget of a training chunk, the epoch
timer, the progress bar."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class KNNMonitor(L.Callback):
    """kNN top-1 of the teacher backbone on the val split every `every_n_epochs` epochs (0 = never).

    The curve is logged and also written as JSON so learning curves can be committed as records.
    """

    def __init__(self, every_n_epochs: int = 0, ks: Sequence[int] = (20,), temperature: float = 0.07,
                 out_file: str | Path | None = None) -> None:
        self.every, self.ks, self.temperature = every_n_epochs, list(ks), temperature
        self.out_file = Path(out_file) if out_file else None
        self.curve: list[dict] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every <= 0 or (trainer.current_epoch + 1) % self.every or not trainer.is_global_zero:
            return
        from scfs.eval.knn import evaluate_backbone_knn

        t0 = time.perf_counter()
        bank, query = trainer.datamodule.knn_loaders()
        seconds = {"loaders_s": time.perf_counter() - t0}
        acc = evaluate_backbone_knn(pl_module.backbone("teacher"), bank, query, self.ks, self.temperature,
                                    device=pl_module.device, timings=seconds)
        seconds["total_s"] = time.perf_counter() - t0
        pl_module.log_dict({f"knn/{k}": v for k, v in acc.items()}, rank_zero_only=True)
        # the pass's seconds by part, in the curve: a kNN pass that costs several epochs shows where it goes
        self.curve.append({"epoch": trainer.current_epoch + 1, "step": trainer.global_step, **acc,
                           "seconds": {k: round(v, 3) for k, v in seconds.items()}})
        if self.out_file:
            self.out_file.write_text(json.dumps(self.curve, indent=2))

    def state_dict(self) -> dict:
        return {"curve": self.curve}

    def load_state_dict(self, state_dict: dict) -> None:
        self.curve = list(state_dict.get("curve", []))


class WallClockBudget(L.Callback):
    """Stop training cleanly after `minutes` of this process's training time, so a long run goes in chunks:
    `chunk_minutes=8` per call, then the same command with `resume=<last.ckpt>` (or the same multirun again)
    continues mid-epoch where it stopped. `LastCheckpoint` saves the step at which `should_stop` is set.

    Unlike Lightning's `max_time`, whose elapsed time is restored from the checkpoint (a resumed run would stop at
    once), the budget counts from this process's start of training. The decision is taken every `check_every`
    steps and agreed by all ranks (one small collective then, none in between).
    """

    def __init__(self, minutes: float, check_every: int = 20) -> None:
        if minutes <= 0:
            raise ValueError(f"chunk_minutes={minutes} must be > 0 (or null for no budget)")
        self.seconds, self.check_every = float(minutes) * 60.0, max(int(check_every), 1)
        self.t0: float | None = None
        self.stopped = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import time

        self.t0 = time.monotonic()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        import time

        if self.t0 is None or trainer.global_step % self.check_every:
            return
        over = time.monotonic() - self.t0 >= self.seconds
        if trainer.strategy.reduce_boolean_decision(over, all=False):
            self.stopped = trainer.should_stop = True


class EpochTimer(L.Callback):
    """Wall seconds and optimizer steps of every training epoch (the kNN passes of later callbacks excluded: it
    runs first), so a run reports the speed a user sees end to end (data, loop and step together), not a benchmark's.
    Epoch 0 holds the compile on compiled recipes and is kept apart from the steady epochs.

    Each epoch's opening is timed too: from its start to its first batch's `on_train_batch_start`, which Lightning
    calls once the loader's first batch of the epoch is in and on the device. Workers that start every epoch's
    sampling afresh (`prefetch_across_epochs=false`) make that wait a whole batch's work, per epoch whatever its
    length: on a short epoch (a benchmark's) a visible share of it, on an ImageNet epoch of thousands of steps not.
    Workers that run on across epochs (the default) leave the epoch loop's own start and what they have not yet
    made of the first batch.

    With checkpoints written on a background thread (`BackgroundCheckpointIO`), each epoch also says how many of
    its seconds ran beside a write: a write handed over at an epoch's end runs into the next epoch, whose speed it
    may cost."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []
        self._t0: float | None = None
        self._opening: float | None = None
        self._step0 = 0
        self._writer: str | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0, self._opening, self._step0 = time.perf_counter(), None, trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._t0 is not None and self._opening is None:
            self._opening = time.perf_counter() - self._t0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._t0 is None:
            return
        now = time.perf_counter()
        epoch = {"epoch": trainer.current_epoch, "seconds": now - self._t0, "steps": trainer.global_step - self._step0}
        if self._opening is not None:
            epoch["opening_s"] = self._opening
        writer = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
        background = callable(getattr(writer, "seconds_writing", None))
        if background:
            epoch["background_write_s"] = writer.seconds_writing(self._t0, now)
        self._writer = "background" if background else "training thread"
        self.epochs.append(epoch)
        self._t0 = None

    def report(self, images_per_step: int) -> dict[str, Any]:
        """`epoch_seconds` (every timed epoch), `first_epoch_s`, and `img_per_s`: the median over the epochs after
        the first of images / second (None with fewer than two epochs). Once every epoch's opening was timed, also
        `epoch_openings_s` and `img_per_s_after_openings`: the same median with each epoch's opening taken out,
        the rate a long epoch approaches. `checkpoint_writes`: where the run's checkpoint writer wrote (`background`
        or `training thread`, as resolved on the machine, not as configured); with background writes,
        `epoch_background_writes_s`: the seconds of each epoch that ran beside a write."""
        import statistics

        out: dict[str, Any] = {"epoch_seconds": [round(e["seconds"], 2) for e in self.epochs]}
        if self.epochs:
            out["first_epoch_s"] = round(self.epochs[0]["seconds"], 2)
        steady = [e for e in self.epochs[1:] if e["steps"] > 0 and e["seconds"] > 0]
        out["img_per_s"] = (round(statistics.median(e["steps"] * images_per_step / e["seconds"] for e in steady), 1)
                            if steady else None)
        if self.epochs and all("opening_s" in e for e in self.epochs):
            out["epoch_openings_s"] = [round(e["opening_s"], 3) for e in self.epochs]
            rest = [e["steps"] * images_per_step / (e["seconds"] - e["opening_s"]) for e in steady
                    if e["seconds"] > e["opening_s"]]
            out["img_per_s_after_openings"] = round(statistics.median(rest), 1) if rest else None
        if self._writer is not None:
            out["checkpoint_writes"] = self._writer
        if self.epochs and all("background_write_s" in e for e in self.epochs):
            out["epoch_background_writes_s"] = [round(e["background_write_s"], 3) for e in self.epochs]
        return out


class LoggedStepsProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, whose training postfix is redrawn only on the steps where the loggers write.

    Between refreshes Lightning's bar costs next to nothing (a modulo); a refresh reads
    `trainer.progress_bar_metrics`, which turns every `prog_bar=True` value (the loss) into a Python number with
    `.item()`: a host sync that waits until the GPU has run everything queued. The loggers sync the same way every
    `log_every_n_steps` optimiser steps, counted over the run, while Lightning's bar refreshes every `refresh_rate`
    batches counted from each epoch's start. Once an epoch length is not a multiple of the rate the two fall on
    different steps, and the GPU queue drains twice per window instead of once, each drain leaving the GPU idle
    while the host prepares the next step. This bar counts its refreshes like the loggers do (Lightning's
    `_batches_that_stepped`), so with `refresh_rate = log_every_n_steps` its sync lands on a step that syncs
    anyway. The last batch of an epoch only moves the counter; `on_train_epoch_end` shows the metrics (one read
    per epoch, as in Lightning's bar).
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        bar = self._train_progress_bar
        if bar is None or not self.is_enabled or bar.disable:
            return
        n = batch_idx + 1
        last = n == bar.total
        accumulating = n % max(int(trainer.accumulate_grad_batches), 1) != 0 and not last
        stepped = trainer.fit_loop.epoch_loop._batches_that_stepped + 1  # as the loggers count, this batch included
        if not accumulating and stepped % self.refresh_rate == 0:
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar
        elif last:
            bar.n = n
            bar.refresh()

"""How often `last.ckpt` is written at epoch ends (`checkpoint.last_min_interval_s`): short epochs skip the writes
until the last one is old enough, while the last epoch, a deferred step save, a stopping run and the end of training
always write."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
from helpers import compose_cfg

from scfs.config import ConfigError
from scfs.models.checkpoint import safe_load
from scfs.train import run
from scfs.training import checkpointing
from scfs.training.checkpointing import LastCheckpoint, RunAlreadyCompleteError


def _spy_saves(monkeypatch) -> list[tuple[str, int]]:
    """Every `trainer.save_checkpoint` of the run: (file name, global step), the write itself unchanged."""
    saves: list[tuple[str, int]] = []
    real = L.Trainer.save_checkpoint

    def save(self, filepath, *args, **kwargs):
        saves.append((str(filepath).rsplit("/", 1)[-1], self.global_step))
        return real(self, filepath, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "save_checkpoint", save)
    return saves


RUN = ["trainer.max_epochs=3", "trainer.limit_train_batches=2", "checkpoint.every_n_train_steps=0",
       "checkpoint.every_n_epochs=100", "eval.knn_at_start=false"]


@pytest.mark.parametrize(("interval", "steps"), [(0, [2, 4, 6]), (3600, [6])])
def test_epoch_end_writes_follow_the_interval_and_the_last_epoch_always_writes(interval, steps, shapes_root,
                                                                                 tmp_path, monkeypatch):
    saves = _spy_saves(monkeypatch)
    run(compose_cfg([*RUN, f"checkpoint.last_min_interval_s={interval}"], data_root=shapes_root), tmp_path / "run")
    assert [s for name, s in saves if name == "last.ckpt"] == steps
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert safe_load(last)["global_step"] == 6
    # the final write is the resume point of a complete run
    with pytest.raises(RunAlreadyCompleteError):
        run(compose_cfg([*RUN, f"resume={last}"], data_root=shapes_root), tmp_path / "again")


def _trainer(epoch: int, max_epochs: int | None = 10, should_stop: bool = False, max_steps: int = -1,
             step: int = 50, rank0_says: bool | None = None) -> SimpleNamespace:
    def broadcast(obj, src=0):
        assert src == 0
        return obj if rank0_says is None else rank0_says

    return SimpleNamespace(current_epoch=epoch, max_epochs=max_epochs, should_stop=should_stop, max_steps=max_steps,
                           global_step=step, strategy=SimpleNamespace(broadcast=broadcast))


def test_epoch_end_due_after_the_interval_at_the_end_and_when_stopping(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(checkpointing.time, "monotonic", lambda: clock[0])
    cb = LastCheckpoint("unused", min_interval_s=60)
    assert cb._saved_at == 1000.0
    clock[0] = 1059.0
    assert not cb._epoch_end_due(_trainer(epoch=3))
    assert cb._epoch_end_due(_trainer(epoch=9))  # the last of max_epochs=10
    assert cb._epoch_end_due(_trainer(epoch=3, should_stop=True))  # a chunk budget or max_time stopping here
    assert cb._epoch_end_due(_trainer(epoch=3, max_steps=50, step=50))
    assert not cb._epoch_end_due(_trainer(epoch=3, max_epochs=-1, max_steps=500, step=50))  # no epoch limit
    clock[0] = 1060.0
    assert cb._epoch_end_due(_trainer(epoch=3))
    # every rank follows rank 0's answer, whatever its own clock says
    assert cb._epoch_end_due(_trainer(epoch=3, rank0_says=False)) is False
    clock[0] = 1000.0
    assert cb._epoch_end_due(_trainer(epoch=3, rank0_says=True)) is True
    assert LastCheckpoint("unused", min_interval_s=0)._epoch_end_due(_trainer(epoch=3))
    # a step save due at the epoch's last step waits for the epoch end, and happens there
    every_25 = LastCheckpoint("unused", every_n_train_steps=25, min_interval_s=60)
    assert every_25._epoch_end_due(_trainer(epoch=3, step=50))
    assert not every_25._epoch_end_due(_trainer(epoch=3, step=51))


@pytest.mark.parametrize("bad", ["-1", "soon", "nan"])
def test_a_bad_interval_is_one_line_naming_the_key(bad, shapes_root, tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint.last_min_interval_s=.*expected seconds >= 0"):
        run(compose_cfg([*RUN, f"checkpoint.last_min_interval_s={bad}"], data_root=shapes_root), tmp_path)
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()

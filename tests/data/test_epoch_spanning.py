"""Workers that run on into the next epoch (`scfs.data.epoch_spanning`): every epoch yields exactly a plain
loader's batches, the next epoch's first batches are made before it is asked for, and a jump, an unfinished epoch
or a resume resets the stream where it is asked to be; through Lightning the run sees a plain loader's batches."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from scfs.data.datamodule import SSLDataModule
from scfs.data.epoch_spanning import EpochSpanningLoader, why_not_spanning
from scfs.data.samplers import EpochSeededRandomSampler
from scfs.training.checkpointing import ResumableDataLoader, ResumeState, make_resumable, make_train_loader_resumable

N, B = 42, 4  # 10 batches an epoch; drop_last drops 2 samples
_LOGS = itertools.count()


class _Logged(Dataset):
    """Sample i is i; every fetch, in whichever worker, appends a line to `log`."""

    def __init__(self, log: Path) -> None:
        self.log = str(log)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{i}\n".encode())
        finally:
            os.close(fd)
        return i


def _fetches(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def _loader(tmp_path: Path, cls=EpochSpanningLoader, seed: int = 5, **kw) -> DataLoader:
    return cls(_Logged(tmp_path / f"log-{next(_LOGS)}"), batch_size=B, drop_last=True,
               sampler=EpochSeededRandomSampler(N, seed), num_workers=2, persistent_workers=True, **kw)


def _epoch(loader: DataLoader, epoch: int) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [batch.tolist() for batch in loader]


def _plain(epoch: int, seed: int = 5) -> list[list[int]]:
    sampler = EpochSeededRandomSampler(N, seed)
    sampler.set_epoch(epoch)
    return [b.tolist() for b in DataLoader(list(range(N)), batch_size=B, drop_last=True, sampler=sampler)]


def _wait_for(cond, seconds: float = 20.0) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_each_epoch_yields_a_plain_loaders_batches(tmp_path: Path) -> None:
    loader = _loader(tmp_path)
    assert loader.span_epochs() is None and loader.spanning
    epochs = [_epoch(loader, e) for e in range(4)]
    assert epochs == [_plain(e) for e in range(4)]
    assert len({str(e) for e in epochs}) == 4  # a new permutation every epoch
    assert loader.restarts == 1  # one stream for all four


def test_the_next_epochs_batches_are_made_before_it_is_asked_for(tmp_path: Path) -> None:
    per_epoch = (N // B) * B
    spanning, plain = _loader(tmp_path), _loader(tmp_path, prefetch_factor=2)
    spanning.span_epochs()
    _epoch(spanning, 0)
    _epoch(plain, 0)
    # the workers go on with epoch 1 (2 workers x prefetch_factor 2 batches) while nobody asks
    assert _wait_for(lambda: _fetches(Path(spanning.dataset.log)) >= per_epoch + 2 * 2 * B)
    time.sleep(0.3)
    assert _fetches(Path(plain.dataset.log)) == per_epoch  # a plain loader waits for the next iter()
    assert _epoch(spanning, 1) == _plain(1)


def test_no_batch_past_the_last_epoch_is_made(tmp_path: Path) -> None:
    loader = _loader(tmp_path)
    loader.span_epochs(last_epoch=1)
    assert [_epoch(loader, e) for e in (0, 1)] == [_plain(0), _plain(1)]
    time.sleep(0.5)
    assert _fetches(Path(loader.dataset.log)) == 2 * (N // B) * B


def test_a_jump_or_an_unfinished_epoch_resets_the_stream_where_asked(tmp_path: Path) -> None:
    loader = _loader(tmp_path)
    loader.span_epochs()
    loader.sampler.set_epoch(0)
    it = iter(loader)
    assert len(it) == N // B
    assert [next(it).tolist() for _ in range(3)] == _plain(0)[:3]  # epoch 0 left unfinished
    assert _epoch(loader, 3) == _plain(3)
    assert _epoch(loader, 4) == _plain(4)
    assert _epoch(loader, 2) == _plain(2)  # backwards too
    assert loader.restarts == 3
    assert [b.tolist() for b in loader.epoch_iter(5, skip=7)] == _plain(5)[7:]
    assert _epoch(loader, 6) == _plain(6)
    assert loader.restarts == 4


def test_a_resumed_epoch_skips_its_trained_batches_and_leaves_the_rng_alone(tmp_path: Path) -> None:
    loader = _loader(tmp_path, cls=ResumableDataLoader)
    loader.span_epochs()
    loader.load_state_dict({"epoch": 2, "batches": 6, "batch_size": B})
    rng = torch.get_rng_state()
    it = iter(loader)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [b.tolist() for b in it] == _plain(2)[6:]
    assert _epoch(loader, 3) == _plain(3)
    assert loader.restarts == 1  # the resumed epoch ran on into the next


def test_which_loaders_can_span(tmp_path: Path) -> None:
    assert why_not_spanning(_loader(tmp_path)) is None
    assert why_not_spanning(EpochSpanningLoader(list(range(8)), batch_size=2)) == "no persistent workers"
    odd = EpochSpanningLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    assert why_not_spanning(odd) == "a sampler without set_epoch"
    plain = EpochSpanningLoader(list(range(8)), batch_size=2)
    assert plain.span_epochs() == "no persistent workers" and not plain.spanning
    assert [b.tolist() for b in plain] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    resumable = make_resumable(_loader(tmp_path))
    assert isinstance(resumable, ResumableDataLoader) and not resumable.spanning
    spanning = _loader(tmp_path)
    spanning.span_epochs(last_epoch=4)
    resumable = make_resumable(spanning)
    assert resumable.spanning and resumable.span_last_epoch == 4


# ---- through Lightning, with the training set-up's resumable loader ------------------------------------------------
DATA = {"name": "shapes", "image_size": 16, "n_train": 40, "n_val": 8, "num_classes": 10}
CROPS = {"global_size": 16, "local_size": 8, "n_local": 2}


class _Recorder(L.LightningModule):
    """Records each training batch's labels and a checksum of its images, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[tuple[list[int], int]]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.setdefault(self.current_epoch, []).append((y.tolist(), int(x.long().sum())))
        return (self.w * 0).sum() + self.w.sum() ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SaveAt(L.Callback):
    """Writes `<folder>/mid.ckpt` at the end of optimizer step `step`, as the run's step saves do."""

    def __init__(self, step: int, folder: Path) -> None:
        self.step, self.folder = step, folder

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.folder / "mid.ckpt")


def _fit(root: Path, prefetch: bool, ckpt_path: Path | None = None,
         **trainer_kw) -> tuple[_Recorder, SSLDataModule, L.Trainer]:
    dm = SSLDataModule({**DATA, "root": str(root)}, CROPS, batch_size=8, num_workers=2, batch_aug=True, seed=3,
                       prefetch_across_epochs=prefetch)
    dm.setup()
    make_train_loader_resumable(dm)
    module = _Recorder()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        **trainer_kw)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, dm, trainer


def test_through_lightning_the_run_sees_a_plain_loaders_batches(tmp_path: Path) -> None:
    spanning, _, trainer = _fit(tmp_path, prefetch=True)
    loader = trainer.train_dataloader
    assert isinstance(loader, ResumableDataLoader) and loader.spanning and loader.span_last_epoch == 2
    assert loader.restarts == 1  # one stream over the three epochs
    assert loader._iterator is None  # Lightning's teardown stopped the workers
    plain, _, trainer = _fit(tmp_path, prefetch=False)
    assert not trainer.train_dataloader.spanning
    assert spanning.seen == plain.seen and sorted(spanning.seen) == [0, 1, 2]
    assert all(len(v) == 5 for v in spanning.seen.values())


def test_a_run_resumed_mid_epoch_trains_on_the_batches_an_uninterrupted_one_does(tmp_path: Path) -> None:
    whole, _, _ = _fit(tmp_path, prefetch=True)
    first, _, _ = _fit(tmp_path, prefetch=True, max_steps=7, callbacks=[ResumeState(), _SaveAt(7, tmp_path)])
    assert torch.load(tmp_path / "mid.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"][
        "combined_loader"][0]["batches"] == 2
    second, _, trainer = _fit(tmp_path, prefetch=True, ckpt_path=tmp_path / "mid.ckpt", callbacks=[ResumeState()])
    assert trainer.train_dataloader.spanning and trainer.train_dataloader.restarts == 1
    joined = {e: first.seen.get(e, []) + second.seen.get(e, []) for e in whole.seen}
    assert joined == whole.seen


def test_a_run_that_stops_its_epochs_early_keeps_plain_workers(tmp_path: Path) -> None:
    _, _, trainer = _fit(tmp_path, prefetch=True, limit_train_batches=2)
    assert not trainer.train_dataloader.spanning


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_bad_prefetch_across_epochs_value_is_one_clear_line(value) -> None:
    from scfs.config import ConfigError, validate_config
    from tests.helpers import compose_cfg

    with pytest.raises(ConfigError, match=r"prefetch_across_epochs=.*expected true or false"):
        validate_config(compose_cfg([f"prefetch_across_epochs={value}"]))

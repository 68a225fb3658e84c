"""The on-device data path (`data.on_device=true`) yields the DataLoader path's batches, shards per rank like it,
resumes mid-epoch, caches decoded image folders, and trains end to end (CPU stands in for the GPU)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from PIL import Image

from scfs.data.datamodule import DeviceBatchLoader, SSLDataModule, materialise
from scfs.data.samplers import EpochSeededRandomSampler
from tests.helpers import compose_cfg

DATA = {"name": "shapes", "image_size": 16, "n_train": 40, "n_val": 8, "num_classes": 10}
CROPS = {"global_size": 16, "local_size": 8, "n_local": 2}


def _dm(root: Path, on_device: bool, batch_size: int = 8) -> SSLDataModule:
    dm = SSLDataModule({**DATA, "root": str(root)}, CROPS, batch_size=batch_size, batch_aug=True, seed=3,
                       on_device=on_device)
    dm.setup()
    return dm


def test_on_device_batches_equal_the_dataloader_batches(tmp_path: Path) -> None:
    ref, dev = _dm(tmp_path, False).train_dataloader(), _dm(tmp_path, True).train_dataloader()
    assert isinstance(dev, DeviceBatchLoader) and len(dev) == len(ref) == 5
    for epoch in (0, 1):
        ref.sampler.set_epoch(epoch)
        dev.sampler.set_epoch(epoch)
        pairs = list(zip(ref, dev, strict=True))
        for (xr, yr), (xd, yd) in pairs:
            assert xd.dtype == torch.uint8 and torch.equal(xr, xd) and torch.equal(yr.long(), yd)
    first_epoch1 = pairs[0][1][1]
    dev.sampler.set_epoch(0)
    assert not torch.equal(next(iter(dev))[1], first_epoch1)  # a new permutation per epoch


def test_sampler_shards_are_slices_of_the_global_batches() -> None:
    one = EpochSeededRandomSampler(50, seed=1, batch_size=8, num_replicas=1).indices()
    shards = [EpochSeededRandomSampler(50, seed=1, batch_size=4, num_replicas=2, rank=r) for r in (0, 1)]
    assert [len(s) for s in shards] == [24, 24]  # 6 full global batches of 8, the rest dropped
    a, b = (s.indices().view(-1, 4) for s in shards)
    assert torch.equal(torch.cat([a, b], 1).reshape(-1), one[:48])
    assert not set(a.flatten().tolist()) & set(b.flatten().tolist())


def test_on_device_loader_resumes_mid_epoch(tmp_path: Path) -> None:
    dev = _dm(tmp_path, True).train_dataloader()
    dev.sampler.set_epoch(1)
    full = [y for _, y in dev]
    dev.batches_done = 2
    state = dev.state_dict()
    again = _dm(tmp_path, True).train_dataloader()
    again.load_state_dict(state)
    rest = [y for _, y in again]
    assert len(rest) == len(full) - 2 and all(torch.equal(a, b) for a, b in zip(rest, full[2:], strict=True))


def test_image_folder_is_decoded_once_and_cached(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "train" / c / f"{i}.png")
    from scfs.data.datasets import build_dataset

    cfg = {"name": "folder", "root": str(tmp_path)}
    ds = build_dataset(cfg, "train")
    imgs, labels = materialise(ds, cfg)
    assert imgs.shape == (6, 3, 8, 8) and labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(imgs[4], ds[4][0])
    assert len(list((tmp_path / ".scfs_cache").glob("uint8-6-*.pt"))) == 1
    imgs2, _ = materialise(ds, cfg)
    assert torch.equal(imgs, imgs2)


def test_training_runs_on_the_on_device_path(tmp_path: Path) -> None:
    from scfs.train import build, trainer_kwargs

    cfg = compose_cfg(["data.on_device=true"], data_root=tmp_path)
    L.seed_everything(0, verbose=False)
    dm, model = build(cfg)
    trainer = L.Trainer(**trainer_kwargs(cfg), logger=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 2 and isinstance(trainer.train_dataloader, DeviceBatchLoader)


def test_on_device_knn_batches_equal_the_eval_transform_batches(tmp_path: Path) -> None:
    """kNN bank and queries served from the device split carry the same normalised images and labels, in the
    same order, as the DataLoader + EvalTransform path (and kNN accuracy is therefore the same)."""
    from scfs.data.datamodule import DeviceEvalBatches

    ref_dm, dev_dm = _dm(tmp_path, False), _dm(tmp_path, True)
    ref_dm.eval_batch_size = dev_dm.eval_batch_size = 16
    for ref, dev in zip(ref_dm.knn_loaders(), dev_dm.knn_loaders(), strict=True):
        assert isinstance(dev, DeviceEvalBatches) and not isinstance(ref, DeviceEvalBatches)
        xr, yr = map(torch.cat, zip(*ref, strict=True))
        xd, yd = map(torch.cat, zip(*dev, strict=True))
        assert xd.dtype == torch.float32 and xd.shape == xr.shape
        torch.testing.assert_close(xd, xr, rtol=0, atol=1e-6)
        assert torch.equal(yd, yr.long())


def test_on_device_knn_falls_back_when_the_eval_view_resizes(tmp_path: Path) -> None:
    """An evaluation view that resizes (eval_size != image size) keeps the DataLoader + EvalTransform path."""
    from scfs.data.datamodule import DeviceEvalBatches

    dm = SSLDataModule({**DATA, "root": str(tmp_path), "eval_size": 12}, CROPS, batch_size=8, batch_aug=True,
                       seed=3, on_device=True)
    dm.setup()
    assert not any(isinstance(loader, DeviceEvalBatches) for loader in dm.knn_loaders())

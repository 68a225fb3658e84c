"""`data.colour_on_device`: DataLoader workers only crop (`MultiCropGeometry`), the module flips, colours and
normalises the uint8 crops of the whole batch on its device (`BatchMultiCrop.colour`, CPU stands in for the GPU)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from scfs.data.batch_aug import BatchMultiCrop
from scfs.data.datamodule import SSLDataModule
from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD, MultiCropGeometry
from tests.helpers import compose_cfg

CROPS = {"global_size": 16, "local_size": 8, "n_local": 3}


def _photo_tree(root: Path, n: int = 12) -> Path:
    """An ImageFolder of JPEGs of different sizes (what per-sample crops exist for)."""
    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / "train" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(20, 48)), int(rng.integers(20, 48))
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    return root


def test_geometry_crops_are_the_resized_boxes_in_uint8() -> None:
    img = torch.randint(0, 256, (3, 37, 29), dtype=torch.uint8)
    out = MultiCropGeometry(**CROPS)(img)
    assert [tuple(v.shape) for v in out["views"]] == [(3, 16, 16)] * 2 + [(3, 8, 8)] * 3
    assert all(v.dtype == torch.uint8 for v in out["views"]) and out["boxes"].shape == (5, 4)
    for v, (x0, y0, x1, y1) in zip(out["views"], out["boxes"].tolist()):
        assert 0 <= x0 < x1 <= 29 and 0 <= y0 < y1 <= 37
        ref = F.resized_crop(img, int(y0), int(x0), int(y1 - y0), int(x1 - x0), list(v.shape[-2:]), antialias=True)
        assert torch.equal(v, ref)


def test_colour_equals_the_batched_views_when_the_crop_is_the_whole_image() -> None:
    """Full-image boxes at the image's own size make roi_align the identity, so `forward` (crops + colour on the
    device) and `colour` on the raw images must agree: same draw of flips, jitter, grayscale, blur, solarize."""
    spec = {"global_size": 12, "local_size": 12, "n_local": 2, "global_scale": (1.0, 1.0), "local_scale": (1.0, 1.0),
            "ratio": (1.0, 1.0), "blur_p": (1.0, 0.5, 0.5), "solarize_p": 0.5}
    aug = BatchMultiCrop(**spec)
    images = torch.randint(0, 256, (6, 3, 12, 12), dtype=torch.uint8)
    full = aug(images, generator=torch.Generator().manual_seed(7))
    assert (full["boxes"] == torch.tensor([0.0, 0.0, 12.0, 12.0])).all()
    col = aug.colour([images] * 4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(col["flips"], full["flips"])
    for a, b in zip(col["views"], full["views"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_colour_flips_and_normalises_when_nothing_else_is_drawn() -> None:
    aug = BatchMultiCrop(**CROPS, flip_p=1.0, jitter_p=0.0, gray_p=0.0, blur_p=(0.0, 0.0, 0.0), solarize_p=0.0)
    views = [torch.randint(0, 256, (4, 3, s, s), dtype=torch.uint8) for s in (16, 16, 8, 8, 8)]
    out = aug.colour(views)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert out["flips"].all() and out["flips"].shape == (4, 5)
    for v, o in zip(views, out["views"]):
        torch.testing.assert_close(o, (v.flip(-1).float() / 255 - mean) / std, rtol=1e-5, atol=1e-5)


def test_colour_rejects_views_that_do_not_match_the_crops_config() -> None:
    aug = BatchMultiCrop(**CROPS)
    with pytest.raises(ValueError, match="crops config"):
        aug.colour([torch.zeros(2, 3, 16, 16, dtype=torch.uint8)] * 5)  # locals must be 8 px
    with pytest.raises(ValueError, match="uint8"):
        aug.colour([torch.zeros(2, 3, s, s) for s in (16, 16, 8, 8, 8)])


def test_datamodule_yields_uint8_crops_and_leaves_batch_aug_alone(tmp_path: Path) -> None:
    root = _photo_tree(tmp_path)
    data = {"name": "folder", "root": str(root), "colour_on_device": True}
    dm = SSLDataModule(data, CROPS, batch_size=4)
    dm.setup()
    sample, labels = next(iter(dm.train_dataloader()))
    assert [tuple(v.shape) for v in sample["views"]] == [(4, 3, 16, 16)] * 2 + [(4, 3, 8, 8)] * 3
    assert sample["views"][0].dtype == torch.uint8 and sample["boxes"].shape == (4, 5, 4) and labels.shape == (4,)
    # batch_aug makes every view on the device already: the flag is moot there (+experiment=imagenet data=shapes)
    both = SSLDataModule(data, CROPS, batch_size=4, batch_aug=True)
    both.setup()
    assert not both.colour_on_device and both.train_set.transform is None


def test_training_runs_with_colour_on_device(tmp_path: Path) -> None:
    from scfs.train import build, trainer_kwargs

    root = _photo_tree(tmp_path, n=16)
    cfg = compose_cfg(["data=folder", "data.colour_on_device=true", "data.eval_size=16", "batch_size=8",
                       "crops.global_size=16", "crops.local_size=8", "crops.n_local=2", "eval.knn_at_start=false"],
                      data_root=root)
    L.seed_everything(0, verbose=False)
    dm, model = build(cfg)
    seen = []

    class Spy(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # after on_after_batch_transfer
            seen.append((batch[0]["views"][0].dtype, batch[0]["flips"].shape))

    trainer = L.Trainer(**trainer_kwargs(cfg), logger=False, enable_checkpointing=False, callbacks=[Spy()])
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 2 and torch.isfinite(trainer.callback_metrics["loss"])
    assert seen == [(torch.float32, (8, 4))] * 2  # the module made float views and drew the flips

"""MultiCrop: boxes in original pixels, view/box consistency, collate, argument checks; EvalTransform."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torch.utils.data import DataLoader, default_collate

from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, MultiCrop, blur_for_size

NO_COLOUR = {"jitter_p": 0.0, "gray_p": 0.0, "blur_p": (0.0, 0.0, 0.0), "solarize_p": 0.0}


@pytest.fixture
def img() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (3, 48, 60), dtype=torch.uint8, generator=g)  # H=48, W=60: not square


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(F.to_dtype(x, torch.float32, scale=True), list(IMAGENET_MEAN), list(IMAGENET_STD))


def _expected(img: torch.Tensor, box: torch.Tensor, size: int, flip: bool) -> torch.Tensor:
    x0, y0, x1, y1 = (int(v) for v in box)
    out = F.resized_crop(img, y0, x0, y1 - y0, x1 - x0, [size, size], antialias=True)
    return _norm(F.horizontal_flip(out) if flip else out)


def test_output_structure(img: torch.Tensor) -> None:
    mc = MultiCrop(global_size=32, local_size=16, n_local=4)
    out = mc(img)
    assert mc.n_views == 6 and len(out["views"]) == 6
    assert [tuple(v.shape) for v in out["views"]] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 4
    assert all(v.dtype == torch.float32 for v in out["views"])
    assert out["boxes"].shape == (6, 4) and out["boxes"].dtype == torch.float32
    assert out["flips"].shape == (6,) and out["flips"].dtype == torch.bool


@pytest.mark.parametrize("flip_p", [0.0, 1.0])
def test_views_are_crops_of_their_boxes(img: torch.Tensor, flip_p: float) -> None:
    torch.manual_seed(1)
    mc = MultiCrop(global_size=32, local_size=16, n_local=6, flip_p=flip_p, **NO_COLOUR)
    for _ in range(5):
        out = mc(img)
        boxes = out["boxes"]
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 60).all() and (boxes[:, 3] <= 48).all()
        assert (boxes[:, 2:] > boxes[:, :2]).all()
        assert bool(out["flips"].all()) == (flip_p == 1.0) and bool(out["flips"].any()) == (flip_p == 1.0)
        for i, (view, box) in enumerate(zip(out["views"], boxes)):
            size = 32 if i < 2 else 16
            assert torch.equal(view, _expected(img, box, size, flip_p == 1.0))
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / (48 * 60)
        assert (area[:2] > 0.2).all() and (area[:2] <= 1).all()  # global scale (0.25, 1) up to rounding
        assert (area[2:] < 0.3).all() and (area[2:] > 0.03).all()  # local scale (0.05, 0.25)


def test_solarize_only_on_second_global(img: torch.Tensor) -> None:
    torch.manual_seed(2)
    mc = MultiCrop(global_size=32, local_size=16, n_local=2, flip_p=0.0, **{**NO_COLOUR, "solarize_p": 1.0})
    out = mc(img)
    for i, (view, box) in enumerate(zip(out["views"], out["boxes"])):
        x0, y0, x1, y1 = (int(v) for v in box)
        raw = F.resized_crop(img, y0, x0, y1 - y0, x1 - x0, [32 if i < 2 else 16] * 2, antialias=True)
        if i == 1:
            raw = F.solarize(raw, threshold=128)
        assert torch.equal(view, _norm(raw)), i


def test_colour_augmentations_run_and_stay_finite(img: torch.Tensor) -> None:
    torch.manual_seed(3)
    mc = MultiCrop(global_size=32, local_size=16, n_local=2, jitter_p=1.0, gray_p=1.0, blur_p=(1, 1, 1),
                   solarize_p=1.0)
    out = mc(img)
    for v in out["views"]:
        assert torch.isfinite(v).all()
        rgb = v * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None, None]
        assert torch.allclose(rgb[0], rgb[1], atol=1e-5)  # grayscale: equal channels


def test_blur_kernel_scales_with_crop_size() -> None:
    k = {s: blur_for_size(s, (0.1, 2.0), 224).kernel_size[0] for s in (16, 32, 64, 224)}
    assert k[16] == 3 and k[16] <= k[32] <= k[64] < k[224] <= 23 and all(v % 2 == 1 for v in k.values())
    assert blur_for_size(16, (0.1, 2.0), None).kernel_size[0] <= 15  # never larger than the crop


def test_default_collate_and_dataloader(img: torch.Tensor) -> None:
    mc = MultiCrop(global_size=32, local_size=16, n_local=3)
    batch = default_collate([(mc(img), 0), (mc(img), 1)])
    sample, labels = batch
    assert isinstance(sample["views"], list) and len(sample["views"]) == 5
    assert sample["views"][0].shape == (2, 3, 32, 32) and sample["views"][4].shape == (2, 3, 16, 16)
    assert sample["boxes"].shape == (2, 5, 4) and sample["flips"].shape == (2, 5)
    assert labels.tolist() == [0, 1]

    class Tiny(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return mc(img), i

    views = next(iter(DataLoader(Tiny(), batch_size=4)))[0]["views"]
    assert views[1].shape == (4, 3, 32, 32)


def test_input_kinds(img: torch.Tensor) -> None:
    mc = MultiCrop(global_size=16, local_size=8, n_local=1)
    pil = Image.fromarray(img.permute(1, 2, 0).numpy())
    assert mc(pil)["views"][0].shape == (3, 16, 16)
    assert mc(img[:1])["views"][2].shape == (3, 8, 8)  # grey (1,H,W) is expanded
    with pytest.raises(ValueError, match="uint8"):
        mc(img.float())
    with pytest.raises(ValueError, match=r"\(3,H,W\)"):
        mc(img[None])


@pytest.mark.parametrize("kwargs, match", [
    ({"global_scale": (0.5, 1.5)}, "global_scale"),
    ({"local_scale": (0.0, 0.2)}, "local_scale"),
    ({"local_scale": (0.3, 0.2)}, "local_scale"),
    ({"n_local": -1}, "n_local"),
    ({"global_size": 0}, "sizes must be > 0"),
    ({"local_size": -4}, "sizes must be > 0"),
    ({"flip_p": 1.5}, "flip_p"),
    ({"blur_p": (1.0, 0.1)}, "blur_p"),
    ({"jitter": (0.4, 0.4, 0.2)}, "jitter"),
    ({"std": (0.2, 0.2, 0.0)}, "std"),
])
def test_argument_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MultiCrop(**kwargs)


def test_no_local_views(img: torch.Tensor) -> None:
    out = MultiCrop(n_local=0)(img)
    assert len(out["views"]) == 2 and out["boxes"].shape == (2, 4)


def test_eval_transform(img: torch.Tensor) -> None:
    out = EvalTransform(32)(img)
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert torch.equal(EvalTransform(32, resize=40)(img), EvalTransform(32, resize=40)(img))  # deterministic
    raw = F.center_crop(F.resize(img, [40], antialias=True), [32, 32])
    assert torch.equal(EvalTransform(32, resize=40)(img), _norm(raw))
    with pytest.raises(ValueError, match="resize"):
        EvalTransform(32, resize=16)
    with pytest.raises(ValueError, match="> 0"):
        EvalTransform(0)

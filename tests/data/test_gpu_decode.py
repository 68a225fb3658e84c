"""`data.decode=gpu`: DataLoader workers read the files' bytes, the module decodes the batch with `decode_jpeg` on
its device and cuts the views of images of different sizes from one packed canvas (`BatchMultiCrop` on a list).
The CPU stands in for the GPU: `decode_jpeg(list, device="cpu")` is the same code path."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image

from scfs.data.batch_aug import BatchAugParams, BatchMultiCrop, pack_images
from scfs.data.datamodule import SSLDataModule
from scfs.data.datasets import ImageDecodeError, build_dataset, decode_rgb
from scfs.data.encoded import (
    EncodedFile,
    EncodedImageFiles,
    EncodedImages,
    collate_encoded,
    decode_images,
    read_for_device,
)
from tests.helpers import compose_cfg

OFF = dict(flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=(0.0, 0.0, 0.0), solarize_p=0.0, mean=(0.0, 0.0, 0.0),
           std=(1.0, 1.0, 1.0))  # geometry only, views in [0, 1]
SIZES = [(37, 29), (20, 50), (64, 48), (31, 31), (12, 90), (45, 23)]


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth colour picture with some texture, (h, w, 3) uint8: JPEG keeps it close to itself."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.arange(h) / h, np.arange(w) / w, indexing="ij")
    ph = rng.uniform(0, 2 * np.pi, (3, 1, 1))
    img = 0.5 + 0.3 * np.sin(2 * np.pi * (1.5 * xx + yy) + ph) + 0.05 * rng.standard_normal((3, h, w))
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8).transpose(1, 2, 0)


def _tree(root: Path, n: int = 16) -> dict[str, Path]:
    """An ImageFolder of RGB JPEGs of different sizes (train and val) whose train split also holds one PNG, one
    grayscale JPEG, one CMYK JPEG and one EXIF-rotated JPEG (the files the workers decode). Returns those four."""
    special: dict[str, Path] = {}
    for split, count in (("train", n), ("val", 6)):
        for i in range(count):
            d = root / split / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            h, w = SIZES[i % len(SIZES)]
            im = Image.fromarray(_photo(h + i, w, i))
            kind = ("png", "gray", "cmyk", "exif")[i] if split == "train" and i < 4 else "jpeg"
            path = d / f"{i}.{'png' if kind == 'png' else 'jpg'}"
            if kind == "gray":
                im = im.convert("L")
            elif kind == "cmyk":
                im = im.convert("CMYK")
            exif = Image.Exif()
            if kind == "exif":
                exif[0x0112] = 6  # rotate 90 degrees on display
            im.save(path, exif=exif) if kind == "exif" else im.save(path)
            if kind != "jpeg":
                special[kind] = path
    return special


def _params(m: BatchMultiCrop, boxes: list[list[int]], n_views: int) -> BatchAugParams:
    """Geometry-only parameters with the given (x0, y0, x1, y1) box per image, the same for every view."""
    p = m.sample_params(len(boxes), 8, 8)
    b = torch.tensor(boxes, dtype=torch.int64)[None].expand(n_views, -1, -1).clone()
    return dataclasses.replace(p, boxes=b)


# ---- box sampler ------------------------------------------------------------------------------------------------
def _fallback_box(h: int, w: int, ratio: tuple[float, float]) -> list[int]:
    """torchvision RandomResizedCrop.get_params' fallback: the centred crop clamped to the allowed aspects."""
    if w / h < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif w / h > max(ratio):
        cw, ch = int(round(h * max(ratio))), h
    else:
        cw, ch = w, h
    x0, y0 = (w - cw) // 2, (h - ch) // 2
    return [x0, y0, x0 + cw, y0 + ch]


def test_per_image_boxes_are_inside_with_scale_and_ratio_in_range() -> None:
    """Boxes drawn for 600 images of random sizes (the first 20 so elongated that no candidate fits): inside their
    own image; area fraction in the view's scale range and aspect in `ratio` up to integer rounding, or else
    exactly torchvision's centre-crop fallback; and image i's box is the one a batch of images of image i's size
    gets from the same draw."""
    g = torch.Generator().manual_seed(0)
    n = 600
    h = torch.randint(16, 400, (n,), generator=g).double()
    w = torch.round(h * torch.exp(torch.empty(n).uniform_(-1.0, 1.0, generator=g).double()))
    h[:20], w[:20] = 10.0, 200.0  # aspect 20
    m = BatchMultiCrop(32, 16, 2, global_scale=(0.25, 1.0), local_scale=(0.05, 0.25))
    p = m.sample_params(n, h, w, generator=torch.Generator().manual_seed(1))
    bx = p.boxes.double()
    x0, y0, x1, y1 = bx.unbind(-1)
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x1 <= w).all() and (y1 <= h).all()
    assert (x1 > x0).all() and (y1 > y0).all()
    bw, bh = x1 - x0, y1 - y0
    frac, logr = bw * bh / (h * w), torch.log(bw / bh)
    fallback = torch.tensor([_fallback_box(int(a), int(b), m.ratio) for a, b in zip(h, w)], dtype=torch.int64)
    for v, (lo, hi) in enumerate([m.global_scale, m.global_scale, m.local_scale, m.local_scale]):
        slack_a = (bw[v] + bh[v] + 0.25) * 0.5 / (h * w)  # |(w+-.5)(h+-.5) - wh|
        slack_r = 0.5 / bw[v] + 0.5 / bh[v]
        in_range = ((frac[v] >= lo - slack_a) & (frac[v] <= hi + slack_a)
                    & (logr[v] >= math.log(m.ratio[0]) - slack_r) & (logr[v] <= math.log(m.ratio[1]) + slack_r))
        is_fallback = (p.boxes[v] == fallback).all(-1)
        assert (in_range | is_fallback).all(), v
        assert in_range[20:].float().mean() > 0.95, v  # the fallback is the exception
    assert (p.boxes[:2, :20] == torch.tensor([93, 0, 106, 10])).all()  # 10 x 200 at >= 25 %: a centred 4:3 crop
    for i in (0, 25, 301, 599):
        q = m.sample_params(n, int(h[i]), int(w[i]), generator=torch.Generator().manual_seed(1))
        assert torch.equal(q.boxes[:, i], p.boxes[:, i])


# ---- crops from the packed canvas -------------------------------------------------------------------------------
def _images(seed: int = 0) -> list[torch.Tensor]:
    return [torch.from_numpy(_photo(h, w, seed + k)).permute(2, 0, 1).contiguous() for k, (h, w) in enumerate(SIZES)]


def test_canvas_crop_of_the_whole_image_is_torchvisions_bilinear_resize() -> None:
    """Upscaling the whole image: one bilinear sample per output pixel (= `resized_crop`, antialias=False, which
    antialias does not change when upscaling); the one-pixel repeated border gives resized_crop's edge clamping.
    Max difference seen 2.4e-6 (float32 rounding) of the [0, 1] range; tolerance 1e-5."""
    imgs = _images()
    m = BatchMultiCrop(96, 96, 0, **OFF)
    out = m.apply(imgs, _params(m, [[0, 0, im.shape[2], im.shape[1]] for im in imgs], 2))
    for i, im in enumerate(imgs):
        ref = F.resized_crop(im.float() / 255, 0, 0, im.shape[1], im.shape[2], [96, 96], antialias=False)
        torch.testing.assert_close(out["views"][0][i], ref, atol=1e-5, rtol=0)


def test_canvas_crop_of_an_interior_box_at_half_size_is_exact() -> None:
    """An interior box shrunk 2x: roi_align's adaptive sampling takes the 2 x 2 pixel centres of each output bin
    and averages them, which is what `resized_crop` without antialias does at exactly half size (its sample falls
    between four pixel centres). Neighbours outside the box and the other images in the canvas play no part.
    Max difference seen 1.2e-7; tolerance 1e-5. (With antialias=True torchvision's triangle filter differs: 0.05.)"""
    imgs = _images(3)
    boxes = [[3, 0, 23, 20] for _ in imgs]  # x0, y0, x1, y1: 20 x 20, inside every image but the 12 px high one,
    boxes[4] = [30, 1, 50, 11]  # whose box is 20 x 10
    m = BatchMultiCrop(10, 10, 0, **OFF)
    p = _params(m, boxes, 2)
    out = m.apply(imgs, p)
    for i, im in enumerate(imgs):
        x0, y0, x1, y1 = boxes[i]
        view = out["views"][0][i]
        if (x1 - x0, y1 - y0) == (20, 20):
            ref = F.resized_crop(im.float() / 255, y0, x0, y1 - y0, x1 - x0, [10, 10], antialias=False)
            torch.testing.assert_close(view, ref, atol=1e-5, rtol=0)
        else:  # 2x across, 1x down: per row, the average of each pair of pixels
            ref = im[:, y0:y1, x0:x1].float().div(255).unflatten(2, (10, 2)).mean(-1)
            torch.testing.assert_close(view, ref, atol=1e-5, rtol=0)


def test_canvas_crops_against_antialiased_resized_crop_on_photos() -> None:
    """Random boxes, down- and upscaled, against `resized_crop(antialias=True)` of the same box: roi_align's box
    prefilter (mean of ceil(box/out)^2 bilinear samples) is not torchvision's triangle filter, and roi_align
    reads the true neighbours just outside the box where resized_crop clamps to its edge. On these smooth photos
    with 5 % noise, over 4 draws: max 0.045 to 0.069, mean 0.0023 to 0.0028 of the [0, 1] range; tolerances 0.1
    (max) and 0.005 (mean). Each view also equals `BatchMultiCrop` on that image alone (max seen 3.5e-6,
    tolerance 1e-5): the canvas changes nothing but float rounding."""
    imgs = _images(7)
    m = BatchMultiCrop(24, 12, 4, **OFF)
    hw = torch.tensor([tuple(im.shape[-2:]) for im in imgs], dtype=torch.float64)
    p = m.sample_params(len(imgs), hw[:, 0], hw[:, 1], generator=torch.Generator().manual_seed(5))
    out = m.apply(imgs, p)
    errs = []
    for v, view in enumerate(out["views"]):
        s = view.shape[-1]
        for i, im in enumerate(imgs):
            x0, y0, x1, y1 = (int(c) for c in p.boxes[v, i])
            ref = F.resized_crop(im.float() / 255, y0, x0, y1 - y0, x1 - x0, [s, s], antialias=True)
            errs.append((view[i] - ref).abs().flatten())
            alone = dataclasses.replace(p, **{f.name: getattr(p, f.name)[:, i:i + 1] for f in dataclasses.fields(p)})
            torch.testing.assert_close(view[i], m.apply(im[None], alone)["views"][v][0], atol=1e-5, rtol=0)
    err = torch.cat(errs)
    assert err.max() <= 0.1 and err.mean() <= 0.005, (err.max(), err.mean())


def test_pack_images_places_every_image_once_with_repeated_borders() -> None:
    imgs = _images(1) + [torch.full((1, 5, 7), 200, dtype=torch.uint8)]  # a grayscale one: repeated to 3 channels
    canvas, origin = pack_images(imgs)
    assert canvas.shape[:2] == (1, 3) and origin.shape == (len(imgs), 2)
    covered = torch.zeros(canvas.shape[-2:], dtype=torch.int32)
    for im, (ox, oy) in zip(imgs, origin.long().tolist()):
        h, w = im.shape[-2:]
        torch.testing.assert_close(canvas[0, :, oy:oy + h, ox:ox + w], im.expand(3, -1, -1).float(), atol=0, rtol=0)
        torch.testing.assert_close(canvas[0, :, oy - 1, ox:ox + w], im[:, 0].expand(3, -1).float(), atol=0, rtol=0)
        torch.testing.assert_close(canvas[0, :, oy:oy + h, ox + w], im[:, :, -1].expand(3, -1).float(), atol=0,
                                   rtol=0)
        covered[oy - 1:oy + h + 1, ox - 1:ox + w + 1] += 1
    assert covered.max() == 1  # no overlap, borders included
    assert covered.sum() >= 0.5 * covered.numel()  # shelf packing wastes less than half the canvas here


# ---- workers, batches, decoding ---------------------------------------------------------------------------------
def test_workers_send_rgb_jpeg_bytes_and_decode_everything_else(tmp_path: Path) -> None:
    special = _tree(tmp_path)
    jpeg = next(p for p in (tmp_path / "train").rglob("*.jpg") if p not in special.values())
    data = read_for_device(jpeg)
    assert data.ndim == 1 and data.dtype == torch.uint8 and bytes(data.numpy()) == jpeg.read_bytes()
    for kind, path in special.items():
        img = read_for_device(path)
        assert img.ndim == 3 and img.shape[0] == 3, kind
        assert torch.equal(img, decode_rgb(path)), kind  # what data.decode=cpu gives, EXIF rotation included
    assert read_for_device(special["exif"]).shape[1:] == Image.open(special["exif"]).size  # rotated: (W, H) -> (H, W)


def test_device_decode_of_a_batch_equals_the_cpu_path(tmp_path: Path) -> None:
    _tree(tmp_path)
    ds = EncodedImageFiles.of(build_dataset({"name": "folder", "root": str(tmp_path)}, "train"))
    batch, labels = collate_encoded([ds[i] for i in range(len(ds))])
    assert isinstance(batch, EncodedImages) and sum(len(s) == 1 for s in batch.shapes) == len(ds) - 4
    images, out_labels = decode_images(batch, labels, "cpu")
    assert torch.equal(out_labels, torch.tensor(ds.targets))
    for img, (path, _) in zip(images, ds.samples):
        assert torch.equal(img, decode_rgb(path)), path


def _truncated_jpeg(path: Path) -> None:
    """A JPEG whose header PIL reads but whose scan data stops early: only a full decode finds out."""
    Image.fromarray(_photo(40, 40, 9)).save(path)
    raw = path.read_bytes()
    path.write_bytes(raw[:raw.index(b"\xff\xda") + 40])


def test_a_corrupt_jpeg_gives_one_line_naming_the_file(tmp_path: Path) -> None:
    _tree(tmp_path, n=6)
    bad = tmp_path / "train" / "c1" / "0-broken.jpg"  # first of class 1: its neighbour before it is of class 0
    _truncated_jpeg(bad)
    ds = EncodedImageFiles.of(build_dataset({"name": "folder", "root": str(tmp_path)}, "train"))
    i_bad = [p for p, _ in ds.samples].index(str(bad))
    assert read_for_device(bad).ndim == 1  # the worker's header check passes it on
    batch, labels = collate_encoded([ds[i] for i in range(len(ds))], strict=True)
    with pytest.raises(ImageDecodeError) as err:
        decode_images(batch, labels, "cpu")
    msg = str(err.value)
    assert "\n" not in msg and str(bad) in msg and "strict" in msg and "truncated" in msg
    # not strict: one warning line names the file; its neighbour (image and label) stands in
    batch.strict = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        images, out = decode_images(batch, labels, "cpu")
    msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and str(bad) in msgs[0] and "\n" not in msgs[0]
    j = i_bad - 1  # the nearest readable image, the earlier one on a tie
    assert labels[j] != labels[i_bad]
    assert torch.equal(images[i_bad], images[j]) and out[i_bad] == labels[j] and labels[i_bad] == ds.targets[i_bad]


def test_datamodule_yields_encoded_batches_and_refuses_in_memory_paths(tmp_path: Path) -> None:
    _tree(tmp_path, n=8)
    crops = {"global_size": 16, "local_size": 8, "n_local": 2}
    data = {"name": "folder", "root": str(tmp_path), "decode": "gpu", "colour_on_device": True}
    dm = SSLDataModule(data, crops, batch_size=4)
    dm.setup()
    batch, labels = next(iter(dm.train_dataloader()))
    assert isinstance(batch, EncodedImages) and len(batch) == 4 and labels.shape == (4,)
    assert not dm.colour_on_device and dm.train_decode_min_side() is None  # full-size decode, views on the device
    # Lightning's transfer moves the labels and leaves the encoded bytes on the host, where decode_jpeg wants them
    from lightning.fabric.utilities.apply_func import move_data_to_device

    moved, moved_labels = move_data_to_device((batch, labels), torch.device("meta"))
    assert moved is batch and moved.flat.device.type == "cpu" and moved_labels.device.type == "meta"
    with pytest.raises(ValueError, match="batch_aug"):
        SSLDataModule(data, crops, batch_size=4, batch_aug=True)
    with pytest.raises(ValueError, match="decode"):
        SSLDataModule({**data, "decode": "tpu"}, crops, batch_size=4)


TRAIN = ["data=folder", "data.decode=gpu", "data.eval_size=16", "batch_size=8", "crops.global_size=16",
         "crops.local_size=8", "crops.n_local=2", "eval.knn_at_start=false"]


def test_module_decodes_the_loaders_batch_and_makes_float_views(tmp_path: Path) -> None:
    """The module's `on_after_batch_transfer` on a batch of the real loader: decoded on its device (the CPU here),
    2 x 16 px + 2 x 8 px normalised views with boxes inside each image and the loader's labels."""
    from scfs.train import build

    _tree(tmp_path, n=16)
    dm, model = build(compose_cfg(TRAIN, data_root=tmp_path))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch[0], EncodedImages)
    sample, labels = model.on_after_batch_transfer(batch, 0)
    assert [tuple(v.shape) for v in sample["views"]] == [(8, 3, 16, 16)] * 2 + [(8, 3, 8, 8)] * 2
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in sample["views"])
    assert torch.equal(labels, batch[1]) and sample["boxes"].shape == (8, 4, 4) and sample["flips"].shape == (8, 4)
    sizes = torch.tensor([tuple(t.shape[-2:]) for t in decode_images(batch[0], None, "cpu")[0]], dtype=torch.float32)
    assert (sample["boxes"][..., 2] <= sizes[:, None, 1]).all() and (sample["boxes"][..., 3] <= sizes[:, None, 0]).all()
    # an undecodable file: its neighbour's image and label stand in, in what the step gets
    bad = tmp_path / "broken.jpg"
    _truncated_jpeg(bad)
    good = dm.train_set.samples[0][0]
    pair = collate_encoded([(EncodedFile(read_for_device(good), good), 0),
                            (EncodedFile(read_for_device(bad), str(bad)), 1)])
    with pytest.warns(RuntimeWarning, match="broken.jpg"):
        sample, labels = model.on_after_batch_transfer(pair, 0)
    assert labels.tolist() == [0, 0] and sample["views"][0].shape == (2, 3, 16, 16)
    model.eval()  # evaluation batches are not training batches: left alone
    assert model.on_after_batch_transfer(batch, 0) is batch


@pytest.mark.slow
def test_training_runs_two_steps_with_decode_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m scfs.train data=folder data.decode=gpu` on the CPU (in-process `run`, ~20 s): 2 steps whose
    batches were decoded by the module (JPEGs, a PNG, grayscale, CMYK and EXIF-rotated files in the training
    split), then the end-of-run kNN on the CPU-decoded evaluation splits."""
    import scfs.data.encoded as encoded
    from scfs.train import run

    _tree(tmp_path / "data", n=16)
    calls = []
    real = encoded.decode_images

    def spy(batch, labels, device):
        calls.append((len(batch), str(device)))
        return real(batch, labels, device)

    monkeypatch.setattr(encoded, "decode_images", spy)
    cfg = compose_cfg(TRAIN, data_root=tmp_path / "data")
    L.seed_everything(0, verbose=False)
    s = run(cfg, tmp_path / "run")
    assert s["steps"] == 2 and s["loss"] == s["loss"]
    assert calls == [(8, "cpu")] * 2

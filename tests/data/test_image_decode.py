"""torchvision's decoders through `scfs.data.image_decode`: PIL's pixels, a single JPEG or a batch of them, and no
deprecation warning from the project's decode paths (torchvision 0.29 deprecates its image codecs)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.io
from PIL import Image, ImageOps

from scfs.data.datasets import build_dataset, decode_rgb
from scfs.data.encoded import EncodedImageFiles, collate_encoded, decode_images
from scfs.data.image_decode import DEPRECATION, decode_file_rgb, decode_jpeg_rgb

SIZES = [(37, 29), (20, 50), (64, 48), (31, 31)]


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth colour picture with some texture, (h, w, 3) uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.arange(h) / h, np.arange(w) / w, indexing="ij")
    img = 0.5 + 0.3 * np.sin(2 * np.pi * (1.5 * xx + yy) + rng.uniform(0, 6, (3, 1, 1)))
    img = img + 0.05 * rng.standard_normal((3, h, w))
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8).transpose(1, 2, 0)


def _jpegs(root: Path) -> list[Path]:
    """An ImageFolder train split of RGB JPEGs of different sizes, one of them EXIF-rotated (a host decode)."""
    paths = []
    for i, (h, w) in enumerate(SIZES):
        path = root / "train" / f"c{i % 2}" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        exif = Image.Exif()
        if i == 0:
            exif[0x0112] = 6  # rotate 90 degrees on display
        Image.fromarray(_photo(h, w, i)).save(path, exif=exif)
        paths.append(path)
    return paths


def _pil(path: Path) -> torch.Tensor:
    with Image.open(path) as im:
        return torch.from_numpy(np.array(ImageOps.exif_transpose(im).convert("RGB"))).permute(2, 0, 1)


def _bytes(path: Path) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)


def test_cpu_decode_of_one_jpeg_and_of_a_batch_equals_pil(tmp_path: Path) -> None:
    """libjpeg in torchvision and in PIL: identical pixels here (max difference 0); tolerance 1 for another
    libjpeg build's rounding. The file decoder applies the EXIF rotation, the byte decoder does not."""
    paths = _jpegs(tmp_path)
    batch = decode_jpeg_rgb([_bytes(p) for p in paths], "cpu")
    assert isinstance(batch, list) and len(batch) == len(paths)
    for path, from_batch in zip(paths, batch):
        ref = _pil(path)
        torch.testing.assert_close(decode_file_rgb(path), ref, atol=1, rtol=0)
        if path.name != "0.jpg":
            torch.testing.assert_close(decode_jpeg_rgb(_bytes(path)), ref, atol=1, rtol=0)
            torch.testing.assert_close(from_batch, ref, atol=1, rtol=0)
    assert batch[0].shape[1:] == Image.open(paths[0]).size[::-1]  # unrotated (H, W)


def test_project_decode_paths_warn_nothing_and_torchvisions_call_still_would(tmp_path: Path) -> None:
    """The CPU path (`decode_rgb`) and the device path (`decode_images` on a batch, CPU standing in for CUDA)
    raise no DeprecationWarning; torchvision's own call in the same block does, so the check can see one and the
    silencing ends with each call."""
    paths = _jpegs(tmp_path)
    ds = EncodedImageFiles.of(build_dataset({"name": "folder", "root": str(tmp_path)}, "train"))
    batch, labels = collate_encoded([ds[i] for i in range(len(ds))])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for path in paths:
            decode_rgb(path)
            decode_file_rgb(path)
        images, _ = decode_images(batch, labels, "cpu")
        decode_jpeg_rgb(_bytes(paths[1]))
        assert not [w for w in seen if issubclass(w.category, DeprecationWarning)], [str(w.message) for w in seen]
        torchvision.io.decode_jpeg(_bytes(paths[1]))
    assert [w for w in seen if issubclass(w.category, DeprecationWarning) and DEPRECATION in str(w.message)]
    assert len(images) == len(paths)


def test_decode_rgb_takes_torchvisions_path_under_deprecation_as_error(tmp_path: Path, monkeypatch) -> None:
    """With DeprecationWarnings made errors (`-W error::DeprecationWarning`), `decode_rgb` still decodes with
    torchvision instead of falling back to PIL on the raised warning."""
    import scfs.data.datasets as datasets

    pil_opens: list[Path] = []
    real_open = datasets.Image.open
    monkeypatch.setattr(datasets.Image, "open", lambda p, *a, **k: pil_opens.append(p) or real_open(p, *a, **k))
    path = _jpegs(tmp_path)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        img = decode_rgb(path)
    assert pil_opens == [] and torch.equal(img, _pil(path))


def test_a_single_bad_jpeg_still_raises_runtime_error() -> None:
    """`decode_images` finds the culprit of a failed batch one file at a time on this error type."""
    with pytest.raises(RuntimeError):
        decode_jpeg_rgb(torch.frombuffer(bytearray(b"\xff\xd8\xff" + bytes(40)), dtype=torch.uint8))

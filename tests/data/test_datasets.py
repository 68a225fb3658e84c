"""Datasets: shapes / folder / cifar10 / imagenet via build_dataset, odd image modes, unreadable files."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scfs.data import datasets as ds
from scfs.data.datasets import ImageDecodeError, ImageFolderLayoutError, build_dataset, decode_rgb

RNG = np.random.default_rng(0)
RGB = (RNG.random((12, 10, 3)) * 255).astype(np.uint8)  # H=12, W=10


def _save(path: Path, kind: str) -> None:
    """Write one image of an odd kind (or a broken file) to path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(RGB)
    if kind == "rgb":
        im.save(path)
    elif kind == "gray":
        im.convert("L").save(path)
    elif kind == "rgba":
        im.convert("RGBA").save(path)
    elif kind == "palette":
        im.convert("P").save(path)
    elif kind == "cmyk":
        im.convert("CMYK").save(path, "JPEG")
    elif kind == "16bit":
        Image.fromarray(np.full((12, 10), 65535, np.uint16)).save(path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("not an image")
    elif kind == "truncated":
        im.save(path, "JPEG")
        path.write_bytes(path.read_bytes()[:60])
    else:
        raise ValueError(kind)


GOOD = {"a/gray.png": "gray", "a/rgba.png": "rgba", "a/pal.png": "palette", "b/cmyk.jpg": "cmyk",
        "b/deep.png": "16bit", "b/plain.jpg": "rgb"}
BAD = {"a/empty.jpg": "empty", "b/text.jpg": "text", "b/trunc.jpg": "truncated"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """ImageFolder tree: train/ with odd modes and broken files, val/ with one image per class."""
    for rel, kind in {**GOOD, **BAD}.items():
        _save(tmp_path / "train" / rel, kind)
    (tmp_path / "train" / "a" / "notes.txt").write_text("ignored: not an image extension")
    for c in "ab":
        _save(tmp_path / "val" / c / "x.png", "rgb")
    return tmp_path


@pytest.mark.parametrize("kind", ["rgb", "gray", "rgba", "palette", "cmyk", "16bit"])
def test_decode_rgb_modes(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("x.jpg" if kind == "cmyk" else "x.png")
    _save(path, kind)
    img = decode_rgb(path)
    assert img.shape == (3, 12, 10) and img.dtype == torch.uint8
    if kind == "16bit":
        assert int(img.min()) == 255  # scaled, not truncated to the low byte
    if kind in ("rgb", "rgba", "palette"):
        assert img.float().mean() == pytest.approx(RGB.mean(), abs=8)


def test_pil_fallback_rescales_16bit_grey() -> None:
    im = Image.fromarray(np.array([[0, 32896, 65535]], np.uint16))
    out = np.asarray(ds._pil_to_rgb(im))
    assert out.shape == (1, 3, 3) and out[0, :, 0].tolist() == [0, 128, 255]


@pytest.mark.parametrize("kind", ["empty", "text", "truncated"])
def test_decode_rgb_broken(tmp_path: Path, kind: str) -> None:
    _save(tmp_path / "x.jpg", kind)
    with pytest.raises(ImageDecodeError, match="x.jpg"):
        decode_rgb(tmp_path / "x.jpg")


def test_folder_dataset_skips_and_counts_bad_files(tree: Path) -> None:
    data = build_dataset({"name": "folder", "root": str(tree)}, "train")
    assert data.classes == ["a", "b"] and data.num_classes == 2 and len(data) == len(GOOD) + len(BAD)
    with pytest.warns(RuntimeWarning, match="skipping unreadable image") as rec:
        items = [data[i] for i in range(len(data))]
    for img, label in items:
        assert img.shape == (3, 12, 10) and img.dtype == torch.uint8 and label in (0, 1)
    assert sorted(Path(p).name for p in data.bad_files) == sorted(Path(p).name for p in BAD)
    assert any("3 bad file(s)" in str(w.message) for w in rec)
    # known-bad files are not retried and no new warning is raised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(len(data)):
            data[i]


def test_substitute_keeps_image_label_pairs(tmp_path: Path) -> None:
    _save(tmp_path / "train" / "a" / "0.jpg", "empty")
    _save(tmp_path / "train" / "b" / "1.png", "rgb")
    data = build_dataset({"name": "folder", "root": tmp_path}, "train")
    with pytest.warns(RuntimeWarning):
        img, label = data[0]
    assert label == 1  # the neighbour's own label, not the broken file's


def test_strict_raises(tree: Path) -> None:
    data = build_dataset({"name": "folder", "root": tree, "strict": True}, "train")
    bad = next(i for i, (p, _) in enumerate(data.samples) if p.endswith("empty.jpg"))
    with pytest.raises(ImageDecodeError, match="empty.jpg"):
        data[bad]


def test_all_files_unreadable(tmp_path: Path) -> None:
    _save(tmp_path / "train" / "a" / "0.jpg", "text")
    data = build_dataset({"name": "folder", "root": tmp_path}, "train")
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no readable image") as exc:
        data[0]
    # an ImageDecodeError too, so scfs.train reports it in one line (a bare RuntimeError came as a traceback)
    assert isinstance(exc.value, ImageDecodeError) and "re-run python -m scfs.data.prepare" in str(exc.value)


def test_val_class_missing_from_train_is_a_layout_error(tmp_path: Path) -> None:
    _save(tmp_path / "train" / "a" / "0.png", "rgb")
    _save(tmp_path / "val" / "b" / "0.png", "rgb")
    with pytest.raises(ImageFolderLayoutError, match=r"has classes that .* lacks: \['b'\]"):
        build_dataset({"name": "folder", "root": tmp_path}, "val")


def test_split_without_class_folders_says_the_layout(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    with pytest.raises(ImageFolderLayoutError, match="one sub-folder per class"):
        build_dataset({"name": "folder", "root": tmp_path}, "train")


def test_transform_and_val_split(tree: Path) -> None:
    data = build_dataset({"name": "folder", "root": tree}, "val", transform=lambda x: x.float() / 255)
    img, label = data[1]
    assert img.dtype == torch.float32 and label == 1 and data.targets == [0, 1]
    (tree / "val").rename(tree / "test")  # folder accepts test/ for val
    assert len(build_dataset({"name": "folder", "root": tree}, "val")) == 2


def test_val_with_unknown_class_is_refused(tree: Path) -> None:
    _save(tree / "val" / "zzz" / "x.png", "rgb")
    with pytest.raises(ValueError, match="zzz"):
        build_dataset({"name": "folder", "root": tree}, "val")


def test_cifar10_imagefolder_and_imagenet(tmp_path: Path) -> None:
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            _save(tmp_path / "c10" / split / c / "0000.jpg", "rgb")
    val = build_dataset({"name": "cifar10", "root": tmp_path / "c10"}, "val")
    assert val.samples[0][0].startswith(str(tmp_path / "c10" / "test")) and val.classes == ["cat", "dog"]
    for split in ("train", "val"):
        _save(tmp_path / "inet" / split / "n01" / "a.jpg", "rgb")
    inet = build_dataset({"name": "imagenet", "root": tmp_path / "inet"}, "val")
    assert len(inet) == 1 and inet[0][0].shape == (3, 12, 10)


def test_cifar10_python_batches(tmp_path: Path, monkeypatch) -> None:
    """torchvision's cifar-10-batches-py layout (md5 check bypassed for the fake files)."""
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = (np.arange(2 * 3072) % 256).astype(np.uint8).reshape(2, 3072)
        with open(base / name, "wb") as f:
            pickle.dump({"data": data, "labels": [3, 7]}, f)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *a, **kw: True)
    for root in (tmp_path, base):
        train = build_dataset({"name": "cifar10", "root": root}, "train")
        assert len(train) == 10 and train.num_classes == 10
        img, label = train[1]
        assert img.shape == (3, 32, 32) and img.dtype == torch.uint8 and label == 7
        assert len(build_dataset({"name": "cifar10", "root": root}, "val")) == 2


@pytest.mark.parametrize("name", ["cifar10", "folder", "imagenet"])
def test_missing_root_message(tmp_path: Path, name: str) -> None:
    root = tmp_path / "nope"
    with pytest.raises(FileNotFoundError) as err:
        build_dataset({"name": name, "root": str(root)}, "train")
    msg = str(err.value)
    assert str(root) in msg and "python -m scfs.data.prepare" in msg and "\n" not in msg
    if name == "cifar10":
        assert "cifar10 --archive ../shared/data/cifar10-jpeg.tar.xz --out" in msg


def test_missing_split_message(tmp_path: Path) -> None:
    _save(tmp_path / "train" / "a" / "x.png", "rgb")
    with pytest.raises(FileNotFoundError, match="test or val"):
        build_dataset({"name": "cifar10", "root": tmp_path}, "val")


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        build_dataset({"name": "mnist", "root": "x"}, "train")
    with pytest.raises(ValueError, match="split"):
        build_dataset({"name": "folder", "root": "x"}, "test")
    with pytest.raises(ValueError, match="root"):
        build_dataset({"name": "folder"}, "train")


def test_shapes_dataset_from_dictconfig(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "shapes", "root": str(tmp_path), "image_size": 32, "n_train": 20,
                            "n_val": 10, "num_classes": 5, "seed": 0, "eval_size": 32})
    train, val = build_dataset(cfg, "train"), build_dataset(cfg, "val", transform=lambda x: x.float())
    assert len(train) == 20 and len(val) == 10 and train.num_classes == 5 and len(train.classes) == 5
    img, label = train[3]
    assert img.shape == (3, 32, 32) and img.dtype == torch.uint8 and isinstance(label, int)
    assert label == train.targets[3] and 0 <= label < 5
    assert val[0][0].dtype == torch.float32
    assert np.array_equal(img.permute(1, 2, 0).numpy(), train.data.images[3])


def _smooth_image(h: int, w: int) -> Image.Image:
    """A smooth RGB image (gradients), so a reduced decode and a resized full decode can be compared."""
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1).astype(np.uint8)
    return Image.fromarray(arr)


def test_large_jpeg_is_decoded_at_a_reduced_scale_that_keeps_the_needed_side(tmp_path: Path) -> None:
    path = tmp_path / "big.jpg"
    _smooth_image(900, 1200).save(path, quality=95)
    full = decode_rgb(path)
    small = decode_rgb(path, min_side=200)
    assert full.shape == (3, 900, 1200)
    assert small.shape == (3, 225, 300)  # 1/4: the largest DCT reduction with the shorter side >= 200 (1/8 -> 112)
    ref = torch.nn.functional.interpolate(full[None].float(), size=(225, 300), mode="area")[0]
    assert (small.float() - ref).abs().mean() < 3  # the same picture, not a different crop or channel order


@pytest.mark.parametrize(("name", "size"), [("small.jpg", (300, 200)), ("big.png", (1200, 900))])
def test_reduced_decoding_leaves_small_jpegs_and_other_formats_alone(tmp_path: Path, name: str, size) -> None:
    path = tmp_path / name
    _smooth_image(size[1], size[0]).save(path)
    assert torch.equal(decode_rgb(path, min_side=200), decode_rgb(path))


def test_training_decodes_at_the_side_its_crops_need_and_evaluation_at_full_size(tmp_path: Path) -> None:
    from scfs.data.datamodule import SSLDataModule

    root = tmp_path / "folder"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            _smooth_image(40, 60).save(root / split / c / "0.jpg")
    crops = {"global_size": 224, "global_scale": (0.25, 1.0), "local_size": 96, "local_scale": (0.05, 0.25),
             "n_local": 8}
    dm = SSLDataModule({"name": "folder", "root": str(root)}, crops, batch_size=2)
    assert dm.train_decode_min_side() == 448  # 224 / sqrt(0.25); local 96 / sqrt(0.05) = 430
    dm.setup()
    assert dm.train_set.min_side == 448
    assert all(loader.dataset.min_side is None for loader in dm.knn_loaders())
    assert SSLDataModule({"name": "folder", "root": str(root), "decode_min_side": 0}, crops,
                         batch_size=2).train_decode_min_side() is None
    assert SSLDataModule({"name": "folder", "root": str(root), "decode_min_side": 300}, crops,
                         batch_size=2).train_decode_min_side() == 300
    assert SSLDataModule({"name": "folder", "root": str(root)}, crops, batch_size=2,
                         batch_aug=True).train_decode_min_side() is None

"""End to end: `python -m scfs.train data=folder data.root=<tree with bad files>` trains, names what it skipped;
`data.strict=true` stops with a clear message. Odd but decodable images (grey, RGBA, palette, CMYK, 16-bit,
smaller than the crop) are converted and used; an empty class folder is fine."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import compose_cfg
from PIL import Image

from scfs.data.datasets import ImageDecodeError
from scfs.train import run

RNG = np.random.default_rng(0)
FOLDER = ["data=folder", "++data.batch_aug=false", "batch_size=4", "eval.knn_k=[3]"]


def _img(h: int = 12, w: int = 10) -> Image.Image:
    return Image.fromarray((RNG.random((h, w, 3)) * 255).astype(np.uint8))


def _tree(root: Path) -> dict[str, Path]:
    """train/{a,b}: decodable odd images + broken files, train/empty_class/, val/{a,b}. Returns the bad files."""
    a, b = root / "train" / "a", root / "train" / "b"
    for d in (a, b, root / "train" / "empty_class", root / "val" / "a", root / "val" / "b"):
        d.mkdir(parents=True)
    _img().save(a / "rgb.jpg")
    _img().convert("L").save(a / "gray.png")
    _img().convert("RGBA").save(a / "rgba.png")
    pal = _img().convert("P")
    pal.info["transparency"] = 0
    pal.save(a / "palette_transparent.png", transparency=0)
    _img().convert("CMYK").save(a / "cmyk.jpg", "JPEG")
    Image.fromarray(np.full((12, 10), 40000, np.uint16)).save(a / "deep16.png")
    _img(3, 3).save(a / "tiny3x3.png")  # smaller than the 16-px local and 32-px global crops
    _img(1, 1).save(a / "one_pixel.png")
    for i in range(4):
        _img().save(b / f"ok{i}.jpg")
    bad = {"zero": b / "zero_bytes.jpg", "text": b / "not_an_image.jpg", "trunc": b / "truncated.jpg",
           "noise": b / "random_bytes.png", "dangling": b / "unreadable.jpg"}
    bad["zero"].write_bytes(b"")
    bad["text"].write_text("this is not an image")
    _img(64, 64).save(bad["trunc"], "JPEG")
    bad["trunc"].write_bytes(bad["trunc"].read_bytes()[:200])
    bad["noise"].write_bytes(RNG.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    bad["dangling"].symlink_to(root / "does-not-exist.jpg")  # listed, but reading it fails
    for cls in ("a", "b"):
        for i in range(2):
            _img().save(root / "val" / cls / f"v{i}.png")
    return bad


def test_folder_with_bad_files_trains_and_names_every_skipped_file(tmp_path):
    bad = _tree(tmp_path / "data")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = run(compose_cfg([*FOLDER, f"data.root={tmp_path / 'data'}"]), tmp_path / "run")
    assert s["steps"] == 2 and s["loss"] == s["loss"]
    warned = " ".join(str(w.message) for w in caught if "unreadable image" in str(w.message))
    for path in bad.values():
        assert str(path) in warned, f"no warning names {path}"
    assert set(s["skipped_files"]) == {str(p) for p in bad.values()}  # and nothing decodable was skipped


def test_strict_mode_stops_with_the_bad_file_named(tmp_path):
    bad = _tree(tmp_path / "data")
    with pytest.raises(ImageDecodeError, match=r"unreadable image .* \(strict mode\)") as info:
        run(compose_cfg([*FOLDER, f"data.root={tmp_path / 'data'}", "data.strict=true"]), tmp_path / "run")
    assert any(str(p) in str(info.value) for p in bad.values())

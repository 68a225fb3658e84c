"""Image folders that list wrongly: symlink loops and links into other folders (each real folder listed once, one
warning naming the links), class folders without images (not a class, a warning), and a corrupt file whose name is
not valid UTF-8 (its skip message reaches train.log)."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rel_helpers import PYTHON, cli_overrides, subprocess_env

from scfs.data.datasets import ImageFolderLayoutError, build_dataset, shown_path


def _img(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((12, 10, 3)) * 255).astype(np.uint8)).save(path)


def _tree(root: Path, per_class: int = 3) -> Path:
    for split, n in (("train", per_class), ("val", 2)):
        for c in ("a", "b"):
            for i in range(n):
                _img(root / split / c / f"{c}{i}.png", i)
    return root


def _build(root: Path, split: str = "train"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = build_dataset({"name": "folder", "root": str(root)}, split)
    return ds, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("target", ["..", "../..", "../../..", "."], ids=["class", "split", "root", "self"])
def test_symlink_loop_is_not_followed_and_named_once(tmp_path, target):
    """`train/b/dirloop -> ..` turned 37 files into 1,435 samples and never finished listing."""
    root = _tree(tmp_path / "data")
    (root / "train" / "b" / "dirloop").symlink_to(target, target_is_directory=True)
    ds, warned = _build(root)
    assert len(ds) == 6 and len({p for p, _ in ds.samples}) == 6  # no sample twice, none under another label
    assert sorted(Path(p).name for p, y in ds.samples if y == ds.classes.index("b")) == ["b0.png", "b1.png", "b2.png"]
    loops = [w for w in warned if "symlinked folder(s) not entered" in w]
    assert len(loops) == 1 and "dirloop" in loops[0]


def test_link_into_another_class_does_not_repeat_its_images(tmp_path):
    root = _tree(tmp_path / "data")
    (root / "train" / "a" / "more_b").symlink_to(root / "train" / "b", target_is_directory=True)
    (root / "train" / "b" / "more_a").symlink_to(root / "train" / "a", target_is_directory=True)
    ds, warned = _build(root)
    assert len(ds) == 6 and any("more_a" in w and "more_b" in w for w in warned)


def test_link_to_a_folder_outside_is_followed_once(tmp_path):
    """Links are not ignored: a class folder may keep its images elsewhere (followed once per real folder)."""
    root = _tree(tmp_path / "data")
    for i in range(2):
        _img(tmp_path / "elsewhere" / f"x{i}.png", i)
    (root / "train" / "a" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "train" / "a" / "linked_again").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    ds, warned = _build(root)
    assert len(ds) == 8 and sum(Path(p).name.startswith("x") for p, _ in ds.samples) == 2
    assert any("linked_again" in w for w in warned)


def test_empty_class_folder_is_not_a_class(tmp_path):
    """It used to become class 3 of 3 with 0 images (the probe's chance level and outputs counted it)."""
    root = _tree(tmp_path / "data")
    (root / "train" / "empty_class" / "sub").mkdir(parents=True)  # only an empty sub-folder: still no image
    ds, warned = _build(root)
    assert ds.classes == ["a", "b"] and ds.num_classes == 2
    assert any("1 class folder(s)" in w and "empty_class" in w for w in warned)
    val, val_warned = _build(root, "val")
    assert val.classes == ["a", "b"] and not any("class folder" in w for w in val_warned)  # said once, for train
    _img(root / "val" / "empty_class" / "v.png")
    with pytest.raises(ImageFolderLayoutError, match=r"has classes that .*train has no images of: \['empty_class'\]"):
        _build(root, "val")


def test_non_utf8_corrupt_file_is_skipped_and_reaches_train_log(tmp_path):
    """`--- Logging error --- UnicodeEncodeError ... surrogates not allowed`: the skipped-files line was lost."""
    root = _tree(tmp_path / "data", per_class=8)
    bad = os.path.join(os.fsencode(root / "train" / "a"), b"broken-\xff\xfe.jpg")
    with open(bad, "wb") as f:
        f.write(b"not a jpeg")
    shown = shown_path(bad)
    assert "\\xff\\xfe" in shown and shown.encode("utf-8")  # encodable, the raw bytes visible
    run_dir = tmp_path / "run"
    p = subprocess.run([PYTHON, "-m", "scfs.train", *cli_overrides(limit_batches=4), "data=folder",
                        f"data.root={root}", "++data.batch_aug=false", "batch_size=4", "eval.knn_k=[3]",
                        "eval.knn_at_start=false", f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Logging error" not in p.stderr and "UnicodeEncodeError" not in p.stderr
    log = (run_dir / "train.log").read_text()
    assert "1 unreadable image file(s) were skipped" in log and shown in log
    assert shown in json.loads((run_dir / "summary.json").read_text())["skipped_files"]

"""Shapes generator: determinism, cache layout, masks vs boxes, labels, colour independence, COCO export."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from scfs.data import shapes as shapes_mod
from scfs.data.shapes import CLASS_NAMES, ShapesSpec, ensure_shapes, export_coco, load_shapes

SMALL = ShapesSpec(n_train=64, n_val=32, max_objects=3)  # with distractors


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    t0 = time.perf_counter()
    folder = ensure_shapes(tmp_path_factory.mktemp("shapes"), SMALL, verbose=False)
    dt = time.perf_counter() - t0
    n = SMALL.n_train + SMALL.n_val
    print(f"\nshapes: {n} images at {SMALL.image_size}px in {dt:.2f}s "
          f"({dt / n * 1e3:.2f} ms/image, ~{dt / n * 4000:.1f}s for the default 3000+1000)")
    return folder


def _file_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "spec.json"}


def test_layout_dtypes_and_cache_name(small: Path) -> None:
    assert small.name == SMALL.digest() and len(small.name) == 12
    for split, n in (("train", SMALL.n_train), ("val", SMALL.n_val)):
        d = load_shapes(small, split)
        px = SMALL.image_size
        assert d.images.shape == (n, px, px, 3) and d.images.dtype == np.uint8
        assert d.labels.shape == (n,) and d.labels.dtype == np.int64
        assert d.masks.shape == (n, px, px) and d.masks.dtype == np.uint8
        assert len(d.objects) == n and d.classes == CLASS_NAMES
        assert all(1 <= len(o) <= SMALL.max_objects for o in d.objects)
        assert set(d.labels.tolist()) == set(range(10))  # balanced labels cover every class
    meta = json.loads((small / "spec.json").read_text())
    assert meta["spec"]["n_train"] == 64 and meta["classes"] == list(CLASS_NAMES)
    assert not [p for p in small.parent.iterdir() if p.name.startswith(".tmp")]
    assert small.stat().st_mode & 0o777 == 0o755


def test_deterministic_and_seed_dependent(small: Path, tmp_path: Path) -> None:
    again = ensure_shapes(tmp_path / "a", SMALL, verbose=False)
    assert _file_bytes(again) == _file_bytes(small)
    other = ensure_shapes(tmp_path / "b", ShapesSpec(n_train=64, n_val=32, max_objects=3, seed=1), verbose=False)
    assert other.name != small.name
    assert not np.array_equal(load_shapes(other, "train").images, load_shapes(small, "train").images)


def test_cache_is_reused(small: Path) -> None:
    before = (small / "train_images.npy").stat().st_mtime_ns
    assert ensure_shapes(small.parent, SMALL, verbose=False) == small
    assert (small / "train_images.npy").stat().st_mtime_ns == before


def test_failed_generation_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    def boom(spec, split):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(shapes_mod, "generate_split", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        ensure_shapes(tmp_path, SMALL, verbose=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("split", ["train", "val"])
def test_masks_match_boxes_and_label_is_largest(small: Path, split: str) -> None:
    d = load_shapes(small, split)
    for img_objs, mask, label in zip(d.objects, d.masks, d.labels):
        ids = set(np.unique(mask).tolist()) - {0}
        assert ids == set(range(1, len(img_objs) + 1))  # every object visible, no orphan ids
        areas = []
        for k, obj in enumerate(img_objs):
            ys, xs = np.nonzero(mask == k + 1)
            assert obj["box"] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            assert xs.size >= shapes_mod.MIN_VISIBLE_PX
            areas.append(xs.size)
        main = int(np.argmax(areas))
        assert img_objs[main]["label"] == label
        others = [o["label"] for i, o in enumerate(img_objs) if i != main]
        assert label not in others and len(set(others)) == len(others)


def test_colour_does_not_identify_class(tmp_path: Path) -> None:
    spec = ShapesSpec(n_train=500, n_val=0, seed=3)
    d = load_shapes(ensure_shapes(tmp_path, spec, verbose=False), "train")
    colours = []
    for i, objs in enumerate(d.objects):
        main = next(k for k, o in enumerate(objs) if o["label"] == d.labels[i])
        colours.append(d.images[i][d.masks[i] == main + 1].mean(0))
    colours = np.array(colours)
    overall = colours.mean(0)
    per_class = np.array([colours[d.labels == c].mean(0) for c in range(spec.num_classes)])
    # ~50 images per class, colour std ~70 per channel -> standard error ~10; 40 is a 4-sigma bound
    assert np.abs(per_class - overall).max() < 40, per_class - overall


def test_spec_validation() -> None:
    for bad in ({"image_size": 8}, {"num_classes": 11}, {"num_classes": 1}, {"max_objects": 0},
                {"n_train": -1}, {"max_objects": 4, "num_classes": 3}):
        with pytest.raises(ValueError, match="ShapesSpec"):
            ShapesSpec(**bad)


def test_load_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="spec.json"):
        load_shapes(tmp_path, "train")
    with pytest.raises(ValueError, match="split"):
        load_shapes(tmp_path, "test")


PYCOCO_NUMPY2 = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


@PYCOCO_NUMPY2
def test_export_coco(small: Path, tmp_path: Path) -> None:
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO

    out = export_coco(small, "val", tmp_path / "val.json")
    coco = COCO(str(out))
    d = load_shapes(small, "val")
    assert len(coco.getImgIds()) == len(d) and len(coco.getCatIds()) == 10
    assert coco.loadCats(1)[0]["name"] == CLASS_NAMES[0]
    for i in (0, 5, 17):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[i]))
        assert len(anns) == len(d.objects[i])
        for k, (ann, obj) in enumerate(zip(anns, d.objects[i])):
            x0, y0, x1, y1 = obj["box"]
            assert ann["bbox"] == [x0, y0, x1 - x0, y1 - y0] and ann["category_id"] == obj["label"] + 1
            m = coco.annToMask(ann)
            assert np.array_equal(m.astype(bool), d.masks[i] == k + 1) and ann["area"] == m.sum()


@PYCOCO_NUMPY2
def test_uncompressed_rle_fallback_matches_pycocotools(monkeypatch) -> None:
    mask_utils = pytest.importorskip("pycocotools.mask")
    mask = np.zeros((7, 5), bool)
    mask[2:5, 1:4] = True
    mask[6, 4] = True
    monkeypatch.setitem(sys.modules, "pycocotools", None)  # makes the import fail -> fallback encoder
    rle = shapes_mod._rle(mask)
    monkeypatch.undo()
    assert isinstance(rle["counts"], list)
    decoded = mask_utils.decode(mask_utils.frPyObjects(rle, *rle["size"]))
    assert np.array_equal(decoded.astype(bool), mask)


@pytest.mark.slow
def test_default_spec_generation_time(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    ensure_shapes(tmp_path, ShapesSpec())
    dt = time.perf_counter() - t0
    print(f"\ndefault shapes spec (3000+1000 at 32px): {dt:.1f}s")
    assert dt < 30


def test_clutter_and_object_scale_knobs():
    """clutter=0 leaves a flat background; object_scale sets the main object's size; the digest covers the spec
    and the generator version."""
    from scfs.data.shapes import ShapesSpec, generate_split

    assert ShapesSpec().digest() == ShapesSpec(clutter=0.0, object_scale=(0.36, 0.42)).digest()
    assert ShapesSpec(clutter=0.5).digest() != ShapesSpec().digest()
    assert ShapesSpec(object_scale=(0.3, 0.42)).digest() != ShapesSpec().digest()
    flat = generate_split(ShapesSpec(image_size=32, n_train=16, n_val=0, clutter=0.0, max_objects=1), "train")
    busy = generate_split(ShapesSpec(image_size=32, n_train=16, n_val=0, clutter=1.0, max_objects=1), "train")
    bg_std = [im[m == 0].std(0).mean() for im, m in zip(flat.images, flat.masks)]
    bg_std_busy = [im[m == 0].std(0).mean() for im, m in zip(busy.images, busy.masks)]
    assert np.mean(bg_std) < 0.6 * np.mean(bg_std_busy)
    big = generate_split(ShapesSpec(image_size=32, n_train=16, n_val=0, object_scale=(0.4, 0.45), max_objects=1),
                         "train")
    small = generate_split(ShapesSpec(image_size=32, n_train=16, n_val=0, object_scale=(0.15, 0.2), max_objects=1),
                           "train")
    assert (big.masks > 0).mean() > 2 * (small.masks > 0).mean()


def test_version_changes_the_digest(monkeypatch):
    before = ShapesSpec().digest()
    monkeypatch.setattr(shapes_mod, "GENERATOR_VERSION", shapes_mod.GENERATOR_VERSION + 1)
    assert ShapesSpec().digest() != before


def test_main_object_is_whole_centred_and_untouched(small: Path) -> None:
    """The label's object is never occluded nor cut by the border (crops that keep it see the whole class), lies
    near the centre, differs in luminance from the background, and distractors keep a gap around it."""
    d = load_shapes(small, "train")
    size = SMALL.image_size
    luma = np.array([0.299, 0.587, 0.114])
    for img, mask, objs, label in zip(d.images, d.masks, d.objects, d.labels):
        assert objs[0]["label"] == label
        main = mask == 1
        ys, xs = np.nonzero(main)
        assert xs.min() > 0 and ys.min() > 0 and xs.max() < size - 1 and ys.max() < size - 1
        assert xs.min() < size / 2 < xs.max() and ys.min() < size / 2 < ys.max()  # around the centre
        grown = np.zeros_like(main)
        grown[:-1] |= main[1:]
        grown[1:] |= main[:-1]
        grown[:, :-1] |= main[:, 1:]
        grown[:, 1:] |= main[:, :-1]
        assert not (grown & (mask > 1)).any()  # no distractor pixel next to the main object
        obj_l = (img[main].astype(float) @ luma).mean()
        bg_l = (img[mask == 0].astype(float) @ luma).mean()
        assert obj_l - bg_l > 40

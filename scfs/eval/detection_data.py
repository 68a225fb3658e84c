"""Detection data in COCO format: annotation checking, datasets for torchvision detectors, shapes / COCO / VOC.

Everything goes through one in-memory COCO dict per split (``images``, ``annotations``, ``categories``), so the
same checks, training targets and `COCOeval` ground truth serve the embedded shapes split (exported by
`scfs.data.shapes.export_coco`), COCO-format json files and Pascal VOC (converted from its XML).

Why a cleaning pass instead of trusting the file: a single malformed annotation otherwise surfaces as a shape
error deep inside the RPN hours into a run. The policy (`clean_coco`):

* structural problems - a missing top-level key, an annotation without ``image_id`` / ``category_id`` /
  ``bbox``, an unknown image or category id, an image without ``height`` / ``width`` - raise a `ValueError`
  that names the file, the count and the first offenders (``strict=False``: those entries are skipped and
  counted instead);
* geometry is repaired or skipped, always counted: boxes reaching outside the image are clipped to it, boxes
  that are empty after clipping (or non-finite) are dropped;
* images without any usable annotation stay in the evaluation ground truth (their false positives count) and
  are left out of training (``skip_empty``), counted either way.

The counts end up in the report (``data.stats``), so a run says what it skipped.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from scfs.config import ConfigError
from scfs.errors import ReportedError

log = logging.getLogger("scfs.eval.detect")

REQUIRED_TOP = ("images", "annotations", "categories")
REQUIRED_ANN = ("image_id", "category_id", "bbox")
SHOWN = 5
MIN_BOX_SIDE = 1.0  # pixels; smaller boxes (after clipping) cannot be matched by any anchor and are dropped

VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")


class AnnotationError(ReportedError, ValueError):
    """The annotation file is malformed (missing keys, unknown ids); the message names the offenders."""


# ---- cleaning ------------------------------------------------------------------------------------------------
def _examples(items: list[Any]) -> str:
    shown = ", ".join(str(i) for i in items[:SHOWN])
    return f"{shown}{', ...' if len(items) > SHOWN else ''}"


def clean_coco(raw: Any, source: str = "annotations", strict: bool = True,
               need_masks: bool = False) -> tuple[dict[str, Any], dict[str, int]]:
    """A checked copy of a COCO detection dict and the counts of what was repaired or skipped (see module doc).

    The copy has every field `COCOeval` needs (``area``, ``iscrowd``, ``id``), boxes clipped to their image, and
    only annotations that can be trained on or evaluated against. `need_masks`: every non-crowd annotation must
    carry a ``segmentation`` (Mask R-CNN); with ``strict=False`` the ones without are skipped and counted.
    """
    if not isinstance(raw, Mapping):
        raise AnnotationError(f"{source}: expected a COCO json object, got {type(raw).__name__}")
    missing_top = [k for k in REQUIRED_TOP if not isinstance(raw.get(k), list)]
    if missing_top:
        raise AnnotationError(f"{source}: missing or non-list top-level key(s) {missing_top}: a COCO detection file "
                              f"needs {list(REQUIRED_TOP)} (found {sorted(raw)[:10]})")
    stats: Counter[str] = Counter()
    problems: dict[str, list[Any]] = {}

    def problem(kind: str, what: Any) -> None:
        problems.setdefault(kind, []).append(what)
        stats[f"skipped_{kind}"] += 1

    categories = []
    for c in raw["categories"]:
        if not isinstance(c, Mapping) or "id" not in c:
            raise AnnotationError(f"{source}: every category needs an 'id' (got {c!r})")
        categories.append({"id": int(c["id"]), "name": str(c.get("name", c["id"])),
                           "supercategory": str(c.get("supercategory", ""))})
    if not categories:
        raise AnnotationError(f"{source}: 'categories' is empty")
    cat_ids = {c["id"] for c in categories}
    if len(cat_ids) != len(categories):
        raise AnnotationError(f"{source}: duplicate category ids")

    images: dict[int, dict[str, Any]] = {}
    for img in raw["images"]:
        if not isinstance(img, Mapping) or "id" not in img:
            problem("image_without_id", img)
            continue
        try:
            h, w = int(img["height"]), int(img["width"])
        except (KeyError, TypeError, ValueError):
            problem("image_without_size", img.get("id"))
            continue
        if h <= 0 or w <= 0:
            problem("image_without_size", img.get("id"))
            continue
        iid = int(img["id"])
        if iid in images:
            raise AnnotationError(f"{source}: duplicate image id {iid}")
        images[iid] = {"id": iid, "file_name": str(img.get("file_name", "")), "height": h, "width": w}

    annotations: list[dict[str, Any]] = []
    next_id = 1 + max((int(a["id"]) for a in raw["annotations"]
                       if isinstance(a, Mapping) and isinstance(a.get("id"), (int, np.integer))), default=0)
    used_ids: set[int] = set()
    for a in raw["annotations"]:
        if not isinstance(a, Mapping):
            problem("annotation_not_a_dict", a)
            continue
        absent = [k for k in REQUIRED_ANN if k not in a]
        if absent:
            problem("annotation_missing_keys", f"{a.get('id', '?')} (no {'/'.join(absent)})")
            continue
        iid, cid = int(a["image_id"]), int(a["category_id"])
        if iid not in images:
            problem("annotation_unknown_image", f"{a.get('id', '?')} (image_id {iid})")
            continue
        if cid not in cat_ids:
            problem("annotation_unknown_category", f"{a.get('id', '?')} (category_id {cid})")
            continue
        crowd = int(bool(a.get("iscrowd", 0)))
        if need_masks and not crowd and not a.get("segmentation"):
            problem("annotation_without_segmentation", a.get("id", "?"))
            continue
        try:
            x, y, bw, bh = (float(v) for v in a["bbox"])
        except (TypeError, ValueError):
            problem("annotation_missing_keys", f"{a.get('id', '?')} (bbox {a['bbox']!r} is not [x, y, w, h])")
            continue
        img = images[iid]
        if not all(math.isfinite(v) for v in (x, y, bw, bh)):
            stats["dropped_degenerate_boxes"] += 1
            continue
        x0, y0 = max(x, 0.0), max(y, 0.0)
        x1, y1 = min(x + bw, float(img["width"])), min(y + bh, float(img["height"]))
        if (x0, y0, x1, y1) != (x, y, x + bw, y + bh):
            stats["clipped_boxes"] += 1
        if x1 - x0 < MIN_BOX_SIDE or y1 - y0 < MIN_BOX_SIDE:
            stats["dropped_degenerate_boxes"] += 1
            continue
        aid = a.get("id")
        if not isinstance(aid, (int, np.integer)) or int(aid) in used_ids:
            aid, next_id = next_id, next_id + 1
        used_ids.add(int(aid))
        ann = {"id": int(aid), "image_id": iid, "category_id": cid, "bbox": [x0, y0, x1 - x0, y1 - y0],
               "iscrowd": crowd, "area": float(a["area"]) if a.get("area") else (x1 - x0) * (y1 - y0)}
        if a.get("segmentation"):
            ann["segmentation"] = a["segmentation"]
        if crowd:
            stats["crowd_annotations"] += 1
        annotations.append(ann)

    if problems and strict:
        lines = [f"{len(v)} {k.replace('_', ' ')}: {_examples(v)}" for k, v in problems.items()]
        raise AnnotationError(f"{source} is malformed: " + "; ".join(lines)
                              + " (data.strict=false skips these entries and counts them)")
    for k, v in problems.items():
        log.warning("%s: skipped %d %s (first: %s)", source, len(v), k.replace("_", " "), _examples(v))
    if not images:
        raise AnnotationError(f"{source}: no usable image entries")
    with_anns = {a["image_id"] for a in annotations if not a["iscrowd"]}
    stats["images"] = len(images)
    stats["annotations"] = len(annotations)
    stats["images_without_annotations"] = sum(1 for i in images if i not in with_anns)
    for k in ("clipped_boxes", "dropped_degenerate_boxes"):
        if stats[k]:
            log.warning("%s: %d box(es) %s", source, stats[k], k.replace("_", " "))
    doc = {"images": list(images.values()), "annotations": annotations, "categories": categories}
    return doc, dict(stats)


def load_coco_json(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file {path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path} is not valid json ({err})") from None


def coco_api(doc: Mapping[str, Any]):
    """A pycocotools `COCO` index over an in-memory dict (the ground truth `COCOeval` compares against)."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = {"info": {}, "licenses": [], **doc}
    _quiet(coco.createIndex)
    return coco


def _quiet(fn: Callable[[], Any]) -> Any:
    """pycocotools prints progress lines; keep the CLI output to our own summary."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return fn()


# ---- images --------------------------------------------------------------------------------------------------
class FolderImages:
    """Images as files: ``root / file_name`` (COCO), or absolute paths (VOC). Decoded to uint8 (3,H,W)."""

    def __init__(self, root: str | os.PathLike | None) -> None:
        self.root = Path(root) if root else None

    def path(self, info: Mapping[str, Any]) -> Path:
        p = Path(info["file_name"])
        return p if p.is_absolute() or self.root is None else self.root / p

    def exists(self, info: Mapping[str, Any]) -> bool:
        return self.path(info).is_file()

    def __call__(self, info: Mapping[str, Any]) -> torch.Tensor:
        from scfs.data.datasets import decode_rgb

        return decode_rgb(self.path(info))

    def __repr__(self) -> str:
        return f"FolderImages({self.root})"


class ArrayImages:
    """Images in a uint8 (N,H,W,3) array, addressed by COCO image id = array index (the shapes export)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def exists(self, info: Mapping[str, Any]) -> bool:
        return 0 <= int(info["id"]) < len(self.array)

    def __call__(self, info: Mapping[str, Any]) -> torch.Tensor:
        pixels = np.array(self.array[int(info["id"])])  # a copy: memory-mapped arrays are read-only
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()

    def __repr__(self) -> str:
        return f"ArrayImages({tuple(self.array.shape)})"


ImageSource = FolderImages | ArrayImages


# ---- masks ---------------------------------------------------------------------------------------------------
def decode_segmentation(segm: Any, h: int, w: int) -> np.ndarray:
    """uint8 (h, w) mask of a COCO segmentation: polygons, uncompressed or compressed RLE."""
    import warnings

    from pycocotools import mask as mask_utils

    if isinstance(segm, list):  # polygons
        rle = mask_utils.merge(mask_utils.frPyObjects(segm, h, w))
    elif isinstance(segm.get("counts"), list):  # uncompressed RLE
        rle = mask_utils.frPyObjects(segm, h, w)
    else:
        rle = dict(segm)
        if isinstance(rle["counts"], str):
            rle["counts"] = rle["counts"].encode("ascii")
    with warnings.catch_warnings():  # pycocotools' numpy-2 `copy=` deprecation notice, once per mask
        warnings.simplefilter("ignore", DeprecationWarning)
        return mask_utils.decode(rle)


# ---- the dataset ---------------------------------------------------------------------------------------------
@dataclass
class DetectionSplit:
    """One split: the checked COCO dict (also the COCOeval ground truth), where the pixels are, and counts."""

    name: str
    coco: dict[str, Any]
    images: ImageSource
    stats: dict[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def categories(self) -> list[dict[str, Any]]:
        return sorted(self.coco["categories"], key=lambda c: c["id"])

    @property
    def class_names(self) -> list[str]:
        return [c["name"] for c in self.categories]


class CocoDetectionDataset(Dataset):
    """`(image float (3,H,W) in [0,1], target)` pairs in the format torchvision's detectors train on.

    target: ``boxes`` (N,4) float xyxy in pixels, ``labels`` (N,) int64 in 1..K (contiguous; 0 is torchvision's
    background, category ids are mapped in sorted order), ``image_id``, and ``masks`` (N,H,W) uint8 when
    `masks`. Crowd regions are not training targets (as in torchvision's reference scripts); they stay in the
    evaluation ground truth, where COCOeval ignores detections on them. `train=True` drops images without
    targets (`skip_empty`, counted in ``stats['skipped_empty_images']``) and flips horizontally with `flip_p`.
    """

    def __init__(self, split: DetectionSplit, masks: bool = False, train: bool = False, flip_p: float = 0.5,
                 skip_empty: bool = True, check_files: bool = True) -> None:
        self.split, self.masks, self.train, self.flip_p = split, masks, train, float(flip_p)
        self.cat_to_label = {c["id"]: i + 1 for i, c in enumerate(split.categories)}
        self.label_to_cat = {v: k for k, v in self.cat_to_label.items()}
        by_image: dict[int, list[dict[str, Any]]] = {img["id"]: [] for img in split.coco["images"]}
        for a in split.coco["annotations"]:
            if not a["iscrowd"]:
                by_image[a["image_id"]].append(a)
        self.stats: dict[str, int] = {}
        infos = split.coco["images"]
        if check_files:
            present = [i for i in infos if split.images.exists(i)]
            if len(present) < len(infos):
                missing = [i["file_name"] for i in infos if not split.images.exists(i)]
                self.stats["skipped_missing_files"] = len(missing)
                if not present:
                    raise FileNotFoundError(f"{split.name}: none of the {len(infos)} images exists "
                                            f"({split.images!r}; first: {_examples(missing)})")
                log.warning("%s: %d image file(s) missing, skipped (first: %s)", split.name, len(missing),
                            _examples(missing))
            infos = present
        if train and skip_empty:
            kept = [i for i in infos if by_image[i["id"]]]
            self.stats["skipped_empty_images"] = len(infos) - len(kept)
            infos = kept
        if not infos:
            raise ValueError(f"{split.name}: no images left to {'train on' if train else 'evaluate'} "
                             f"(counts: {split.stats})")
        self.infos = infos
        self.anns = by_image

    def __len__(self) -> int:
        return len(self.infos)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        info = self.infos[index]
        img = self.split.images(info)
        h, w = int(info["height"]), int(info["width"])
        if tuple(img.shape[1:]) != (h, w):
            raise ValueError(f"{self.split.name}: image {info['id']} ({info['file_name']}) is "
                             f"{img.shape[2]}x{img.shape[1]} but the annotations say {w}x{h}")
        anns = self.anns[info["id"]]
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                              for a in anns], dtype=torch.float32).reshape(-1, 4)
        target = {"boxes": boxes, "labels": torch.tensor([self.cat_to_label[a["category_id"]] for a in anns],
                                                         dtype=torch.int64),
                  "image_id": torch.tensor(info["id"], dtype=torch.int64)}
        if self.masks:
            m = [decode_segmentation(a["segmentation"], h, w) for a in anns]
            target["masks"] = torch.from_numpy(np.stack(m)) if m else torch.zeros((0, h, w), dtype=torch.uint8)
        image = img.float().div_(255.0)
        if self.train and self.flip_p > 0 and torch.rand(()) < self.flip_p:
            image = image.flip(-1)
            target["boxes"] = torch.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], 1)
            if self.masks:
                target["masks"] = target["masks"].flip(-1)
        return image, target


def collate(batch: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> tuple[list, list]:
    """Detectors take lists (images differ in size)."""
    return [b[0] for b in batch], [b[1] for b in batch]


# ---- sources -------------------------------------------------------------------------------------------------
def shapes_splits(data: Mapping[str, Any], out_dir: str | os.PathLike, masks: bool) -> dict[str, DetectionSplit]:
    """The embedded shapes data as COCO detection splits: generated (cached) by spec, exported to json in
    `out_dir` by `scfs.data.shapes.export_coco` (boxes + RLE instance masks, category_id = label + 1)."""
    from scfs.data.shapes import ShapesSpec, ensure_shapes, export_coco, load_shapes

    spec_keys = ("image_size", "n_train", "n_val", "num_classes", "max_objects", "seed", "clutter", "object_scale")
    spec = ShapesSpec(**{k: (tuple(data[k]) if k == "object_scale" else data[k]) for k in spec_keys
                         if data.get(k) is not None})
    folder = ensure_shapes(data.get("root") or "data/shapes", spec)
    out: dict[str, DetectionSplit] = {}
    for split in ("train", "val"):
        # every DDP rank exports the same file: write a private copy, read it, then rename it into place (atomic)
        path = Path(out_dir) / f"shapes_{split}_coco.json"
        tmp = export_coco(folder, split, path.with_name(f".{path.stem}.{os.getpid()}.tmp"))
        raw = json.loads(tmp.read_text())
        os.replace(tmp, path)
        doc, stats = clean_coco(raw, str(path), strict=True, need_masks=masks)
        out[split] = DetectionSplit(f"shapes/{split}", doc, ArrayImages(load_shapes(folder, split, mmap=True).images),
                                    stats, str(path))
    return out


def coco_split(images: str | os.PathLike, annotations: str | os.PathLike, name: str, strict: bool,
               masks: bool) -> DetectionSplit:
    """A COCO-format split: image folder + annotation json."""
    root = Path(images)
    if not root.is_dir():
        raise FileNotFoundError(f"{name}: image folder {root} does not exist (data.images / data.val_images)")
    doc, stats = clean_coco(load_coco_json(annotations), str(annotations), strict, masks)
    return DetectionSplit(name, doc, FolderImages(root), stats, str(annotations))


def voc_split(root: str | os.PathLike, sets: Sequence[Sequence[Any]], name: str) -> DetectionSplit:
    """Pascal VOC (`torchvision.datasets.VOCDetection`, never downloading) as one COCO dict.

    `sets`: ``[[year, image_set], ...]`` (e.g. 07+12 trainval). VOC's 1-based inclusive pixel boxes become COCO
    xywh (x0 = xmin - 1, w = xmax - xmin + 1); ``difficult`` objects become crowd regions, i.e. ignored by COCOeval
    and not trained on (the usual VOC convention).
    """
    import xml.etree.ElementTree as ET

    from torchvision.datasets import VOCDetection

    cats = [{"id": i + 1, "name": n, "supercategory": "voc"} for i, n in enumerate(VOC_CLASSES)]
    cat_id = {c["name"]: c["id"] for c in cats}
    images, anns = [], []
    for year, image_set in sets:
        try:
            ds = VOCDetection(str(root), year=str(year), image_set=str(image_set), download=False)
        except RuntimeError as err:
            raise FileNotFoundError(
                f"{name}: VOC{year} {image_set} not found under {root} (expected {root}/VOCdevkit/VOC{year}/ with "
                f"Annotations/, JPEGImages/, ImageSets/Main/{image_set}.txt; set data.root; nothing is downloaded): "
                f"{err}") from None
        for img_path, xml_path in zip(ds.images, ds.annotations, strict=True):
            node = ds.parse_voc_xml(ET.parse(xml_path).getroot())["annotation"]
            iid = len(images) + 1
            size = node["size"]
            images.append({"id": iid, "file_name": str(Path(img_path).resolve()), "height": int(size["height"]),
                           "width": int(size["width"])})
            objs = node.get("object", [])
            for o in objs if isinstance(objs, list) else [objs]:
                b = o["bndbox"]
                x0, y0 = float(b["xmin"]) - 1, float(b["ymin"]) - 1
                w, h = float(b["xmax"]) - x0, float(b["ymax"]) - y0
                anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": cat_id[o["name"].strip()],
                             "bbox": [x0, y0, w, h], "area": w * h, "iscrowd": int(o.get("difficult", "0") == "1")})
    doc, stats = clean_coco({"images": images, "annotations": anns, "categories": cats}, name, strict=True)
    return DetectionSplit(name, doc, FolderImages(None), stats, f"{root} {list(map(list, sets))}")


def detection_format(data: Mapping[str, Any]) -> str:
    """`data.format`, with `auto` = coco when annotation files are given, else shapes."""
    fmt = str(data.get("format") or "auto")
    if fmt == "auto":
        fmt = "coco" if data.get("annotations") else "shapes"
    if fmt not in ("shapes", "coco", "voc"):
        raise ConfigError(f"config key data.format={fmt!r} is invalid: expected auto, shapes, coco or voc")
    return fmt


def build_detection_splits(data: Mapping[str, Any], out_dir: str | os.PathLike,
                           masks: bool) -> dict[str, DetectionSplit]:
    """``{"train": ..., "val": ...}`` for the configured source (see conf/eval/detect.yaml, `data`)."""
    fmt = detection_format(data)
    strict = bool(data.get("strict", True))
    if fmt == "shapes":
        return shapes_splits(data, out_dir, masks)
    if fmt == "coco":
        need = [k for k in ("images", "annotations", "val_images", "val_annotations") if not data.get(k)]
        if need:
            raise ConfigError(f"data.format=coco needs data.{', data.'.join(need)} (image folders and COCO json files "
                              "of the training and validation splits)")
        return {"train": coco_split(data["images"], data["annotations"], "train", strict, masks),
                "val": coco_split(data["val_images"], data["val_annotations"], "val", strict, masks)}
    if masks:
        raise ConfigError("Pascal VOC detection has no instance masks: use model.arch=faster_rcnn with data.format=voc")
    return {"train": voc_split(data["root"], data["voc_train"], "voc/train"),
            "val": voc_split(data["root"], data["voc_val"], "voc/val")}

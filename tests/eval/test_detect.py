"""Detection transfer: the shapes pipeline trains and evaluates (COCOeval), the detector's trunk holds exactly the
checkpoint's tensors, bad annotation files fail clearly or are skipped and counted, compare reads detection runs,
and a short CPU fine-tune on an easy shapes split learns (AP50 > 30, `slow`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from scfs.eval.common import compose_eval_cfg, load_eval_backbone
from scfs.eval.compare import compare_table, load_run
from scfs.eval.detect import lr_factor, run_detect
from scfs.eval.detection_data import (
    AnnotationError,
    ArrayImages,
    CocoDetectionDataset,
    DetectionSplit,
    clean_coco,
    voc_split,
)
from scfs.eval.detection_metrics import STAT_NAMES
from scfs.eval.detection_model import build_detector, trunk_state
from scfs.eval.report import read_wandb_summary
from scfs.models.checkpoint import safe_load

# 64-px shapes, a handful of images and iterations: the whole pipeline in seconds
DET_TINY = ["data.n_train=24", "data.n_val=8", "batch_size=4", "eval_batch_size=8", "schedule.max_iters=3",
            "schedule.warmup_iters=2", "schedule.steps=[2]", "progress=false", "figure_images=2", "log_every_n_steps=1"]


@pytest.fixture
def det_cfg(shapes_root):
    def make(*overrides: str):
        return compose_eval_cfg("detect", [f"data.root={shapes_root}", *DET_TINY, "logger.wandb=false", *overrides])

    return make


def _ckpt_trunk(path, which="teacher") -> dict[str, torch.Tensor]:
    prefix = f"{which}.backbone.body."
    sd = safe_load(path)["state_dict"]
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and "num_batches_tracked" not in k}


# ---- the pipeline --------------------------------------------------------------------------------------------
def test_few_iterations_give_finite_losses_and_full_cocoeval(tiny_ckpt, tmp_path, det_cfg):
    doc = run_detect(det_cfg(f"ckpt={tiny_ckpt}", "logger.wandb=true", "model.arch=mask_rcnn", "model.norm=frozen",
                             "model.trainable_layers=3"), tmp_path)
    assert math.isfinite(doc["train"]["final_loss"]) and doc["train"]["iters"] == 3
    assert doc["iou_types"] == ["bbox", "segm"]
    assert set(doc["metrics"]) == {f"{i}/{k}" for i in ("bbox", "segm") for k in STAT_NAMES}
    assert all(v is None or 0.0 <= v <= 100.0 for v in doc["metrics"].values())
    assert doc["metrics"]["bbox/AP"] is not None and doc["n_eval_images"] == 8
    for iou in ("bbox", "segm"):  # COCOeval ran to the end: its 12-line summary table
        assert len(doc["coco_summary"][iou].splitlines()) == 12
    assert len(doc["per_category"]) == 10 and doc["data"]["stats"]["train"]["images"] == 24
    for name in ("metrics.json", "report.md", "predictions.png", "val_detections.json", "checkpoints/last.ckpt"):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "metrics.json").read_text())["metrics"] == doc["metrics"]
    assert "| bbox |" in (tmp_path / "report.md").read_text()
    summary = read_wandb_summary(tmp_path)
    assert summary["detect/bbox/AP"] == doc["metrics"]["bbox/AP"]
    assert summary["checkpoint_id"] == doc["checkpoint"]["id"]

    # trainable_layers=3: the stem and layer1 are the checkpoint's, bit for bit, after fine-tuning; layer4 moved
    tuned = {k[len("detector.backbone.body."):]: v for k, v in safe_load(tmp_path / "checkpoints/last.ckpt")
             ["state_dict"].items() if k.startswith("detector.backbone.body.")}
    ref = _ckpt_trunk(tiny_ckpt)
    frozen = [k for k in ref if k.split(".")[0] in ("conv1", "bn1", "layer1")]
    assert frozen and all(torch.equal(tuned[k], ref[k]) for k in frozen)
    assert any(not torch.equal(tuned[k], ref[k]) for k in ref if k.startswith("layer4") and k.endswith("weight"))


def test_default_faster_rcnn_from_random_init_with_trainable_bn(tmp_path, det_cfg):
    doc = run_detect(det_cfg("ckpt=random", "schedule.max_iters=2", "figure_images=0"), tmp_path)  # the defaults
    assert doc["iou_types"] == ["bbox"] and set(doc["metrics"]) == {f"bbox/{k}" for k in STAT_NAMES}
    assert doc["checkpoint"]["format"] == "random" and math.isfinite(doc["train"]["final_loss"])
    assert doc["model"]["norm"] == "bn" and doc["model"]["trainable_layers"] == 5


def test_coco_format_files_on_disk(tmp_path, shapes_root, det_cfg):
    """The COCO path end to end: an image folder + COCO json files (here shapes written out as PNG files)."""
    from PIL import Image

    from scfs.data.shapes import ShapesSpec, ensure_shapes, export_coco, load_shapes

    folder = ensure_shapes(shapes_root, ShapesSpec(image_size=64, n_train=24, n_val=8))
    for split in ("train", "val"):
        export_coco(folder, split, tmp_path / f"{split}.json")  # file_name: {split}/{i:06d}.png
        (tmp_path / "img" / split).mkdir(parents=True)
        for i, img in enumerate(load_shapes(folder, split).images):
            Image.fromarray(img).save(tmp_path / "img" / split / f"{i:06d}.png")
    img = tmp_path / "img"
    doc = run_detect(det_cfg("ckpt=random", f"data.images={img}", f"data.annotations={tmp_path}/train.json",
                             f"data.val_images={img}", f"data.val_annotations={tmp_path}/val.json",
                             "schedule.max_iters=2", "figure_images=1"), tmp_path / "run")
    assert doc["data"]["format"] == "coco" and doc["data"]["name"] == "coco" and doc["n_eval_images"] == 8


def test_resume_continues_from_the_detector_checkpoint(tmp_path, det_cfg):
    run_detect(det_cfg("ckpt=random", "schedule.max_iters=2", "figure_images=0"), tmp_path / "a")
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    doc = run_detect(det_cfg("ckpt=random", "schedule.max_iters=4", "figure_images=0", f"resume={last}"),
                     tmp_path / "b")
    assert doc["train"]["iters"] == 4 and (tmp_path / "b" / "checkpoints" / "last.ckpt").is_file()


def test_random_like_takes_the_checkpoints_network(tiny_ckpt, det_cfg):
    from scfs.eval.detect import _with_backbone_of

    cfg = _with_backbone_of(det_cfg("ckpt=random", "backbone.channels=[4,4,4,4]"), str(tiny_ckpt))
    backbone, info = load_eval_backbone(cfg)
    assert info.format == "random" and list(cfg.backbone.channels) == [8, 16, 16, 32]
    assert {k: v.shape for k, v in backbone.body.state_dict().items()} == \
        {k: v.shape for k, v in _ckpt_trunk(tiny_ckpt).items()} | {k: torch.Size([]) for k in
                                                                    backbone.body.state_dict() if "num_batches" in k}


# ---- the trunk is the checkpoint -----------------------------------------------------------------------------
@pytest.mark.parametrize("norm,which", [("frozen", "teacher"), ("bn", "student"), ("sync", "teacher")])
def test_detector_trunk_equals_checkpoint_tensors(tiny_ckpt, det_cfg, norm, which):
    cfg = det_cfg(f"ckpt={tiny_ckpt}", f"which={which}", f"model.norm={norm}", "model.trainable_layers=3")
    backbone, _ = load_eval_backbone(cfg)
    detector = build_detector(backbone.body, 10, dict(cfg.model))
    trunk, ref = trunk_state(detector), _ckpt_trunk(tiny_ckpt, which)
    assert set(ref) <= set(trunk) and len(ref) > 20
    for k, v in ref.items():
        assert torch.equal(trunk[k], v), k
    other = _ckpt_trunk(tiny_ckpt, "student" if which == "teacher" else "teacher")
    assert any(not torch.equal(trunk[k], other[k]) for k in ref)  # teacher and student really differ
    # requires_grad per stage follows torchvision's trainable_layers=3: layer2..4 train, stem and layer1 do not
    # (bn1 and layer1's norms are FrozenBatchNorm2d whatever `norm` says: frozen weights, frozen statistics)
    grads = {n.split(".")[2]: p.requires_grad for n, p in detector.named_parameters() if n.startswith("backbone.body")}
    assert grads == {"conv1": False, "layer1": False, "layer2": True, "layer3": True, "layer4": True}
    body = detector.backbone.body
    assert isinstance(body.bn1, FrozenBatchNorm2d) and isinstance(body.layer1[0].bn1, FrozenBatchNorm2d)
    expected = {"frozen": FrozenBatchNorm2d, "bn": torch.nn.BatchNorm2d, "sync": torch.nn.SyncBatchNorm}[norm]
    assert type(body.layer4[0].bn1) is expected


def test_supervised_torchvision_weights_from_a_local_file(tmp_path, det_cfg):
    """A torchvision ResNet state dict (as torchvision's resnet*.pth, saved locally; nothing is downloaded)."""
    import torchvision

    torch.manual_seed(1)
    tv = torchvision.models.resnet18(weights=None)
    torch.save(tv.state_dict(), tmp_path / "resnet18-local.pth")
    cfg = det_cfg(f"ckpt={tmp_path / 'resnet18-local.pth'}", "backbone=resnet18")
    backbone, info = load_eval_backbone(cfg)
    trunk = trunk_state(build_detector(backbone.body, 10, dict(cfg.model)))
    ref = {k: v for k, v in tv.state_dict().items() if not k.startswith("fc.") and "num_batches_tracked" not in k}
    assert info.format == "state-dict" and all(torch.equal(trunk[k], v) for k, v in ref.items())


def test_timm_trunk_computes_what_torchvision_resnet_computes():
    """The detector's trunk is the timm body; a torchvision ResNet-18 given the same weights yields the same maps."""
    import torchvision
    from torchvision.models._utils import IntermediateLayerGetter

    from scfs.models import Backbone

    torch.manual_seed(0)
    ours = Backbone("resnet18", stages=("layer4",)).eval()
    tv = torchvision.models.resnet18(weights=None).eval()
    missing, unexpected = tv.load_state_dict(ours.body.state_dict(), strict=False)
    assert set(missing) == {"fc.weight", "fc.bias"} and not unexpected
    layers = {f"layer{i}": str(i) for i in range(1, 5)}
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        a, b = IntermediateLayerGetter(ours.body, layers)(x), IntermediateLayerGetter(tv, layers)(x)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_coco_and_voc_experiments_build_a_resnet50_detector():
    for exp, arch in (("coco_maskrcnn_1x", "MaskRCNN"), ("voc_fasterrcnn", "FasterRCNN")):
        cfg = compose_eval_cfg("detect", [f"+experiment={exp}", "ckpt=random"])
        assert cfg.schedule.batch_size == 16 and cfg.schedule.lr == 0.02 and cfg.backbone.name == "resnet50"
        backbone, _ = load_eval_backbone(cfg)
        model = dict(cfg.model) | {"min_size": 64, "max_size": 64}
        det = build_detector(backbone.body, 80 if arch == "MaskRCNN" else 20, model).eval()
        assert type(det).__name__ == arch and isinstance(det.backbone.body.layer1[0].bn1, torch.nn.SyncBatchNorm)
        with torch.no_grad():
            out = det([torch.rand(3, 64, 80)])
        assert set(out[0]) >= {"boxes", "labels", "scores"}
    coco = compose_eval_cfg("detect", ["+experiment=coco_maskrcnn_1x", "ckpt=x"])
    assert coco.schedule.max_iters == 90000 and list(coco.schedule.steps) == [60000, 80000]


def test_lr_schedule_is_warmup_then_steps():
    f = [lr_factor(i, 100, 0.001, [450, 550], 0.1) for i in (0, 50, 100, 449, 450, 549, 550)]
    assert f[0] == pytest.approx(0.001) and f[1] == pytest.approx(0.5005) and f[2] == f[3] == 1.0
    assert f[4] == pytest.approx(0.1) and f[5] == pytest.approx(0.1) and f[6] == pytest.approx(0.01)


def test_cocoeval_of_the_ground_truth_itself_is_100_and_of_nothing_0():
    """The output -> COCO results conversion (xyxy -> xywh, label -> category id, masks -> RLE) is exact."""
    from pycocotools import mask as mask_utils

    from scfs.eval.detection_data import coco_api
    from scfs.eval.detection_metrics import coco_evaluate, to_coco_results

    images = [{"id": i, "file_name": f"{i}.png", "height": 40, "width": 50} for i in (3, 4)]
    boxes = {3: [[5, 6, 20, 15], [30, 2, 45, 30]], 4: [[0, 0, 50, 40]]}
    anns = []
    for iid, bs in boxes.items():
        for x0, y0, x1, y1 in bs:
            m = np.zeros((40, 50), np.uint8)
            m[y0:y1, x0:x1] = 1
            rle = mask_utils.encode(np.asfortranarray(m))
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": 7 if x0 else 1,
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float(m.sum()), "iscrowd": 0,
                         "segmentation": {"size": [40, 50], "counts": rle["counts"].decode()}})
    doc, _ = clean_coco(_coco(anns, images), "gt")
    gt = coco_api(doc)
    label_to_cat = {1: 1, 2: 7}
    results = []
    for iid, bs in boxes.items():
        t = torch.tensor(bs, dtype=torch.float32)
        masks = torch.zeros(len(bs), 1, 40, 50)
        for k, (x0, y0, x1, y1) in enumerate(bs):
            masks[k, 0, y0:y1, x0:x1] = 0.9
        out = {"boxes": t, "scores": torch.ones(len(bs)), "labels": torch.tensor([2 if b[0] else 1 for b in bs]),
               "masks": masks}
        results += to_coco_results(out, iid, label_to_cat, masks=True)
    ev = coco_evaluate(gt, results, ("bbox", "segm"))
    assert ev["metrics"]["bbox/AP"] == pytest.approx(100.0) and ev["metrics"]["segm/AP"] == pytest.approx(100.0)
    assert ev["metrics"]["bbox/APl"] is None or ev["metrics"]["bbox/APl"] == pytest.approx(100.0)
    only3 = coco_evaluate(gt, [r for r in results if r["image_id"] == 3], ("bbox",), img_ids=[3])
    assert only3["metrics"]["bbox/AP"] == pytest.approx(100.0)  # image 4 not evaluated: not a miss
    none = coco_evaluate(gt, [], ("bbox",))
    assert none["metrics"]["bbox/AP"] == 0.0 and none["summary"]["bbox"] == "no detections"


# ---- bad annotation files ------------------------------------------------------------------------------------
def _coco(anns, images=None):
    images = images if images is not None else [{"id": 1, "file_name": "a.png", "height": 20, "width": 30},
                                                {"id": 2, "file_name": "b.png", "height": 20, "width": 30}]
    return {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}, {"id": 7, "name": "b"}]}


def test_missing_top_level_keys_are_a_clear_error():
    with pytest.raises(AnnotationError, match=r"missing or non-list top-level key\(s\) \['annotations'\]"):
        clean_coco({"images": [], "categories": []}, "bad.json")


def test_malformed_annotations_raise_or_are_skipped_and_counted():
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 5, 5]},
            {"id": 2, "image_id": 1, "category_id": 1},                          # no bbox
            {"id": 3, "image_id": 9, "category_id": 1, "bbox": [0, 0, 3, 3]},   # unknown image
            {"id": 4, "image_id": 1, "category_id": 3, "bbox": [0, 0, 3, 3]}]   # unknown category
    with pytest.raises(AnnotationError) as err:
        clean_coco(_coco(anns), "bad.json")
    msg = str(err.value)
    assert "bad.json" in msg and "1 annotation missing keys: 2 (no bbox)" in msg
    assert "annotation unknown image: 3 (image_id 9)" in msg and "category_id 3" in msg and "data.strict=false" in msg
    doc, stats = clean_coco(_coco(anns), "bad.json", strict=False)
    assert [a["id"] for a in doc["annotations"]] == [1]
    assert stats["skipped_annotation_missing_keys"] == 1 and stats["skipped_annotation_unknown_image"] == 1
    assert stats["skipped_annotation_unknown_category"] == 1
    with pytest.raises(AnnotationError, match="annotation without segmentation"):
        clean_coco(_coco(anns[:1]), "bad.json", need_masks=True)


def test_boxes_outside_the_image_are_clipped_or_dropped_and_empty_images_counted():
    anns = [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [-4, 15, 10, 10]},  # reaches out: clipped
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [40, 5, 5, 5]},    # wholly outside: dropped
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [3, 3, 0, 4]},     # zero width: dropped
            {"id": 4, "image_id": 2, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": 1}]  # crowd only
    doc, stats = clean_coco(_coco(anns), "odd.json")
    assert stats["clipped_boxes"] == 2 and stats["dropped_degenerate_boxes"] == 2
    assert doc["annotations"][0]["bbox"] == [0.0, 15.0, 6.0, 5.0] and doc["annotations"][0]["area"] == 30.0
    assert stats["images_without_annotations"] == 1 and stats["crowd_annotations"] == 1
    split = DetectionSplit("odd", doc, ArrayImages(np.zeros((3, 20, 30, 3), np.uint8)), stats)
    train = CocoDetectionDataset(split, train=True, flip_p=0.0)
    assert len(train) == 1 and train.stats["skipped_empty_images"] == 1  # the crowd-only image has no target
    img, target = train[0]
    assert img.shape == (3, 20, 30) and target["labels"].tolist() == [2]  # category 7 -> contiguous label 2
    assert target["boxes"].tolist() == [[0.0, 15.0, 6.0, 20.0]]
    assert len(CocoDetectionDataset(split, train=False)) == 2  # evaluation keeps the empty image
    missing = DetectionSplit("gone", doc, ArrayImages(np.zeros((2, 20, 30, 3), np.uint8)), stats)  # no id 2
    assert CocoDetectionDataset(missing, train=False).stats["skipped_missing_files"] == 1


def test_voc_is_read_without_download_and_converted_to_coco(tmp_path):
    from PIL import Image

    base = tmp_path / "VOCdevkit" / "VOC2007"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (base / sub).mkdir(parents=True)
    (base / "ImageSets/Main/test.txt").write_text("000001\n")
    Image.new("RGB", (50, 40)).save(base / "JPEGImages/000001.jpg")
    (base / "Annotations/000001.xml").write_text(
        "<annotation><size><width>50</width><height>40</height><depth>3</depth></size>"
        "<object><name>dog</name><difficult>0</difficult><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>10</xmax>"
        "<ymax>20</ymax></bndbox></object><object><name>cat</name><difficult>1</difficult><bndbox><xmin>5</xmin>"
        "<ymin>5</ymin><xmax>30</xmax><ymax>30</ymax></bndbox></object></annotation>")
    split = voc_split(tmp_path, [[2007, "test"]], "voc/val")
    dog, cat = split.coco["annotations"]
    assert dog["bbox"] == [0.0, 1.0, 10.0, 19.0] and dog["category_id"] == 12 and dog["iscrowd"] == 0
    assert cat["iscrowd"] == 1  # difficult -> ignored region
    assert split.images(split.coco["images"][0]).shape == (3, 40, 50)
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        voc_split(tmp_path, [[2012, "trainval"]], "voc/train")


# ---- compare -------------------------------------------------------------------------------------------------
def test_compare_shows_detection_runs_side_by_side(tmp_path):
    def doc(label, ap, cid):
        m = {f"{i}/{k}": ap for i in ("bbox", "segm") for k in STAT_NAMES} | {"bbox/APl": None}
        return {"kind": "detect", "metrics": m, "iou_types": ["bbox", "segm"], "model": {"arch": "mask_rcnn"},
                "checkpoint": {"id": cid, "which": "teacher", "label": label, "format": "scfs-lightning"},
                "data": {"name": "shapes"}, "config": {}}

    for name, ap, cid in (("scfs", 40.0, "a" * 16), ("random", 20.0, "b" * 16)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(doc(name, ap, cid)))
    table = compare_table([load_run(tmp_path / n / "metrics.json") for n in ("scfs", "random")])
    assert "| mask_rcnn bbox AP50 | **40.00** | 20.00 |" in table and "| mask_rcnn segm APl |" in table
    assert "bbox APl" not in table  # no ground truth in that range: no row


# ---- learning, measured --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_short_cpu_finetune_on_easy_shapes_reaches_ap50_above_30(tmp_path, shapes_root):
    """Easy split: 3 classes (circle, square, triangle), 1-2 objects on a flat background. Measured: see README."""
    cfg = compose_eval_cfg("detect", [
        f"data.root={shapes_root}", "ckpt=random", "model.arch=faster_rcnn", "data.num_classes=3",
        "data.max_objects=2", "data.clutter=0.0", "data.n_train=600", "data.n_val=100", "schedule.max_iters=400",
        "schedule.warmup_iters=20", "schedule.steps=[350]", "batch_size=8", "progress=false", "logger.wandb=false",
        "figure_images=0"])
    doc = run_detect(cfg, tmp_path)
    assert doc["metrics"]["bbox/AP50"] > 30.0, doc["metrics"]

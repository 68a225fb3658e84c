"""COCO-style detection metrics with pycocotools: detector outputs -> COCO results -> `COCOeval` numbers.

Numbers are percentages (as detectron2 and the papers report them): AP (IoU .50:.95), AP50, AP75 and APs/APm/APl
(area < 32², 32²-96², > 96² in pixels of the *original* image - on 64-px shapes nearly everything is "small" or
"medium", so APl is often undefined). COCOeval's -1 ("no ground truth in this range") becomes None, never a
number that would average into a table.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl")  # COCOeval.stats[0:6]
IOU_TYPES = {"faster_rcnn": ("bbox",), "mask_rcnn": ("bbox", "segm")}


def to_coco_results(output: Mapping[str, torch.Tensor], image_id: int, label_to_cat: Mapping[int, int],
                    masks: bool = False, mask_threshold: float = 0.5) -> list[dict[str, Any]]:
    """One image's torchvision detections (boxes xyxy in original pixels, labels 1..K, scores, masks (N,1,H,W)
    probabilities) as COCO result entries (bbox xywh, category_id, score, segmentation RLE)."""
    boxes = output["boxes"].detach().float().cpu()
    if boxes.numel() == 0:
        return []
    scores = output["scores"].detach().float().cpu().tolist()
    labels = output["labels"].detach().cpu().tolist()
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1).tolist()
    res = [{"image_id": int(image_id), "category_id": int(label_to_cat[int(lab)]), "bbox": [round(v, 2) for v in b],
            "score": round(float(s), 5)} for b, lab, s in zip(xywh, labels, scores, strict=True)]
    if masks and "masks" in output:
        from pycocotools import mask as mask_utils

        m = (output["masks"].detach().cpu()[:, 0] > mask_threshold).numpy().astype(np.uint8)
        rles = mask_utils.encode(np.asfortranarray(m.transpose(1, 2, 0)))
        for r, rle in zip(res, rles, strict=True):
            r["segmentation"] = {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}
    return res


def _stat(v: float) -> float | None:
    return None if v < 0 else float(100.0 * v)


def coco_evaluate(gt: Any, results: Sequence[Mapping[str, Any]], iou_types: Sequence[str],
                  names: Mapping[int, str] | None = None, img_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """`COCOeval` of `results` against the ground-truth `COCO` index `gt`, for each IoU type, over the images
    `img_ids` (default: all of `gt`; the images the detector actually saw, so a skipped unreadable file or a
    partial periodic validation does not count as missed objects).

    Returns ``{"metrics": {"bbox/AP": ..., "segm/AP50": ...}, "per_category": [{"id", "name", "bbox/AP",
    "bbox/AP50", ...}], "summary": {"bbox": <COCOeval's printed table>}, "n_detections": int}``. No detections at
    all is a valid outcome (AP 0 wherever there is ground truth), not an error.
    """
    from pycocotools.cocoeval import COCOeval

    names = dict(names or {c["id"]: c["name"] for c in gt.dataset["categories"]})
    cat_ids = sorted(names)
    metrics: dict[str, float | None] = {}
    per_cat = {cid: {"id": cid, "name": names[cid]} for cid in cat_ids}
    summaries: dict[str, str] = {}
    for iou in iou_types:
        res = [r for r in results if iou == "bbox" or "segmentation" in r]
        if not res:
            ids = set(img_ids) if img_ids is not None else None
            has_gt = {a["category_id"] for a in gt.dataset["annotations"]
                      if not a.get("iscrowd") and (ids is None or a["image_id"] in ids)}
            for k in STAT_NAMES:
                metrics[f"{iou}/{k}"] = 0.0
            for cid in cat_ids:
                per_cat[cid][f"{iou}/AP"] = per_cat[cid][f"{iou}/AP50"] = 0.0 if cid in has_gt else None
            summaries[iou] = "no detections"
            continue
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            dt = gt.loadRes([dict(r) for r in res])
            ev = COCOeval(gt, dt, iou)
            if img_ids is not None:
                ev.params.imgIds = sorted(int(i) for i in img_ids)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        summaries[iou] = "\n".join(ln for ln in buf.getvalue().splitlines() if ln.startswith(" Average"))
        for k, v in zip(STAT_NAMES, ev.stats[:6], strict=True):
            metrics[f"{iou}/{k}"] = _stat(float(v))
        prec = ev.eval["precision"]  # (T iou thresholds, R recall, K categories, A areas, M max dets)
        for ki, cid in enumerate(ev.params.catIds):
            p_all = prec[:, :, ki, 0, -1]
            p50 = prec[0, :, ki, 0, -1]
            per_cat[cid][f"{iou}/AP"] = _stat(float(p_all[p_all > -1].mean())) if (p_all > -1).any() else None
            per_cat[cid][f"{iou}/AP50"] = _stat(float(p50[p50 > -1].mean())) if (p50 > -1).any() else None
    return {"metrics": metrics, "per_category": list(per_cat.values()), "summary": summaries,
            "n_detections": len(results)}

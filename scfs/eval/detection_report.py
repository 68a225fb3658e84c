"""The detection run's report: `metrics.json` (read by `scfs.eval.compare`), `report.md`, `predictions.png` and the
W&B run's summary / tables / image - the same layout as the kNN and linear reports, with detection's numbers
(COCO AP per IoU type, per-category AP, what the data checks skipped) in place of accuracy and confusion."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scfs.eval.detection_metrics import STAT_NAMES
from scfs.eval.report import run_facts
from scfs.plotting import new_figure


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def markdown_report(doc: Mapping[str, Any]) -> str:
    ck, data, model = doc["checkpoint"], doc["data"], doc["model"]
    iou_types = doc["iou_types"]
    lines = [f"# detection transfer: {ck.get('label')}", "",
             f"* checkpoint: `{ck.get('path')}` (id `{ck.get('id')}`, {ck.get('format')}, {ck.get('which')})",
             f"* detector: {model['arch']} with FPN over the checkpoint's {ck.get('backbone', {}).get('name')} trunk "
             f"(returned layers {model['returned_layers']}, {model['fpn_channels']} FPN channels, norm "
             f"{model['norm']}, trainable_layers {model['trainable_layers']}, input min_size {model['min_size']} / "
             f"max_size {model['max_size']})",
             f"* data: {data['name']} ({data['format']}; {data['n_train']} train / {data['n_val']} val images, "
             f"{data['num_classes']} classes)",
             f"* schedule: {doc['train']['iters']} iterations, batch {doc['train']['batch_size']}, lr "
             f"{doc['train']['lr']}, steps {doc['train']['steps']}, warmup {doc['train']['warmup_iters']}; "
             f"final training loss {_fmt(doc['train'].get('final_loss'))}"]
    lines += run_facts(doc)
    lines += ["", "## COCO metrics (val)", "", "| IoU type | " + " | ".join(STAT_NAMES) + " |",
              "|---" + "|---:" * len(STAT_NAMES) + "|"]
    for iou in iou_types:
        lines.append(f"| {iou} | " + " | ".join(_fmt(doc["metrics"].get(f"{iou}/{k}")) for k in STAT_NAMES) + " |")
    lines += ["", "## Per-category AP", "",
              "| id | name | " + " | ".join(f"{i} AP | {i} AP50" for i in iou_types) + " |",
              "|---|---" + "|---:|---:" * len(iou_types) + "|"]
    for r in doc["per_category"]:
        lines.append(f"| {r['id']} | {r['name']} | "
                     + " | ".join(f"{_fmt(r.get(f'{i}/AP'))} | {_fmt(r.get(f'{i}/AP50'))}" for i in iou_types) + " |")
    lines += ["", "## Data checks", "", "| split | count | value |", "|---|---|---:|"]
    for split, stats in data.get("stats", {}).items():
        lines += [f"| {split} | {k.replace('_', ' ')} | {v} |" for k, v in stats.items()]
    for iou, text in doc.get("coco_summary", {}).items():
        lines += ["", f"## COCOeval ({iou})", "", "```", text, "```"]
    if doc.get("figures", {}).get("predictions"):
        lines += ["", "## Predictions (val; top-k detections per image, k = its number of objects; ground truth "
                  "dashed)", "",
                  f"![predictions]({doc['figures']['predictions']})"]
    return "\n".join(lines) + "\n"


def plot_predictions(images: Sequence[torch.Tensor], gts: Sequence[Mapping[str, Any]],
                     preds: Sequence[Sequence[Mapping[str, Any]]], names: Mapping[int, str], path: Path,
                     title: str) -> Path:
    """A grid of val images with ground-truth boxes (dashed) and, per image, as many top-scoring detections as it
    has objects (solid, labelled with class and score): a weak detector's guesses stay visible, not thresholded
    away."""
    from matplotlib.patches import Rectangle

    n = len(images)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig = new_figure(2.6 * cols, 2.6 * rows + 0.3)
    for i, (img, gt, pr) in enumerate(zip(images, gts, preds, strict=True)):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.imshow(img.permute(1, 2, 0).numpy())
        for a in gt:
            x, y, w, h = a["bbox"]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), w, h, fill=False, ls="--", lw=1, ec="white"))
        for r in sorted(pr, key=lambda r: -r["score"])[: max(len(gt), 1)]:
            x, y, w, h = r["bbox"]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), w, h, fill=False, lw=1.2, ec="yellow"))
            ax.text(x, y - 1, f"{names.get(r['category_id'], r['category_id'])} {r['score']:.2f}", fontsize=6,
                    color="black", bbox={"facecolor": "yellow", "alpha": 0.7, "pad": 0.5, "lw": 0})
        ax.set_axis_off()
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def log_wandb(run: Any, doc: Mapping[str, Any], run_dir: Path) -> None:
    """Summary numbers (``detect/bbox/AP`` ...), the per-category table and the predictions image."""
    import wandb

    run.config.update({"checkpoint": doc["checkpoint"], "data_eval": {k: v for k, v in doc["data"].items()
                                                                      if k != "stats"}}, allow_val_change=True)
    summary = {f"detect/{k}": v for k, v in doc["metrics"].items() if v is not None}
    summary.update({"checkpoint_id": doc["checkpoint"].get("id"), "checkpoint_path": doc["checkpoint"].get("path")})
    cols = ["id", "name"] + [f"{i}/{s}" for i in doc["iou_types"] for s in ("AP", "AP50")]
    payload: dict[str, Any] = {"detect/per_category": wandb.Table(
        columns=cols, data=[[r.get(c) for c in cols] for r in doc["per_category"]])}
    if doc.get("figures", {}).get("predictions"):
        payload["detect/predictions"] = wandb.Image(str(run_dir / doc["figures"]["predictions"]))
    run.summary.update(summary)
    run.log(payload)
    run.summary.update(summary)  # logging media must not shadow the numbers


def write_report(doc: dict[str, Any], run_dir: Path, wandb_run: Any = None) -> dict[str, Any]:
    """metrics.json + report.md (+ W&B when a run is given); returns `doc`."""
    from scfs.eval.report import json_default

    if wandb_run is not None:
        log_wandb(wandb_run, doc, run_dir)
    (run_dir / "metrics.json").write_text(json.dumps(doc, indent=2, default=json_default))
    (run_dir / "report.md").write_text(markdown_report(doc))
    return doc


def json_safe(obj: Any) -> Any:
    """Plain containers (numpy scalars to Python) for metrics.json."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    return obj

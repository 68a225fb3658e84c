"""Side-by-side markdown table of evaluation runs: `python -m scfs.eval.compare RUN [RUN ...]`.

A RUN is an eval run folder (holding `metrics.json`), a `metrics.json` file, or a glob of either
(`'runs/eval/knn-*'`). Columns are the evaluated checkpoints (runs of the same checkpoint - say its kNN and its
linear probe - share a column), rows the metrics of every kind; the best value of a row is in bold. Typical use:
SCFS vs DINO vs random init (`ckpt=random`) on the same data. Detection runs (`python -m scfs.eval.detect`) add
COCO AP rows per detector and IoU type (`mask_rcnn bbox AP`, `... AP50`, `... AP75`, `... APs/APm/APl`).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEADLINE = ("top1", "top5")
DETECTION_STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl")  # COCOeval's headline numbers (percent)


def find_runs(patterns: Sequence[str]) -> list[Path]:
    """metrics.json files named by run folders / files / globs, in the order given (duplicates dropped)."""
    out: list[Path] = []
    for pat in patterns:
        matches = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
        if not matches:
            raise FileNotFoundError(f"{pat!r} matches no eval run")
        for m in matches:
            p = Path(m)
            f = p if p.is_file() else p / "metrics.json"
            if not f.is_file():
                raise FileNotFoundError(f"{p} is not an eval run: no metrics.json "
                                        "(run python -m scfs.eval.knn/linear/detect)")
            if f.resolve() not in [o.resolve() for o in out]:
                out.append(f)
    return out


def load_run(path: Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    doc.setdefault("run_dir", str(Path(path).parent))
    return doc


def _kind_name(doc: dict[str, Any]) -> str:
    if doc["kind"] == "detect":  # detection rows name the detector: Faster and Mask R-CNN runs stay apart
        return (doc.get("model") or {}).get("arch") or "detect"
    if doc["kind"] == "linear":
        return "linear (fast)" if (doc.get("config") or {}).get("fast") else "linear"
    return doc["kind"]


def _rows(doc: dict[str, Any], all_metrics: bool) -> list[tuple[str, float]]:
    kind, m = _kind_name(doc), doc["metrics"]
    rows = []
    if doc["kind"] == "knn" and doc.get("knn_curve"):
        k = doc.get("report_k") or (doc.get("config") or {}).get("report_k", 20)
        rows += [(f"{kind} top-1 (k={k})", m["top1"])] + ([(f"{kind} top-5 (k={k})", m["top5"])] if "top5" in m else [])
        if all_metrics:
            for r in doc["knn_curve"]:
                rows += [(f"{kind} top-1 k={r['k']}", r["top1"])]
                if "top5" in r:
                    rows += [(f"{kind} top-5 k={r['k']}", r["top5"])]
    elif doc["kind"] == "detect":  # COCO AP per IoU type; None (no ground truth in a size range) is left out
        for iou in doc.get("iou_types") or ("bbox", "segm"):
            rows += [(f"{kind} {iou} {k}", m[f"{iou}/{k}"]) for k in DETECTION_STATS
                     if m.get(f"{iou}/{k}") is not None]
    else:
        rows += [(f"{kind} top-{h[3:]}", m[h]) for h in HEADLINE if h in m]
    return rows


def compare_table(docs: Sequence[dict[str, Any]], all_metrics: bool = False) -> str:
    """The markdown table (checkpoints as columns, metrics as rows, best per row in bold)."""
    columns: list[dict[str, Any]] = []  # {"label", "id", "values": {row: value}, "data"}
    row_order: list[str] = []
    for doc in docs:
        ck = doc["checkpoint"]
        rows = _rows(doc, all_metrics)
        data = doc["data"].get("name")
        col = next((c for c in columns if c["id"] == (ck["id"], ck["which"], data)
                    and not set(c["values"]) & {r for r, _ in rows}), None)
        if col is None:
            col = {"label": ck.get("label") or ck["id"], "id": (ck["id"], ck["which"], data), "values": {},
                   "info": f"`{ck['id'][:12]}` {ck['which']}" if ck.get("format") != "random" else "random init",
                   "data": data}
            columns.append(col)
        for r, v in rows:
            col["values"][r] = v
            if r not in row_order:
                row_order.append(r)
    header = "| metric | " + " | ".join(c["label"] for c in columns) + " |"
    lines = [header, "|---" + "|---:" * len(columns) + "|"]
    lines.append("| checkpoint | " + " | ".join(c["info"] for c in columns) + " |")
    lines.append("| data | " + " | ".join(str(c["data"]) for c in columns) + " |")
    for r in row_order:
        vals = [c["values"].get(r) for c in columns]
        present = [v for v in vals if v is not None]
        best = max(present) if len(present) > 1 else None
        cells = ["-" if v is None else (f"**{v:.2f}**" if v == best else f"{v:.2f}") for v in vals]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m scfs.eval.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="eval run folders, metrics.json files or globs")
    ap.add_argument("--all", action="store_true", help="also every k of the kNN runs")
    ap.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    try:
        docs = [load_run(p) for p in find_runs(args.runs)]
    except FileNotFoundError as err:
        ap.error(str(err))
    table = compare_table(docs, args.all)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return table


if __name__ == "__main__":
    main(sys.argv[1:])

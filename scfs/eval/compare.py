"""Side-by-side markdown table of evaluation runs, or the table of a study: `python -m scfs.eval.compare RUN [RUN ...]`.

A RUN is an eval run folder (holding `metrics.json`), a `metrics.json` file, or a glob of either
(`'runs/eval/knn-*'`). Columns are the evaluated checkpoints (runs of the same checkpoint - say its kNN and its
linear probe - share a column), rows the metrics of every kind; the best value of a row is in bold. Typical use:
SCFS vs DINO vs random init (`ckpt=random`) on the same data. Detection runs (`python -m scfs.eval.detect`) add
COCO AP rows per detector and IoU type (`mask_rcnn bbox AP`, `... AP50`, `... AP75`, `... APs/APm/APl`).

A multirun folder (`runs/multirun/<date>/<time>`, the one holding `multirun.yaml`) is a study: its jobs are grouped
by configuration (all overrides but `seed`, `resume`, `chunk_minutes`) and each group gets mean ± std over its
seeds of the final kNN top-1, the linear probe's top-1 (where a job folder holds a linear probe's `metrics.json`)
and the wall clock; the table goes to `<study>/study.md`, the numbers with every job's to `<study>/study.json`, and
the kNN against epochs (mean line, ± std band over seeds, from each job's `knn_curve.json`) to
`<study>/study_knn.png`.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
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


# ---- a study: the jobs of one multirun, grouped by configuration --------------------------------------------------
def is_study(path: str | Path) -> bool:
    """A multirun folder: Hydra writes `multirun.yaml` into it."""
    return (Path(path) / "multirun.yaml").is_file()


def _linear_top1(job_dir: Path) -> float | None:
    """Top-1 of a linear probe whose metrics.json lies in the job folder (the newest if several)."""
    found = []
    for f in job_dir.glob("**/metrics.json"):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("kind") == "linear" and "top1" in (doc.get("metrics") or {}):
            found.append((f.stat().st_mtime, float(doc["metrics"]["top1"])))
    return max(found)[1] if found else None


def study_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job folder of a multirun (linked ones, reused from an earlier multirun, too): its overrides, summary
    (None while running, after a failure or when stopped by its chunk budget), kNN curve and linear probe top-1."""
    from scfs.study import is_finished, job_overrides

    jobs = []
    for d in sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir() and (p / ".hydra").is_dir()),
                    key=lambda p: (len(p.name), p.name)):
        summary = json.loads((d / "summary.json").read_text()) if is_finished(d) else None  # not a chunk's end
        curve = json.loads((d / "knn_curve.json").read_text()) if (d / "knn_curve.json").is_file() else []
        jobs.append({"dir": str(d), "overrides": job_overrides(d), "summary": summary, "knn_curve": curve,
                     "linear_top1": _linear_top1(d)})
    return jobs


def _stats(values: list[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (n - 1; 0 for one value) of the seeds' values."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values} if values else {"mean": None, "std": None, "n": 0, "values": []}


def _seed(overrides: list[str]) -> str | None:
    return next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == "seed"), None)


def study_groups(jobs: list[dict[str, Any]], k: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Jobs grouped by configuration (first appearance order), with the statistics of the finished ones; the label
    of a group is what sets it apart from the others. Returns the groups and the kNN k they report."""
    from scfs.study import configuration_key, distinguishing

    finished = [j for j in jobs if j["summary"]]
    if k is None:
        keys = [key for j in finished for key in j["summary"].get("knn", {}) if key.startswith("top1_k")]
        k = int(keys[0][len("top1_k"):]) if keys else 20
    keys = [configuration_key(j["overrides"]) for j in jobs]
    apart = distinguishing([list(c) for c in keys])
    labels = dict(zip(keys, (" ".join(lbl) or "(one configuration)" for lbl in apart)))
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, job in zip(keys, jobs):
        g = groups.setdefault(key, {"config": list(key), "label": labels[key], "jobs": [], "unfinished": []})
        (g["jobs"] if job["summary"] else g["unfinished"]).append(job)
    for g in groups.values():
        done = g["jobs"]
        g["seeds"] = [_seed(j["overrides"]) for j in done]
        g["knn"] = _stats([float(j["summary"]["knn"][f"top1_k{k}"]) for j in done
                           if f"top1_k{k}" in j["summary"].get("knn", {})])
        g["linear"] = _stats([j["linear_top1"] for j in done if j["linear_top1"] is not None])
        g["seconds"] = _stats([float(j["summary"]["seconds"]) for j in done if "seconds" in j["summary"]])
    return list(groups.values()), k


def _cell(st: dict[str, Any], fmt: str = ".1f") -> str:
    if not st["n"]:
        return "-"
    return f"{st['mean']:{fmt}} ± {st['std']:{fmt}}" if st["n"] > 1 else f"{st['mean']:{fmt}} (one seed)"


def study_table(groups: list[dict[str, Any]], k: int) -> str:
    """One row per configuration: seeds, kNN top-1, linear top-1 and wall clock as mean ± std over the seeds."""
    lines = [f"| configuration | seeds | kNN top-1 (k={k}) | linear top-1 | wall clock s | not finished |",
             "|---|---|---:|---:|---:|---:|"]
    for g in groups:
        seeds = ",".join(str(s) for s in g["seeds"]) or "-"
        lines.append(f"| {g['label']} | {seeds} | {_cell(g['knn'])} | {_cell(g['linear'])} | "
                     f"{_cell(g['seconds'], '.0f')} | {len(g['unfinished'])} |")
    return "\n".join(lines)


def study_figure(groups: list[dict[str, Any]], k: int, out: Path) -> Path | None:
    """kNN top-1 against epochs per configuration: the mean over seeds and a ± std band, at the epochs every seed
    of the group has a point for (the runs' `knn_curve.json`). None when no job has a curve."""
    from scfs.plotting import new_figure

    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    drawn = False
    for g in groups:
        curves = [{p["epoch"]: p[f"top1_k{k}"] for p in j["knn_curve"] if f"top1_k{k}" in p} for j in g["jobs"]]
        curves = [c for c in curves if c]
        if not curves:
            continue
        epochs = sorted(set.intersection(*(set(c) for c in curves)))
        stats = [_stats([c[e] for c in curves]) for e in epochs]
        mean = [s["mean"] for s in stats]
        ax.plot(epochs, mean, marker="o", label=f"{g['label']} (n={len(curves)})")
        ax.fill_between(epochs, [m - s["std"] for m, s in zip(mean, stats)],
                        [m + s["std"] for m, s in zip(mean, stats)], alpha=0.25)
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"kNN top-1 (k={k}), %")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    return out


def compare_study(sweep_dir: str | Path, k: int | None = None, out: Path | None = None,
                  figure: bool = True) -> str:
    """The study table of a multirun folder, also written as `study.md` and `study.json` (and the figure)."""
    sweep_dir = Path(sweep_dir)
    groups, k = study_groups(study_jobs(sweep_dir), k)
    if not groups:
        raise FileNotFoundError(f"{sweep_dir} holds no job folders (<job>/.hydra): is it a multirun folder?")
    table = study_table(groups, k)
    out = out or sweep_dir / "study.md"
    fig = study_figure(groups, k, out.with_name(out.stem + "_knn.png")) if figure else None
    record = {"study": str(sweep_dir), "k": k, "figure": str(fig) if fig else None,
              "groups": [{key: g[key] for key in ("label", "config", "seeds", "knn", "linear", "seconds")}
                         | {"jobs": [j["dir"] for j in g["jobs"]], "unfinished": [j["dir"] for j in g["unfinished"]]}
                         for g in groups]}
    out.write_text(f"Study: `{sweep_dir}` (mean ± sample std over seeds)\n\n{table}\n")
    out.with_suffix(".json").write_text(json.dumps(record, indent=2))
    return table


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m scfs.eval.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="eval run folders, metrics.json files or globs; or one multirun folder")
    ap.add_argument("--all", action="store_true", help="also every k of the kNN runs")
    ap.add_argument("--out", type=Path, help="also write the table to this markdown file (a study: instead of "
                    "<study>/study.md; the JSON and the figure go beside it)")
    ap.add_argument("--k", type=int, help="a study: the kNN k to report (default: the runs' first)")
    ap.add_argument("--no-figure", action="store_true", help="a study: no figure")
    args = ap.parse_args(argv)
    if any(is_study(r) for r in args.runs):
        if len(args.runs) != 1:
            ap.error("a multirun folder is compared on its own: one folder per call")
        try:
            table = compare_study(args.runs[0], args.k, args.out, figure=not args.no_figure)
        except FileNotFoundError as err:
            ap.error(str(err))
        print(table)
        return table
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

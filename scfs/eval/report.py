"""Evaluation reports: the same numbers in W&B (offline by default) and in the run folder.

Files (always): `metrics.json` (machine-readable; `scfs.eval.compare` reads it), `report.md` (for people and
commits), `confusion.png`, `per_class.png` and, for kNN, `knn_vs_k.png`. W&B (when installed and enabled): the
summary metrics, the config, the checkpoint id, a per-class accuracy table, the confusion-matrix image and the
kNN accuracy-vs-k table/plot, in `<run_dir>/wandb/`. Without wandb the files are written and a log line says so.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scfs.plotting import new_figure

log = logging.getLogger("scfs.eval.report")
_ENV_SET: dict[str, str] = {}  # W&B folders this process pointed at a run dir (so the next run may move them)


# ---- numbers -----------------------------------------------------------------------------------------------
def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> np.ndarray:
    """(true, predicted) counts."""
    idx = labels.long() * num_classes + preds.long()
    return torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes).numpy()


def per_class_accuracy(confusion: np.ndarray, names: Sequence[str]) -> list[dict[str, Any]]:
    n = confusion.sum(1)
    correct = np.diag(confusion)
    return [{"class": i, "name": names[i], "n": int(n[i]), "correct": int(correct[i]),
             "accuracy": float(100.0 * correct[i] / n[i]) if n[i] else float("nan")} for i in range(len(names))]


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Top-k accuracy in percent from (N, C) scores; top-5 is skipped when there are 5 classes or fewer."""
    out: dict[str, float] = {}
    kmax = min(max(ks), scores.shape[1])
    top = scores.topk(kmax, dim=1).indices
    for k in ks:
        if k > 1 and scores.shape[1] <= k:
            continue
        out[f"top{k}"] = 100.0 * (top[:, :k] == labels[:, None]).any(1).double().mean().item()
    return out


@dataclass
class EvalResult:
    """One evaluation: what was evaluated, on what, and the numbers."""

    kind: str  # knn | linear
    metrics: dict[str, float]
    checkpoint: dict[str, Any]
    data: dict[str, Any]
    class_names: list[str]
    confusion: np.ndarray
    config: dict[str, Any] = field(default_factory=dict)
    knn_curve: list[dict[str, float]] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # kind-specific top-level entries of metrics.json

    @property
    def per_class(self) -> list[dict[str, Any]]:
        return per_class_accuracy(self.confusion, self.class_names)


# ---- figures (matplotlib's Agg canvas directly: no pyplot, no global backend switch in notebooks) -------------
def _save(fig, ax, title: str, path: Path) -> Path:
    """Title the report figure's axes, lay it out and write it to `path`."""
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_confusion(confusion: np.ndarray, names: Sequence[str], path: Path, title: str) -> Path:
    n = len(names)
    fig = new_figure(max(4.0, 0.45 * n + 2), max(3.5, 0.45 * n + 1.5))
    ax = fig.add_subplot()
    rows = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
    im = ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="fraction of true class")
    if n <= 30:
        ax.set_xticks(range(n), labels=names, rotation=90, fontsize=7)
        ax.set_yticks(range(n), labels=names, fontsize=7)
        for i in range(n):
            for j in range(n):
                if confusion[i, j]:
                    ax.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=6,
                            color="white" if rows[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    return _save(fig, ax, title, path)


def plot_per_class(per_class: list[dict[str, Any]], path: Path, title: str) -> Path:
    fig = new_figure(max(4.0, 0.3 * len(per_class) + 1.5), 3.2)
    ax = fig.add_subplot()
    ax.bar(range(len(per_class)), [r["accuracy"] for r in per_class], color="tab:blue")
    if len(per_class) <= 40:
        ax.set_xticks(range(len(per_class)), labels=[r["name"] for r in per_class], rotation=90, fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)")
    return _save(fig, ax, title, path)


def plot_knn_curve(curve: list[dict[str, float]], path: Path, title: str) -> Path:
    fig = new_figure(4.5, 3.2)
    ax = fig.add_subplot()
    ks = [r["k"] for r in curve]
    for key in ("top1", "top5"):
        if all(key in r for r in curve):
            ax.plot(ks, [r[key] for r in curve], marker="o", label=key)
    ax.set_xscale("log")
    ax.set_xticks(ks, labels=[str(k) for k in ks])
    ax.set_xlabel("k")
    ax.set_ylabel("accuracy (%)")
    ax.legend()
    return _save(fig, ax, title, path)


# ---- W&B ---------------------------------------------------------------------------------------------------
def wandb_env(run_dir: Path) -> None:
    """Keep W&B's cache/config/data folders inside the run dir (it writes to ~/.cache otherwise), unless the user
    chose them."""
    base = run_dir / "wandb_files"
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        if var not in os.environ or _ENV_SET.get(var) == os.environ[var]:
            os.environ[var] = _ENV_SET[var] = str(base / var.split("_")[1].lower())
    os.environ.setdefault("WANDB_SILENT", "true")


class EvalLogger:
    """Owns the run folder's W&B run (or its absence) for one evaluation.

    `lightning_logger()` hands the same W&B run to a Lightning Trainer (the linear probe's curves);
    `write(result)` logs the final report there and writes the files.
    """

    def __init__(self, run_dir: Path, logger_cfg: Mapping[str, Any] | None, name: str,
                 config: Mapping[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run: Any = None
        cfg = dict(logger_cfg or {})
        self.mode = cfg.get("mode", "offline")
        if not cfg.get("wandb", True) or cfg.get("mode", "offline") == "disabled":
            return
        try:
            import wandb
        except ImportError:
            log.warning("wandb is not installed: writing the report files in %s only", self.run_dir)
            return
        wandb_env(self.run_dir)
        self.run = wandb.init(project=cfg.get("project", "scfs-eval"), entity=cfg.get("entity"), name=name,
                              dir=str(self.run_dir), mode=cfg.get("mode", "offline"), config=dict(config or {}),
                              job_type="eval", reinit="finish_previous",
                              settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))

    @property
    def wandb_dir(self) -> str | None:
        d = getattr(self.run, "dir", None)
        return str(Path(d).parent) if d else None

    def lightning_logger(self):
        """A Lightning logger writing into this evaluation's W&B run (CSV in the run dir without W&B)."""
        if self.run is not None:
            from lightning.pytorch.loggers import WandbLogger

            return WandbLogger(experiment=self.run)
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(self.run_dir), name="csv")

    def write(self, result: EvalResult) -> dict[str, Any]:
        """Figures, W&B summary/tables/images, metrics.json and report.md; returns the metrics.json content."""
        figs = write_figures(result, self.run_dir)
        if self.run is not None:
            self._log_wandb(result, figs)
        doc = metrics_document(result, figs, self.wandb_dir)
        (self.run_dir / "metrics.json").write_text(json.dumps(doc, indent=2, default=json_default))
        (self.run_dir / "report.md").write_text(markdown_report(doc))
        return doc

    def _log_wandb(self, result: EvalResult, figs: dict[str, str]) -> None:
        import wandb

        run = self.run
        run.config.update({"checkpoint": result.checkpoint, "data_eval": result.data}, allow_val_change=True)
        summary = {f"{result.kind}/{k}": v for k, v in result.metrics.items()}
        summary.update({"checkpoint_id": result.checkpoint.get("id"), "checkpoint_path": result.checkpoint.get("path")})
        run.summary.update(summary)
        cols = ["class", "name", "n", "correct", "accuracy"]
        table = wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in result.per_class])
        payload: dict[str, Any] = {f"{result.kind}/per_class": table,
                                   f"{result.kind}/confusion": wandb.Image(figs["confusion"]),
                                   f"{result.kind}/per_class_plot": wandb.Image(figs["per_class"])}
        if result.knn_curve:
            cols = [c for c in ("k", "top1", "top5") if all(c in r for r in result.knn_curve)]
            curve = wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in result.knn_curve])
            payload[f"{result.kind}/accuracy_vs_k"] = wandb.plot.line(curve, "k", "top1", title="kNN top-1 vs k")
            payload[f"{result.kind}/accuracy_vs_k_table"] = curve
            payload[f"{result.kind}/accuracy_vs_k_plot"] = wandb.Image(figs["knn_vs_k"])
        run.log(payload)
        run.summary.update(summary)  # logging media must not shadow the numbers

    def finish(self, timeout_s: float = 30.0) -> None:
        """Finish the W&B run and wait (bounded) until its transaction log holds the exit record: wandb-core
        flushes the .wandb file asynchronously, and the run folder should be complete when the CLI returns."""
        if self.run is None:
            return
        wandb_dir = self.wandb_dir
        self.run.finish()
        self.run = None
        if wandb_dir and self.mode == "offline":
            deadline = time.monotonic() + timeout_s
            while not wandb_run_complete(wandb_dir):
                if time.monotonic() > deadline:
                    log.warning("W&B run %s: no exit record after %.0fs; the file may still be written", wandb_dir,
                                timeout_s)
                    break
                time.sleep(0.1)

    def __enter__(self) -> EvalLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()


def json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_figures(result: EvalResult, run_dir: Path) -> dict[str, str]:
    title = f"{result.kind} - {result.checkpoint.get('label')} - {result.data.get('name')}"
    figs = {"confusion": str(plot_confusion(result.confusion, result.class_names, run_dir / "confusion.png", title)),
            "per_class": str(plot_per_class(result.per_class, run_dir / "per_class.png", title))}
    if result.knn_curve:
        figs["knn_vs_k"] = str(plot_knn_curve(result.knn_curve, run_dir / "knn_vs_k.png", title))
    return figs


def metrics_document(result: EvalResult, figs: Mapping[str, str], wandb_dir: str | None) -> dict[str, Any]:
    return {"kind": result.kind, "metrics": result.metrics, "checkpoint": result.checkpoint, "data": result.data,
            "knn_curve": result.knn_curve, "per_class": result.per_class, "confusion": result.confusion.tolist(),
            "class_names": result.class_names, "timings": result.timings, "notes": result.notes,
            "figures": {k: Path(v).name for k, v in figs.items()}, "wandb_dir": wandb_dir, **result.extra,
            "config": result.config}


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def run_facts(doc: Mapping[str, Any]) -> list[str]:
    """The report lines every eval kind shares: timings, notes and the W&B run folder."""
    lines = [f"* {k}: {v:.1f} s" for k, v in doc.get("timings", {}).items()]
    lines += [f"* {n}" for n in doc.get("notes", [])]
    if doc.get("wandb_dir"):
        lines.append(f"* W&B run: `{doc['wandb_dir']}`")
    return lines


def markdown_report(doc: Mapping[str, Any]) -> str:
    ck, data = doc["checkpoint"], doc["data"]
    lines = [f"# {doc['kind']} evaluation: {ck.get('label')}", "",
             f"* checkpoint: `{ck.get('path')}` (id `{ck.get('id')}`, {ck.get('format')}, {ck.get('which')})",
             f"* data: {data.get('name')} ({data.get('n_train')} train / {data.get('n_val')} val images, "
             f"{data.get('num_classes')} classes, transform `{data.get('transform')}`)"]
    lines += run_facts(doc)
    lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in doc["metrics"].items()]
    if doc.get("knn_curve"):
        cols = [c for c in ("top1", "top5") if all(c in r for r in doc["knn_curve"])]
        lines += ["", "## kNN accuracy vs k", "", "| k | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        lines += [f"| {r['k']} | " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in doc["knn_curve"]]
        lines += ["", f"![kNN vs k]({doc['figures'].get('knn_vs_k')})"]
    lines += ["", "## Per-class accuracy", "", "| class | name | n | correct | accuracy |", "|---|---|---|---|---|"]
    lines += [f"| {r['class']} | {r['name']} | {r['n']} | {r['correct']} | {_fmt(r['accuracy'])} |"
              for r in doc["per_class"]]
    lines += ["", f"![per-class accuracy]({doc['figures'].get('per_class')})", "", "## Confusion matrix", "",
              f"![confusion matrix]({doc['figures'].get('confusion')})", ""]
    return "\n".join(lines)


# ---- reading W&B offline runs back -------------------------------------------------------------------------
_BLOCK = 32 * 1024
_HEADER = 7  # b":W&B" + 2-byte magic + 1-byte version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path: str | os.PathLike) -> Iterator[Any]:
    """The protobuf `Record`s of a `run-*.wandb` transaction log (LevelDB log framing, wandb's own proto).

    wandb >= 0.2x writes these from its Go core and no longer ships a Python reader (`DataStore`), so this
    decodes the framing and hands each payload to `wandb.proto.wandb_internal_pb2.Record`.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:7]!r})")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < 7:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += room
            continue
        if pos + 7 + length > len(data):  # a record still being written
            return
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            payload = chunk
        elif kind == _FIRST:
            pending = chunk
            continue
        elif kind == _MIDDLE:
            pending += chunk
            continue
        elif kind == _LAST:
            payload, pending = pending + chunk, b""
        else:
            raise ValueError(f"{path}: unknown record type {kind} at byte {pos}")
        rec = pb.Record()
        rec.ParseFromString(payload)
        yield rec


def wandb_run_complete(run_dir: str | os.PathLike) -> bool:
    """Whether the run's transaction log is there and ends with its exit record."""
    try:
        return any(rec.WhichOneof("record_type") == "exit" for rec in read_wandb_records(find_wandb_file(run_dir)))
    except (FileNotFoundError, ValueError):
        return False


def find_wandb_file(run_dir: str | os.PathLike) -> Path:
    """The newest `run-*.wandb` under `run_dir` (an eval run folder or a W&B run folder)."""
    p = Path(run_dir)
    if p.is_file():
        return p
    found = sorted(p.rglob("run-*.wandb"), key=lambda f: f.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no W&B run file (run-*.wandb) under {p}")
    return found[-1]


def read_wandb_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The final summary of an offline W&B run, replayed from its summary records."""
    summary: dict[str, Any] = {}
    for rec in read_wandb_records(find_wandb_file(run_dir)):
        if rec.WhichOneof("record_type") != "summary":
            continue
        for item in rec.summary.update:
            key = item.key or ".".join(item.nested_key)
            summary[key] = json.loads(item.value_json)
        for item in rec.summary.remove:
            summary.pop(item.key or ".".join(item.nested_key), None)
    return summary

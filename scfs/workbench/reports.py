"""Notebook 3's evaluation report: kNN and linear probe of several checkpoints, then one W&B run holding it all.

Uses the evaluation CLIs' functions (`scfs.eval.knn.run_knn`, `scfs.eval.linear.run_linear` with `fast=true`)
on the training config's data, so the numbers are the ones the CLIs print. If those are unavailable or fail for a
checkpoint, a minimal in-process path (pooled features, `knn_evaluate`, a logistic regression on the features)
fills in and says so: the report is produced either way. The figures and the table are `scfs.viz.eval_report`'s.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scfs.viz.eval_report import checkpoint_label

log = logging.getLogger("scfs.workbench.reports")


def eval_overrides(train_cfg: Any) -> list[str]:
    """Overrides that point an eval config (conf/eval/*.yaml) at the training config's data and backbone (the
    backbone matters for `ckpt=random` only; our checkpoints carry their own)."""
    from omegaconf import OmegaConf

    def value(v: Any) -> str:
        if isinstance(v, str):
            return v if re.fullmatch(r"[A-Za-z0-9_./-]+", v) else "'" + v.replace("'", "\\'") + "'"
        return json.dumps(v)

    out = []
    for group in ("data", "backbone"):
        for k, v in OmegaConf.to_container(train_cfg[group], resolve=True).items():
            out.append(f"++{group}.{k}={value(v)}")
    return out


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "run"


def evaluate_checkpoints(checkpoints: Mapping[str, str], train_cfg: Any, out_dir: str | Path, *,
                         ks: Sequence[int] = (1, 5, 10, 20, 50), linear_epochs: int = 100,
                         extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """kNN and fast linear probe of each `{label: ckpt path or 'random'}`; returns the metrics documents (the
    `metrics.json` of each eval run under `out_dir/<kind>-<label>/`). A failing checkpoint is reported and
    skipped; the others go on."""
    out_dir = Path(out_dir)
    docs: list[dict[str, Any]] = []
    common = [*eval_overrides(train_cfg), "logger.wandb=false", "progress=false",
              f"feature_cache={out_dir / 'feature_cache'}", f"ks={json.dumps(list(ks))}",
              f"report_k={20 if 20 in ks else ks[-1]}", *extra]
    for label, ckpt in checkpoints.items():
        for kind in ("knn", "linear"):
            run_dir = out_dir / f"{kind}-{_slug(label)}"
            t0 = time.time()
            try:
                docs.append(_run_cli(kind, ckpt, label, common, linear_epochs, run_dir))
            except Exception as err:  # one bad checkpoint must not sink the report
                log.warning("%s of %s via scfs.eval failed (%s: %s); using the in-process fallback", kind, label,
                            type(err).__name__, err)
                try:
                    docs.append(_fallback(kind, ckpt, label, train_cfg, ks, linear_epochs, run_dir))
                except Exception as err2:
                    print(f"{kind} of {label} ({ckpt}) failed: {type(err2).__name__}: {err2}")
                    continue
            print(f"{kind:6s} {label}: top-1 {docs[-1]['metrics']['top1']:.1f}% ({time.time() - t0:.1f}s) "
                  f"-> {run_dir}")
    return docs


def _run_cli(kind: str, ckpt: str, label: str, common: list[str], epochs: int, run_dir: Path) -> dict[str, Any]:
    from scfs.eval.common import compose_eval_cfg

    if kind == "knn":
        from scfs.eval.knn import run_knn

        return run_knn(compose_eval_cfg("knn", [f"ckpt={ckpt}", f"label={label}", *common]), run_dir)
    from scfs.eval.linear import run_linear

    lin = [o for o in common if not o.startswith(("ks=", "report_k="))]
    return run_linear(compose_eval_cfg("linear", [f"ckpt={ckpt}", f"label={label}", "fast=true",
                                                  f"probe.epochs={epochs}", *lin]), run_dir)


def _fallback(kind: str, ckpt: str, label: str, train_cfg: Any, ks: Sequence[int], epochs: int,
              run_dir: Path) -> dict[str, Any]:
    """Pooled features of the eval view -> kNN curve, or a full-batch logistic regression: no scfs.eval CLI."""
    import torch

    from scfs.eval.features import extract_pooled
    from scfs.eval.knn import knn_evaluate
    from scfs.models.backbone import load_backbone
    from scfs.train import build
    from scfs.workbench import backbone_cfg

    torch.manual_seed(0)
    bb = load_backbone(ckpt, backbone_cfg=backbone_cfg(train_cfg) if ckpt == "random" else None)
    dm, _ = build(train_cfg)
    bank, query = dm.knn_loaders()
    tr_f, tr_y = extract_pooled(bb, bank, l2=True)
    te_f, te_y = extract_pooled(bb, query, l2=True)
    n_cls = int(max(tr_y.max(), te_y.max())) + 1
    curve = None
    if kind == "knn":
        res = knn_evaluate(tr_f, tr_y, te_f, te_y, list(ks), 0.07, n_cls, 20 if 20 in ks else ks[-1])
        pred, curve = res.scores.argmax(1), res.curve
        top1 = res.metrics[f"top1_k{res.report_k}"]
    else:
        lin = torch.nn.Linear(tr_f.shape[1], n_cls)
        opt = torch.optim.LBFGS(lin.parameters(), max_iter=max(epochs, 20))

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(lin(tr_f), tr_y) + 1e-4 * lin.weight.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            pred = lin(te_f).argmax(1)
        top1 = 100.0 * (pred == te_y).double().mean().item()
    conf = np.zeros((n_cls, n_cls), dtype=np.int64)
    np.add.at(conf, (te_y.numpy(), pred.numpy()), 1)
    names = list(getattr(query.dataset, "classes", [])) or [str(i) for i in range(n_cls)]
    per_class = [{"class": i, "name": names[i], "n": int(conf[i].sum()), "correct": int(conf[i, i]),
                  "accuracy": float(100.0 * conf[i, i] / conf[i].sum()) if conf[i].sum() else float("nan")}
                 for i in range(n_cls)]
    doc = {"kind": kind, "metrics": {"top1": top1}, "checkpoint": {"label": label, "path": ckpt, "id": label,
                                                                   "which": "teacher"},
           "data": {"name": train_cfg.data.name}, "knn_curve": curve, "per_class": per_class,
           "notes": ["fallback path (scfs.eval CLI unavailable): " + ("kNN T=0.07" if kind == "knn"
                                                                       else "L-BFGS logistic regression")],
           "config": {"fast": True}, "run_dir": str(run_dir)}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").write_text(json.dumps(doc, indent=2))
    return doc


def log_report_to_wandb(docs: Sequence[Mapping[str, Any]], figures: Mapping[str, str | Path], table: str,
                        run_dir: str | Path, project: str = "scfs-notebooks", name: str = "linear-eval-report",
                        mode: str | None = None) -> str | None:
    """One W&B run (offline unless `mode`/WANDB_MODE says otherwise) holding the summary metrics of every
    checkpoint, the comparison table and the figures; returns its folder (None without wandb)."""
    import os

    try:
        import wandb
    except ImportError:
        print("wandb is not installed: the report stays in", run_dir)
        return None
    try:
        run = wandb.init(project=project, name=name, dir=str(run_dir),
                         mode=mode or os.environ.get("WANDB_MODE", "offline"), job_type="report",
                         reinit="finish_previous", settings=wandb.Settings(silent=True, console="off",
                                                                            x_disable_stats=True))
    except Exception as err:  # a broken W&B set-up must not lose the report: the files are written already
        print(f"W&B logging failed ({type(err).__name__}: {err}); the report stays in {run_dir}")
        return None
    try:
        rows = [[checkpoint_label(d), d["kind"], float(d["metrics"]["top1"]),
                 float(d["metrics"].get("top5", float("nan")))] for d in docs]
        payload: dict[str, Any] = {"report/top1": wandb.Table(columns=["checkpoint", "kind", "top1", "top5"],
                                                              data=rows),
                                   "report/compare_markdown": wandb.Html(f"<pre>{table}</pre>")}
        payload.update({f"report/{k}": wandb.Image(str(v)) for k, v in figures.items()})
        run.log(payload)
        run.summary.update({f"{d['kind']}/{checkpoint_label(d)}/top1": float(d["metrics"]["top1"]) for d in docs})
        return str(Path(run.dir).parent)
    finally:
        run.finish()

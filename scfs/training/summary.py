"""What a finished run reports: `summary.json` (kNN of the trained teacher, losses against their uniform levels,
the checkpoint, the W&B folder, what was skipped) and the one line printed at the end.

The kNN runs outside the Trainer, on the device `eval_device` picks, so the numbers before and after training
come from the same code path and the same device.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from scfs.names import search_label
from scfs.training.loggers import wandb_run_dir
from scfs.training.setup import eval_device

log = logging.getLogger("scfs.train")  # the run's messages, whichever module says them


def teacher_knn(model: Any, bank: Any, query: Any, ks: list[int], cfg: DictConfig) -> dict[str, float]:
    """kNN of the teacher outside the Trainer (before fit, after its teardown) on `eval_device`; the backbone
    goes back where it was, so the whole module moves to its device together in `trainer.fit`."""
    from scfs.eval.knn import evaluate_backbone_knn

    teacher, dev = model.backbone("teacher"), eval_device(cfg)
    home = next(teacher.parameters()).device
    try:
        return evaluate_backbone_knn(teacher.to(dev), bank, query, ks, cfg.eval.knn_temperature, device=dev)
    finally:
        teacher.to(home)


def start_summary(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The keys every process's summary has (the others are added by rank 0 after training)."""
    return {"name": cfg.name, "method": cfg.method.name, "search": search_label(cfg.search), "run_dir": str(run_dir)}


def summarise(summary: dict[str, Any], cfg: DictConfig, trainer: Any, model: Any, dm: Any, knn_data: tuple[Any, Any],
              last: Any, budget: Any, t0: float) -> dict[str, Any]:
    """Complete `summary` on rank 0 after training (kNN, losses, checkpoint, W&B folder, steps, seconds, epoch
    seconds and steady img/s, skipped files, figure), log the final kNN, write `<run_dir>/summary.json` and print
    `summary_line`. `knn_data` is the (bank, query) loader pair, `last` the run's `LastCheckpoint`, `budget` its
    `WallClockBudget` or None."""
    import torch

    run_dir, logger, ks = Path(summary["run_dir"]), trainer.logger, list(cfg.eval.knn_k)
    bank, query = knn_data
    summary["knn"] = teacher_knn(model, bank, query, ks, cfg)  # teardown moved the module to the CPU
    summary["loss"] = float(trainer.callback_metrics.get("loss_epoch", float("nan")))
    summary["loss_dino"] = float(trainer.callback_metrics.get("loss/dino", float("nan")))
    summary["uniform_loss"] = model.uniform_loss()
    summary["uniform_loss_dino"] = float(torch.log(torch.tensor(float(cfg.method.out_dim))))
    summary["checkpoint"] = str(last.path)
    summary["wandb_dir"] = wandb_run_dir(logger)
    summary["epochs"] = trainer.current_epoch
    summary["steps"] = trainer.global_step
    summary["seconds"] = round(time.time() - t0, 1)
    from scfs.training.callbacks import EpochTimer

    timer = next((c for c in trainer.callbacks if isinstance(c, EpochTimer)), None)
    if timer is not None:
        summary.update(timer.report(int(getattr(dm, "batch_size", cfg.batch_size)) * trainer.world_size))
    from scfs.training.background_compile import ChildCompile

    child = next((c for c in trainer.callbacks if isinstance(c, ChildCompile)), None)
    if child is not None:  # compile_background / compile_parallel: what the child did for the run
        summary[child.summary_key] = child.summary_entry()
    from scfs.training.cudnn_warmup import CudnnWarmupCallback

    warmup = next((c for c in trainer.callbacks if isinstance(c, CudnnWarmupCallback)), None)
    if warmup is not None:  # compile_cudnn_warmup: how many convolutions, and when the last was chosen
        summary[warmup.summary_key] = warmup.summary_entry()
    if budget is not None and budget.stopped:
        summary["stopped_by_chunk_budget"] = True
        summary["resume_with"] = f"resume={last.path}"
        log.info("chunk budget of %s min reached at step %d: continue with resume=%s", cfg.chunk_minutes,
                 trainer.global_step, last.path)
    skipped = skipped_files(dm.train_set, bank, query)
    if skipped:
        summary["skipped_files"] = skipped
        log.warning("%d unreadable image file(s) were skipped (listed in summary.json): %s", len(skipped),
                    ", ".join(list(skipped)[:10]) + (" ..." if len(skipped) > 10 else ""))
    if cfg.eval.get("figure", False):
        summary["figure"] = save_figure(model, dm, run_dir, logger)
    logger.log_metrics({f"final/knn_{k}": v for k, v in summary["knn"].items()}, step=trainer.global_step)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(summary_line(summary, ks[0]), flush=True)
    return summary


def skipped_files(*datasets: Any) -> dict[str, str]:
    """Unreadable files that the datasets skipped in this process (path -> reason)."""
    from scfs.data.datasets import shown_path

    out: dict[str, str] = {}
    for ds in datasets:
        ds = getattr(ds, "dataset", ds)  # a DataLoader
        out.update(getattr(ds, "bad_files", None) or {})
    return {shown_path(k): v for k, v in out.items()}  # non-UTF-8 names as \xNN: log files and JSON take them


def save_figure(model: Any, dm: Any, run_dir: Path, logger: Any) -> str | None:
    """The searched-regions figure of the run (`scfs.viz`), None where the plotting extras are not installed."""
    try:
        from scfs.viz import save_training_figure
    except ImportError:
        return None
    return save_training_figure(model, dm, run_dir, logger)


def summary_line(s: dict[str, Any], k: int) -> str:
    """The one line a run prints at its end: kNN top-1 (k=`k`) against random init, loss against its uniform
    level, checkpoint and W&B folder."""
    key = f"top1_k{k}"
    trained = s["knn"][key]
    what = s["method"].upper() + (f" ({s['search']})" if s["method"] != "dino" else "")  # DINO has no search
    parts = [f"{what} done in {s['seconds']:.0f}s, "
             f"{s['epochs']} epochs / {s['steps']} steps"]
    if "knn_init" in s:
        init = s["knn_init"][key]
        parts.append(f"kNN top-1 (k={k}, val): trained teacher {trained:.1f}% vs random init {init:.1f}% "
                     f"({trained - init:+.1f})")
    else:
        parts.append(f"kNN top-1 (k={k}, val): {trained:.1f}%")
    parts.append(f"loss {s['loss']:.3f} (uniform level {s['uniform_loss']:.3f}; DINO term {s['loss_dino']:.3f} "
                 f"vs log(out_dim) {s['uniform_loss_dino']:.3f})")
    parts.append(f"checkpoint {s['checkpoint']}")
    parts.append(f"wandb {s['wandb_dir']}")
    return " | ".join(parts)

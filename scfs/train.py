"""`python -m scfs.train [overrides]`: SCFS (or DINO) pretraining driven by the Hydra configs in `conf/`.

With no arguments it generates the embedded shapes dataset and pretrains SCFS on the CPU in a few minutes,
then prints one summary line: kNN top-1 of the trained teacher vs the same network at random init, the final
loss against its uniform level, the checkpoint and the W&B run folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("scfs.train")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
SECRET_WORDS = ("api_key", "apikey", "secret", "token", "password")


def scrub(obj: Any) -> Any:
    """Drop secret-looking keys before a config is logged anywhere."""
    if isinstance(obj, dict):
        return {k: ("***" if any(w in str(k).lower() for w in SECRET_WORDS) else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def find_resume_checkpoint(resume: str | None, name: str, runs_root: Path = Path("runs")) -> str | None:
    """`resume=auto`: newest `last.ckpt` under runs/<name>/; `resume=<path>`: that file (must exist)."""
    if resume in (None, "", "none", "null"):
        return None
    if resume == "auto":
        found = sorted((runs_root / name).glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not found:
            log.info("resume=auto: no checkpoint under %s, starting fresh", runs_root / name)
            return None
        return str(found[-1])
    if not Path(resume).is_file():
        raise FileNotFoundError(f"resume={resume!r}: no such checkpoint file; use resume=auto or a path to a .ckpt")
    return str(resume)


def make_logger(cfg: DictConfig, run_dir: Path):
    """W&B in offline mode unless asked otherwise; falls back to CSV when wandb is not installed."""
    from lightning.pytorch.loggers import CSVLogger

    lcfg = cfg.logger
    if lcfg.name == "wandb" and lcfg.get("mode", "offline") != "disabled":
        try:
            import wandb  # noqa: F401
            from lightning.pytorch.loggers import WandbLogger
        except ImportError:
            log.warning("wandb is not installed: logging to CSV in %s instead", run_dir)
        else:
            wandb_dir = run_dir / "wandb_files"
            for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
                os.environ.setdefault(var, str(wandb_dir / var.split("_")[1].lower()))
            os.environ.setdefault("WANDB_SILENT", "true")
            mode = lcfg.get("mode", "offline")
            logger = WandbLogger(project=lcfg.project, entity=lcfg.get("entity"), save_dir=str(run_dir),
                                 offline=mode == "offline", mode=mode, tags=list(lcfg.get("tags", [])),
                                 name=f"{cfg.name}-{run_dir.name}", settings=_wandb_settings())
            return logger
    return CSVLogger(save_dir=str(run_dir), name="csv")


def _wandb_settings():
    import wandb

    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


def build(cfg: DictConfig):
    """Data module and LightningModule from a composed config (also used by notebooks and tests)."""
    from scfs.config import validate_config
    from scfs.data.datamodule import SSLDataModule
    from scfs.method.module import SCFSModule

    validate_config(cfg)
    crops = OmegaConf.to_container(cfg.crops, resolve=True)
    batch_aug = bool(cfg.data.get("batch_aug", False))
    dm = SSLDataModule(OmegaConf.to_container(cfg.data, resolve=True), crops, batch_size=cfg.batch_size,
                       num_workers=cfg.num_workers, batch_aug=batch_aug, seed=cfg.seed)
    backbone_cfg = OmegaConf.to_container(cfg.backbone, resolve=True)
    for k in ("layers", "channels"):
        if k in backbone_cfg:
            backbone_cfg[k] = tuple(backbone_cfg[k])
    model = SCFSModule(backbone_cfg, OmegaConf.to_container(cfg.method, resolve=True),
                       OmegaConf.to_container(cfg.search, resolve=True),
                       OmegaConf.to_container(cfg.optim, resolve=True),
                       batch_size=cfg.batch_size, n_local=cfg.crops.n_local, crops=crops if batch_aug else None,
                       seed=cfg.seed)
    return dm, model


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Pretrain, evaluate with kNN and return the summary dict (also written to `<run_dir>/summary.json`)."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from scfs.eval.knn import evaluate_backbone_knn
    from scfs.method.callbacks import KNNMonitor
    from scfs.method.checkpoint_io import AtomicCheckpointIO
    from scfs.method.monitors import OnlineLinearMonitor

    t0 = time.time()
    run_dir = Path(run_dir or cfg.get("run_dir") or Path("runs") / cfg.name / time.strftime("%Y-%m-%d_%H-%M-%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.trainer.get("accelerator", "cpu") == "cpu" and os.environ.get("SCFS_THREADS"):
        torch.set_num_threads(int(os.environ["SCFS_THREADS"]))
    dm, model = build(cfg)
    dm.setup()
    ks = list(cfg.eval.knn_k)
    summary: dict[str, Any] = {"name": cfg.name, "method": cfg.method.name, "search": cfg.search.mode,
                               "run_dir": str(run_dir)}
    bank, query = dm.knn_loaders()
    if cfg.eval.knn_at_start:
        summary["knn_init"] = evaluate_backbone_knn(model.backbone("teacher"), bank, query, ks,
                                                    cfg.eval.knn_temperature)

    logger = make_logger(cfg, run_dir)
    logger.log_hyperparams(scrub(OmegaConf.to_container(cfg, resolve=True)))
    ckpt_dir = run_dir / "checkpoints"
    callbacks = [
        ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=-1, every_n_epochs=cfg.checkpoint.every_n_epochs,
                        filename="epoch{epoch:03d}", auto_insert_metric_name=False),
        KNNMonitor(every_n_epochs=cfg.eval.knn_every_n_epochs, ks=ks, temperature=cfg.eval.knn_temperature,
                   out_file=run_dir / "knn_curve.json"),
    ]
    online_every = cfg.eval.get("online_linear_every_n_epochs", 1)
    if online_every and hasattr(dm.train_set, "num_classes"):
        callbacks.append(OnlineLinearMonitor(num_classes=dm.train_set.num_classes, every_n_epochs=online_every))
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True), logger=logger, callbacks=callbacks,
                        default_root_dir=str(run_dir), plugins=[AtomicCheckpointIO()])
    ckpt_path = find_resume_checkpoint(cfg.get("resume"), cfg.name)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)

    if trainer.is_global_zero:
        device = model.device
        summary["knn"] = evaluate_backbone_knn(model.backbone("teacher"), bank, query, ks, cfg.eval.knn_temperature,
                                               device=device)
        summary["loss"] = float(trainer.callback_metrics.get("loss_epoch", float("nan")))
        summary["loss_dino"] = float(trainer.callback_metrics.get("loss/dino", float("nan")))
        summary["uniform_loss"] = model.uniform_loss()
        summary["uniform_loss_dino"] = float(torch.log(torch.tensor(float(cfg.method.out_dim))))
        summary["checkpoint"] = str(ckpt_dir / "last.ckpt")
        summary["wandb_dir"] = _wandb_run_dir(logger)
        summary["epochs"] = trainer.current_epoch
        summary["steps"] = trainer.global_step
        summary["seconds"] = round(time.time() - t0, 1)
        if cfg.eval.get("figure", False):
            summary["figure"] = _save_figure(model, dm, run_dir, logger)
        logger.log_metrics({f"final/knn_{k}": v for k, v in summary["knn"].items()}, step=trainer.global_step)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(summary_line(summary, ks[0]), flush=True)
    _finish_logger(logger)
    return summary


def _wandb_run_dir(logger) -> str | None:
    exp = getattr(logger, "experiment", None)
    d = getattr(exp, "dir", None)
    return str(Path(d).parent) if d else None


def _finish_logger(logger) -> None:
    if type(logger).__name__ == "WandbLogger":
        import wandb

        wandb.finish()


def _save_figure(model, dm, run_dir: Path, logger) -> str | None:
    try:
        from scfs.viz import save_training_figure
    except ImportError:
        return None
    return save_training_figure(model, dm, run_dir, logger)


def summary_line(s: dict[str, Any], k: int) -> str:
    key = f"top1_k{k}"
    trained = s["knn"][key]
    parts = [f"{s['method'].upper()} ({s['search']}) done in {s['seconds']:.0f}s, "
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


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()

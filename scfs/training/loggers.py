"""The experiment logger of a training run: W&B, offline unless asked otherwise, or CSV when wandb is missing.

W&B keeps its cache, config and data under the run folder and prints nothing, so a run leaves no files elsewhere
and its console stays readable. Lightning and wandb are imported when a logger is made, not at import.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from scfs.reliability import scrub

log = logging.getLogger("scfs.train")  # the run's messages, whichever module says them


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


def start_logger(cfg: DictConfig, run_dir: Path):
    """`make_logger` with the resolved config as the run's hyperparameters, secret-looking values scrubbed."""
    logger = make_logger(cfg, run_dir)
    logger.log_hyperparams(scrub(OmegaConf.to_container(cfg, resolve=True)))
    return logger


def _wandb_settings():
    import wandb

    return wandb.Settings(silent=True, console="off", x_disable_stats=True)


def wandb_run_dir(logger: Any) -> str | None:
    """The W&B run's folder (`.../wandb/offline-run-*`), None for a logger without one."""
    exp = getattr(logger, "experiment", None)
    d = getattr(exp, "dir", None)
    return str(Path(d).parent) if d else None


def finish_logger(logger: Any, failed: bool = False) -> None:
    """Close the W&B run (marked failed after an error), so its offline files are complete and syncable."""
    if type(logger).__name__ == "WandbLogger":
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1 if failed else 0)

"""`python -m scfs.train [overrides]`: SCFS (or DINO) pretraining driven by the Hydra configs in `conf/`.

With no arguments it generates the embedded shapes dataset and pretrains SCFS on the CPU in a few minutes,
then prints one summary line: kNN top-1 of the trained teacher vs the same network at random init, the final
loss against its uniform level, the checkpoint and the W&B run folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from scfs.cli import cli_with_one_line_errors, run_reporting_errors
from scfs.errors import ReportedError
from scfs.reliability import find_secrets, offline_by_default, scrub, scrub_files

log = logging.getLogger("scfs.train")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
def refuse_secrets(cfg: DictConfig) -> None:
    """Secrets never belong in a config: Hydra saves it to `.hydra/`, the logger stores it, runs get shared.

    Raises `ConfigError` naming the key (not the value) and saying where the secret should live instead.
    """
    from scfs.config import ConfigError

    found = find_secrets(OmegaConf.to_container(cfg, resolve=False))
    if found:
        keys = ", ".join(k for k, _ in found)
        raise ConfigError(f"config key(s) {keys} look like secrets (value not shown): secrets must not be put in "
                          "configs or overrides, which are saved in the run folder and logged; set them in the "
                          "environment instead (W&B reads WANDB_API_KEY, Hugging Face HF_TOKEN)")


def check_resume_checkpoint(path: str, model: Any | None = None) -> dict[str, Any]:
    """Read a resume file the safe way (weights only: a file that needs pickle code is refused with
    `UnsafeCheckpointError`) and check that it is a training checkpoint, before anything is built or written, so
    a wrong file fails in one clear line instead of deep inside Lightning. Returns its global_step, epoch and
    tensor shapes; with `model`, also checks that the architecture matches (`check_resume_matches`)."""
    from scfs.models.checkpoint import NonFiniteWeightsError, NotACheckpointError, safe_load
    from scfs.reliability import check_finite

    ckpt = safe_load(path)
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("state_dict"), dict) and "loops" in ckpt
            and "optimizer_states" in ckpt):
        raise NotACheckpointError(f"resume={path}: not a training checkpoint of scfs.train (no loop / optimizer "
                                  "state); to start from its weights use backbone.pretrained_path=<file> instead")
    bad = check_finite(ckpt)
    if bad:  # our writer never saves these; a file from elsewhere (or edited) would only reproduce the divergence
        raise NonFiniteWeightsError(
            f"resume={path} holds non-finite values (NaN/Inf) in {', '.join(bad)}: it is no resume point; resume "
            f"from an earlier checkpoint of that run ({_other_checkpoints(Path(path))})")
    progress = ((ckpt.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    info = {"path": str(path), "global_step": int(ckpt.get("global_step", 0)), "epoch": int(ckpt.get("epoch", 0)),
            # epochs whose batches were all trained (Lightning counts an epoch as processed before its end hooks,
            # where the epoch-end last.ckpt is written)
            "epochs_done": int(((progress.get("current") or {}).get("processed")) or 0),
            "shapes": {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}}
    if model is not None:
        check_resume_matches(info, model)
    return info


def _other_checkpoints(path: Path) -> str:
    found = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: p.stat().st_mtime)
    return f"e.g. resume={found[-1]}" if found else f"there is no other .ckpt in {path.parent}; start afresh"


class RunAlreadyCompleteError(ReportedError, ValueError):
    """`resume=` names a checkpoint whose run already trained its whole schedule: nothing would be trained."""


def check_not_complete(info: dict[str, Any], trainer_cfg: Any) -> None:
    """Refuse to resume a run that has finished its schedule (`trainer.max_epochs` / `trainer.max_steps`):
    Lightning would return at once, and the summary would report a loss of nan and a last.ckpt never written."""
    max_epochs = trainer_cfg.get("max_epochs")
    max_steps = int(trainer_cfg.get("max_steps", -1) or -1)
    step, epochs = info["global_step"], info["epochs_done"]
    if 0 < max_steps <= step:
        reason, fix = f"trainer.max_steps={max_steps}", f"raise trainer.max_steps (e.g. trainer.max_steps={2 * step})"
    elif max_epochs not in (None, -1) and epochs >= int(max_epochs):
        reason, fix = (f"trainer.max_epochs={max_epochs}",
                       f"raise trainer.max_epochs (e.g. trainer.max_epochs={epochs + max(int(max_epochs), 1)})")
    else:
        return
    raise RunAlreadyCompleteError(
        f"resume={info['path']}: that run is already complete at epoch {epochs} / step {step} ({reason}); to "
        f"train further {fix} and resume again; to evaluate it: python -m scfs.eval.knn ckpt={info['path']}")


def check_resume_matches(info: dict[str, Any], model: Any) -> None:
    """Missing / unexpected / mis-shaped weights of the resume file against the configured model, listed."""
    from scfs.models.checkpoint import CheckpointMismatchError

    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = info["shapes"]
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    shapes = sorted(f"{k}: {theirs[k]} vs {ours[k]}" for k in set(ours) & set(theirs) if ours[k] != theirs[k])
    if missing or unexpected or shapes:
        parts = [f"resume={info['path']} does not match the configured model"]
        for name, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                           ("shape mismatches (checkpoint vs model)", shapes)):
            if keys:
                parts.append(f"{name}: {len(keys)} ({', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''})")
        parts.append("resume with the same backbone / method / search config as the interrupted run")
        raise CheckpointMismatchError("; ".join(parts))


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
        from scfs.models.checkpoint import missing_checkpoint

        err = missing_checkpoint(resume, "resume")
        raise type(err)(f"{err}; use resume=auto or a path to a .ckpt")
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
    """Data module and the method's LightningModule (`method.name`, see `scfs.methods`) from a composed config
    (also used by notebooks and tests)."""
    from scfs.config import validate_config
    from scfs.data.datamodule import SSLDataModule
    from scfs.methods import method_class

    validate_config(cfg)
    method = method_class(cfg.method.name)  # an unknown name fails here, before any data is touched
    crops = OmegaConf.to_container(cfg.crops, resolve=True)
    batch_aug = bool(cfg.data.get("batch_aug", False))
    batch_size = per_device_batch_size(cfg)
    dm = SSLDataModule(OmegaConf.to_container(cfg.data, resolve=True), crops, batch_size=batch_size,
                       num_workers=cfg.num_workers, batch_aug=batch_aug, seed=cfg.seed,
                       on_device=bool(cfg.data.get("on_device", False)))
    backbone_cfg = OmegaConf.to_container(cfg.backbone, resolve=True)
    for k in ("layers", "channels"):
        if k in backbone_cfg:
            backbone_cfg[k] = tuple(backbone_cfg[k])
    model = method(backbone_cfg, OmegaConf.to_container(cfg.method, resolve=True),
                       OmegaConf.to_container(cfg.search, resolve=True),
                       OmegaConf.to_container(cfg.optim, resolve=True),
                       batch_size=batch_size, n_local=cfg.crops.n_local,
                       crops=crops if batch_aug or cfg.data.get("colour_on_device", False) else None,
                       seed=cfg.seed, compile=bool(cfg.get("compile", False)),
                       compile_mode=str(cfg.get("compile_mode", "default")),
                       finite_check_every_n_steps=int(cfg.get("finite_check_every_n_steps", 1)))
    return dm, model


def world_size(cfg: DictConfig) -> int:
    """Processes of the run: trainer.devices x trainer.num_nodes (1 on the CPU default)."""
    from scfs.config import _devices

    return _devices(cfg) * max(int(cfg.trainer.get("num_nodes", 1) or 1), 1)


def per_device_batch_size(cfg: DictConfig) -> int:
    """`batch_size` is per device; `global_batch_size` (when set) wins and is split over all processes, so
    `global_batch_size=512` trains on the same 512 images per step on 1, 2 or 8 GPUs."""
    gb = cfg.get("global_batch_size")
    if gb in (None, 0):
        return int(cfg.batch_size)
    world = world_size(cfg)
    if int(gb) % world:
        from scfs.config import ConfigError

        raise ConfigError(f"config key global_batch_size={gb} is invalid: it is not divisible across {world} "
                          "processes (devices x num_nodes)")
    return int(gb) // world


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """Lightning Trainer arguments from `cfg.trainer` plus what multi-GPU training needs.

    * `use_distributed_sampler=False`: `SSLDataModule` shards each global batch over the ranks itself
      (`EpochSeededRandomSampler`); Lightning's wrapper would interleave ranks and drop `set_epoch`.
    * `sync_bn=true` -> `sync_batchnorm`: Lightning converts every BatchNorm of the LightningModule (student
      *and* teacher, so the EMA pairs SyncBatchNorm with SyncBatchNorm) to `torch.nn.SyncBatchNorm`
      (CUDA only): batch statistics over the global batch, as one process would compute them.
    """
    kw = OmegaConf.to_container(cfg.trainer, resolve=True)
    kw.setdefault("use_distributed_sampler", False)
    if cfg.get("sync_bn", False):
        if kw.get("accelerator", "cpu") == "cpu":
            from scfs.config import ConfigError

            raise ConfigError("config key sync_bn=true is invalid on trainer.accelerator=cpu: torch's SyncBatchNorm "
                              "runs on CUDA only (use trainer=gpu or trainer=ddp)")
        kw["sync_batchnorm"] = True
    return kw


def _eval_device(cfg: DictConfig) -> Any:
    """Where the kNN of the network at init runs (before the Trainer exists): this process's GPU on GPU recipes.
    On the CPU a ResNet-18 over the 60,000 CIFAR-10 images takes minutes (measured: 5.5 min of an H200 run).
    Also after `trainer.fit`, whose teardown moves the module back to the CPU."""
    import torch

    accel = str(cfg.trainer.get("accelerator", "cpu"))
    if accel in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def _teacher_knn(model: Any, bank: Any, query: Any, ks: list[int], cfg: DictConfig) -> dict[str, float]:
    """kNN of the teacher outside the Trainer (before fit, after its teardown) on `_eval_device`; the backbone
    goes back where it was, so the whole module moves to its device together in `trainer.fit`."""
    from scfs.eval.knn import evaluate_backbone_knn

    teacher, dev = model.backbone("teacher"), _eval_device(cfg)
    home = next(teacher.parameters()).device
    try:
        return evaluate_backbone_knn(teacher.to(dev), bank, query, ks, cfg.eval.knn_temperature, device=dev)
    finally:
        teacher.to(home)


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Pretrain, evaluate with kNN and return the summary dict (also written to `<run_dir>/summary.json`).

    Everything that can be checked is checked before data or model are touched: the config, secrets in it, and
    the resume file (weights-only load, training-checkpoint layout, same architecture).
    """
    offline_by_default()
    from scfs.config import check_accelerator, validate_config

    validate_config(cfg)
    refuse_secrets(cfg)
    check_accelerator(cfg.trainer)
    from scfs.reliability import RunFolderLock, launch_rank

    t0 = time.time()
    ckpt_path = find_resume_checkpoint(cfg.get("resume"), cfg.name)
    if ckpt_path:  # temp files of writes killed in that run: nothing else ever writes to its folder again
        from scfs.models.checkpoint_io import remove_stale_temps

        for tmp in remove_stale_temps(Path(ckpt_path).parent):
            log.info("removed %s, left by a checkpoint write that was killed", tmp)
    resume_info = check_resume_checkpoint(ckpt_path) if ckpt_path else None
    if resume_info:
        check_not_complete(resume_info, cfg.trainer)
    run_dir = Path(run_dir or cfg.get("run_dir") or Path("runs") / cfg.name / time.strftime("%Y-%m-%d_%H-%M-%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    # a second run in this folder would overwrite last.ckpt and the logs; under DDP every process of the run gets
    # here, and the rank-0 process holds the folder for all of them
    with RunFolderLock(run_dir) if launch_rank() == 0 else contextlib.nullcontext():
        return _train(cfg, run_dir, ckpt_path, resume_info, t0)


def _train(cfg: DictConfig, run_dir: Path, ckpt_path: str | None, resume_info: dict[str, Any] | None,
           t0: float) -> dict[str, Any]:
    """`run` from the model build on, in a locked run folder."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from scfs.models.checkpoint_io import AtomicCheckpointIO
    from scfs.reliability import BatchTooLargeError, oom_message
    from scfs.reliability.resume import LastCheckpoint, ResumeState, make_train_loader_resumable
    from scfs.training.callbacks import KNNMonitor, WallClockBudget
    from scfs.training.monitors import OnlineLinearMonitor

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.trainer.get("accelerator", "cpu") == "cpu" and os.environ.get("SCFS_THREADS"):
        torch.set_num_threads(int(os.environ["SCFS_THREADS"]))
    dm, model = build(cfg)
    if resume_info:
        check_resume_matches(resume_info, model)
        log.info("resuming from %s (global_step %d)", ckpt_path, resume_info["global_step"])
    dm.setup()
    make_train_loader_resumable(dm)
    ks = list(cfg.eval.knn_k)
    summary: dict[str, Any] = {"name": cfg.name, "method": cfg.method.name, "search": cfg.search.mode,
                               "run_dir": str(run_dir)}
    bank, query = dm.knn_loaders()
    if cfg.eval.knn_at_start:
        summary["knn_init"] = _teacher_knn(model, bank, query, ks, cfg)

    logger = make_logger(cfg, run_dir)
    logger.log_hyperparams(scrub(OmegaConf.to_container(cfg, resolve=True)))
    ckpt_dir = run_dir / "checkpoints"
    last = LastCheckpoint(ckpt_dir, every_n_train_steps=cfg.checkpoint.get("every_n_train_steps", 0))
    callbacks = [
        ModelCheckpoint(dirpath=ckpt_dir, save_last=False, save_top_k=-1, every_n_epochs=cfg.checkpoint.every_n_epochs,
                        filename="epoch{epoch:03d}", auto_insert_metric_name=False),
        KNNMonitor(every_n_epochs=cfg.eval.knn_every_n_epochs, ks=ks, temperature=cfg.eval.knn_temperature,
                   out_file=run_dir / "knn_curve.json"),
    ]
    online_every = cfg.eval.get("online_linear_every_n_epochs", 1)
    if online_every and hasattr(dm.train_set, "num_classes"):
        callbacks.append(OnlineLinearMonitor(num_classes=dm.train_set.num_classes, every_n_epochs=online_every))
    budget = WallClockBudget(float(cfg.chunk_minutes)) if cfg.get("chunk_minutes") else None
    if budget is not None:
        callbacks.append(budget)
    callbacks += [ResumeState(), last]  # after the monitors: restores the RNG after they rebuilt their layers
    if cfg.trainer.get("enable_progress_bar", True):  # the bar reads logged values on the host (a sync) per refresh
        from lightning.pytorch.callbacks import TQDMProgressBar

        callbacks.append(TQDMProgressBar(refresh_rate=max(int(cfg.trainer.get("log_every_n_steps", 1) or 1), 1)))
    trainer = L.Trainer(**trainer_kwargs(cfg), logger=logger, callbacks=callbacks,
                        default_root_dir=str(run_dir), plugins=[AtomicCheckpointIO()])
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    except torch.cuda.OutOfMemoryError as err:
        _finish_logger(logger, failed=True)
        raise BatchTooLargeError(oom_message(per_device_batch_size(cfg), trainer.global_step,
                                             _last_good(last, ckpt_path), cfg.trainer.get("devices", 1))) from err
    except FloatingPointError as err:
        _finish_logger(logger, failed=True)
        good = _last_good(last, ckpt_path)
        hint = (f" Last good checkpoint: {good}; after fixing the cause continue with resume={good}" if good
                else " No checkpoint was written before it")
        raise type(err)(f"{err}.{hint}") from err
    except BaseException:
        _finish_logger(logger, failed=True)
        raise

    if (resume_info and trainer.global_step == resume_info["global_step"] and not trainer.interrupted
            and not (budget is not None and budget.stopped)):
        _finish_logger(logger, failed=True)  # a schedule end the pre-check did not foresee (e.g. trainer.max_time)
        raise RunAlreadyCompleteError(
            f"resume={ckpt_path}: no step was trained (the run is already complete at epoch "
            f"{resume_info['epochs_done']} / step {resume_info['global_step']}); raise trainer.max_epochs / "
            "trainer.max_steps to continue")
    if trainer.is_global_zero:
        summary["knn"] = _teacher_knn(model, bank, query, ks, cfg)  # teardown moved the module to the CPU
        summary["loss"] = float(trainer.callback_metrics.get("loss_epoch", float("nan")))
        summary["loss_dino"] = float(trainer.callback_metrics.get("loss/dino", float("nan")))
        summary["uniform_loss"] = model.uniform_loss()
        summary["uniform_loss_dino"] = float(torch.log(torch.tensor(float(cfg.method.out_dim))))
        summary["checkpoint"] = str(ckpt_dir / "last.ckpt")
        summary["wandb_dir"] = _wandb_run_dir(logger)
        summary["epochs"] = trainer.current_epoch
        summary["steps"] = trainer.global_step
        summary["seconds"] = round(time.time() - t0, 1)
        if budget is not None and budget.stopped:
            summary["stopped_by_chunk_budget"] = True
            summary["resume_with"] = f"resume={ckpt_dir / 'last.ckpt'}"
            log.info("chunk budget of %s min reached at step %d: continue with resume=%s", cfg.chunk_minutes,
                     trainer.global_step, ckpt_dir / "last.ckpt")
        skipped = _skipped_files(dm.train_set, bank, query)
        if skipped:
            summary["skipped_files"] = skipped
            log.warning("%d unreadable image file(s) were skipped (listed in summary.json): %s", len(skipped),
                        ", ".join(list(skipped)[:10]) + (" ..." if len(skipped) > 10 else ""))
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


def _finish_logger(logger, failed: bool = False) -> None:
    """Close the W&B run (marked failed after an error), so its offline files are complete and syncable."""
    if type(logger).__name__ == "WandbLogger":
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1 if failed else 0)


def _last_good(last: Any, resumed_from: str | None) -> str | None:
    """The newest checkpoint on disk that a rerun can continue from."""
    if last.path.is_file():
        return str(last.path)
    return resumed_from


def _skipped_files(*datasets: Any) -> dict[str, str]:
    """Unreadable files that the datasets skipped in this process (path -> reason)."""
    from scfs.data.datasets import shown_path

    out: dict[str, str] = {}
    for ds in datasets:
        ds = getattr(ds, "dataset", ds)  # a DataLoader
        out.update(getattr(ds, "bad_files", None) or {})
    return {shown_path(k): v for k, v in out.items()}  # non-UTF-8 names as \xNN: log files and JSON take them


def _save_figure(model, dm, run_dir: Path, logger) -> str | None:
    try:
        from scfs.viz import save_training_figure
    except ImportError:
        return None
    return save_training_figure(model, dm, run_dir, logger)


def summary_line(s: dict[str, Any], k: int) -> str:
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


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    out = HydraConfig.get().runtime.output_dir
    secrets = find_secrets(OmegaConf.to_container(cfg, resolve=False))
    if secrets:  # Hydra has already saved them under <out>/.hydra: take them out before refusing the run
        scrub_files(out, [v for _, v in secrets])
    run_reporting_errors("scfs.train", run, cfg, out)


def cli() -> None:
    """`python -m scfs.train`: Hydra's main with one-line errors.

    A bad config (unknown `+experiment`, unknown key, invalid value) prints `scfs.train: config error: ...` and
    exits with status 2; the known run failures (non-finite loss, out of memory, unsafe or mismatched checkpoint,
    unreadable image in strict mode) print `scfs.train: error: ...` and exit with 1. `SCFS_TRACEBACK=1` (or
    `HYDRA_FULL_ERROR=1`) shows the full traceback instead.
    """
    cli_with_one_line_errors("scfs.train", main)


if __name__ == "__main__":
    cli()

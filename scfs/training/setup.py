"""The steps that set a training run up, from a composed config to a Trainer ready to fit.

Everything that can be checked is checked before data or model are touched (`check_run_config`,
`prepare_resume`), so a mistake costs a second and one line. torch and Lightning are imported inside the steps
that need them: `python -m scfs.train` with a bad config fails before they load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from scfs.reliability import offline_by_default, refuse_secrets
from scfs.training.build import build

log = logging.getLogger("scfs.train")  # the run's messages, whichever module says them


# ---- checks before anything is built -----------------------------------------------------------------------------
def check_run_config(cfg: DictConfig) -> None:
    """The config's values, secrets in it, and an accelerator this machine has; the hub goes offline first (it
    reads that when imported, and the model build imports it). The accelerator is taken from the CUDA driver
    where that shows enough, so that torch's import runs beside the compile helpers' start-up, not before it;
    `check_accelerator_with_torch` then asks torch."""
    offline_by_default()
    from scfs.config import check_accelerator, validate_config

    validate_config(cfg)
    refuse_secrets(cfg)
    check_accelerator(cfg.trainer, driver_first=True)


def check_accelerator_with_torch(cfg: DictConfig) -> None:
    """torch's own view of the accelerator, once the helpers are on their way: where the driver let the run
    through and torch cannot use its GPUs (a driver older than torch's CUDA), this one line names it, before the
    data and the model are built."""
    from scfs.config import check_accelerator

    check_accelerator(cfg.trainer)


def prepare_resume(cfg: DictConfig) -> dict[str, Any] | None:
    """The checkpoint `resume=` names, checked (see `check_resume_checkpoint`) and not already complete, or None
    for a fresh run. Returns its `check_resume_checkpoint` info (`path`, `global_step`, `epochs_done`, shapes).

    A fresh run imports nothing heavy here: the compile helpers start right after this step
    (`scfs.training.compile_helpers.start_early_helpers`), and the imports of Lightning and the model's modules are
    better spent beside theirs than before they begin."""
    ckpt_path = find_resume_checkpoint(cfg.get("resume"), cfg.name)
    if not ckpt_path:
        return None
    from scfs.models.checkpoint_io import remove_stale_temps
    from scfs.training.checkpointing import check_not_complete, check_resume_checkpoint

    # temp files of writes killed in that run: nothing else ever writes to its folder again
    for tmp in remove_stale_temps(Path(ckpt_path).parent):
        log.info("removed %s, left by a checkpoint write that was killed", tmp)
    resume = check_resume_checkpoint(ckpt_path)
    check_not_complete(resume, cfg.trainer)
    return resume


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


# ---- the run folder ----------------------------------------------------------------------------------------------
def make_run_dir(cfg: DictConfig, run_dir: str | Path | None = None) -> Path:
    """`run_dir`, else `cfg.run_dir`, else `runs/<name>/<date_time>`; created."""
    run_dir = Path(run_dir or cfg.get("run_dir") or Path("runs") / cfg.name / time.strftime("%Y-%m-%d_%H-%M-%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def hold_run_folder(run_dir: Path) -> contextlib.AbstractContextManager:
    """The run folder's lock for the duration of the run: a second run in this folder would overwrite last.ckpt
    and the logs. Under DDP every process of the run gets here, and the rank-0 process holds it for all of them."""
    from scfs.reliability import RunFolderLock, launch_rank

    return RunFolderLock(run_dir) if launch_rank() == 0 else contextlib.nullcontext()


# ---- data and model (`build`, in scfs.training.build) -----------------------------------------------------------
def build_for_training(cfg: DictConfig, resume: dict[str, Any] | None):
    """`build` after seeding, the model checked against the resume file, and the data set up with a train loader
    that resumes mid-epoch. The order of the random draws (seed, model init, data set-up) is the run's: a change
    here changes every run's numbers."""
    import lightning as L
    import torch

    from scfs.training.checkpointing import check_resume_matches, make_train_loader_resumable

    prepare_compile_cache(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.trainer.get("accelerator", "cpu") == "cpu" and os.environ.get("SCFS_THREADS"):
        torch.set_num_threads(int(os.environ["SCFS_THREADS"]))
    dm, model = build(cfg)
    if resume:
        check_resume_matches(resume, model)
        log.info("resuming from %s (global_step %d)", resume["path"], resume["global_step"])
    dm.setup()
    make_train_loader_resumable(dm)
    return dm, model


def prepare_compile_cache(cfg: DictConfig) -> Path | None:
    """With `compile=true`: point torch.compile's on-disk cache at `compile_cache` (unless TORCHINDUCTOR_CACHE_DIR
    is set) and say in one line why the first steps wait. The cache keeps the compiled graphs and kernels across
    runs, so a second run of a recipe spends its warm-up on tracing only. With `compile_artifacts` the file a
    run on another machine wrote is loaded into that folder first (`scfs.training.compile_artifacts`)."""
    if not cfg.get("compile", False):
        return None
    from scfs.training.compile_helpers import choose_compile_cache

    chosen = choose_compile_cache(cfg)
    cache = Path(chosen) if chosen else None
    warm = cache is not None and cache.is_dir() and any(cache.iterdir())
    where = f"cache {cache}" if cache else "torch's default cache"
    if cfg.get("compile_backend", "inductor") == "cudagraphs":
        log.info("compile=true (compile_backend=cudagraphs): the first steps trace the step and record its CUDA "
                 "graphs, no kernels generated: about a minute")
    else:
        log.info("compile=true (%s): the first steps compile the step; %s", cfg.get("compile_mode", "default"),
                 f"reusing the compiled graphs in the {where}, about a minute" if warm else
                 f"nothing cached yet in the {where}: a few minutes this time, about a minute on later runs")
    if cfg.get("compile_artifacts"):
        from scfs.training.compile_artifacts import load_compile_artifacts

        load_compile_artifacts(str(cfg.compile_artifacts))  # into the cache folder chosen above
    return cache


def eval_device(cfg: DictConfig) -> Any:
    """Where the kNN of the network at init runs (before the Trainer exists): this process's GPU on GPU recipes.
    On the CPU a ResNet-18 over the 60,000 CIFAR-10 images takes minutes (measured: 5.5 min of an H200 run).
    Also after `trainer.fit`, whose teardown moves the module back to the CPU."""
    import torch

    accel = str(cfg.trainer.get("accelerator", "cpu"))
    if accel in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


# ---- callbacks and Trainer ---------------------------------------------------------------------------------------
def parallel_compile_callbacks(cfg: DictConfig, run_dir: Path, batch_size: int, early: Any = None) -> list[Any]:
    """`compile_parallel`'s callback, `auto` resolved for this machine (`parallel_helpers`); an `auto` left off
    says why in one line (and stops the helpers `early`, started before the set-up, which the callback takes
    over otherwise)."""
    from scfs.training.background_compile import ParallelCompile
    from scfs.training.compile_helpers import auto_parallel_off_reason, cpu_cores, parallel_helpers

    cuda = eval_device(cfg).type == "cuda"
    parallel, backward = parallel_helpers(cfg, cuda)
    if not parallel:
        if early is not None:
            early.stop()
        log.info("compile_parallel=auto: off here (%s); the run compiles its step alone",
                 auto_parallel_off_reason(cfg, cuda, cpu_cores()))
        return []
    return [ParallelCompile(cfg, run_dir, batch_size=batch_size, backward=backward, early=early)]


def make_callbacks(cfg: DictConfig, dm: Any, run_dir: Path, early: Any = None) -> tuple[list[Any], Any, Any]:
    """The run's callbacks, with its `LastCheckpoint` (the newest resume point, named in failure messages) and
    its `WallClockBudget` (None without `chunk_minutes`; the summary says whether it stopped the run). `early`:
    `compile_parallel`'s helpers started before the set-up (`scfs.training.compile_helpers.start_early_helpers`)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from scfs.training.callbacks import EpochTimer, KNNMonitor, LoggedStepsProgressBar, WallClockBudget
    from scfs.training.checkpointing import LastCheckpoint, ResumeState
    from scfs.training.monitors import OnlineLinearMonitor

    ckpt_dir = run_dir / "checkpoints"
    ks = list(cfg.eval.knn_k)
    last = LastCheckpoint(ckpt_dir, every_n_train_steps=cfg.checkpoint.get("every_n_train_steps", 0),
                          min_interval_s=cfg.checkpoint.get("last_min_interval_s", 0))
    callbacks = [
        EpochTimer(),  # first: its epoch ends before the kNN pass and the checkpoints of the callbacks below
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
    if cfg.get("compile", False) and cfg.get("compile_background", False):
        from scfs.training.background_compile import BackgroundCompile

        callbacks.append(BackgroundCompile(cfg, run_dir, batch_size=dm.batch_size))
    elif cfg.get("compile", False) and cfg.get("compile_parallel", False) is not False:
        callbacks += parallel_compile_callbacks(cfg, run_dir, dm.batch_size, early)
    if cfg.get("compile", False) and cfg.get("compile_cudnn_warmup", False) is not False:
        from scfs.training.cudnn_warmup import CudnnWarmupCallback

        callbacks.append(CudnnWarmupCallback(cfg))
    if cfg.get("compile", False) and cfg.get("compile_artifacts"):
        from scfs.training.compile_artifacts import CompileArtifacts

        callbacks.append(CompileArtifacts(str(cfg.compile_artifacts)))
    if cfg.trainer.get("enable_progress_bar", True):  # its refreshes read the loss on the host where the loggers do
        callbacks.append(LoggedStepsProgressBar(refresh_rate=max(int(cfg.trainer.get("log_every_n_steps", 1) or 1), 1)))
    return callbacks, last, budget


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


def background_writes(cfg: DictConfig) -> bool:
    """Whether the run writes its checkpoints on a background thread (`checkpoint.background_writes`)."""
    from scfs.config import uses_cuda
    from scfs.models.checkpoint_io import writes_in_background

    on_gpu = uses_cuda(str(cfg.get("trainer", {}).get("accelerator", "cpu")))
    return writes_in_background(cfg.get("checkpoint", {}).get("background_writes", "auto"), "gpu" if on_gpu else "cpu")


def make_trainer(cfg: DictConfig, run_dir: Path, logger: Any, callbacks: list[Any]):
    """The Lightning Trainer of the run, writing checkpoints atomically (`AtomicCheckpointIO`; on a background
    thread with `BackgroundCheckpointIO` where `background_writes`).

    Inside a SLURM allocation (`hydra/launcher=slurm`, or `srun` by hand) Lightning's `SLURMEnvironment` takes the
    ranks from SLURM and, on SIGUSR1 (sent `signal_delay_s` before the time limit, see
    `conf/hydra/launcher/slurm.yaml`), saves `hpc_ckpt_<n>.ckpt` in the run folder and requeues the job, which
    then resumes from it (`scfs.study.resume_checkpoint_after_requeue`).
    """
    import signal

    import lightning as L
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from scfs.models.checkpoint_io import AtomicCheckpointIO, BackgroundCheckpointIO

    plugins: list[Any] = [BackgroundCheckpointIO() if background_writes(cfg) else AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1))
    return L.Trainer(**trainer_kwargs(cfg), logger=logger, callbacks=callbacks, default_root_dir=str(run_dir),
                     plugins=plugins)

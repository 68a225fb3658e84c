"""`python -m scfs.train [overrides]`: SCFS (or DINO) pretraining driven by the Hydra configs in `conf/`.

With no arguments it generates the embedded shapes dataset and pretrains SCFS on the CPU in a few minutes,
then prints one summary line: kNN top-1 of the trained teacher vs the same network at random init, the final
loss against its uniform level, the checkpoint and the W&B run folder.

`run` is the sequence of steps; each step lives in `scfs.training` (set-up, fit, summary, logger, checkpoints).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from scfs.cli import cli_with_one_line_errors, run_job_reporting_errors, run_reporting_errors
from scfs.names import CONF_DIR
from scfs.reliability import find_secrets, scrub_files
from scfs.study import resume_checkpoint_after_requeue
from scfs.training.build import build, per_device_batch_size, world_size
from scfs.training.fit import fit
from scfs.training.loggers import finish_logger, start_logger
from scfs.training.setup import (
    build_for_training,
    check_accelerator_with_torch,
    check_run_config,
    hold_run_folder,
    make_callbacks,
    make_run_dir,
    make_trainer,
    prepare_resume,
    trainer_kwargs,
)
from scfs.training.summary import start_summary, summarise, summary_line, teacher_knn

# what notebooks, tests and benchmarks call (the set-up steps they share with `run` included)
__all__ = ["CONF_DIR", "build", "cli", "main", "per_device_batch_size", "run", "summary_line", "trainer_kwargs",
           "world_size"]


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Pretrain, evaluate with kNN and return the summary dict (also written to `<run_dir>/summary.json`).

    Everything that can be checked is checked before data or model are touched: the config, secrets in it, and
    the resume file (weights-only load, training-checkpoint layout, same architecture).
    """
    check_run_config(cfg)
    t0 = time.time()
    resume = prepare_resume(cfg)
    run_dir = make_run_dir(cfg, run_dir)
    with hold_run_folder(run_dir), early_compile_helpers(cfg, run_dir) as early:
        check_accelerator_with_torch(cfg)
        dm, model = build_for_training(cfg, resume)
        summary = start_summary(cfg, run_dir)
        bank, query = dm.knn_loaders()
        if cfg.eval.knn_at_start:
            summary["knn_init"] = teacher_knn(model, bank, query, list(cfg.eval.knn_k), cfg)
        logger = start_logger(cfg, run_dir)
        callbacks, last, budget = make_callbacks(cfg, dm, run_dir, early)
        trainer = make_trainer(cfg, run_dir, logger, callbacks)
        fit(cfg, trainer, model, dm, resume, last, budget)
        if trainer.is_global_zero:
            summarise(summary, cfg, trainer, model, dm, (bank, query), last, budget, t0)
            if cfg.get("compile", False) and cfg.get("compile_artifacts"):  # with the final kNN pass's graphs
                from scfs.training.compile_artifacts import CompileArtifacts

                CompileArtifacts(str(cfg.compile_artifacts)).save()
        finish_logger(logger)
        return summary


@contextlib.contextmanager
def early_compile_helpers(cfg: DictConfig, run_dir: Path) -> Iterator[Any]:
    """`compile_parallel`'s helpers started now, before the run's imports of torch and Lightning and its set-up,
    so that their own start-up runs beside it (`scfs.training.compile_helpers.start_early_helpers`; None where
    the run starts none early); stopped when the run ends, however it ends."""
    import logging

    from scfs.training.compile_helpers import start_early_helpers

    try:
        early = start_early_helpers(cfg, run_dir)
    except Exception as err:  # a head start lost, nothing else: ParallelCompile starts the helpers at fit
        logging.getLogger("scfs.train").warning("compile_parallel: the helpers could not start before the set-up "
                                                "(%s: %s); they start at fit", type(err).__name__, err)
        early = None
    try:
        yield early
    finally:
        if early is not None:
            early.stop()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    out = HydraConfig.get().runtime.output_dir
    requeued = resume_checkpoint_after_requeue(Path(out)) if cfg.get("resume") is None else None
    if requeued is not None:  # a preempted SLURM job started again: it continues in its own folder
        cfg.resume = str(requeued)
    secrets = find_secrets(OmegaConf.to_container(cfg, resolve=False))
    if secrets:  # Hydra has already saved them under <out>/.hydra: take them out before refusing the run
        scrub_files(out, [v for _, v in secrets])
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # a job of an in-process multirun: the next jobs still run
        return run_job_reporting_errors("scfs.train", run, cfg, out)
    return run_reporting_errors("scfs.train", run, cfg, out)


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

"""`trainer.fit` with its known failures said in one line that names the last good checkpoint to resume from.

Out of memory becomes `BatchTooLargeError` (the batch size to try), a non-finite loss keeps its message plus the
resume point, and a resumed run that trained no step is refused (`RunAlreadyCompleteError`). On any failure the
W&B run is closed as failed, so its offline files are complete.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from scfs.training.build import per_device_batch_size
from scfs.training.loggers import finish_logger


def fit(cfg: DictConfig, trainer: Any, model: Any, dm: Any, resume: dict[str, Any] | None, last: Any,
        budget: Any) -> None:
    """Train `model` on `dm`, from the `resume` checkpoint when given. `last` is the run's `LastCheckpoint`,
    `budget` its `WallClockBudget` or None."""
    from scfs.reliability import BatchTooLargeError, is_cuda_oom, oom_message
    from scfs.training.checkpointing import RunAlreadyCompleteError

    ckpt_path = resume["path"] if resume else None
    logger = trainer.logger
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    except FloatingPointError as err:
        finish_logger(logger, failed=True)
        good = last_good(last, ckpt_path)
        hint = (f" Last good checkpoint: {good}; after fixing the cause continue with resume={good}" if good
                else " No checkpoint was written before it")
        raise type(err)(f"{err}.{hint}") from err
    except BaseException as err:
        finish_logger(logger, failed=True)
        if is_cuda_oom(err):
            raise BatchTooLargeError(oom_message(per_device_batch_size(cfg), trainer.global_step,
                                                 last_good(last, ckpt_path), cfg.trainer.get("devices", 1))) from err
        raise

    if (resume and trainer.global_step == resume["global_step"] and not trainer.interrupted
            and not (budget is not None and budget.stopped)):
        finish_logger(logger, failed=True)  # a schedule end the pre-check did not foresee (e.g. trainer.max_time)
        raise RunAlreadyCompleteError(
            f"resume={ckpt_path}: no step was trained (the run is already complete at epoch "
            f"{resume['epochs_done']} / step {resume['global_step']}); raise trainer.max_epochs / "
            "trainer.max_steps to continue")


def last_good(last: Any, resumed_from: str | None) -> str | None:
    """The newest checkpoint on disk that a rerun can continue from."""
    if last.path.is_file():
        return str(last.path)
    return resumed_from

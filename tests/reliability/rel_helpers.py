"""Helpers of the reliability tests: the tiny config as CLI overrides and a clean subprocess environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers import TINY

REPO = Path(__file__).resolve().parents[2]


def cli_overrides(*extra: str, limit_batches: int | None = None) -> list[str]:
    """`helpers.TINY` for `python -m scfs.train` (optionally with another limit_train_batches), then `extra`."""
    tiny = [o for o in TINY if not (limit_batches and o.startswith("+trainer.limit_train_batches"))]
    if limit_batches:
        tiny.append(f"+trainer.limit_train_batches={limit_batches}")
    return [*tiny, *extra]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The test environment for a child `python -m scfs.train`: one CPU thread (bit-exact comparisons with an
    in-process run need the same thread count), the repo importable, W&B silent."""
    env = dict(os.environ)
    env.update({"SCFS_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
                "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"})
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop("SCFS_TRACEBACK", None)
    env.update(extra)
    return env


PYTHON = sys.executable

"""One line per user mistake at the command line: the error plumbing every CLI of the project shares.

A config error exits 2, a known run failure (`scfs.errors.ReportedError`, a non-finite loss, a missing file, CUDA
out of memory outside a step) exits 1, each printed as `<prog>: <kind>: <message>` on one line;
`SCFS_TRACEBACK=1` (or `HYDRA_FULL_ERROR=1`) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from omegaconf import DictConfig

from scfs.errors import ReportedError
from scfs.reliability import is_cuda_oom, offline_by_default, one_line


def _config_errors() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from scfs.config import ConfigError

    return ConfigError, HydraException, OmegaConfBaseException


def _run_errors() -> tuple[type[BaseException], ...]:
    """Failures whose message says everything (what happened, what is kept, what to do): no traceback needed."""
    return FloatingPointError, FileNotFoundError, IsADirectoryError, NotADirectoryError, ReportedError


class ReportedExit(SystemExit):
    """The exit after a one-line error, with that line: a multirun job turns it into its failure (`JobFailed`)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(code)
        self.line = line


class JobFailed(ReportedError, Exception):
    """A job of an in-process multirun that failed with a one-line error: Hydra records it as the job's failure and
    the sweep goes on with the next job (a SystemExit would end the whole sweep)."""


def _fail(code: int, kind: str, err: BaseException, prog: str = "scfs.train") -> None:
    if os.environ.get("SCFS_TRACEBACK"):
        raise err
    line = f"{prog}: {kind}: {_retired_key(err) or one_line(err)}{_missing_plugin(err)}"
    print(line, file=sys.stderr, flush=True)
    raise ReportedExit(code, line)


def run_job_reporting_errors(prog: str, fn: Any, *args: Any) -> Any:
    """`run_reporting_errors` for one job of a multirun run in this process (Hydra's basic launcher, submitit): the
    one-line error is printed as in a single run, then raised as `JobFailed` so the other jobs still run."""
    try:
        return run_reporting_errors(prog, fn, *args)
    except ReportedExit as done:
        raise JobFailed(done.line) from None


def _missing_plugin(err: BaseException) -> str:
    """A Hydra group option that a plugin provides was not found: say which install step brings the plugin."""
    text = str(err)
    if "hydra/launcher/submitit_" in text:
        return ' (the SLURM launcher needs hydra-submitit-launcher: pip install "scfs[slurm]")'
    if "hydra/sweeper/study" in text or "hydra/launcher/local_gpus" in text:
        return (" (scfs's Hydra plugins in hydra_plugins/scfs_launchers are not importable: run from the repository "
                "root, or reinstall with pip install -e . so the install includes them)")
    return ""


def _retired_key(err: BaseException) -> str | None:
    """Hydra refuses an override of a key the config no longer has; say what replaced it instead."""
    from scfs.names import RETIRED_KEYS

    text = str(err)
    return next((why for key, why in RETIRED_KEYS.items() if f"'{key}'" in text or f"{key}=" in text), None)


def run_reporting_errors(prog: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)` inside a Hydra job: a config error exits 2, a known run failure 1, each as one line (handled
    here so Hydra does not print its report with the overrides and a traceback)."""
    try:
        return fn(*args)
    except _config_errors() as err:
        _fail(2, "config error", err, prog)
    except _run_errors() as err:
        _fail(1, "error", err, prog)
    except RuntimeError as err:
        if not is_cuda_oom(err):
            raise
        _fail(1, "error", RuntimeError(_oom_outside_step(err, args[0] if args else None)), prog)


def _oom_outside_step(err: BaseException, cfg: Any) -> str:
    """CUDA out of memory where no training step is running (eval feature passes, the kNN monitor of scfs.train):
    the batch size that ran out, and half of it to try."""
    bs = cfg.get("batch_size") if isinstance(cfg, DictConfig) else None
    first = str(err).strip().splitlines()[0] if str(err).strip() else "CUDA out of memory"
    fix = (f"rerun with batch_size={max(int(bs) // 2, 1)} (it was {bs}; the results do not depend on it)"
           if isinstance(bs, int) and bs > 1 else "use a smaller batch_size or a GPU with more free memory")
    return f"CUDA out of memory outside a training step ({first}): {fix}; nothing was written that needs cleaning up"


def cli_with_one_line_errors(prog: str, hydra_main: Any) -> None:
    """Run a `hydra.main` app so that composition errors (unknown group option or key, bad override) are one
    line too; `SCFS_TRACEBACK=1` or `HYDRA_FULL_ERROR=1` shows the full traceback instead. The eval CLIs use it."""
    offline_by_default()
    full = bool(os.environ.get("HYDRA_FULL_ERROR"))
    if full:
        os.environ["SCFS_TRACEBACK"] = "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises composition errors instead of printing its report
    try:
        hydra_main()
    except _config_errors() as err:
        if full:
            raise
        _fail(2, "config error", err, prog)
    except ReportedError as err:  # a multirun whose jobs failed (each said why in its own line already)
        if full:
            raise
        _fail(1, "error", err, prog)

"""A compiled run's cache as one portable file (`compile_artifacts=<path>`): a fresh machine skips most of the
compile.

torch.compile's on-disk cache (`compile_cache`) lives in a folder of the machine; a GPU window on a fresh machine
starts with it empty and spends minutes compiling again. torch's "mega-cache" serialises what this process compiled
(inductor's graphs and kernels, AOTAutograd's graphs, autotuning results) into bytes
(`torch.compiler.save_cache_artifacts`) that another process loads into its own on-disk cache
(`torch.compiler.load_cache_artifacts`) before compiling: its compile then finds the graphs as a second run on the
same machine would. Dynamo still traces the Python code (seconds), and the entries are keyed by torch version,
device and graph, so a file from another torch or GPU simply misses and the run compiles as without it.

The run loads the file at start when it exists, and writes it (atomically, rank 0) whenever the steps have compiled
something new: after the first step, after the first logging step's loss, after the evaluation passes, at the end.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import lightning as L

log = logging.getLogger("scfs.train")


def _quiet_torch_cache_log() -> Any:
    """torch logs a corrupt file with a full traceback; the run says it in one line instead."""
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    return logger, level


def load_compile_artifacts(path: str | os.PathLike) -> int | None:
    """Load the artifacts file at `path` into torch.compile's on-disk cache (the folder TORCHINDUCTOR_CACHE_DIR
    names, so call it after `prepare_compile_cache`). Returns the number of artifacts loaded, or None with one
    warning line when the file is missing or unreadable: the run then compiles as without it."""
    import torch

    p = Path(path).expanduser()
    if not p.is_file():
        log.warning("compile_artifacts=%s: no such file yet; compiling from scratch, and writing it after the first "
                    "steps", p)
        return None
    logger, level = _quiet_torch_cache_log()
    try:
        data = p.read_bytes()
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as err:  # noqa: BLE001 - a bad cache file must never stop a run
        info, why = None, f"{type(err).__name__}: {err}"
    else:
        why = "not a torch.compile artifacts file, or from another torch version"
    finally:
        logger.setLevel(level)
    n = sum(len(v) for v in info.artifacts.values()) if info is not None else 0
    if info is None or n == 0:
        log.warning("compile_artifacts=%s could not be loaded (%s); compiling from scratch, and overwriting it "
                    "after the first steps", p, why)
        return None
    _keep_loaded(data)
    log.info("compile_artifacts: loaded %d cache entries from %s (%.1f MB): the first steps reuse them", n, p,
             p.stat().st_size / 1e6)
    return n


def _keep_loaded(data: bytes) -> None:
    """Count the loaded entries as this process's own, so the file it writes later keeps them all: torch saves only
    what the process itself compiled or hit, and a run that skips a pass (no kNN at start, say) would otherwise
    shrink the file it was given. Best effort (torch's private cache registry): without it the file is rewritten
    from this run's graphs alone."""
    from itertools import chain

    try:
        from torch.compiler._cache import CacheArtifactManager

        arts = CacheArtifactManager.deserialize(data) or {}
        for a in chain(*arts.values()):
            CacheArtifactManager.record_artifact(a.type(), a.key, a.content)
    except Exception as err:  # noqa: BLE001 - the cache is loaded already; only the later file may be smaller
        log.debug("compile_artifacts: loaded entries not kept for the next write (%s)", err)


def has_new_artifacts() -> bool:
    """Whether this process compiled anything since the last save (cheap: a length check)."""
    from torch.compiler._cache import CacheArtifactManager

    need = getattr(CacheArtifactManager, "need_serialize", None)
    return bool(need()) if need is not None else True


def save_compile_artifacts(path: str | os.PathLike) -> int | None:
    """Write everything this process compiled so far (artifacts loaded at start included, as they are hit) to
    `path`, atomically (`scfs.models.checkpoint_io.atomic_write`). Returns the bytes written, or None when nothing
    was compiled."""
    import torch

    got = torch.compiler.save_cache_artifacts()
    if got is None:
        return None
    from scfs.models.checkpoint_io import atomic_write

    data = got[0]
    atomic_write(Path(path).expanduser(), lambda f: f.write(data))
    return len(data)


class CompileArtifacts(L.Callback):
    """Write `compile_artifacts` whenever the run has compiled something new: checked after every step (a length
    check, no sync) and at the ends of the epochs and the fit. Only the rank-0 process writes: under DDP every rank
    compiles the same graphs."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        self.saves = 0

    def save(self, trainer: L.Trainer | None = None) -> None:
        if (trainer is not None and not trainer.is_global_zero) or not has_new_artifacts():
            return
        size = save_compile_artifacts(self.path)
        if size is not None:
            self.saves += 1
            if self.saves == 1:
                log.info("compile_artifacts: wrote %s (%.1f MB); a run on a fresh machine loads it with "
                         "compile_artifacts=<that file>", self.path, size / 1e6)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

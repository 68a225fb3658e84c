"""Checkpoint files that survive crashes and never run code when read back.

Writes: Lightning's default CheckpointIO writes straight to the final path, so a crash or `kill -9` mid-save
leaves a truncated `last.ckpt` and the run's work is gone. Here the checkpoint goes to a temporary file in the
same folder, is flushed and fsync'ed, then `os.replace`d over the target (atomic on POSIX), and the folder is
fsync'ed so the rename itself survives a power cut. A checkpoint whose weights or optimizer state hold NaN/Inf is
refused (`NonFiniteCheckpointError`): the last good file stays the one to resume from.

Reads (`trainer.fit(ckpt_path=...)`, i.e. `resume=`): always `torch.load(weights_only=True)` through
`scfs.models.checkpoint.safe_load`, so a file that would need pickle code execution is refused with an
`UnsafeCheckpointError` instead of being run.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

TMP_SUFFIX = ".tmp"


class NonFiniteCheckpointError(FloatingPointError):
    """The checkpoint to be written holds NaN/Inf weights or optimizer state; it is not written."""


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.{socket.gethostname()}.{os.getpid()}."


def _remove_stale_temps(path: Path) -> None:
    """Delete temp files of `path` left by writers (of this host) that were killed mid-save."""
    host = socket.gethostname()
    for tmp in path.parent.glob(f".{path.name}.{host}.*{TMP_SUFFIX}"):
        pid = tmp.name[len(f".{path.name}.{host}."):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            pass


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save` that is all-or-nothing: readers see the old file or the complete new one, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose `save_checkpoint` is check-finite, write-temp, fsync, rename and whose
    `load_checkpoint` never unpickles code."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        from scfs.reliability import check_finite

        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO does not take storage_options")
        bad = check_finite(checkpoint)
        if bad:
            raise NonFiniteCheckpointError(
                f"refusing to write checkpoint {path} at global_step {checkpoint.get('global_step', '?')}: "
                f"non-finite values in {', '.join(bad)}; the previous checkpoint in that folder is kept (it is the "
                "last good one). Lower optim.lr or enable gradient clipping (trainer.gradient_clip_val)")
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Callable | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Ignores `weights_only=False`: resuming never executes pickled code (see module doc)."""
        from scfs.models.checkpoint import safe_load

        ckpt = safe_load(path)
        if not isinstance(ckpt, dict):
            raise ValueError(f"{path} is not a Lightning checkpoint (it holds a {type(ckpt).__name__})")
        return ckpt

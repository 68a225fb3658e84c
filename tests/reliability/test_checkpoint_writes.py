"""Checkpoint writes that go wrong: a full disk is one line saying so (the previous file survives), and the temp
files of killed writes are cleaned up on the next save or resume."""

from __future__ import annotations

import errno
import io
import os
import shutil
import socket
import subprocess
import time

import pytest
import torch
from helpers import compose_cfg

import scfs.models.checkpoint_io as cio
from scfs.cli import run_reporting_errors
from scfs.models.checkpoint import safe_load
from scfs.models.checkpoint_io import DiskFullError, atomic_torch_save, remove_stale_temps
from scfs.reliability import one_line
from scfs.train import run
from scfs.training.checkpointing import RunAlreadyCompleteError


class _FullDisk(io.RawIOBase):
    """A file that takes `room` bytes and then fails every write with ENOSPC, as a full file system does."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, b) -> int:
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()

    def close(self) -> None:
        self.f.close()
        super().close()


def _fill_disk_after(monkeypatch, room: int, good_saves: int = 0) -> None:
    """The next checkpoint writes (after `good_saves` good ones) run out of space after `room` bytes."""
    real = os.fdopen
    calls = []

    def fdopen(fd, *args, **kwargs):
        calls.append(fd)
        f = real(fd, *args, **kwargs)
        return f if len(calls) <= good_saves else _FullDisk(f, room)

    monkeypatch.setattr(cio.os, "fdopen", fdopen)


def test_disk_full_keeps_the_previous_file_and_says_no_space_left(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1, "w": torch.ones(1000)}, path)
    _fill_disk_after(monkeypatch, room=2048)
    with pytest.raises(DiskFullError) as info:
        atomic_torch_save({"step": 2, "w": torch.ones(100_000)}, path)
    msg = one_line(info.value)
    assert "No space left on device while writing checkpoint" in msg and str(path) in msg
    assert "unexpected pos" not in msg  # torch's own wording, which hid the cause
    assert f"the previous last.ckpt is intact (resume={path}" in msg and "free space there" in msg
    assert safe_load(path)["step"] == 1
    assert os.listdir(tmp_path) == ["last.ckpt"]  # the partial temp file is gone too


@pytest.mark.parametrize("background", [False, True], ids=["on-the-training-thread", "in-the-background"])
def test_disk_full_during_training_is_one_line_and_keeps_last_good(tmp_path, shapes_root, monkeypatch, capsys,
                                                                   background):
    """The 129-line traceback ending in `unexpected pos 502016 vs 501904`, through the CLI's error reporting; a
    background write's failure too (said at the next save or at the end)."""
    _fill_disk_after(monkeypatch, room=4096, good_saves=1)  # step 1 saved, step 2's save hits the full disk
    cfg = compose_cfg(["checkpoint.every_n_train_steps=1", "trainer.limit_train_batches=3", "eval.knn_at_start=false",
                       f"checkpoint.background_writes={str(background).lower()}"], data_root=shapes_root)
    with pytest.raises(SystemExit) as code:
        run_reporting_errors("scfs.train", run, cfg, tmp_path)
    assert code.value.code == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("scfs.train: error: No space left on device"), lines
    assert safe_load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 1


def _temp_name(target: str, host: str, pid: int) -> str:
    return f".{target}.{host}.{pid}.k3x9q2ab{cio.TMP_SUFFIX}"


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_temps_are_removed_live_writers_kept(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / _temp_name("last.ckpt", host, _dead_pid())
    old_other_host = tmp_path / _temp_name("last.ckpt", "other-node.cluster", 4242)
    fresh_other_host = tmp_path / _temp_name("epoch003.ckpt", "other-node.cluster", 4243)
    with subprocess.Popen(["sleep", "30"]) as live_proc:
        live = tmp_path / _temp_name("last.ckpt", host, live_proc.pid)
        for p in (dead, old_other_host, fresh_other_host, live):
            p.write_bytes(b"")
        hour_ago = time.time() - 3600
        os.utime(old_other_host, (hour_ago, hour_ago))
        removed = remove_stale_temps(tmp_path)
        live_proc.kill()
    assert sorted(removed) == sorted([dead, old_other_host])
    assert fresh_other_host.exists() and live.exists()  # writers that may still be running


def test_resume_cleans_the_temps_left_in_the_interrupted_runs_folder(finished, shapes_root, tmp_path):
    """A resumed run writes to a new run folder, so the old folder's temps used to stay there forever."""
    folder = tmp_path / "old" / "checkpoints"
    shutil.copytree(finished.parent, folder)
    stale = folder / _temp_name("last.ckpt", socket.gethostname(), _dead_pid())
    stale.write_bytes(b"")
    with pytest.raises(RunAlreadyCompleteError):  # cleaned even when the resume itself is refused
        run(compose_cfg([f"resume={folder / 'last.ckpt'}"], data_root=shapes_root), tmp_path / "new")
    assert not stale.exists() and (folder / "last.ckpt").is_file()

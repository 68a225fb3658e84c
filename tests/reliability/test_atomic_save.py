"""A kill while a checkpoint is written never leaves an unreadable one; NaN never reaches a checkpoint file."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from rel_helpers import PYTHON, subprocess_env

from scfs.models.checkpoint_io import AtomicCheckpointIO, NonFiniteCheckpointError, atomic_torch_save

MB = 300
# Writes a ~300 MB checkpoint over `path` again and again until killed; `writer` is the save under test.
WRITER = f"""
import sys, torch
from scfs.models.checkpoint_io import atomic_torch_save
path, writer = sys.argv[1], sys.argv[2]
obj = {{"state_dict": {{f"w{{i}}": torch.full((({MB} << 20) // 4 // 10,), float(i)) for i in range(10)}}}}
save = atomic_torch_save if writer == "atomic" else torch.save
print("ready", flush=True)
while True:
    save(obj, path)
"""


def _good_checkpoint(path: Path) -> int:
    obj = {"state_dict": {f"w{i}": torch.full((((MB << 20) // 4 // 10),), float(i)) for i in range(10)}}
    torch.save(obj, path)
    return path.stat().st_size


def _loads(path: Path) -> bool:
    try:
        sd = torch.load(path, weights_only=True, mmap=True)["state_dict"]
        return all(float(sd[f"w{i}"][-1]) == i for i in range(10))
    except Exception:
        return False


def _kill_mid_write(path: Path, writer: str, full_size: int) -> None:
    """Start the writer, SIGKILL it while bytes are being written (temp file growing, or the target itself)."""
    proc = subprocess.Popen([PYTHON, "-c", WRITER, str(path), writer], env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout.readline().strip() == b"ready"
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            partial = [p for p in path.parent.iterdir() if p.is_file() and 0 < p.stat().st_size < full_size]
            if partial:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.0005)
        else:
            pytest.fail("never saw a write in progress")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_kill_during_atomic_save_keeps_the_last_checkpoint_readable(tmp_path):
    path = tmp_path / "last.ckpt"
    size = _good_checkpoint(path)
    _kill_mid_write(path, "atomic", size)
    assert _loads(path), "last.ckpt is unreadable after a kill mid-save"
    atomic_torch_save({"x": torch.ones(1)}, path)  # the next save also removes the dead writer's temp file
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_the_same_kill_corrupts_a_plain_torch_save(tmp_path):
    """The control: with plain torch.save the harness above does leave a torn file (it detects the failure)."""
    path = tmp_path / "last.ckpt"
    size = _good_checkpoint(path)
    _kill_mid_write(path, "plain", size)
    assert not _loads(path)


def test_non_finite_checkpoint_is_refused_and_the_old_file_kept(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 2, "state_dict": {"w": torch.ones(3)}}, path)
    bad = {"global_step": 3, "state_dict": {"w": torch.tensor([1.0, float("nan"), 1.0])},
           "optimizer_states": [{"state": {0: {"momentum_buffer": torch.tensor([float("inf")])}}}],
           "callbacks": {"ModelCheckpoint": {"kth_value": torch.tensor(float("inf"))}}}  # legitimately inf
    with pytest.raises(NonFiniteCheckpointError, match=r"global_step 3.*state_dict\.w.*optimizer_states"):
        io.save_checkpoint(bad, path)
    assert io.load_checkpoint(path)["global_step"] == 2
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]

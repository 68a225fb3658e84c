"""Resuming reads the checkpoint with `torch.load(weights_only=True)`: a file that would run pickled code is
refused (and its code never runs), a wrong file fails in one clear message before training."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import compose_cfg

from scfs.models.checkpoint import CheckpointMismatchError, UnsafeCheckpointError
from scfs.models.checkpoint_io import AtomicCheckpointIO
from scfs.train import run


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))  # would create the marker folder when unpickled


def _malicious(tmp_path) -> tuple:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "loops": {}, "optimizer_states": [], "x": _Payload(str(marker))}, path)
    return path, marker


def test_resume_from_a_pickle_code_file_is_refused(tmp_path, shapes_root):
    path, marker = _malicious(tmp_path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        run(compose_cfg([f"resume={path}"], data_root=shapes_root), tmp_path / "run")
    assert not marker.exists()
    assert not (tmp_path / "run").exists()  # refused before anything was built or written


def test_lightning_resume_path_itself_is_weights_only(tmp_path):
    """Also when Lightning loads it (trainer.fit(ckpt_path=...)), not only in our pre-check."""
    path, marker = _malicious(tmp_path)
    with pytest.raises(UnsafeCheckpointError):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=False)
    assert not marker.exists()


def test_resume_from_another_architecture_lists_the_keys(tmp_path, shapes_root):
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"student.backbone.body.conv1.weight": torch.zeros(1), "extra.weight": torch.zeros(1)},
                "loops": {}, "optimizer_states": [], "global_step": 3}, path)
    with pytest.raises(CheckpointMismatchError, match=r"missing keys: \d+ .*unexpected keys: 1 \(extra\.weight\)"):
        run(compose_cfg([f"resume={path}"], data_root=shapes_root), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resume_from_weights_only_file_says_what_to_use_instead(tmp_path, shapes_root):
    path = tmp_path / "weights.pt"
    torch.save({"conv1.weight": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not a training checkpoint.*backbone.pretrained_path"):
        run(compose_cfg([f"resume={path}"], data_root=shapes_root), tmp_path / "run")

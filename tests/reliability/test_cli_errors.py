"""A bad config fails through the CLI in one line (no traceback) with exit status 2, before any data or model."""

from __future__ import annotations

import subprocess

import pytest
from rel_helpers import PYTHON, subprocess_env


def _train(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "scfs.train", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)


def _one_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("scfs.train: config error: ")
    return lines[0]


def test_unknown_experiment_names_it_and_lists_the_available_ones(tmp_path):
    line = _one_line(_train(tmp_path, "+experiment=nope"))
    assert "experiment/nope" in line
    assert "cifar10, cifar10_vit, imagenet, imagenet_vit, shapes_long, shapes_long_cpu" in line


@pytest.mark.parametrize(("override", "expected"), [
    ("batch_size=0", "config key batch_size=0 is invalid: expected an integer > 0"),
    ("search=fuzzy", "search/fuzzy"),
    ("no_such_key=1", "no_such_key"),
], ids=["invalid-value", "unknown-group-option", "unknown-key"])
def test_bad_values_fail_in_one_line(tmp_path, override, expected):
    assert expected in _one_line(_train(tmp_path, override))
    assert not (tmp_path / "run" / "checkpoints").exists()


def _error_line(p: subprocess.CompletedProcess, code: int, prog: str = "scfs.train") -> str:
    """One line `<prog>: [config ]error: ...` on stderr, no traceback, exit status `code`."""
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith(" ")]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), p.stderr
    return lines[0]


def test_unknown_timm_backbone_is_a_config_error_with_suggestions(tmp_path):
    """timm's "Unknown model" used to come out of the model build as a traceback."""
    line = _error_line(_train(tmp_path, "backbone.name=resnt50"), 2)
    assert "config key backbone.name='resnt50' is invalid" in line and "did you mean resnet50" in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_accelerator_without_cuda_is_a_config_error(tmp_path):
    """Lightning's "No supported gpu backend found!" came as a traceback, after the data set-up."""
    line = _error_line(_train(tmp_path, "trainer.accelerator=gpu"), 2)
    assert "trainer.accelerator=gpu is invalid: torch sees no CUDA GPU" in line and "accelerator=cpu" in line


def test_batch_larger_than_the_dataset_is_a_config_error(tmp_path):
    line = _error_line(_train(tmp_path, "++data.n_train=8", "batch_size=16"), 2)
    assert "batch_size=16 is larger than the training set (8 images)" in line


@pytest.mark.parametrize(("kind", "expected"), [
    ("folder", "is a folder, not a checkpoint file"),
    ("random-bytes", "is not a readable PyTorch checkpoint"),
    ("weights-only", "not a training checkpoint of scfs.train"),
])
def test_bad_resume_files_fail_in_one_line(tmp_path, kind, expected):
    """resume= a folder was called missing; random bytes and a plain state dict gave tracebacks."""
    import torch

    path = tmp_path / "thing"
    if kind == "folder":
        path.mkdir()
    elif kind == "random-bytes":
        path.write_bytes(bytes(range(256)) * 8)
    else:
        torch.save({"conv1.weight": torch.zeros(1)}, path)
    line = _error_line(_train(tmp_path, f"resume={path}"), 1)
    assert expected in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_typo_in_a_key_is_not_answered_with_the_advice_to_add_it(tmp_path):
    """Hydra says "To append to your config use +serch=soft": followed, the run ignores the typo'd key."""
    line = _error_line(_train(tmp_path, "serch=soft"), 2)
    assert "Could not override 'serch': the config has no such key or group (a typo?)" in line


def test_missing_pretrained_file_is_named_in_one_line(tmp_path):
    """`backbone.pretrained_path` is a key of every backbone config (no `+` needed); a file that is not there is
    named before any data or model work."""
    p = _train(tmp_path, f"backbone.pretrained_path={tmp_path / 'missing.pth'}")
    assert p.returncode != 0 and "Traceback" not in p.stderr + p.stdout
    assert "missing.pth does not exist" in p.stderr and "Could not override" not in p.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()

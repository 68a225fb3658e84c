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
    assert "cifar10, imagenet, shapes_long, shapes_long_cpu" in line


@pytest.mark.parametrize(("override", "expected"), [
    ("batch_size=0", "config key batch_size=0 is invalid: expected an integer > 0"),
    ("search=fuzzy", "search/fuzzy"),
    ("no_such_key=1", "no_such_key"),
], ids=["invalid-value", "unknown-group-option", "unknown-key"])
def test_bad_values_fail_in_one_line(tmp_path, override, expected):
    assert expected in _one_line(_train(tmp_path, override))
    assert not (tmp_path / "run" / "checkpoints").exists()

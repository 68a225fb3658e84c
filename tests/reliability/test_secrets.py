"""API keys and other secrets never end up in configs or run folders: a secret-looking config key is refused at
start-up (use the environment), and what Hydra already wrote to `.hydra/` is scrubbed."""

from __future__ import annotations

import subprocess

import pytest
from helpers import compose_cfg
from rel_helpers import PYTHON, subprocess_env

from scfs.config import ConfigError
from scfs.reliability import find_secrets, is_secret_key, scrub
from scfs.train import run

SECRET = "SECRET123"
FAKE_KEY = "fedcba9876543210fedcba9876543210fedcba98"


def _files_containing(folder, needle: str) -> list:
    return [p for p in folder.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_secret_on_the_command_line_is_refused_and_scrubbed_from_the_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.run([PYTHON, "-m", "scfs.train", f"+logger.api_key={SECRET}", f"hydra.run.dir={run_dir}"],
                       cwd=tmp_path, env=subprocess_env(WANDB_API_KEY=FAKE_KEY), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "logger.api_key" in p.stderr and "environment" in p.stderr and "WANDB_API_KEY" in p.stderr
    assert SECRET not in p.stderr + p.stdout and FAKE_KEY not in p.stderr + p.stdout
    assert (run_dir / ".hydra" / "config.yaml").is_file()  # Hydra wrote it before our code ran ...
    assert _files_containing(run_dir, SECRET) == []  # ... and it no longer holds the secret
    assert _files_containing(run_dir, FAKE_KEY) == []


def test_secret_in_a_composed_config_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match=r"logger\.api_key.*environment") as info:
        run(compose_cfg([f"+logger.api_key={SECRET}"]), tmp_path / "run")
    assert SECRET not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_secret_key_names():
    for key in ("api_key", "wandb_api_key", "apikey", "hf_token", "password", "client_secret", "private_key"):
        assert is_secret_key(key), key
    for key in ("max_tokens", "tokenizer", "keypoints", "secretary_bird_class", "batch_size"):
        assert not is_secret_key(key), key
    cfg = {"logger": {"name": "wandb", "api_key": SECRET}, "data": {"items": [{"token": "t0k3n"}]}}
    assert find_secrets(cfg) == [("logger.api_key", SECRET), ("data.items.0.token", "t0k3n")]
    assert scrub(cfg) == {"logger": {"name": "wandb", "api_key": "***"}, "data": {"items": [{"token": "***"}]}}

"""Test-wide settings: deterministic CPU threads, Triton in interpreter mode when there is no GPU, offline W&B."""

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory) -> Path:
    """One tiny generated shapes dataset shared by the training tests (generation is cached by spec)."""
    return tmp_path_factory.mktemp("shapes")

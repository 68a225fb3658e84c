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


@pytest.fixture
def eager_backend(monkeypatch):
    """The method's `torch.compile` calls traced by dynamo's eager backend: graphs and breaks without inductor."""
    import torch
    from torch import nn

    import scfs.methods.base as base

    real_compile, real_module_compile = torch.compile, nn.Module.compile
    monkeypatch.setattr(base.torch, "compile", lambda fn, **kw: real_compile(fn, backend="eager", dynamic=False))
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: real_module_compile(self, backend="eager",
                                                                                      dynamic=False))

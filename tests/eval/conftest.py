"""Eval test fixtures: one real (2-step) pretraining checkpoint per session and tiny eval configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import compose_cfg

from scfs.eval.common import compose_eval_cfg

TINY_EVAL = ["++data.n_train=48", "++data.n_val=24", "++data.image_size=32", "backbone.channels=[8,16,16,32]",
             "progress=false", "batch_size=32"]


@pytest.fixture(scope="session")
def tiny_ckpt(shapes_root, tmp_path_factory) -> Path:
    """A real Lightning checkpoint of `python -m scfs.train` (2 steps on tiny shapes, ~8 s once per session)."""
    import torch

    from scfs.train import run

    out = tmp_path_factory.mktemp("pretrain")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # see _one_cpu_thread
    try:
        run(compose_cfg(["eval.knn_at_start=false"], data_root=shapes_root), out)
    finally:
        torch.set_num_threads(before)
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture
def eval_cfg(shapes_root, tmp_path):
    """`eval_cfg("knn", "ckpt=...", ...)`: the real conf/eval config on the tiny shapes data, W&B off by default,
    feature cache in the test's tmp dir."""

    def make(kind: str, *overrides: str):
        return compose_eval_cfg(kind, [f"data.root={shapes_root}", *TINY_EVAL, "logger.wandb=false",
                                       f"feature_cache={tmp_path / 'cache'}", *overrides])

    return make


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """Eval tests run tiny ops; on the shared 2-core CPU, intra-op threads mostly wait on each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Fixtures of the reliability tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One CPU thread for every reliability test: the bit-exact resume comparisons need the same thread count in
    the pytest process and in the `python -m scfs.train` children (SCFS_THREADS), and on a busy 2-core CI box
    the tiny runs are several times faster single-threaded. `run()` calls torch.set_num_threads from
    SCFS_THREADS; the process's setting is restored afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setenv("SCFS_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def finished(shapes_root, tmp_path_factory):
    """last.ckpt of a tiny run that trained its whole schedule (1 epoch, 2 steps), shared read-only: copy it before
    changing anything in its folder."""
    from helpers import compose_cfg

    from scfs.train import run

    out = tmp_path_factory.mktemp("finished")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(compose_cfg(["eval.knn_at_start=false"], data_root=shapes_root), out)
    finally:
        torch.set_num_threads(before)
    return out / "checkpoints" / "last.ckpt"

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

"""Checkpoints written on a background thread (`checkpoint.background_writes`, `BackgroundCheckpointIO`): the file
is the state at the step it was due however training moves on, writes keep their order, a NaN checkpoint is refused
at once, a failed write is raised once (at the next save or at the end), and a requeue checkpoint is on disk when
the call returns, and a run ends with its last checkpoint on disk (a full disk through the CLI:
`test_checkpoint_writes.py`)."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import compose_cfg
from test_checkpoint_writes import _fill_disk_after

import scfs.models.checkpoint_io as cio
from scfs.config import ConfigError, validate_config
from scfs.models.checkpoint import safe_load
from scfs.models.checkpoint_io import BackgroundCheckpointIO, DiskFullError, NonFiniteCheckpointError
from scfs.train import run
from scfs.training.setup import background_writes


def _ckpt(w: torch.Tensor, step: int) -> dict:
    return {"state_dict": {"w": w}, "optimizer_states": [{"state": {0: {"momentum_buffer": w * 2}}}],
            "global_step": step}


@pytest.fixture
def held_writes(monkeypatch):
    """Background writes wait for `release.set()` before they touch the disk."""
    release = threading.Event()
    real = cio.atomic_torch_save

    def held(obj, path):
        assert release.wait(30), "the test never released the writes"
        real(obj, path)

    monkeypatch.setattr(cio, "atomic_torch_save", held)
    return release


def test_the_file_is_the_state_at_its_step_however_training_moves_on(tmp_path, held_writes) -> None:
    io = BackgroundCheckpointIO()
    w = torch.randn(64)
    before = w.clone()
    io.save_checkpoint(_ckpt(w, 3), tmp_path / "last.ckpt")  # returns before anything is written
    assert not (tmp_path / "last.ckpt").exists()
    w.add_(1.0)  # the next optimizer step, in place
    held_writes.set()
    io.teardown()
    saved = safe_load(tmp_path / "last.ckpt")
    assert saved["global_step"] == 3
    torch.testing.assert_close(saved["state_dict"]["w"], before, rtol=0, atol=0)
    torch.testing.assert_close(saved["optimizer_states"][0]["state"][0]["momentum_buffer"], before * 2, rtol=0, atol=0)


def test_a_cpu_checkpoint_goes_to_torch_save_as_it_is() -> None:
    ckpt = _ckpt(torch.randn(8), 1)
    assert cio.snapshot_taken(ckpt) == {}
    assert cio.host_copy(ckpt, {}) is ckpt


@pytest.mark.gpu
def test_a_gpu_write_copies_beside_the_kernels_queued_after_it_not_behind_them(tmp_path, monkeypatch) -> None:
    """The snapshot reaches host memory while the default stream still runs the kernels queued after the save
    (training's next steps), and the file holds the state at its step, from pinned host memory. `torch.save` of the
    device tensors would copy them on the default stream, after those kernels."""
    handed: list[tuple[dict, bool]] = []
    real = cio.atomic_torch_save

    def write(obj, path):  # the copies have landed when the file write begins; the disk's time is left out
        handed.append((obj, not torch.cuda.default_stream().query()))
        real(obj, path)

    monkeypatch.setattr(cio, "atomic_torch_save", write)
    io = BackgroundCheckpointIO()
    w = torch.randn(1 << 22, device="cuda")
    before = w.cpu()
    io.save_checkpoint(_ckpt(w, 7), tmp_path / "last.ckpt")
    torch.cuda._sleep(int(4e9))  # seconds of work on the default stream
    w.add_(1.0)  # the next optimizer step, in place, after it
    io.wait()
    torch.cuda.synchronize()
    io.teardown()
    (obj, busy), = handed
    assert busy, "the copies off the GPU waited for the kernels queued after the save"
    moved = obj["state_dict"]["w"]
    assert moved.device.type == "cpu" and moved.is_pinned()
    saved = safe_load(tmp_path / "last.ckpt")
    torch.testing.assert_close(saved["state_dict"]["w"], before, rtol=0, atol=0)
    torch.testing.assert_close(saved["optimizer_states"][0]["state"][0]["momentum_buffer"], before * 2, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_gpu_write_without_pinned_memory_copies_into_pageable_memory(tmp_path, monkeypatch, caplog) -> None:
    real = torch.empty_like

    def no_pinned(*args, **kwargs):
        if kwargs.get("pin_memory"):
            raise RuntimeError("CUDA error: out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "empty_like", no_pinned)
    io = BackgroundCheckpointIO()
    w = torch.randn(4096, device="cuda")
    io.save_checkpoint(_ckpt(w, 2), tmp_path / "last.ckpt")
    io.teardown()
    torch.testing.assert_close(safe_load(tmp_path / "last.ckpt")["state_dict"]["w"], w.cpu(), rtol=0, atol=0)
    assert [r.getMessage() for r in caplog.records].count(
        "checkpoint write: no pinned host memory for the copy off the GPU (CUDA error: out of memory); copying into "
        "pageable memory instead, still on the writer's own stream") == 1


def test_writes_keep_their_order(tmp_path, held_writes) -> None:
    io = BackgroundCheckpointIO()
    for step in (1, 2, 3):
        io.save_checkpoint(_ckpt(torch.full((4,), float(step)), step), tmp_path / "last.ckpt")
    held_writes.set()
    io.wait()
    assert safe_load(tmp_path / "last.ckpt")["global_step"] == 3
    io.teardown()


def test_a_nan_checkpoint_is_refused_on_the_callers_thread(tmp_path) -> None:
    io = BackgroundCheckpointIO()
    with pytest.raises(NonFiniteCheckpointError, match="refusing to write checkpoint .*global_step 5"):
        io.save_checkpoint(_ckpt(torch.tensor([1.0, float("nan")]), 5), tmp_path / "last.ckpt")
    io.teardown()
    assert not (tmp_path / "last.ckpt").exists()


def test_a_failed_write_is_raised_once_at_the_next_save(tmp_path, monkeypatch) -> None:
    _fill_disk_after(monkeypatch, room=64)
    io = BackgroundCheckpointIO()
    io.save_checkpoint(_ckpt(torch.randn(4096), 1), tmp_path / "last.ckpt")  # fails on the thread
    io._executor.submit(lambda: None).result()  # the write has failed by now; nothing has collected it yet
    with pytest.raises(DiskFullError, match="No space left on device while writing checkpoint"):
        io.save_checkpoint(_ckpt(torch.randn(4), 2), tmp_path / "last.ckpt")
    io.teardown()  # said once: the end of training does not repeat it


class _Inline:
    """An executor that runs each write before `submit` returns: a write that fails at once."""

    def submit(self, fn, *args):
        from concurrent.futures import Future

        fn(*args)
        done: Future = Future()
        done.set_result(None)
        return done

    def shutdown(self, wait: bool = True) -> None:
        pass


def test_the_call_that_hands_a_write_over_never_raises_its_failure(tmp_path, monkeypatch) -> None:
    _fill_disk_after(monkeypatch, room=64)
    io = BackgroundCheckpointIO()
    io._executor = _Inline()
    io.save_checkpoint(_ckpt(torch.randn(4096), 1), tmp_path / "last.ckpt")  # failed before the call returned
    with pytest.raises(DiskFullError):
        io.teardown()
    io.teardown()  # said once


def test_a_failed_write_is_raised_when_training_ends(tmp_path, monkeypatch) -> None:
    _fill_disk_after(monkeypatch, room=64)
    io = BackgroundCheckpointIO()
    io.save_checkpoint(_ckpt(torch.randn(4096), 1), tmp_path / "last.ckpt")
    with pytest.raises(DiskFullError):
        io.teardown()
    assert not list(tmp_path.iterdir())  # no file, no temp left behind


def test_a_requeue_checkpoint_is_on_disk_when_the_call_returns(tmp_path, held_writes) -> None:
    io = BackgroundCheckpointIO()
    io.save_checkpoint(_ckpt(torch.randn(4), 1), tmp_path / "last.ckpt")
    threading.Timer(0.3, held_writes.set).start()  # the earlier write goes first
    io.save_checkpoint(_ckpt(torch.randn(4), 2), tmp_path / "hpc_ckpt_1.ckpt")
    assert safe_load(tmp_path / "hpc_ckpt_1.ckpt")["global_step"] == 2
    assert safe_load(tmp_path / "last.ckpt")["global_step"] == 1
    io.teardown()


def test_background_writes_follow_the_device_unless_set() -> None:
    assert not background_writes(compose_cfg([]))  # the CPU default writes on the training thread
    assert background_writes(compose_cfg(["trainer=gpu"]))
    assert background_writes(compose_cfg(["checkpoint.background_writes=true"]))
    assert not background_writes(compose_cfg(["trainer=gpu", "checkpoint.background_writes=false"]))
    with pytest.raises(ConfigError, match=r"checkpoint.background_writes='sometimes' is invalid: expected auto"):
        validate_config(compose_cfg(["checkpoint.background_writes=sometimes"]))


def test_a_run_with_background_writes_ends_with_its_last_checkpoint_on_disk(tmp_path, shapes_root) -> None:
    cfg = compose_cfg(["checkpoint.every_n_train_steps=1", "trainer.limit_train_batches=3", "eval.knn_at_start=false",
                       "checkpoint.background_writes=true"], data_root=shapes_root)
    summary = run(cfg, tmp_path)
    assert safe_load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == summary["steps"]
    # the epoch clock saw the writes: a step save every step leaves no epoch without one beside it
    beside = summary["epoch_background_writes_s"]
    assert summary["checkpoint_writes"] == "background"
    assert len(beside) == len(summary["epoch_seconds"]) and all(0 < s <= e for s, e in
                                                                zip(beside, summary["epoch_seconds"], strict=True))

"""`kill -9` (or a crash) mid-epoch, then `resume=auto`: the run ends with exactly the weights of an
uninterrupted one (every tensor, rtol=0, atol=0), on the CPU with `trainer.deterministic=true`."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers import assert_same_tensors, compose_cfg
from omegaconf import OmegaConf
from rel_helpers import PYTHON, cli_overrides, subprocess_env
from torch.utils.data import Dataset

from scfs.data.datasets import build_dataset
from scfs.data.samplers import EpochSeededRandomSampler
from scfs.methods.base import SelfDistillation
from scfs.models.checkpoint import safe_load
from scfs.train import run
from scfs.training.checkpointing import ResumableDataLoader

# 2 epochs x 3 batches = 6 steps, last.ckpt after every optimizer step
COMMON = ["trainer.max_epochs=2", "checkpoint.every_n_train_steps=1", "trainer.deterministic=true",
          "eval.knn_at_start=false"]
NAME = "scfs-shapes"  # cfg.name of the default method/data: resume=auto looks under runs/<name>/

# `python -m scfs.train` that stops at the start of the batch after `SCFS_TEST_HOLD_AT` optimizer steps (their
# last.ckpt written) and waits there to be killed: the kill lands at that step however fast the child runs against
# the parent, which trains its own reference run meanwhile
HOLD_ENV = "SCFS_TEST_HOLD_AT"
HOLDING_MAIN = (
    "import os, runpy, sys, time\n"
    "from scfs.methods.base import SelfDistillation\n"
    "_start = SelfDistillation.on_train_batch_start\n"
    f"_hold = int(os.environ['{HOLD_ENV}'])\n"
    "def _held(self, batch, batch_idx):\n"
    "    while self.trainer.global_step >= _hold:\n"
    "        time.sleep(1.0)\n"
    "    return _start(self, batch, batch_idx)\n"
    "SelfDistillation.on_train_batch_start = _held\n"
    "sys.argv[0] = 'scfs.train'\n"
    "runpy.run_module('scfs.train', run_name='__main__', alter_sys=True)\n"
)


def assert_same_training_state(a: dict, b: dict) -> None:
    """Every tensor of weights, optimizer state and callback state equal, bit for bit."""
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"])
    assert_same_tensors(a["state_dict"], b["state_dict"], "state_dict")
    assert_same_tensors(a["optimizer_states"], b["optimizer_states"], "optimizer_states")
    assert_same_tensors(a["callbacks"]["OnlineLinearMonitor"], b["callbacks"]["OnlineLinearMonitor"], "online_linear")


def _global_step(path: Path) -> int:
    try:
        return int(safe_load(path)["global_step"])
    except Exception:  # not there yet
        return -1


@pytest.mark.parametrize("writes", ["false", "true"], ids=["writes-on-the-training-thread", "background-writes"])
def test_kill9_mid_epoch_then_resume_auto_is_bit_exact(tmp_path, shapes_root, writes):
    """With background writes the kill lands while the training thread has moved on from the step the file holds."""
    common = [*COMMON, f"checkpoint.background_writes={writes}"]
    cfg = compose_cfg([*common, "trainer.limit_train_batches=3"], data_root=shapes_root)
    build_dataset(OmegaConf.to_container(cfg.data), "train")  # generate the data once, before two processes use it
    overrides = cli_overrides(*common, f"data.root={shapes_root}", limit_batches=3)
    kill_after = random.choice([1, 2, 4, 5])  # all mid-epoch; printed on failure
    env = {**subprocess_env(), HOLD_ENV: str(kill_after)}
    last = tmp_path / "runs" / NAME / "first" / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen([PYTHON, "-c", HOLDING_MAIN, *overrides, f"hydra.run.dir=runs/{NAME}/first"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ref = run(cfg, tmp_path / "ref")  # the uninterrupted run, while the child starts up
        deadline = time.time() + 120
        while _global_step(last) < kill_after and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
    finally:
        proc.kill()  # SIGKILL: no handler, no cleanup, no final save
    out = proc.communicate()[0].decode(errors="replace")
    assert proc.returncode == -9, f"the run was not killed mid-run (kill_after={kill_after}):\n{out[-3000:]}"
    assert _global_step(last) == kill_after, (kill_after, _global_step(last))

    resumed = subprocess.run([PYTHON, "-m", "scfs.train", *overrides, "resume=auto",
                              f"hydra.run.dir=runs/{NAME}/second"],
                             cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "6 steps" in resumed.stdout and ref["steps"] == 6
    a = safe_load(tmp_path / "ref" / "checkpoints" / "last.ckpt")
    b = safe_load(tmp_path / "runs" / NAME / "second" / "checkpoints" / "last.ckpt")
    assert_same_training_state(a, b)


PER_SAMPLE = [*COMMON, "trainer.limit_train_batches=3", "data.batch_aug=false"]


@pytest.fixture(scope="module")
def per_sample_reference(tmp_path_factory, shapes_root) -> dict:
    """The uninterrupted per-sample-augmentation run (single-threaded, like the tests that compare with it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        folder = tmp_path_factory.mktemp("per_sample_ref")
        assert run(compose_cfg(PER_SAMPLE, data_root=shapes_root), folder)["steps"] == 6
        return safe_load(folder / "checkpoints" / "last.ckpt")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("crash_step", [4, 3], ids=["mid-epoch", "epoch-boundary"])
def test_crash_then_resume_with_per_sample_augmentation_is_exact(tmp_path, shapes_root, monkeypatch,
                                                                  per_sample_reference, crash_step):
    """Per-sample MultiCrop (data.batch_aug=false) draws from the global RNG: the checkpoint carries it. Step 4 is
    one batch into epoch 1 (a step checkpoint), step 3 the start of epoch 1 (the epoch-end checkpoint)."""
    original = SelfDistillation.training_step

    def crash(self, batch, batch_idx):
        if self.global_step == crash_step:
            raise RuntimeError("simulated crash")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(SelfDistillation, "training_step", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(compose_cfg(PER_SAMPLE, data_root=shapes_root), tmp_path / "crashed")
    monkeypatch.setattr(SelfDistillation, "training_step", original)
    crashed = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    assert safe_load(crashed)["global_step"] == crash_step

    again = run(compose_cfg([*PER_SAMPLE, f"resume={crashed}"], data_root=shapes_root), tmp_path / "resumed")
    assert again["steps"] == 6
    assert_same_training_state(per_sample_reference, safe_load(tmp_path / "resumed" / "checkpoints" / "last.ckpt"))


def test_last_ckpt_always_holds_the_final_state(tmp_path, shapes_root):
    """Lightning's save_last only refreshes last.ckpt when a numbered checkpoint is written: with one every 2
    epochs, the 3rd epoch would be missing from it. Ours is written at every epoch end."""
    s = run(compose_cfg(["trainer.max_epochs=3", "checkpoint.every_n_epochs=2", "eval.knn_at_start=false"],
                        data_root=shapes_root), tmp_path)
    assert s["steps"] == 6
    assert safe_load(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 6
    assert (tmp_path / "checkpoints" / "epoch001.ckpt").is_file()


class _Recording(Dataset):
    def __init__(self, n: int) -> None:
        self.n, self.seen = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.seen.append(i)
        return i


def _epoch(loader, epoch: int) -> list[int]:
    loader.sampler.set_epoch(epoch)
    return [int(v) for batch in loader for v in batch]


def test_resumable_loader_skips_consumed_batches_without_loading_them():
    full = _epoch(ResumableDataLoader(_Recording(10), batch_size=2, sampler=EpochSeededRandomSampler(10, 3)), 1)
    ds = _Recording(10)
    loader = ResumableDataLoader(ds, batch_size=2, sampler=EpochSeededRandomSampler(10, 3))
    loader.load_state_dict({"epoch": 1, "batches": 2, "batch_size": 2})
    assert _epoch(loader, 1) == full[4:]
    assert ds.seen == full[4:]  # the skipped samples were never decoded
    assert _epoch(loader, 2) == _epoch(ResumableDataLoader(_Recording(10), batch_size=2,
                                                          sampler=EpochSeededRandomSampler(10, 3)), 2)
    # a checkpoint from the end of epoch 1 resumes at the start of epoch 2: nothing to skip there
    loader.load_state_dict({"epoch": 1, "batches": 2, "batch_size": 2})
    assert len(_epoch(loader, 2)) == 10
    assert loader.state_dict()["epoch"] == 2

"""More things that go wrong around a run: two runs in one folder, CUDA out of memory outside the training step,
an unwritable or torn feature cache, odd data roots, a read-only data folder."""

from __future__ import annotations

import errno
import os
import signal
import subprocess

import numpy as np
import pytest
import torch
from helpers import compose_cfg
from PIL import Image
from rel_helpers import PYTHON, subprocess_env

import scfs.eval.features as features_mod
from scfs.cli import run_reporting_errors
from scfs.data.datasets import build_dataset
from scfs.eval.features import cached_features
from scfs.models import Backbone
from scfs.reliability import RunFolderBusyError, RunFolderLock
from scfs.train import run


def _oom(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")


def _one_error_line(capsys, code, prog: str) -> str:
    assert code.value.code == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


# ---- one run per folder ------------------------------------------------------------------------------------------
def test_second_run_in_the_same_folder_is_refused(tmp_path, shapes_root):
    """Two runs with one hydra.run.dir wrote the same last.ckpt and logs, in turns."""
    busy = rf"run folder {tmp_path} is in use by another training run \(pid {os.getpid()} on "
    with RunFolderLock(tmp_path), pytest.raises(RunFolderBusyError, match=busy):  # the first run, still training
        run(compose_cfg(["eval.knn_at_start=false"], data_root=shapes_root), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_lock_of_a_killed_run_does_not_block_the_next(tmp_path):
    holder = subprocess.Popen([PYTHON, "-c", "import sys, time; from scfs.reliability import RunFolderLock; "
                               f"RunFolderLock({str(tmp_path)!r}).__enter__(); print('locked', flush=True); "
                               "time.sleep(60)"], env=subprocess_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusyError, match=f"pid {holder.pid}"):
            RunFolderLock(tmp_path).__enter__()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunFolderLock(tmp_path):  # the kernel released the dead run's lock
        pass


# ---- CUDA out of memory outside the training step ------------------------------------------------------------
def test_oom_in_an_eval_feature_pass_is_one_line_with_the_batch_size(tmp_path, shapes_root, monkeypatch, capsys):
    from scfs.eval.common import compose_eval_cfg
    from scfs.eval.knn import run_knn

    monkeypatch.setattr(features_mod, "extract_pooled", _oom)
    cfg = compose_eval_cfg("knn", [f"data.root={shapes_root}", "++data.n_train=48", "++data.n_val=24",
                                   "++data.image_size=32", "backbone.channels=[8,16,16,32]", "ckpt=random",
                                   "logger.wandb=false", "progress=false", "batch_size=512",
                                   f"feature_cache={tmp_path / 'cache'}"])
    with pytest.raises(SystemExit) as code:
        run_reporting_errors("scfs.eval.knn", run_knn, cfg, tmp_path / "run")
    line = _one_error_line(capsys, code, "scfs.eval.knn")
    assert "CUDA out of memory outside a training step" in line and "batch_size=256 (it was 512" in line


def _runtime_oom(*args, **kwargs):
    raise torch.AcceleratorError("CUDA error: out of memory")


@pytest.mark.parametrize("oom", [_oom, _runtime_oom], ids=["allocator", "cuda-runtime"])
def test_oom_in_the_knn_pass_of_training_is_one_line(tmp_path, shapes_root, monkeypatch, capsys, oom):
    """The kNN of the network at init runs before trainer.fit, outside the training step's OOM handling."""
    import scfs.train as train_mod

    monkeypatch.setattr(train_mod, "teacher_knn", oom)
    with pytest.raises(SystemExit) as code:
        run_reporting_errors("scfs.train", run, compose_cfg(["eval.knn_at_start=true"], data_root=shapes_root),
                             tmp_path)
    assert "batch_size=8 (it was 16" in _one_error_line(capsys, code, "scfs.train")


# ---- the feature cache -----------------------------------------------------------------------------------------
class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(i)), i % 2


def _tiny_backbone() -> Backbone:
    torch.manual_seed(0)
    return Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 16, 16, 32)).eval()


KEY = {"split": "val", "name": "test"}


def test_unwritable_feature_cache_does_not_cost_the_evaluation(tmp_path, monkeypatch, caplog):
    """A full (or read-only) cache folder made the evaluation fail after all its features were computed."""
    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(features_mod.torch, "save", full)
    out = cached_features(_tiny_backbone(), _Images(), model_id="m", data_key=KEY, cache_dir=tmp_path, batch_size=4)
    assert out.features.shape == (6, 32) and not out.from_cache
    assert "No space left on device" in caplog.text and "goes on without caching" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_torn_feature_cache_of_a_killed_eval_is_recomputed(tmp_path):
    first = cached_features(_tiny_backbone(), _Images(), model_id="m", data_key=KEY, cache_dir=tmp_path, batch_size=4)
    first.path.write_bytes(first.path.read_bytes()[:100])  # as if the file were cut short
    again = cached_features(_tiny_backbone(), _Images(), model_id="m", data_key=KEY, cache_dir=tmp_path, batch_size=4)
    assert not again.from_cache and torch.equal(again.features, first.features)
    assert cached_features(_tiny_backbone(), _Images(), model_id="m", data_key=KEY, cache_dir=tmp_path,
                           batch_size=4).from_cache  # and the cache is whole again


# ---- odd data roots --------------------------------------------------------------------------------------------
def _img(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 10, 3), 90, np.uint8)).save(path)


def test_data_root_that_is_a_file_says_so(tmp_path):
    archive = tmp_path / "images.tar"
    archive.write_bytes(b"x" * 100)
    with pytest.raises(NotADirectoryError, match=r"images\.tar is a file, not a folder.*scfs\.data\.prepare extract"):
        build_dataset({"name": "folder", "root": str(archive)}, "train")


def test_only_empty_class_folders_is_a_clear_error(tmp_path):
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no image files .* under .*train"), pytest.warns(RuntimeWarning):
        build_dataset({"name": "folder", "root": str(tmp_path)}, "train")


def test_val_split_without_images_is_a_clear_error(tmp_path):
    _img(tmp_path / "train" / "a" / "0.png")
    (tmp_path / "val" / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no image files .* under .*val"):
        build_dataset({"name": "folder", "root": str(tmp_path)}, "val")


def test_training_never_writes_into_the_data_folder(tmp_path):
    """A read-only data folder (a shared mount) works: nothing is created or changed under data.root."""
    root = tmp_path / "data"
    for split, n in (("train", 6), ("val", 2)):
        for c in ("a", "b"):
            for i in range(n):
                _img(root / split / c / f"{i}.png")
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    s = run(compose_cfg(["data=folder", f"data.root={root}", "++data.batch_aug=false", "batch_size=4",
                         "eval.knn_k=[3]", "eval.knn_at_start=false"]), tmp_path / "run")
    assert s["steps"] == 2
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before

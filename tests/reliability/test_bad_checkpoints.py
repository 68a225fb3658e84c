"""Checkpoints that cannot be used: cut short (truncated, empty), holding NaN/Inf weights, or of a run that has
already finished its schedule. Each is refused before anything is built or written, in one line naming the file
and the fix, for the eval CLIs (`ckpt=`) and for training (`resume=`)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from helpers import compose_cfg
from rel_helpers import PYTHON, subprocess_env

from scfs.eval.common import compose_eval_cfg, load_eval_backbone
from scfs.models.backbone import load_backbone
from scfs.models.checkpoint import NonFiniteWeightsError, NotACheckpointError, safe_load
from scfs.train import run
from scfs.training.checkpointing import RunAlreadyCompleteError

NO_KNN = ["eval.knn_at_start=false"]


def _cut(src, dst, n: int | None):
    data = src.read_bytes()
    dst.write_bytes(b"" if n is None else data[:n])
    return dst


@pytest.fixture
def broken(finished, tmp_path):
    """{'truncated': half of a real checkpoint, 'empty': 0 bytes}."""
    size = finished.stat().st_size
    return {"truncated": _cut(finished, tmp_path / "truncated.ckpt", size // 2),
            "empty": _cut(finished, tmp_path / "empty.ckpt", None)}


@pytest.mark.parametrize("kind", ["truncated", "empty"])
def test_cut_short_checkpoint_is_named_with_the_fix(broken, kind):
    """torch.load said `PytorchStreamReader failed reading zip archive` (truncated) or a bare EOFError (empty)."""
    with pytest.raises(NotACheckpointError) as info:
        safe_load(broken[kind])
    msg = str(info.value)
    assert str(broken[kind]) in msg and "cut short" in msg and "copy it again" in msg
    assert ("empty (0 bytes)" if kind == "empty" else "truncated or corrupt") in msg


@pytest.mark.parametrize("cli", ["knn", "linear", "detect"])
def test_eval_loaders_refuse_cut_short_checkpoints(broken, cli):
    for path in broken.values():
        with pytest.raises(NotACheckpointError, match="cut short"):
            load_eval_backbone(compose_eval_cfg(cli, [f"ckpt={path}"]))


def test_precision_loader_refuses_cut_short_checkpoints(broken):
    from scfs.eval.precision import load_backbones

    with pytest.raises(NotACheckpointError, match="cut short"):
        load_backbones([f"SCFS={broken['truncated']}"])


def _one_error_line(p: subprocess.CompletedProcess, prog: str) -> str:
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith(" ")]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), p.stderr
    return lines[0]


def test_cut_short_checkpoint_is_one_line_in_eval_and_train_clis(broken, tmp_path):
    """The 53-60-line tracebacks of the issue, through the real entry points."""
    env = subprocess_env(WANDB_MODE="disabled")
    p = subprocess.run([PYTHON, "-m", "scfs.eval.knn", f"ckpt={broken['truncated']}", "logger.wandb=false",
                        f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert "truncated or corrupt" in _one_error_line(p, "scfs.eval.knn")
    p = subprocess.run([PYTHON, "-m", "scfs.train", f"resume={broken['empty']}", f"hydra.run.dir={tmp_path / 'run'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "empty (0 bytes)" in _one_error_line(p, "scfs.train")
    assert not (tmp_path / "run" / "checkpoints").exists()


def _poisoned(finished, tmp_path, key_part: str = "teacher.backbone.body.conv1"):
    ckpt = safe_load(finished)
    key = next(k for k in ckpt["state_dict"] if k.startswith(key_part))
    ckpt["state_dict"][key].view(-1)[0] = float("nan")
    path = tmp_path / "nan.ckpt"
    torch.save(ckpt, path)
    return path, key


def test_eval_refuses_nan_weights_instead_of_reporting_an_accuracy(finished, tmp_path):
    """scfs.eval.knn printed "top-1 8.33 %" for a checkpoint with a NaN in conv1."""
    path, key = _poisoned(finished, tmp_path)
    with pytest.raises(NonFiniteWeightsError, match=r"non-finite weights \(NaN/Inf\) in conv1\.weight"):
        load_eval_backbone(compose_eval_cfg("knn", [f"ckpt={path}"]))
    with pytest.raises(NonFiniteWeightsError, match=str(path)):
        load_backbone(path)
    load_backbone(path, "student")  # the NaN is in the teacher only: the student's weights are fine


def test_resume_refuses_nan_weights_and_never_calls_them_last_good(finished, shapes_root, tmp_path):
    """Resuming used to train into "non-finite loss ... Last good checkpoint: <the NaN file>"."""
    path, key = _poisoned(finished, tmp_path, "student.")
    with pytest.raises(NonFiniteWeightsError) as info:
        run(compose_cfg([*NO_KNN, f"resume={path}", "trainer.max_epochs=2"], data_root=shapes_root),
            tmp_path / "run")
    msg = str(info.value)
    assert f"resume={path} holds non-finite values" in msg and key in msg and "last good" not in msg.lower()
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_says_so_and_how_to_continue(finished, shapes_root, tmp_path):
    """It exited 0 with "loss nan" and pointed to a last.ckpt that the new run folder never got."""
    with pytest.raises(RunAlreadyCompleteError) as info:
        run(compose_cfg([*NO_KNN, f"resume={finished}"], data_root=shapes_root), tmp_path / "run")
    msg = str(info.value)
    assert "already complete at epoch 1 / step 2 (trainer.max_epochs=1)" in msg
    assert "raise trainer.max_epochs (e.g. trainer.max_epochs=2)" in msg
    assert not (tmp_path / "run").exists()
    with pytest.raises(RunAlreadyCompleteError, match=r"step 2 \(trainer.max_steps=2\).*trainer.max_steps=4"):
        run(compose_cfg([*NO_KNN, f"resume={finished}", "trainer.max_epochs=5", "+trainer.max_steps=2"],
                        data_root=shapes_root), tmp_path / "run")
    s = run(compose_cfg([*NO_KNN, f"resume={finished}", "trainer.max_epochs=2"], data_root=shapes_root),
            tmp_path / "run")  # the advice works: one more epoch is trained
    assert s["steps"] == 4 and s["loss"] == s["loss"] and (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_precision_cli_says_an_empty_checkpoint_in_one_line(tmp_path):
    """`python -m scfs.eval.precision` goes through the same one-line error plumbing as the other CLIs."""
    import subprocess
    import sys

    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    res = subprocess.run([sys.executable, "-m", "scfs.eval.precision", str(empty), "--limit", "4",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("scfs.eval.precision: error: checkpoint") and "empty" in lines[-1]
    assert "Traceback" not in res.stderr

"""A weights-only teacher file (a Lightning checkpoint stripped to `teacher.backbone.*` in fp16 plus its
hyper_parameters) loads in every loader the evaluation CLIs and the docs figures use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scfs.eval.common import load_eval_backbone
from scfs.eval.precision import load_backbones
from scfs.models.backbone import load_backbone
from scfs.models.checkpoint import NotACheckpointError, safe_load


def teacher_file(ckpt: Path, out: Path) -> Path:
    """The file layout the lead keeps real teachers in: only `teacher.backbone.*`, fp16, and hyper_parameters."""
    raw = safe_load(ckpt)
    state = {k: v.half() for k, v in raw["state_dict"].items() if k.startswith("teacher.backbone.")}
    torch.save({"state_dict": state, "hyper_parameters": raw["hyper_parameters"]}, out)
    return out


def _assert_teacher_in_fp16_rounding(got: torch.nn.Module, ckpt: Path) -> None:
    want = load_backbone(ckpt).state_dict()
    have = got.state_dict()
    assert set(have) == set(want)
    for k, v in want.items():
        assert have[k].dtype == v.dtype, k  # the network stays fp32 (int counters stay int)
        if v.is_floating_point():
            torch.testing.assert_close(have[k], v.half().float(), rtol=0, atol=0, msg=k)  # = fp16 rounding of it
            torch.testing.assert_close(have[k], v, rtol=1e-3, atol=1e-4, msg=k)


def test_teacher_file_loads_in_every_loader(tiny_ckpt, tmp_path, eval_cfg):
    path = teacher_file(tiny_ckpt, tmp_path / "teacher_fp16.pt")
    raw = safe_load(path)
    assert all(k.startswith("teacher.backbone.") for k in raw["state_dict"])
    assert {v.dtype for v in raw["state_dict"].values() if v.is_floating_point()} == {torch.float16}
    _assert_teacher_in_fp16_rounding(load_backbone(path), tiny_ckpt)  # docs_figures / precision build on this
    backbones, paths = load_backbones([f"T={path}", "random"])  # precision and docs_figures
    _assert_teacher_in_fp16_rounding(backbones["T"], tiny_ckpt)
    assert paths["T"] == str(path.resolve())
    assert list(load_backbones([str(path)])[0]) == ["SCFS (soft)"]  # labelled from its hyper_parameters
    bb, info = load_eval_backbone(eval_cfg("knn", f"ckpt={path}"))  # knn and linear
    _assert_teacher_in_fp16_rounding(bb, tiny_ckpt)
    assert info.format == "scfs-lightning" and info.method == "scfs"
    bb, _ = load_eval_backbone(eval_cfg("linear", f"ckpt={path}"))
    _assert_teacher_in_fp16_rounding(bb, tiny_ckpt)
    with pytest.raises(NotACheckpointError, match="no 'student' network .* which=teacher"):
        load_eval_backbone(eval_cfg("knn", f"ckpt={path}", "which=student"))


def test_knn_cli_on_a_teacher_file(tiny_ckpt, tmp_path, eval_cfg):
    """The kNN run of the teacher file scores what the full checkpoint's teacher scores (fp16 weights)."""
    from scfs.eval.knn import run_knn

    path = teacher_file(tiny_ckpt, tmp_path / "teacher_fp16.pt")
    got = run_knn(eval_cfg("knn", f"ckpt={path}"), tmp_path / "file")["metrics"]["top1"]
    want = run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}"), tmp_path / "full")["metrics"]["top1"]
    assert abs(got - want) <= 100 / 24 + 1e-9  # 24 val images: at most one prediction may flip

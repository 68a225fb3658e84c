"""`python -m scfs.bench.step --device cpu --tiny` runs the real training step and writes a sane record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scfs.bench.step import main


def test_step_benchmark_tiny_cpu_writes_json_and_markdown(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "2", "--strict", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    rec = json.loads(js.read_text())
    assert rec["meta"]["processes"] == 1 and rec["meta"]["data"] == "synthetic"
    assert {(r["method"], r["B"]) for r in rec["rows"]} == {("scfs", 8), ("dino", 8)}
    for r in rec["rows"]:
        assert r["step_ms"] > 0 and r["img_per_s"] > 0 and r["steps"] == 2 and r["world"] == 1
    scfs = next(r for r in rec["rows"] if r["method"] == "scfs")
    assert scfs["ratio_scfs_dino"] > 0
    assert "| scfs | 8 | fp32 |" in js.with_suffix(".md").read_text()


def test_step_profile_counts_ops_per_step(tmp_path: Path) -> None:
    """--profile: SCFS runs the DINO step plus its per-stage terms, so it must count more ops per step."""
    torch.set_num_threads(1)
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "2", "--profile", "1", "--strict",
                 "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    prof = {r["method"]: r["profile"] for r in json.loads(js.read_text())["rows"]}
    assert prof["scfs"]["aten_ops_per_step"] > prof["dino"]["aten_ops_per_step"] > 100
    assert prof["scfs"]["top"] and all(t["self_ms_per_step"] >= 0 for t in prof["scfs"]["top"])
    counts = [f["count_per_step"] for f in prof["scfs"]["frequent"]]  # most frequent aten ops, in order
    assert counts == sorted(counts, reverse=True) and counts[0] >= 1
    assert all(f["op"].startswith("aten::") for f in prof["scfs"]["frequent"])
    # the named parts of the step: SCFS has its stage terms, DINO only the shared parts
    assert {"student_backbone", "teacher_backbone_head", "dino_term", "backward", "ema"} <= set(prof["dino"]["parts"])
    assert "stage_layer4_local" in prof["scfs"]["parts"] and not any("stage" in k for k in prof["dino"]["parts"])
    assert all(v["cpu_ms"] > 0 for v in prof["scfs"]["parts"].values())
    assert "Profile (`--profile`)" in js.with_suffix(".md").read_text()


def test_setting_filter_selects_exactly_those_rows() -> None:
    from scfs.bench.step import suite_rows

    rows = suite_rows("cifar", quick=False, tiny=False, batches=None, settings=["bf16_cl", "bf16_cl_graphs"])
    assert rows == [(m, 512, s) for m in ("scfs", "dino") for s in ("bf16_cl", "bf16_cl_graphs")]
    rows = suite_rows("resnet50", quick=True, tiny=False, batches=[64], settings=["bf16_cl_graphs"])
    assert rows == [("scfs", 64, "bf16_cl_graphs"), ("dino", 64, "bf16_cl_graphs")]
    assert ("scfs", 32, "fp32") in suite_rows("resnet50", quick=False, tiny=False, batches=None)


def test_real_data_mode_needs_a_prepared_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A wrong --data-root used to run every row into an error and still write a record (exit 0)."""
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--tiny", "--data", "real", "--data-root", str(tmp_path), "--out", str(tmp_path)])
    assert exc.value.code == 2 and "no train/ folder" in capsys.readouterr().err
    assert not list(tmp_path.glob("step-*.json"))

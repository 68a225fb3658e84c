"""`scfs.bench.flops`: the per-part FLOPs of a training step, checked against a hand count of the DINO head and
against the parts' own invariants (same backbones for both methods, the parts summing to the step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scfs.bench.compile import compose
from scfs.bench.flops import PARTS, main, step_flops


def _cfg(method: str, batch: int = 2):
    return compose("default", "cpu", True, "model", False, [f"method={method}", f"batch_size={batch}",
                                                           "search.backend=reference"])


def test_the_dino_head_is_counted_as_its_matmuls() -> None:
    cfg = _cfg("dino")
    m, emb = cfg.method, int(cfg.backbone.channels[-1])
    per_view = 2 * (emb * m.hidden_dim + m.hidden_dim * m.hidden_dim + m.hidden_dim * m.bottleneck_dim
                    + m.bottleneck_dim * m.out_dim)  # a 3-layer MLP, then the prototypes
    parts = step_flops(cfg)["parts"]
    views = 2 + int(cfg.crops.n_local)
    assert parts["student heads"] == per_view * views
    assert parts["teacher heads"] == per_view * 2  # the teacher sees the global views
    assert parts["backward: heads and losses"] == 2 * per_view * views  # input and weight gradients
    assert parts["losses, search, searched branch"] == 0  # DINO's loss has no matmul


def test_scfs_adds_work_only_outside_the_backbones_and_per_image() -> None:
    scfs, dino = step_flops(_cfg("scfs")), step_flops(_cfg("dino"))
    for part in ("student backbone", "teacher backbone", "backward: backbone"):
        assert scfs["parts"][part] == dino["parts"][part] > 0
    for part in ("student heads", "teacher heads", "losses, search, searched branch", "backward: heads and losses"):
        assert scfs["parts"][part] > dino["parts"][part] >= 0
    assert scfs["total"] == pytest.approx(sum(scfs["parts"].values()))
    assert set(scfs["parts"]) == set(PARTS)
    # per image: all but a few batch-independent products (the closed-form BatchNorm's weight x moments) scale
    # with the batch
    assert step_flops(_cfg("scfs", batch=4))["parts"] == pytest.approx(scfs["parts"], rel=0.02)


def test_the_record_names_the_ratio_and_every_part(tmp_path: Path) -> None:
    assert main(["--tiny", "--recipe", "default", "--out", str(tmp_path)]) == 0
    rec = json.loads(next(tmp_path.glob("flops-*.json")).read_text())
    rows = rec["recipes"]["default"]
    assert rows["ratio"] == pytest.approx(rows["scfs"]["total"] / rows["dino"]["total"]) and rows["ratio"] > 1
    md = next(tmp_path.glob("flops-*.md")).read_text()
    assert all(f"| {p} |" in md for p in PARTS) and "SCFS / DINO work ratio" in md


def test_an_override_reaches_both_methods_and_names_the_record(tmp_path: Path) -> None:
    """`--override` changes the configs the work is counted on (a wider stage-head branch: more SCFS work, DINO's
    unchanged), the record says so and `--tag` names it; a bad override is the config's one-line error."""
    from scfs.config import ConfigError

    assert main(["--tiny", "--recipe", "default", "--out", str(tmp_path / "base")]) == 0
    assert main(["--tiny", "--recipe", "default", "--override", "++method.stage_branch_channels=64", "--tag", "wide",
                 "--out", str(tmp_path / "wide")]) == 0
    base = json.loads(next((tmp_path / "base").glob("flops-*.json")).read_text())["recipes"]["default"]
    js = next((tmp_path / "wide").glob("flops-*-wide*.json"))
    rec = json.loads(js.read_text())
    wide = rec["recipes"]["default"]
    assert rec["overrides"] == ["++method.stage_branch_channels=64"]
    assert "Overrides on every row: `++method.stage_branch_channels=64`" in js.with_suffix(".md").read_text()
    assert wide["dino"]["total"] == base["dino"]["total"]
    assert wide["scfs"]["total"] > base["scfs"]["total"] and wide["ratio"] > base["ratio"]
    with pytest.raises(ConfigError, match="stage_branch_channels"):
        main(["--tiny", "--recipe", "default", "--override", "++method.stage_branch_channels=0",
              "--out", str(tmp_path / "bad")])

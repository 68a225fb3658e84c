"""Precision pooled over seeds: the t quantile and interval on numbers with a known answer, the pooled report's
table, document and figure on fabricated per-seed values, the CLI's seed groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scfs.eval.precision import PrecisionReport, main, seed_groups
from scfs.eval.seeds import pool_over_seeds, t_interval, t_quantile

STAGES = ("layer2", "layer3")


@pytest.mark.parametrize(("df", "want"), [(1, 12.706205), (2, 4.302653), (4, 2.776445), (9, 2.262157),
                                          (30, 2.042272)])
def test_t_quantile_matches_the_tables(df, want):
    assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-6)


def test_t_interval_known_answer():
    mean, lo, hi = t_interval([0.2, 0.3, 0.4])  # sd 0.1, n 3: half = t(0.975, 2) * 0.1 / sqrt(3)
    assert mean == pytest.approx(0.3)
    assert (hi - lo) / 2 == pytest.approx(4.302653 * 0.1 / math.sqrt(3), abs=1e-6)
    assert t_interval([0.5, float("nan"), 0.7])[0] == pytest.approx(0.6)  # a seed without a value is left out
    one = t_interval([0.4])
    assert one[0] == 0.4 and all(math.isnan(v) for v in one[1:])


def _fabricated() -> PrecisionReport:
    """Three SCFS seeds with known values, one DINO checkpoint."""
    per_seed = {"layer2": [0.40, 0.50, 0.60], "layer3": [0.30, 0.30, 0.36]}
    values = {f"SCFS [{k + 1}]": {"soft": {s: v[k] for s, v in per_seed.items()}} for k in range(3)}
    values["DINO"] = {"soft": {"layer2": 0.55, "layer3": 0.45}}
    ci = {m: {"soft": {s: [v - 0.02, v + 0.02] for s, v in d["soft"].items()}} for m, d in values.items()}
    return PrecisionReport(values, 0.25, 100, 25, STAGES, ("soft",), ci=ci, chance_interval=[0.24, 0.26],
                           seeds={"SCFS": ["SCFS [1]", "SCFS [2]", "SCFS [3]"]})


def test_pooled_report_mean_seeds_and_interval(tmp_path):
    rep = _fabricated()
    pool = rep.pooled()["SCFS"]
    assert pool.per_seed["soft"]["layer2"] == [0.40, 0.50, 0.60]
    assert pool.mean["soft"]["layer2"] == pytest.approx(0.5)
    lo, hi = pool.ci["soft"]["layer2"]
    assert (hi - lo) / 2 == pytest.approx(4.302653 * 0.1 / math.sqrt(3), abs=1e-6)
    sd3 = float(np.std([0.30, 0.30, 0.36], ddof=1))
    assert (pool.ci["soft"]["layer3"][1] - pool.mean["soft"]["layer3"]) == pytest.approx(4.302653 * sd3 / 3 ** 0.5,
                                                                                        abs=1e-6)
    assert np.allclose(pool.within["soft"]["layer2"], [[0.38, 0.42], [0.48, 0.52], [0.58, 0.62]])
    table = rep.seeds_markdown()
    assert "| SCFS (3) | soft | 50.0 ± 24.8 (seeds 40.0 / 50.0 / 60.0; within-seed ± 2.0) |" in table
    assert "DINO" not in table
    doc = rep.document()["over_seeds"]["SCFS"]
    assert doc["members"] == ["SCFS [1]", "SCFS [2]", "SCFS [3]"] and doc["mean"]["soft"]["layer2"] == 0.5
    files = rep.save(tmp_path)
    assert "## Over seeds" in (tmp_path / "precision.md").read_text() and files["figure"].endswith(".png")


def test_pooled_figure_one_axis_with_chance_and_the_seeds_as_dots():
    fig = _fabricated().figure()
    (ax,) = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    # the seeds are not lines of their own
    assert sorted(labels) == ["DINO", "SCFS (3 seeds)", "chance (uniform weights)"]
    dots = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections if len(c.get_offsets()) == 3])
    assert sorted(dots.round(6).tolist()) == sorted([40.0, 50.0, 60.0, 30.0, 30.0, 36.0])
    assert any(line.get_ydata()[0] == pytest.approx(25.0) for line in ax.get_lines())  # the chance line


def test_pool_refuses_unknown_members():
    with pytest.raises(ValueError, match="no values"):
        pool_over_seeds({"a": {"soft": {"layer2": 0.1}}}, {}, {"X": ["a", "b"]})


def test_seed_groups_from_the_command_line(tmp_path):
    specs, groups = seed_groups(["SCFS=a.ckpt,b.ckpt,c.ckpt", "DINO=d.ckpt", "random"], random_seeds=[0, 1])
    assert specs == ["SCFS [1]=a.ckpt", "SCFS [2]=b.ckpt", "SCFS [3]=c.ckpt", "DINO=d.ckpt",
                     "random init [seed 0]=random@0", "random init [seed 1]=random@1"]
    assert groups == {"SCFS": ["SCFS [1]", "SCFS [2]", "SCFS [3]"],
                      "random init": ["random init [seed 0]", "random init [seed 1]"]}
    assert seed_groups(["random"]) == (["random"], {})


def test_precision_cli_pools_random_init_over_seeds(tmp_path, capsys):
    doc = main(["random", "--random-seeds", "0", "1", "--data-root", str(tmp_path / "shapes"), "--n-train", "4",
                "--n-val", "6", "--n-crops", "2", "--modes", "soft", "--out", str(tmp_path / "run")])
    pool = doc["over_seeds"]["random init"]
    assert pool["members"] == ["random init [seed 0]", "random init [seed 1]"]
    for s, v in pool["mean"]["soft"].items():
        seeds = [doc["values"][m]["soft"][s] for m in pool["members"]]
        assert pool["per_seed"]["soft"][s] == seeds and v == pytest.approx(np.mean(seeds))
    assert doc["values"]["random init [seed 0]"] != doc["values"]["random init [seed 1]"]
    assert "over 2 seeds soft: best stage" in capsys.readouterr().out


def test_gain_over_each_seeds_own_init_is_paired():
    """SCFS seeds 0.40 / 0.50 / 0.60 over inits 0.35 / 0.40 / 0.58: differences +5 / +10 / +2 points, whose mean
    and t-interval are known; a label with another number of seeds is left out."""
    rep = _fabricated()
    inits = [0.35, 0.40, 0.58]
    for k, v in enumerate(inits):
        rep.values[f"random init [seed {k}]"] = {"soft": {"layer2": v, "layer3": 0.28}}
    rep.seeds["random init"] = [f"random init [seed {k}]" for k in range(3)]
    rep.seeds["DINO"] = ["DINO"]
    gain = rep.gain_over_init()
    assert set(gain) == {"SCFS"}
    g = gain["SCFS"]["soft"]["layer2"]
    assert g["per_seed"] == pytest.approx([0.05, 0.10, 0.02])
    sd = float(np.std([0.05, 0.10, 0.02], ddof=1))
    assert g["mean"] == pytest.approx(0.17 / 3)
    assert (g["ci"][1] - g["ci"][0]) / 2 == pytest.approx(4.302653 * sd / math.sqrt(3), abs=1e-6)
    table = rep.gain_markdown()
    assert "| SCFS (3) | soft | +5.7 ± 10.0 (seeds +5.0 / +10.0 / +2.0) |" in table
    assert rep.document()["gain_over_init"]["SCFS"]["soft"]["layer3"]["per_seed"] == pytest.approx([0.02, 0.02, 0.08])


def test_a_run_at_seed_k_starts_from_random_init_at_seed_k():
    """What makes the pairing valid: the teacher a training run at seed k builds is the network `random@k` builds."""
    import lightning as L
    import torch
    from helpers import compose_cfg
    from omegaconf import OmegaConf

    from scfs.models.backbone import load_backbone
    from scfs.train import build

    for seed in (0, 3):
        cfg = compose_cfg([f"seed={seed}"])
        L.seed_everything(seed, verbose=False)
        _, model = build(cfg)
        trained_from = dict(model.backbone("teacher").named_parameters())
        torch.manual_seed(seed)
        init = dict(load_backbone("random", backbone_cfg=OmegaConf.to_container(cfg.backbone)).named_parameters())
        assert set(init) == set(trained_from)
        assert all(torch.equal(init[k], trained_from[k]) for k in init)

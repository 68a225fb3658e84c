"""`python -m scfs.eval.compare <multirun folder>`: the study table on fabricated job folders with known mean and
sample standard deviation, the JSON record and the kNN-against-epochs figure."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scfs.eval.compare import compare_study, study_groups, study_jobs
from scfs.eval.compare import main as compare_main


def _job(sweep: Path, num: int, overrides: list[str], knn: float | None, seconds: float = 0.0,
         linear: float | None = None, curve: list[tuple[int, float]] = ()) -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    if knn is not None:
        (job / "summary.json").write_text(json.dumps({"knn": {"top1_k20": knn, "top1_k200": knn - 1},
                                                      "seconds": seconds, "method": "scfs"}))
    if curve:
        (job / "knn_curve.json").write_text(json.dumps([{"epoch": e, "top1_k20": v} for e, v in curve]))
    if linear is not None:
        probe = job / "eval" / "linear-x"
        probe.mkdir(parents=True)
        (probe / "metrics.json").write_text(json.dumps({"kind": "linear", "metrics": {"top1": linear, "top5": 99}}))


@pytest.fixture
def study(tmp_path):
    sweep = tmp_path / "runs" / "multirun" / "2026-12-02" / "03-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    common = ["+experiment=cifar10", "trainer.max_epochs=100"]
    for i, (knn, sec, lin) in enumerate([(40.0, 100.0, 70.0), (50.0, 110.0, 74.0), (60.0, 120.0, None)]):
        _job(sweep, i, [*common, "method=scfs", f"seed={i}"], knn, sec, lin, [(10, knn / 2), (20, knn)])
    _job(sweep, 3, [*common, "method=dino", "seed=0"], 30.0, 90.0, curve=[(10, 20.0), (20, 30.0)])
    _job(sweep, 4, [*common, "method=dino", "seed=1", "resume='/x/last.ckpt'"], 34.0, 95.0,
         curve=[(10, 22.0), (20, 34.0)])
    _job(sweep, 5, [*common, "method=dino", "seed=2"], None)  # still running, or failed
    return sweep


def test_study_groups_by_configuration_with_mean_and_sample_std(study):
    groups, k = study_groups(study_jobs(study))
    assert k == 20 and [g["label"] for g in groups] == ["method=scfs", "method=dino"]
    scfs, dino = groups
    assert scfs["seeds"] == ["0", "1", "2"] and scfs["knn"]["mean"] == pytest.approx(50.0)
    assert scfs["knn"]["std"] == pytest.approx(10.0)  # sample std of 40, 50, 60
    assert scfs["linear"]["mean"] == pytest.approx(72.0) and scfs["linear"]["std"] == pytest.approx(2 ** 1.5)
    assert scfs["linear"]["n"] == 2 and scfs["seconds"]["mean"] == pytest.approx(110.0)
    assert dino["knn"]["mean"] == pytest.approx(32.0) and dino["knn"]["std"] == pytest.approx(2 * 2 ** 0.5)
    assert len(dino["unfinished"]) == 1, "a resumed job is the same configuration; the unfinished one is counted"
    assert study_groups(study_jobs(study), k=200)[0][0]["knn"]["mean"] == pytest.approx(49.0)


def test_compare_writes_table_record_and_figure(study, capsys):
    table = compare_main([str(study)])
    assert "| method=scfs | 0,1,2 | 50.0 ± 10.0 | 72.0 ± 2.8 | 110 ± 10 | 0 |" in table
    assert "| method=dino | 0,1 | 32.0 ± 2.8 | - | 92 ± 4 | 1 |" in table
    assert table in capsys.readouterr().out
    assert table in (study / "study.md").read_text()
    record = json.loads((study / "study.json").read_text())
    assert record["groups"][0]["knn"]["values"] == [40.0, 50.0, 60.0]
    assert Path(record["figure"]).is_file() and Path(record["figure"]).stat().st_size > 1000


def test_a_folder_without_jobs_is_refused(tmp_path):
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(FileNotFoundError, match="holds no job folders"):
        compare_study(tmp_path)

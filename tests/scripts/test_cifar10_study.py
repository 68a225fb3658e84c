"""The CIFAR-10 study runner (scripts/cifar10_study.py) on fake training and probe processes: it skips committed
runs, records each finished run with its probe, keeps a run that would miss the deadline out, measures the ramp,
and renders the paired table from the JSON alone."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

FAKE_TRAIN = r'''
import json, sys, time
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
# launched as one job of its study's multirun, in the folder the runner chose
assert sys.argv[1] == "-m" and args["+study"].startswith("cifar10_") and args["hydra.sweep.subdir"] == ".", sys.argv
d = Path(args["hydra.sweep.dir"]); epochs = int(args["trainer.max_epochs"])
import os
print("Epoch 0:   0%|          | 0/97 [00:00<?]", end="\r", flush=True)
time.sleep(float(os.environ.get("FAKE_COMPILE_S", "0")))  # the first step waits for the compile
for e in range(epochs):
    for step in (32, 64, 97):
        print(f"Epoch {e}:  50%|#####     | {step}/97 [00:01<00:01]", end="\r", flush=True)
        time.sleep(0.1)
import torch  # after the epochs, so a fake run's pace does not wait for the import
(d / "checkpoints").mkdir(parents=True, exist_ok=True)
torch.save({"state_dict": {"teacher.backbone.body.w": torch.ones(3), "student.backbone.body.w": torch.ones(3)},
            "hyper_parameters": {"backbone": {"name": "x"}}}, d / "checkpoints" / "last.ckpt")
bonus = 2.0 if args["method"] == "scfs" else 0.0
seed = int(args["seed"])
(d / "knn_curve.json").write_text(json.dumps([{"epoch": epochs, "top1_k20": 50 + bonus + seed, "top1_k200": 49}]))
(d / "summary.json").write_text(json.dumps({"epochs": epochs, "seconds": 1.0, "loss": 1.0, "uniform_loss": 2.0,
    "knn": {"top1_k20": 50 + bonus + seed, "top1_k200": 49 + bonus}, "knn_init": {"top1_k20": 30.0}}))
'''
FAKE_LINEAR = r'''
import json, sys
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
d = Path(args["hydra.run.dir"]); d.mkdir(parents=True, exist_ok=True)
(d / "metrics.json").write_text(json.dumps({"metrics": {"top1": 60.0, "top5": 90.0},
    "probe": {"lr": 0.1, "weight_decay": 0.0}}))
'''


@pytest.fixture()
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("cifar10_study", ROOT / "scripts" / "cifar10_study.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cifar10_study", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "fake_train.py").write_text(FAKE_TRAIN)
    (fakes / "fake_linear.py").write_text(FAKE_LINEAR)
    monkeypatch.setattr(mod, "TRAIN_MODULE", "fake_train")
    monkeypatch.setattr(mod, "LINEAR_MODULE", "fake_linear")
    monkeypatch.setattr(mod, "COMPILE_S", 1.0)
    monkeypatch.setattr(mod, "POLL_S", 0.2)
    monkeypatch.setattr(mod, "MIN_RATE_S", 0.3)
    monkeypatch.setattr(mod, "LINEAR_S", 1.0)
    monkeypatch.setattr(mod, "SECONDS_PER_EPOCH_ALONE", 0.1)
    monkeypatch.setenv("PYTHONPATH", str(fakes) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("COMMIT", "abc1234")
    return mod


def test_runs_records_skips_and_renders(study, tmp_path: Path) -> None:
    committed = tmp_path / "committed-cifar10-quality-x.json"
    committed.write_text(json.dumps({"runs": [{"method": "dino", "variant": "dino", "seed": 0, "epochs": 12,
                                                "knn_top1_k20": 50.0, "knn_top1_k200": 49.0, "linear_top1": 60.0}]}))
    out = tmp_path / "out"
    rc = study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "2",
                     "--deadline", str(time.time() + 120), "--test-epochs", "12", "--ramp", "--ramp-s", "0.5",
                     "--only", "scfs-soft-s0-e12", "dino-dino-s0-e12", "scfs-soft-s1-e12", "dino-dino-s1-e12",
                     "--slim", "scfs-soft-s0-e12", "--committed", str(committed)])
    assert rc == 0
    rec = json.loads(next(out.glob("cifar10-quality-*.json")).read_text())
    keys = sorted(f"{r['method']}-s{r['seed']}" for r in rec["runs"])
    assert keys == ["dino-s1", "scfs-s0", "scfs-s1"]  # dino s0 was in the committed record
    assert all(r["linear_top1"] == 60.0 and r["commit"] == "abc1234" for r in rec["runs"])
    assert all(0 < r["linear_s"] < 60 for r in rec["runs"])  # each probe's wall time, the next window's prior
    assert [st["runs"] for st in rec["concurrency"]["stages"]][:2] == [1, 2]
    assert (out / "ramp.done").is_file()  # the ramp reached --parallel: work waiting for it may start
    parts = sorted((out / "slim").glob("scfs-soft-s0-e12.pt.part*"))
    blob = b"".join(p.read_bytes() for p in parts)
    (tmp_path / "slim.pt").write_bytes(blob)
    slim = torch.load(tmp_path / "slim.pt", weights_only=True)
    assert list(slim["state_dict"]) == ["teacher.backbone.body.w"]
    assert slim["state_dict"]["teacher.backbone.body.w"].dtype == torch.float16
    md = study.render(rec, study.committed(str(committed)))
    # seeds 0 and 1 paired: SCFS - DINO is +2 on both seeds (seed 0 from the committed DINO row)
    assert "+2.00, +2.00" in md and "+2.00 [+2.00, +2.00]" in md


def test_a_run_that_would_miss_the_deadline_is_not_started(study, tmp_path: Path) -> None:
    out = tmp_path / "out"
    study.SECONDS_PER_EPOCH_ALONE = 10.0
    rc = study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "1",
                     "--deadline", str(time.time() + 20), "--test-epochs", "3", "--only", "scfs-soft-s0-e3",
                     "--committed", str(tmp_path / "none-*.json")])
    assert rc == 0
    assert json.loads(next(out.glob("cifar10-quality-*.json")).read_text())["runs"] == []
    assert not (tmp_path / "runs").exists()


def test_a_shorter_run_later_in_the_order_uses_the_minutes_a_longer_one_cannot(study, tmp_path: Path,
                                                                                capsys, monkeypatch) -> None:
    """The first run of the study's order would miss the deadline; the next one, shorter, fits: it runs, and the
    long one is left for the next window and named."""
    long_run = study.Run("scfs", "soft", 0, 40, "cifar10_long")
    short_run = study.Run("dino", "dino", 0, 3, "cifar10_seeds")
    monkeypatch.setattr(study, "plan", lambda *a, **k: [long_run, short_run])
    study.SECONDS_PER_EPOCH_ALONE = 1.0  # the long run needs 40 s and more, the short one about 5 s
    out = tmp_path / "out"
    rc = study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "1",
                     "--deadline", str(time.time() + 25), "--committed", str(tmp_path / "none-*.json")])
    assert rc == 0
    rec = json.loads(next(out.glob("cifar10-quality-*.json")).read_text())
    assert [(r["method"], r["epochs"]) for r in rec["runs"]] == [("dino", 3)]
    assert not (tmp_path / "runs" / long_run.key).exists()
    assert f"{long_run.key} would not finish before the deadline" in capsys.readouterr().out


def test_a_dino_run_is_planned_at_dino_pace(study, tmp_path: Path, capsys, monkeypatch) -> None:
    """Committed rows time SCFS's epochs and DINO's (here DINO at a tenth of SCFS's, compiling in half the time):
    a DINO run that fits the window at its own pace starts, the SCFS run of the same length that would not fit is
    left out."""
    committed = tmp_path / "committed-cifar10-quality-x.json"
    rows = [{"method": "scfs", "variant": "soft", "seed": 0, "epochs": 10, "wall_s": 1.0 + 9 * 10.0,
             "first_epoch_s": 1.0, "side_by_side": 1},
            {"method": "dino", "variant": "dino", "seed": 0, "epochs": 10, "wall_s": 0.5 + 9 * 1.0,
             "first_epoch_s": 0.5, "side_by_side": 1}]
    rows = [{**r, "knn_top1_k20": 50.0, "knn_top1_k200": 49.0, "linear_top1": 60.0} for r in rows]
    committed.write_text(json.dumps({"runs": rows}))
    assert study.method_pace(study.committed(str(committed))) == {"dino": (0.1, 0.5), "scfs": (1.0, 1.0)}
    scfs_run, dino_run = study.Run("scfs", "soft", 0, 3), study.Run("dino", "dino", 0, 3)
    monkeypatch.setattr(study, "plan", lambda *a, **k: [scfs_run, dino_run])
    study.SECONDS_PER_EPOCH_ALONE = 10.0  # SCFS: 1 + 3 x 10 + 1 s > the 15 s left; DINO: 0.5 + 3 x 1 + 1 s
    out = tmp_path / "out"
    rc = study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "1",
                     "--deadline", str(time.time() + 15), "--committed", str(committed)])
    assert rc == 0
    rec = json.loads(next(out.glob("cifar10-quality-*.json")).read_text())
    assert [r["method"] for r in rec["runs"]] == ["dino"]
    assert f"{scfs_run.key} would not finish before the deadline" in capsys.readouterr().out


def test_the_probe_prior_is_the_slowest_timed_probe_of_committed_rows(study) -> None:
    """Rows recorded before probes were timed carry no `linear_s` and do not set the prior; timed rows do."""
    assert study.linear_prior({}) == study.LINEAR_S
    assert study.linear_prior({"a": {"linear_s": None}, "b": {}}) == study.LINEAR_S
    assert study.linear_prior({"a": {"linear_s": 31.5}, "b": {"linear_s": 42.0}, "c": {}}) == 42.0


def test_render_pairs_seeds_with_a_t_interval(study) -> None:
    rows = [{"method": m, "variant": "soft" if m == "scfs" else "dino", "seed": s, "epochs": 100,
             "knn_top1_k20": base + s, "knn_top1_k200": base, "linear_top1": base + 1}
            for s in (0, 1, 2) for m, base in (("scfs", 80.0 + (s == 2)), ("dino", 79.0))]
    md = study.render({"runs": rows})
    # differences +1, +1, +2: mean 1.33, sd 0.577, t(2) = 4.303 -> half width 1.43
    assert "+1.00, +1.00, +2.00 | +1.33 [-0.10, +2.77]" in md


def test_the_ramp_does_not_count_the_compile_wait(study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose first step waits 2 s for the compile still measures its pace (3 x 0.1 s an epoch), not the wait."""
    monkeypatch.setenv("FAKE_COMPILE_S", "2")
    out = tmp_path / "out"
    study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "2", "--ramp",
                "--ramp-s", "0.6", "--deadline", str(time.time() + 120), "--test-epochs", "5",
                "--only", "scfs-soft-s0-e5", "dino-dino-s0-e5", "--committed", str(tmp_path / "none-*.json")])
    stages = json.loads(next(out.glob("cifar10-quality-*.json")).read_text())["concurrency"]["stages"]
    alone = stages[0]
    assert alone["runs"] == 1
    assert 0.2 < alone["epoch_s_per_run"]["scfs-soft-s0-e5"] < 1.2


def test_curve_figure_draws_a_band_over_seeds(study, tmp_path: Path) -> None:
    rows = [{"method": m, "variant": v, "seed": s, "epochs": 100,
             "curve": [{"epoch": e, "top1_k20": base + e / 10 + s} for e in (10, 20, 30)]}
            for s in (0, 1) for m, v, base in (("scfs", "soft", 50.0), ("dino", "dino", 45.0))]
    out = study.curve_figure({"runs": rows}, tmp_path / "curves.png")
    assert out.stat().st_size > 5000


def test_gaps_to_dino_pair_epochs_of_the_same_seed_and_schedule(study, tmp_path: Path) -> None:
    def row(m: str, v: str, seed: int, epochs: int, ys: dict[int, float]) -> dict:
        return {"method": m, "variant": v, "seed": seed, "epochs": epochs,
                "curve": [{"epoch": e, "top1_k20": y} for e, y in ys.items()]}

    rows = [row("dino", "dino", 0, 100, {10: 40.0, 20: 50.0, 30: 60.0}),
            row("dino", "dino", 1, 100, {10: 0.0, 20: 0.0, 30: 0.0}),  # another seed: not the baseline
            row("scfs", "soft", 0, 100, {10: 45.0, 20: 52.0, 30: 62.0}),
            row("scfs", "none", 0, 100, {10: 45.0, 20: 50.5}),  # a shorter curve: its own epochs only
            row("scfs", "hard", 0, 200, {10: 99.0})]  # another schedule: not compared
    gaps = study.gaps_to_dino({"runs": rows})
    assert gaps == {"soft": [(10, 5.0), (20, 2.0), (30, 2.0)], "none": [(10, 5.0), (20, 0.5)]}
    out = study.curve_figure({"runs": rows}, tmp_path / "two-panels.png")
    assert out.stat().st_size > 5000


def test_epochs_to_match_interpolates_dinos_curve_and_says_when_it_never_gets_there(study) -> None:
    dino = {10: 40.0, 20: 50.0, 30: 60.0}
    scfs = {10: 45.0, 20: 55.0, 30: 61.0, 5: 30.0}
    # 45 is halfway from 40 (epoch 10) to 50 (epoch 20); 30 is below DINO's first checkpoint; 61 is never reached
    assert study.epochs_to_match(scfs, dino) == [(5, 10.0), (10, 15.0), (20, 25.0), (30, None)]
    assert study.epochs_to_match({10: 40.0}, dino) == [(10, 10.0)]  # equal counts as reached
    assert study.epochs_to_match({10: 1.0}, {}) == [(10, None)]


def test_render_and_readme_say_when_dino_reaches_scfs(study) -> None:
    def row(m: str, v: str, seed: int, epochs: int, ys: dict[int, float]) -> dict:
        r = _run_row(m, v, seed, epochs, ys[max(ys)], 80.0)
        r["curve"] = [{"epoch": e, "top1_k20": y} for e, y in ys.items()]
        return r

    rows = [row("dino", "dino", s, 100, {50: 40.0, 100: 50.0}) for s in (0, 1)]
    rows += [row("scfs", "soft", 0, 100, {50: 45.0, 100: 51.0}), row("scfs", "soft", 1, 100, {50: 50.0, 100: 52.0}),
             row("scfs", "none", 0, 100, {50: 99.0, 100: 99.0})]  # not the soft search: not paired
    text = study.render({"runs": rows})
    assert "| 100 epochs, seed 0: SCFS epoch | 50 | 100 |" in text
    assert "| DINO reaches it at | 75 (1.50x) | not reached |" in text
    assert "| DINO reaches it at | 100 (2.00x) | not reached |" in text
    block = study.readme_block({"runs": rows})
    assert ("over 100 epochs (seeds 0 / 1) DINO reaches SCFS's epoch-50 value at epoch 75 / 100 and SCFS's "
            "epoch-100 value on no seed") in block
    rows[0]["curve"].append({"epoch": 150, "top1_k20": 60.0})  # a value past SCFS's, beyond the schedule's end
    assert "epoch-100 value at epoch 105 / never" in study.readme_block({"runs": rows})
    assert "Faster or better" not in study.readme_block({"runs": [r for r in rows if r["method"] == "scfs"]})


def test_a_lost_runs_curve_becomes_an_incomplete_record_the_study_does_not_read(study, tmp_path: Path) -> None:
    def curve(ys: dict[int, float]) -> list[dict]:
        return [{"epoch": e, "top1_k20": y, "top1_k200": y - 1} for e, y in ys.items()]

    results = tmp_path / "results"
    results.mkdir()
    dino = dict(_run_row("dino", "dino", 0, 200, 86.8, 88.0), curve=curve({10: 46.0, 20: 58.0, 30: 68.0}),
                commit="d1")
    done = dict(_run_row("scfs", "soft", 0, 100, 82.7, 84.9), curve=curve({10: 51.0}))
    (results / "cifar10-quality-2026-12-03-d1.json").write_text(json.dumps({"runs": [dino, done]}))
    box = tmp_path / "study"  # an extracted watch archive: the lost run, a recorded one, a run of the window's own
    for key, ys in (("scfs-soft-s0-e200", {10: 51.5, 20: 65.5}), ("scfs-soft-s0-e100", {10: 51.0}),
                    ("dino-dino-s1-e100", {10: 40.0})):
        (box / "runs" / key).mkdir(parents=True)
        (box / "runs" / key / "knn_curve.json").write_text(json.dumps(curve(ys)))
    (box / "out").mkdir()
    (box / "out" / "cifar10-quality-2026-12-04-c2.json").write_text(
        json.dumps({"runs": [_run_row("dino", "dino", 1, 100, 80.6, 83.5)]}))
    out = tmp_path / "records"
    written = study.write_partials(box, out, "the machine went", "c2", "2026-12-04",
                                   str(results / "cifar10-quality-*.json"))
    assert [p.name for p in written] == ["cifar10-partial-2026-12-04-c2-scfs-soft-s0-e200.json"]
    rec = json.loads(written[0].read_text())
    assert rec["complete"] is False and rec["last_epoch_measured"] == 20 and rec["epochs_planned"] == 200
    assert rec["partner"] == "dino-dino-s0-e200" and rec["partner_commit"] == "d1"
    assert [(r["epoch"], r["gap_k20"]) for r in rec["paired_curve"]] == [(10, 5.5), (20, 7.5)]
    assert "search=soft" in rec["command"] and "+study=cifar10_long" in rec["command"]
    md = written[0].with_suffix(".md").read_text()
    assert "an incomplete run (kNN curve to epoch 20 of 200)" in md and "the machine went" in md
    assert "| 20 | 65.50 | 58.00 | +7.50 | 64.50 | 57.00 | +7.50 |" in md
    # the study's skip list and tables read complete rows only: the lost run is still to run
    assert "scfs-soft-s0-e200" not in study.committed(str(out / "cifar10-quality-*.json"))
    record = {"runs": [dino, done]}
    assert study.partials_to_draw(record, [rec]) == [rec]
    assert study.partials_to_draw({"runs": [dino, done, _run_row("scfs", "soft", 0, 200, 87.0, 88.0)]}, [rec]) == []
    assert study.curve_figure(record, tmp_path / "fig.png", partial=[rec]).stat().st_size > 5000
    (box / "runs" / "scfs-soft-s0-e200" / "knn_curve.json").write_text("[]")
    with pytest.raises(SystemExit, match="holds no checkpoint"):
        study.write_partials(box, out, "x", "c2", "2026-12-04", str(results / "cifar10-quality-*.json"))


def test_plan_is_the_jobs_of_the_hydra_study_configs(study) -> None:
    """The window runner and `python -m scfs.train -m +study=...` run the same jobs: the seed pairs, the ablation
    and the long pair, each once, the central claim first."""
    keys = [r.key for r in study.plan()]
    assert keys[:6] == ["scfs-soft-s0-e100", "dino-dino-s0-e100", "scfs-soft-s1-e100", "dino-dino-s1-e100",
                        "scfs-soft-s2-e100", "dino-dino-s2-e100"]
    assert sorted(keys[6:9]) == ["scfs-hard-s0-e100", "scfs-none-s0-e100", "scfs-roi-s0-e100"]
    assert sorted(keys[9:]) == ["dino-dino-s0-e200", "scfs-soft-s0-e200"] and len(set(keys)) == len(keys) == 11


def test_render_runs_where_scfs_is_not_installed(tmp_path: Path) -> None:
    """The GPU machine runs `python scripts/cifar10_study.py` from a copied tree where scfs is not installed: the
    paired table (which imports scfs) still renders. The editable install of this checkout is hidden first."""
    import subprocess

    rows = [{"method": m, "variant": "soft" if m == "scfs" else "dino", "seed": s, "epochs": 100,
             "knn_top1_k20": 80.0 + s + (m == "scfs"), "knn_top1_k200": 79.0, "linear_top1": 81.0}
            for s in (0, 1) for m in ("scfs", "dino")]
    rec = tmp_path / "cifar10-quality-2026-01-01.json"
    rec.write_text(json.dumps({"runs": rows}))
    hide = ("import runpy, sys\n"
            "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            f"sys.path = [p for p in sys.path if p not in ('', {str(ROOT)!r})]\n"
            "try:\n    import scfs\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('scfs still importable')\n"
            f"sys.argv = ['cifar10_study.py', 'render', {str(rec)!r}]\n"
            f"runpy.run_path({str(ROOT / 'scripts' / 'cifar10_study.py')!r}, run_name='__main__')\n")
    got = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "+1.00, +1.00 | +1.00" in rec.with_suffix(".md").read_text()


def test_records_of_several_windows_render_as_one_study(study, tmp_path: Path) -> None:
    """Each window writes its own record; `render A B --out` and `figure A B` merge them: every run once (the first
    record's copy), both windows' side-by-side measurements, the pairs over all seeds."""
    def rows(seeds, knn):
        return [{"method": m, "variant": "soft" if m == "scfs" else "dino", "seed": s, "epochs": 100,
                 "knn_top1_k20": knn + s + 2 * (m == "scfs"), "knn_top1_k200": 70.0, "linear_top1": 80.0,
                 "curve": [{"epoch": e, "top1_k20": e / 2 + s} for e in (10, 20)]}
                for s in seeds for m in ("scfs", "dino")]
    a, b = tmp_path / "cifar10-quality-a.json", tmp_path / "cifar10-quality-b.json"
    a.write_text(json.dumps({"runs": rows([0], 80.0), "commit": "aaa", "date": "d1",
                             "concurrency": {"note": "not measured"}}))
    b.write_text(json.dumps({"runs": rows([0, 1], 50.0), "commit": "bbb", "date": "d2", "concurrency": {
        "method": "ramp", "stages": [{"runs": 2, "aggregate_epochs_per_min": 17.6, "epoch_s_per_run": {"x": 7.0}}]}}))
    merged = study.merge([a, b])
    assert len(merged["runs"]) == 4
    assert {r["knn_top1_k20"] for r in merged["runs"] if r["seed"] == 0} == {80.0, 82.0}  # a's copy of seed 0 wins
    with pytest.raises(SystemExit):
        study.main(["render", str(a), str(b)])  # several records and nowhere to put the merged tables
    out = tmp_path / "study.md"
    assert study.main(["render", str(a), str(b), "--out", str(out)]) == 0
    md = out.read_text()
    assert "| knn_top1_k20 | 67.50 ± 20.51 (2 seeds) | 65.50 ± 20.51 (2 seeds) | +2.00, +2.00 |" in md
    assert "| 2 | 17.6 | x 7.0 |" in md and "not measured" in md
    fig = tmp_path / "curves.png"
    assert study.main(["figure", str(a), str(b), "--out", str(fig)]) == 0 and fig.stat().st_size > 0


def test_counts_measured_in_committed_windows_start_together(study, tmp_path: Path, capsys,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With 1 and 2 runs side by side measured in a committed record, a window starts its first runs together (their
    compiles overlap) instead of waiting for each compile, and its ramp measures only the new count, 3."""
    monkeypatch.setenv("FAKE_COMPILE_S", "2")
    committed = tmp_path / "cifar10-quality-old.json"
    committed.write_text(json.dumps({"runs": [], "concurrency": {"stages": [
        {"runs": 1, "aggregate_epochs_per_min": 200.0, "epoch_s_per_run": {}},
        {"runs": 2, "aggregate_epochs_per_min": 300.0, "epoch_s_per_run": {}}]}}))
    out = tmp_path / "out"
    rc = study.main(["run", "--out", str(out), "--runs", str(tmp_path / "runs"), "--parallel", "3", "--ramp",
                     "--ramp-s", "0.6", "--deadline", str(time.time() + 120), "--test-epochs", "5",
                     "--only", "scfs-soft-s0-e5", "dino-dino-s0-e5", "scfs-soft-s1-e5",
                     "--committed", str(committed)])
    assert rc == 0
    starts = [int(line.split("+")[1].split("s")[0]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("[study] +") and " start " in line]
    assert len(starts) == 3 and max(starts) < 2  # all three began before the first one's 2 s compile ended
    stages = json.loads(next(out.glob("cifar10-quality-*.json")).read_text())["concurrency"]["stages"]
    assert [st["runs"] for st in stages] == [3]
    assert (out / "ramp.done").is_file()


@pytest.mark.parametrize("key", ["scfs-soft-s2-e100", "dino-dino-s1-e100", "scfs-roi-s0-e100", "dino-dino-s0-e200"])
def test_each_run_is_a_job_of_its_hydra_study(study, key: str) -> None:
    """The command a run is launched with composes, through its study config, to exactly that run: method, search,
    seed, epochs and the CIFAR-10 data root."""
    from hydra import compose, initialize_config_dir

    run = next(r for r in study.plan() if r.key == key)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+study={run.study}", *study.RECIPE, *run.overrides()])
    assert (cfg.method.name, int(cfg.seed), int(cfg.trainer.max_epochs)) == (run.method, run.seed, run.epochs)
    assert cfg.data.root == "data/cifar10" and cfg.compile is True
    if run.method == "scfs":
        assert cfg.search.local_target == ("roi" if run.variant == "roi" else "search")


def _run_row(method: str, variant: str, seed: int, epochs: int, knn: float, lin: float) -> dict:
    return {"method": method, "variant": variant, "seed": seed, "epochs": epochs, "knn_top1_k20": knn,
            "knn_top1_k200": knn - 2, "linear_top1": lin}


def test_readme_block_is_written_from_the_records_between_the_markers(study, tmp_path: Path) -> None:
    rows = [_run_row("scfs", "soft", s, 100, 82 + s, 84 + s / 2) for s in range(3)]
    rows += [_run_row("dino", "dino", s, 100, 80 + s / 2, 83 + s / 4) for s in range(3)]
    rows += [_run_row("scfs", "none", 0, 100, 81.0, 83.0), _run_row("dino", "dino", 0, 200, 86.8, 88.0)]
    block = study.readme_block({"runs": rows})
    assert "| kNN20, 100 epochs, seeds 0, 1, 2, mean ± std | 83.00 ± 1.00 | 80.50 ± 0.50 | +2.50 [" in block
    assert "| kNN20 / linear, 200 epochs, seed 0 | still to run | 86.80 / 88.00 | – |" in block
    assert "best first: `soft` 82.00 / 84.00, `none` 81.00 / 83.00, DINO 80.00 / 83.00." in block
    assert "`scfs-soft-s0-e200`" in block and f"8 of {len(study.plan())} runs" in block
    rows.append(_run_row("scfs", "soft", 0, 200, 87.5, 88.5))
    assert "| 87.50 / 88.50 | 86.80 / 88.00 | +0.70 (1 seed) / +0.50 (1 seed) |" in study.readme_block({"runs": rows})

    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\nbefore\n{study.README_START}\nold numbers\n{study.README_END}\nafter\n")
    assert not study.write_readme({"runs": rows}, readme, check=True)
    study.write_readme({"runs": rows}, readme)
    text = readme.read_text()
    assert "old numbers" not in text and text.startswith("# T\n\nbefore\n") and text.endswith("\nafter\n")
    assert study.write_readme({"runs": rows}, readme, check=True)  # written once, it matches
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no CIFAR-10 block markers"):
        study.write_readme({"runs": rows}, readme)


def test_the_readme_block_matches_the_committed_records(study) -> None:
    """The README's CIFAR-10 numbers are the committed records': a record added without regenerating the block
    fails here (`python scripts/cifar10_study.py readme benchmarks/results/cifar10-quality-*.json`)."""
    paths = sorted((ROOT / "benchmarks" / "results").glob("cifar10-quality-*.json"))
    assert study.write_readme(study.merge(paths), ROOT / "README.md", check=True)

"""`python -m scfs.bench.e2e`: the linked photo tree, the profiler-report parser, the ratio maths and the record,
and (slow) the whole CLI on the CPU with the tiny network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scfs.bench import e2e
from scfs.bench.records import record_stem
from scfs.data.prepare import PrepareError, repeat_photos
from scfs.data.prepare import main as prepare_main


def photos(folder: Path, n: int = 12) -> Path:
    """`n` small JPEGs of different sizes (the real sample photos are not in the repository)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (40 + 3 * i, 56, 3), dtype=np.uint8)).save(folder / f"p{i:02d}.jpg")
    return folder


def files(tree: Path, split: str) -> list[Path]:
    return sorted(p for p in (tree / split).rglob("*") if p.is_file())


def test_repeat_links_every_photo_into_class_folders(tmp_path: Path) -> None:
    src = photos(tmp_path / "photos", 12)
    counts = repeat_photos(src, tmp_path / "tree", repeat=3, classes=10, val_per_class=1, log=lambda s: None)
    assert counts == {"photos": 12, "train": 36, "val": 10, "classes": 10}
    train = files(tmp_path / "tree", "train")
    assert len(train) == 36 and len({p.parent.name for p in train}) == 10
    assert all(p.stat().st_ino in {f.stat().st_ino for f in src.iterdir()} for p in train)  # hard links, no copies
    assert (src / "p00.jpg").stat().st_nlink == 1 + 3 + 1  # itself, 3 train links, 1 val link
    assert len(files(tmp_path / "tree", "val")) == 10


def test_repeat_is_idempotent_and_rebuilds_for_other_inputs(tmp_path: Path) -> None:
    src = photos(tmp_path / "photos", 5)
    said: list[str] = []
    first = repeat_photos(src, tmp_path / "tree", repeat=2, classes=2, log=said.append)
    stamp = (tmp_path / "tree" / ".scfs-repeat.json").stat().st_mtime_ns
    assert repeat_photos(src, tmp_path / "tree", repeat=2, classes=2, log=said.append) == first
    assert "nothing done" in said[-1] and (tmp_path / "tree" / ".scfs-repeat.json").stat().st_mtime_ns == stamp
    assert repeat_photos(src, tmp_path / "tree", repeat=4, classes=2, log=said.append)["train"] == 20
    assert len(files(tmp_path / "tree", "train")) == 20  # the 2x links were replaced, not added to


def test_repeat_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    src = photos(tmp_path / "photos", 2)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    with pytest.raises(PrepareError, match="was not made by `prepare repeat`"):
        repeat_photos(src, tmp_path / "mine", log=lambda s: None)
    assert (tmp_path / "mine" / "keep.txt").read_text() == "x"


def test_missing_photos_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(PrepareError, match="photos folder .* not found: make it with `python -m scfs.data.prepare "
                                           "imagenet-samples"):
        repeat_photos(tmp_path / "missing", tmp_path / "tree")
    assert prepare_main(["repeat", "--photos", str(tmp_path / "missing"), "--out", str(tmp_path / "tree")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "photos folder" in err
    assert e2e.main(["--device", "cpu", "--tiny", "--photos", str(tmp_path / "missing"), "--tree",
                     str(tmp_path / "tree"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scfs.bench.e2e: error: photos folder") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "tree").exists()


def profiler_text() -> str:
    """A run's log with a SimpleProfiler report of fabricated durations, in Lightning's own format."""
    from lightning.pytorch.profilers import SimpleProfiler

    prof = SimpleProfiler()
    prof._stage = "fit"
    prof.recorded_durations.update({
        "run_training_epoch": [40.0, 10.0, 10.0],  # epoch 0: 30 s of compile on top of a steady 10 s epoch
        "run_training_batch": [30.0 + 0.08] + [0.08] * 299,  # 100 steps per epoch
        "[_TrainingEpochLoop].train_dataloader_next": [0.01] * 300,
        "[Strategy]SingleDeviceStrategy.batch_to_device": [0.004] * 300,
        "[LightningModule]SCFS.on_after_batch_transfer": [0.003] * 300,  # inside batch_to_device
        "[Callback]OnlineLinearMonitor.on_train_batch_end": [0.002] * 300,
        "[LightningModule]SCFS.on_train_batch_start": [0.001] * 300,
        "[Callback]LastCheckpoint.on_train_epoch_end": [0.5] * 3,
    })
    return "epoch 2: 100%|####| loss=3.1\nINFO: " + prof.summary() + "\nSCFS (soft) done in 80s\n"


def test_profiler_report_is_parsed_from_a_run_log() -> None:
    actions = e2e.parse_simple_profiler(profiler_text())
    assert actions["run_training_batch"]["calls"] == 300
    assert actions["run_training_epoch"]["total_s"] == pytest.approx(60.0, rel=1e-4)
    assert actions["[_TrainingEpochLoop].train_dataloader_next"]["mean_s"] == pytest.approx(0.01, rel=1e-4)
    assert "Total" not in actions and len(actions) == 8
    assert e2e.parse_simple_profiler("no report here") == {}


def test_profile_split_takes_the_compile_out_of_the_training_batch() -> None:
    split = e2e.profile_split(e2e.parse_simple_profiler(profiler_text()), [40.0, 10.0, 10.0])
    ms = split["ms_per_step"]
    assert split["steps"] == 300 and split["compile_excess_s"] == pytest.approx(30.0)
    assert ms["batch"] == pytest.approx(80.0, rel=1e-3) and ms["next"] == pytest.approx(10.0, rel=1e-3)
    assert ms["to_device"] == pytest.approx(4.0, rel=1e-3) and ms["hooks"] == pytest.approx(3.0, rel=1e-3)
    assert ms["views"] == pytest.approx(3.0, rel=1e-3)  # the colour ops: counted inside to_device, not again
    assert split["step_ms"] == pytest.approx(100.0, rel=1e-3)  # 30 s of steady epochs / 300 steps
    assert ms["loop"] == pytest.approx(3.0, rel=1e-2)  # the rest: epoch-end hooks and the loop
    assert sum(split["share"].values()) == pytest.approx(1.0)
    assert split["top_hooks"][0]["hook"] == "[Callback]OnlineLinearMonitor.on_train_batch_end"


def test_ratio_against_the_target() -> None:
    missed = e2e.compare(765.0, 968.0, 64)
    assert missed["ratio"] == pytest.approx(765 / 968) and not missed["met"]
    assert missed["verdict"] == "missed by 16.0 points (920 img/s needed)"
    assert missed["missing_ms_per_step"] == pytest.approx(1e3 * 64 * (1 / 765 - 1 / 968))
    assert e2e.compare(930.0, 968.0, 64)["verdict"] == "met"
    assert "no ratio" in e2e.compare(None, 968.0, 64)["verdict"]


def test_settings_mismatch_is_named() -> None:
    run = {"precision": "16-mixed", "channels_last": True, "compile": True, "compile_mode": "reduce-overhead"}
    assert e2e.mismatches(run, e2e.step_settings("bf16_cl_graphs")) == [
        "precision: real run 16-mixed, step bf16-mixed"]
    eager = {"precision": "32-true", "channels_last": False, "compile": False, "compile_mode": "reduce-overhead"}
    assert e2e.mismatches(eager, e2e.step_settings("fp32")) == []


def test_record_name_and_markdown() -> None:
    assert record_stem(Path("r"), "imagenet-e2e", "NVIDIA H200", "2026-12-02", "abc1234") == Path(
        "r/imagenet-e2e-h200-2026-12-02-abc1234")
    split = e2e.profile_split(e2e.parse_simple_profiler(profiler_text()), [40.0, 10.0, 10.0])
    settings = {"precision": "16-mixed", "channels_last": True, "compile": True, "compile_mode": "reduce-overhead",
                "num_workers": 10}
    row = {"decode": "cpu", "B": 64, "epochs": 3, "command": "python -m scfs.train +experiment=imagenet",
           "settings": settings,
           "summary": {"img_per_s": 765.0, "first_epoch_s": 150.2, "epoch_seconds": [150.2, 13.1]},
           "profile": split, "compare": e2e.compare(765.0, 968.0, 64),
           "mismatch": e2e.mismatches(settings, e2e.step_settings("bf16_cl_graphs"))}
    result = {"meta": {"gpu": "NVIDIA H200", "date": "2026-12-02", "commit": "abc1234", "command": "python -m x",
                       "torch": "2.x", "lightning": "2.6", "cpus": 16, "data": "tree"},
              "rows": [row, {"decode": "gpu", "B": 64, "epochs": 3, "command": "c", "error": "exit 1: boom"}],
              "step": {"img_per_s": 968.0, "step_ms": 66.1, "setting": "bf16_cl_graphs", "command": "python -m s"}}
    md = e2e.markdown(result)
    assert ("| cpu | 10 | 16-mixed | reduce-overhead | 64 | 3 | 765 | 968 (bf16_cl_graphs) | 79.0 % | missed by 16.0"
            in md)
    assert "| gpu | - | - | - | 64 | 3 | error: exit 1: boom |" in md
    assert "| cpu | 10.0 | 4.0 | 3.0 | 80.0 | 3.0 | 3.0 | 100.0 | 66.1 | 33.9 |" in md
    assert "precision: real run 16-mixed, step bf16-mixed" in md and "- step benchmark: `python -m s`" in md


def test_step_figure_from_an_existing_record(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rec = {"meta": {"command": "python -m scfs.bench.step --batch 64", "gpu": "NVIDIA H200", "date": "2026-12-01"},
           "rows": [{"method": "scfs", "B": 64, "setting": "bf16_cl", "img_per_s": 600.0},
                    {"method": "scfs", "B": 64, "setting": "bf16_cl_graphs", "img_per_s": 968.0, "step_ms": 66.1}]}
    path = tmp_path / "step.json"
    path.write_text(json.dumps(rec))
    step = e2e.read_step_record(path, "scfs", 64, "bf16_cl_graphs")
    assert step["img_per_s"] == 968.0 and step["settings"]["precision"] == "bf16-mixed"
    assert "record" in step["command"] and "NVIDIA H200" in step["command"]
    e2e_rec = tmp_path / "e2e.json"  # an e2e record's own step, e.g. from an earlier call on the same machine
    e2e_rec.write_text(json.dumps({"meta": {"method": "scfs"}, "step": {**step, "B": 64}}))
    assert e2e.read_step_record(e2e_rec, "scfs", 64, "bf16_cl_graphs")["img_per_s"] == 968.0
    with pytest.raises(e2e.E2EError, match="no scfs row at B=32 with setting bf16_cl_graphs"):
        e2e.read_step_record(path, "scfs", 32, "bf16_cl_graphs")
    assert e2e.main(["--device", "cpu", "--tiny", "--step-record", str(tmp_path / "none.json"), "--photos",
                     str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("scfs.bench.e2e: error: --step-record") and len(err.splitlines()) == 1


@pytest.mark.slow
def test_whole_cli_on_the_cpu_writes_the_record(tmp_path: Path) -> None:
    """The real `python -m scfs.train +experiment=imagenet` and `python -m scfs.bench.step`, tiny, on the CPU."""
    src = photos(tmp_path / "photos", 8)
    out = tmp_path / "out"
    env_commit = os.environ.pop("COMMIT", None)
    try:
        rc = e2e.main(["--device", "cpu", "--tiny", "--photos", str(src), "--tree", str(tmp_path / "tree"),
                       "--repeat", "2", "--batch", "4", "--epochs", "2", "--profile", "--decode", "cpu", "gpu",
                       "--out", str(out), "--tag=-test"])
    finally:
        if env_commit is not None:
            os.environ["COMMIT"] = env_commit
    assert rc == 0
    (js,) = out.glob("imagenet-e2e-cpu-*-test-tiny.json")
    rec = json.loads(js.read_text())
    assert [r["decode"] for r in rec["rows"]] == ["cpu", "gpu"]
    for r in rec["rows"]:
        assert r["returncode"] == 0 and r["summary"]["img_per_s"] > 0 and len(r["summary"]["epoch_seconds"]) == 2
        assert r["settings"]["decode"] == r["decode"] and r["settings"]["precision"] == "32-true"
        assert r["profile"]["steps"] == 8 and r["profile"]["ms_per_step"]["batch"] > 0
        assert r["compare"]["ratio"] > 0 and r["mismatch"] == []
    assert rec["step"]["img_per_s"] > 0 and rec["step"]["setting"] == "fp32"
    assert {p.name for p in (out / f"{js.stem}-logs").iterdir()} == {"run-cpu.log", "run-gpu.log", "step.log"}
    md = js.with_suffix(".md").read_text()
    assert "| cpu | 0 | 32-true | eager | 4 | 2 |" in md and "- step benchmark: `python -m scfs.bench.step" in md

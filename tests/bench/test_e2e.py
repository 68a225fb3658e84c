"""`python -m scfs.bench.e2e`: the linked photo tree, the profiler-report parser, the ratio maths and the record,
the CIFAR-10 recipe's commands, arguments and once-per-epoch split, and (slow) the whole CLI on the CPU with the
tiny network, for both recipes."""

from __future__ import annotations

import json
import sys
import tarfile
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
    assert ms["loop"] == pytest.approx(3.0, rel=1e-2)  # the rest: the loop itself (epoch-end hooks are outside)
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
           "summary": {"img_per_s": 765.0, "first_epoch_s": 150.2, "epoch_seconds": [150.2, 13.1],
                       "epoch_openings_s": [12.5, 0.9], "img_per_s_after_openings": 822.1},
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
    assert "- cpu: 12.50, 0.90 s; the steady epochs without them: 822 img/s, 84.9 % of the step benchmark\n" in md
    assert "primed the machine" not in md  # no prime ran (a CPU flow, --no-prime, or an older record)
    result["meta"]["prime_s"] = 21.4
    assert "Before the runs a throwaway process primed the machine in 21.4 s" in e2e.markdown(result)
    del result["meta"]["prime_s"]
    row["summary"]["epoch_background_writes_s"] = [0.0, 1.375]
    assert ("84.9 % of the step benchmark; beside a background checkpoint write: 0.00, 1.38 s\n"
            in e2e.markdown(result))
    del row["summary"]["epoch_openings_s"]  # a record from before the openings were timed: no line, no made-up one
    assert "Each epoch's opening" not in e2e.markdown(result)


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
def test_whole_cli_on_the_cpu_writes_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `python -m scfs.train +experiment=imagenet` and `python -m scfs.bench.step`, tiny, on the CPU."""
    src = photos(tmp_path / "photos", 8)
    out = tmp_path / "out"
    monkeypatch.delenv("COMMIT", raising=False)
    rc = e2e.main(["--device", "cpu", "--tiny", "--photos", str(src), "--tree", str(tmp_path / "tree"),
                   "--repeat", "2", "--batch", "4", "--epochs", "2", "--profile", "--decode", "cpu", "gpu",
                   "--out", str(out), "--tag=-test"])
    assert rc == 0
    (js,) = out.glob("imagenet-e2e-cpu-*-test-tiny.json")
    rec = json.loads(js.read_text())
    assert [r["decode"] for r in rec["rows"]] == ["cpu", "gpu"]
    for r in rec["rows"]:
        assert r["returncode"] == 0 and r["summary"]["img_per_s"] > 0 and len(r["summary"]["epoch_seconds"]) == 2
        assert len(r["summary"]["epoch_openings_s"]) == 2
        assert r["summary"]["img_per_s_after_openings"] > r["summary"]["img_per_s"]
        assert r["settings"]["decode"] == r["decode"] and r["settings"]["precision"] == "32-true"
        assert r["profile"]["steps"] == 8 and r["profile"]["ms_per_step"]["batch"] > 0
        assert r["compare"]["ratio"] > 0 and r["mismatch"] == []
        assert r["checkpoint_mb"] > 0 and r["settings"]["background_writes"] == "auto"
        assert r["settings"]["prefetch_across_epochs"] is True
        assert r["summary"]["checkpoint_writes"] == "training thread"
    assert rec["step"]["img_per_s"] > 0 and rec["step"]["setting"] == "fp32"
    assert {p.name for p in (out / f"{js.stem}-logs").iterdir()} == {"run-cpu.log", "run-gpu.log", "step.log"}
    md = js.with_suffix(".md").read_text()
    assert "| cpu | 0 | 32-true | eager | 4 | 2 |" in md and "- step benchmark: `python -m scfs.bench.step" in md
    assert rec["meta"]["host"]["python_ms"] > 0 and f"Host: {rec['meta']['host']['cpu']}" in md
    assert "Each epoch's opening" in md and "- gpu: " in md
    assert " MB; written on the training thread)" in md  # the CPU writes on the training thread


def test_the_saves_cell_says_the_files_size_and_where_it_was_written() -> None:
    pe = {"s_per_epoch": {"checkpoint": 0.9}, "share": {"checkpoint": 0.03}, "saves": 2, "per_save_s": 1.357}
    gpu = {"checkpoint_mb": 1234.5, "settings": {"background_writes": "auto", "accelerator": "gpu"}}
    assert e2e.epoch_cell(pe, "checkpoint", gpu) == ("0.900 s (3.0 %), 2 saves of 1.357 s "
                                                     "(last.ckpt 1,234 MB; written in the background)")
    sync = {"checkpoint_mb": 10.0, "settings": {"background_writes": False, "accelerator": "gpu"}}
    assert e2e.epoch_cell(pe, "checkpoint", sync).endswith("(last.ckpt 10 MB; written on the training thread)")
    assert e2e.epoch_cell(pe, "checkpoint", {"settings": {}}) == "0.900 s (3.0 %), 2 saves of 1.357 s"
    # a config that leaves the accelerator to Lightning ran on the GPU (the CPU flow pins trainer.accelerator=cpu)
    auto = {"settings": {"background_writes": "auto", "accelerator": "auto"}}
    assert e2e.epoch_cell(pe, "checkpoint", auto).endswith("(written in the background)")
    cpu = {"settings": {"background_writes": "auto", "accelerator": "cpu"}}
    assert e2e.epoch_cell(pe, "checkpoint", cpu).endswith("(written on the training thread)")
    # the writer the run resolved outranks its config
    ran = {**auto, "summary": {"checkpoint_writes": "training thread"}}
    assert e2e.epoch_cell(pe, "checkpoint", ran).endswith("(written on the training thread)")
    assert e2e.epoch_cell(pe, "checkpoint") == "0.900 s (3.0 %), 2 saves of 1.357 s"


# ---- the CIFAR-10 recipe -----------------------------------------------------------------------------------------
def cifar_folder(root: Path, per_class: int = 4, classes: int = 10) -> Path:
    """A prepared CIFAR-10 folder in miniature: `train/` and `test/` of 32x32 JPEGs per class, as
    `python -m scfs.data.prepare cifar10` leaves it."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", max(per_class // 2, 1))):
        for c in range(classes):
            (root / split / f"class{c}").mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                    root / split / f"class{c}" / f"{i}.jpg")
    return root


def test_cifar10_train_command_is_the_recipe_with_the_kNN_passes_off(tmp_path: Path) -> None:
    cmd = e2e.train_command(Path("data/cifar10"), 512, 6, None, tmp_path / "run", recipe="cifar10", profile=True,
                            overrides=["checkpoint.every_n_epochs=0"])
    assert cmd[0] == sys.executable and cmd[1:] == [
        "-m", "scfs.train", "+experiment=cifar10", "method=scfs", "data.root=data/cifar10", "batch_size=512",
        "global_batch_size=null", "trainer.max_epochs=6", "eval.figure=false", "eval.knn_at_start=false",
        "eval.knn_every_n_epochs=0", f"hydra.run.dir={tmp_path / 'run'}", "+trainer.profiler=simple",
        "checkpoint.every_n_epochs=0"]
    assert not any(c.startswith(("data.decode=", "compile", "trainer.precision=")) for c in cmd)  # as shipped
    tiny = e2e.train_command(Path("d"), 8, 2, None, tmp_path, recipe="cifar10", tiny=True, device="cpu")
    assert {"trainer.accelerator=cpu", "compile=false", "trainer.precision=32-true", "backbone=tiny"} <= set(tiny)
    assert "data.decode=cpu" in e2e.train_command(Path("d"), 64, 3, "cpu", tmp_path)  # imagenet keeps its decode
    with pytest.raises(ValueError, match="recipe 'cifar100'"):
        e2e.train_command(Path("d"), 8, 2, None, tmp_path, recipe="cifar100")


def test_cifar10_step_command_is_the_cifar_suite(tmp_path: Path) -> None:
    cmd = e2e.step_command(512, "bf16_cl_graphs", "dino", tmp_path / "step", recipe="cifar10")
    assert cmd[1:] == ["-m", "scfs.bench.step", "--suite", "cifar", "--batch", "512", "--setting", "bf16_cl_graphs",
                       "--method", "dino", "--no-ceiling", "--strict", "--device", "cuda", "--out",
                       str(tmp_path / "step")]
    assert "--suite" not in e2e.step_command(64, "bf16_cl_graphs", "scfs", tmp_path)  # imagenet: the default suite


def test_the_default_step_setting_is_the_cifar10_recipe_as_shipped(tmp_path: Path) -> None:
    """The step side's default setting for cifar10 has the precision, memory format and compile that
    `+experiment=cifar10` composes to (read back as `run_settings` reads a run's config), so no mismatch is named."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from scfs.bench.step import PATHS
    from scfs.names import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=cifar10"])
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")
    run = e2e.run_settings(tmp_path)
    assert run["on_device"] and run["batch_aug"] and run["compile_mode"] == "reduce-overhead"
    setting = PATHS[e2e.SUITE["cifar10"]][0]
    assert e2e.mismatches(run, e2e.step_settings(setting)) == []
    assert e2e.mismatches(run, e2e.step_settings("bf16_cl"))[0] == "compile: real run True, step False"


def one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("flag", [["--photos", "p"], ["--tree", "t"], ["--repeat", "4"], ["--decode", "gpu"]])
def test_imagenet_only_flags_with_cifar10_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      flag: list[str]) -> None:
    out = tmp_path / "out"
    assert e2e.main(["--recipe", "cifar10", "--device", "cpu", "--tiny", *flag, "--out", str(out)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"scfs.bench.e2e: error: {flag[0]}: imagenet-only") and not out.exists()


def test_cifar10_root_without_train_says_how_to_prepare_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    assert e2e.main(["--recipe", "cifar10", "--device", "cpu", "--tiny", "--root", str(tmp_path / "empty"), "--out",
                     str(tmp_path / "out")]) == 2
    err = one_line_error(capsys)
    assert f"--root {tmp_path / 'empty'}: no train/ folder there" in err
    prepare = "python -m scfs.data.prepare cifar10 --archive .gpudata/cifar10-jpeg.tar.xz"
    assert f"{prepare} --out {tmp_path / 'empty'}`" in err
    assert not (tmp_path / "out").exists()


def test_cifar10_archive_is_prepared_into_root(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = cifar_folder(tmp_path / "src" / "cifar10", per_class=1, classes=2)
    archive = tmp_path / "cifar10-jpeg.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(src, arcname="cifar10")
    root, data = e2e.cifar_data(tmp_path / "data" / "cifar10", archive)
    assert root == tmp_path / "data" / "cifar10" and (root / "train" / "class1" / "0.jpg").is_file()
    assert data.startswith(f"{root}: 2 train files")
    assert e2e.cifar_data(root, archive)[0] == root  # an existing folder is kept
    assert "already exists; nothing done" in capsys.readouterr().out
    assert e2e.main(["--recipe", "cifar10", "--device", "cpu", "--tiny", "--archive", str(tmp_path / "none.tar.xz"),
                     "--root", str(tmp_path / "other"), "--out", str(tmp_path / "out")]) == 2
    assert "archive" in one_line_error(capsys) and not (tmp_path / "out").exists()


def test_step_record_of_the_other_suite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"meta": {"suite": "resnet50"}, "rows": [
        {"method": "scfs", "B": 512, "setting": "bf16_cl_graphs", "img_per_s": 900.0}]}))
    with pytest.raises(e2e.E2EError, match="measures the resnet50 suite, not --recipe cifar10's cifar"):
        e2e.read_step_record(path, "scfs", 512, "bf16_cl_graphs", "cifar10")
    path.write_text(json.dumps({"meta": {"suite": "cifar"}, "rows": [
        {"method": "scfs", "B": 512, "setting": "bf16_cl_graphs", "img_per_s": 15500.0, "step_ms": 33.0}]}))
    assert e2e.read_step_record(path, "scfs", 512, "bf16_cl_graphs", "cifar10")["img_per_s"] == 15500.0


# ---- the once-per-epoch split ------------------------------------------------------------------------------------
NUMBERED = ("[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 5, "
            "'train_time_interval': None}")


def cifar_profile() -> dict[str, list[float]]:
    """Durations of a CIFAR-10 run of 6 epochs of 97 steps as Lightning's SimpleProfiler names its actions (the
    names as a real `+experiment=cifar10 +trainer.profiler=simple` run logs them): epoch 0 holds 60 s of compile,
    a steady epoch 4 s; last.ckpt at every epoch end, the numbered checkpoint at epoch 4, a step save at step 500."""
    steps = 6 * 97
    return {
        "run_training_epoch": [64.0] + [4.0] * 5,
        "run_training_batch": [60.0 + 0.032] + [0.032] * (steps - 1),
        "[_TrainingEpochLoop].train_dataloader_next": [0.0002] * steps,  # the on-device loader's index_select
        "[Strategy]SingleDeviceStrategy.batch_to_device": [0.004] * steps,
        "[LightningModule]SCFS.on_after_batch_transfer": [0.0035] * steps,
        "[Callback]OnlineLinearMonitor.on_train_batch_end": [0.001] * steps,
        "[LightningModule]SCFS.on_train_batch_start": [0.0002] * steps,
        "[Callback]LastCheckpoint.on_train_batch_end": [0.00001] * (steps - 1) + [0.45],
        "[Callback]EpochTimer.on_train_epoch_start": [1e-5] * 6,
        "[Callback]OnlineLinearMonitor.on_train_epoch_start": [0.002] * 6,
        "[Callback]LoggedStepsProgressBar.on_train_epoch_start": [0.0005] * 6,
        "[LightningModule]SCFS.on_train_epoch_start": [1e-5] * 6,
        "[Callback]EpochTimer.on_train_epoch_end": [1e-5] * 6,
        "[Callback]OnlineLinearMonitor.on_train_epoch_end": [0.01] * 6,
        f"{NUMBERED}.on_train_epoch_end": [0.0005] * 4 + [0.45, 0.0005],
        "[LightningModule]SCFS.on_train_epoch_end": [2e-6] * 6,
        "[Callback]LastCheckpoint.on_train_epoch_end": [0.45] * 6,
        "save_checkpoint": [0.449] * 8,  # 6 last.ckpt, 1 numbered, 1 step save
        "[LightningModule]SCFS.on_save_checkpoint": [1e-6] * 8,
        "[LightningDataModule]SSLDataModule.train_dataloader": [25.0],  # the split decoded and copied, once
    }


def report(durations: dict[str, list[float]]) -> str:
    """A run's log around Lightning's own SimpleProfiler report of these durations."""
    from lightning.pytorch.profilers import SimpleProfiler

    prof = SimpleProfiler()
    prof._stage = "fit"
    prof.recorded_durations.update(durations)
    return "Epoch 5: 100%|####| 97/97 loss=7.1\nINFO: " + prof.summary() + "\nSCFS (soft) done in 130s\n"


EPOCH_SECONDS = [64.05] + [4.05] * 5


def test_per_epoch_split_names_the_hooks_and_saves() -> None:
    actions = e2e.parse_simple_profiler(report(cifar_profile()))
    assert f"{NUMBERED}.on_train_epoch_end" in actions  # the long name survives the report's table
    split = e2e.profile_split(actions, EPOCH_SECONDS)
    assert split["ms_per_step"]["batch"] == pytest.approx(32.0, rel=1e-3)
    pe = split["per_epoch"]
    s = pe["s_per_epoch"]
    assert pe["epochs"] == 6 and pe["steady_epoch_s"] == pytest.approx(4.05)
    assert s["epoch_start"] == pytest.approx((0.012 + 0.003 + 1.2e-4) / 6, rel=1e-3)
    assert s["epoch_end"] == pytest.approx((2.7 + 0.4525 + 0.06 + 6e-5 + 1.2e-5) / 6, rel=1e-3)
    assert s["checkpoint"] == pytest.approx(8 * 0.449 / 6, rel=1e-3)
    assert pe["saves"] == 8 and pe["per_save_s"] == pytest.approx(0.449, rel=1e-3)
    # the epoch loop outside the per-batch actions: 24 s of steady epochs less next, to device, batch and hooks
    rest = 24.0 - 582 * (0.0002 + 0.004 + 0.032 + 0.001 + 0.0002 + 0.00001) - 0.45 + 0.00001
    assert s["loop_rest"] == pytest.approx(rest / 6, rel=1e-3)
    assert pe["share"]["checkpoint"] == pytest.approx(s["checkpoint"] / 4.05)
    assert pe["loader_setup_s"] == pytest.approx(25.0)
    assert [h["hook"] for h in pe["top_hooks"]] == ["[Callback]LastCheckpoint.on_train_epoch_end",
                                                   f"{NUMBERED}.on_train_epoch_end",
                                                   "[Callback]OnlineLinearMonitor.on_train_epoch_end"]


def test_absent_actions_are_dashes_not_numbers() -> None:
    """A report without the loader's `next`, any checkpoint save, any epoch-start hook or the datamodule's loader
    (say, a run with checkpoints and the monitor off) gives None for those parts and "–" in the tables."""
    durations = {k: v for k, v in cifar_profile().items()
                 if not k.endswith((".on_train_epoch_start", ".train_dataloader", ".train_dataloader_next"))
                 and k != "save_checkpoint"}
    split = e2e.profile_split(e2e.parse_simple_profiler(report(durations)), EPOCH_SECONDS)
    pe = split["per_epoch"]
    assert split["ms_per_step"]["next"] is None and "next" not in split["share"]
    assert split["ms_per_step"]["batch"] == pytest.approx(32.0, rel=1e-3)
    assert pe["s_per_epoch"]["epoch_start"] is None and pe["s_per_epoch"]["checkpoint"] is None
    assert pe["share"]["checkpoint"] is None and pe["saves"] == 0 and pe["loader_setup_s"] is None
    row = {"decode": None, "B": 512, "epochs": 6, "command": "python -m scfs.train +experiment=cifar10",
           "settings": {"on_device": True, "precision": "bf16-mixed", "compile": True,
                        "compile_mode": "reduce-overhead", "num_workers": 8},
           "summary": {"img_per_s": 12263.0, "first_epoch_s": 64.05, "epoch_seconds": EPOCH_SECONDS},
           "profile": split, "compare": e2e.compare(12263.0, 15515.0, 512)}
    md = e2e.markdown({"meta": {"recipe": "cifar10", "gpu": "NVIDIA H200", "date": "2026-12-04", "commit": "abc1234",
                                "command": "python -m x", "torch": "2.x", "lightning": "2.6", "cpus": 16,
                                "data": "data/cifar10", "eval_off": e2e.NO_EVAL},
                       "rows": [row], "step": {"img_per_s": 15515.0, "step_ms": 33.0, "setting": "bf16_cl_graphs",
                                               "command": "python -m s"}})
    assert md.startswith("# End-to-end training speed (`+experiment=cifar10`, the CIFAR-10 training split)")
    assert "`eval.knn_at_start=false eval.knn_every_n_epochs=0`" in md
    assert "| on-device | – | 4.0 | 3.5 | 32.0 |" in md
    assert "| on-device | 4.05 | – | 0.535 s (13.2 %) | – | " in md
    assert "[Callback]ModelCheckpoint.on_train_epoch_end 0.075" in md  # the callback's state left out of its name
    assert "- real run, cifar10: `python -m scfs.train +experiment=cifar10`" in md
    assert e2e.epoch_overhead({}, [])["error"].startswith("no run_training_epoch")


@pytest.mark.slow
def test_whole_cli_on_the_cpu_for_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `python -m scfs.train +experiment=cifar10` (eager, tiny, the split held on the CPU as the recipe
    holds it on the GPU) and `python -m scfs.bench.step --suite cifar` on a prepared folder in miniature."""
    root = cifar_folder(tmp_path / "cifar10")
    out = tmp_path / "out"
    monkeypatch.delenv("COMMIT", raising=False)
    rc = e2e.main(["--recipe", "cifar10", "--device", "cpu", "--tiny", "--root", str(root), "--batch", "8",
                   "--epochs", "2", "--profile", "--out", str(out), "--tag=-test"])
    assert rc == 0
    (js,) = out.glob("cifar10-e2e-cpu-*-test-tiny.json")
    rec = json.loads(js.read_text())
    assert rec["meta"]["recipe"] == "cifar10" and rec["meta"]["eval_off"] == e2e.NO_EVAL
    (r,) = rec["rows"]
    assert r["returncode"] == 0 and r["summary"]["img_per_s"] > 0 and len(r["summary"]["epoch_seconds"]) == 2
    assert r["summary"]["steps"] == 10 and r["settings"]["on_device"] and r["settings"]["batch_aug"]
    assert r["settings"]["precision"] == "32-true" and not r["settings"]["compile"] and r["mismatch"] == []
    assert r["profile"]["steps"] == 10 and r["profile"]["ms_per_step"]["batch"] > 0
    pe = r["profile"]["per_epoch"]
    # as shipped, last.ckpt is written at an epoch end at most once a minute (`checkpoint.last_min_interval_s`)
    # and always at the last: this short run's one save is the last epoch's
    assert pe["epochs"] == 2 and pe["saves"] >= 1 and pe["s_per_epoch"]["checkpoint"] > 0
    assert pe["s_per_epoch"]["epoch_end"] >= pe["s_per_epoch"]["checkpoint"]  # the epoch-end saves are in it
    assert rec["step"]["img_per_s"] > 0 and rec["step"]["setting"] == "fp32"
    assert "--suite cifar" in rec["step"]["command"]
    assert {p.name for p in (out / f"{js.stem}-logs").iterdir()} == {"run-cifar10.log", "step.log"}
    md = js.with_suffix(".md").read_text()
    assert "`+experiment=cifar10`" in md and "| on-device | 0 | 32-true | eager | 8 | 2 |" in md


# ---- the first epoch's compile -----------------------------------------------------------------------------------
COMPILE = {"compile_parallel": {"first_step_s": 107.1, "early_s": 7.1, "ready_at_go": ["backward"],
                                "early_started_after_s": 2.4,
                                "waited_s": {"teacher": 0.0, "student_backward": 10.76},
                                "ready_s": {"teacher": 29.8, "student_backward": 96.2}, "built_here": [],
                                "started_s": {"student_backward": 3.6},
                                "host_load": {"cores": 16, "samples": 428, "interval_s": 0.25, "busy_mean": 12.5,
                                              "busy_p90": 15.9, "busy_max": 16.0, "runnable_mean": 17.2,
                                              "runnable_max": 61, "oversubscribed_share": 0.41},
                                "helper": {"ok": True, "early": {"imported_s": 6.1, "built_s": 9.0,
                                                                 "on_device_s": 14.2, "ready_s": 18.2}},
                                "local_backward_helper": {"ok": True, "early": {"ready_s": 19.5}},
                                "compiles": [{"graph": "student_forward", "at_s": 0.9, "s": 80.2, "first_run": False,
                                              "inductor_cache": "miss"},
                                             {"graph": "student_forward", "at_s": 81.1, "s": 5.5, "first_run": True},
                                             {"graph": "teacher_forward", "at_s": 87.0, "s": 0.1, "first_run": False,
                                              "inductor_cache": "hit"}]},
           "compile_cudnn_warmup": {"convs": 46, "record_s": 0.6, "done_s": 13.0}}


@pytest.mark.parametrize("helpers", [True, False], ids=["with-helpers", "without"])
def test_the_record_keeps_the_runs_compile_report_and_the_helpers_logs(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      helpers: bool) -> None:
    """A compiled run's first epoch is mostly its compile: the row keeps what the run's summary says of it (the
    first step, its waits, when the helpers wrote their entries, the cuDNN warm-up) and the helpers' logs; the
    profile is read whether or not there were helpers."""
    src = photos(tmp_path / "photos", 8)
    out = tmp_path / "out"

    def fake_run(cmd, log, timeout, env=None, cwd=None):
        run_dir = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("hydra.run.dir=")))
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({"img_per_s": 930.7, "first_epoch_s": 40.0,
                                                          "epoch_seconds": [40.0, 10.0, 10.0],
                                                          **(COMPILE if helpers else {})}))
        if helpers:
            (run_dir / "background_compile_backward.log").write_text("the helper's log")
        log.write_text(profiler_text())
        return 0, 1.0

    monkeypatch.setattr(e2e, "run_logged", fake_run)
    monkeypatch.delenv("COMMIT", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # empty: a cold first step
    assert e2e.main(["--device", "cpu", "--tiny", "--photos", str(src), "--tree", str(tmp_path / "tree"),
                     "--batch", "4", "--epochs", "2", "--decode", "cpu", "--no-step", "--profile",
                     "--out", str(out)]) == 0
    (js,) = out.glob("imagenet-e2e-cpu-*-tiny.json")
    (row,) = json.loads(js.read_text())["rows"]
    assert row["profile"]["ms_per_step"]["batch"] > 0
    logs = out / f"{js.stem}-logs"
    md = js.with_suffix(".md").read_text()
    if not helpers:
        assert "compile" not in row and "The first epoch's compile" not in md
        assert {p.name for p in logs.iterdir()} == {"run-cpu.log"}
        return
    assert row["compile"] == COMPILE
    assert (logs / "run-cpu-background_compile_backward.log").read_text() == "the helper's log"
    assert ("- cpu: the first step took 107.1 s, waiting for the helpers' entries (teacher 0.0 s, student_backward "
            "10.76 s); the helpers started 7.1 s before fit and 2.4 s after the run's own start (ready for the go by "
            "then: backward); the first helper had built its model 18.2 s after its "
            "start: imports done at 6.1 s, model built at 9.0 s, on the device at 14.2 s; the local views' "
            "backward's helper had built its model 19.5 s after its start; they wrote their entries "
            "(seconds after the go) teacher "
            "at 29.8 s, student_backward at 96.2 s (begun at 3.6 s); the host during the first step: 12.5 of 16 "
            "cores busy on average "
            "(p90 15.9), 17.2 runnable threads (max 61), more runnable threads than cores in 41 % of 428 samples; "
            "the run's own compiles and first runs of 0.5 s or more (seconds "
            "from fit's start): `student_forward` 80.2 s at 0.9 s (inductor cache miss), `student_forward` first run "
            "5.5 s at 81.1 s; the student's call went on 0.4 s past its first run's launch-config benchmarks, until "
            "the teacher's compile began (the rest of that first run: its kernels' first launches and, with "
            "`trainer.benchmark`, cuDNN's benchmarks of the forward's convolutions, which only the run's own thread "
            "can make); cuDNN's backward algorithms for 46 convolutions chosen 13.0 s "
            "into training (`compile_cudnn_warmup`).") in md


def test_the_rest_of_the_students_first_run_needs_both_ends() -> None:
    compiles = COMPILE["compile_parallel"]["compiles"]
    assert e2e.rest_of_first_run(compiles) == 0.4
    assert e2e.rest_of_first_run(compiles[:2]) is None  # no teacher's compile in the record
    assert e2e.rest_of_first_run([compiles[0], compiles[2]]) is None  # no first-run entry
    assert e2e.rest_of_first_run([{**c, "graph": "student_global"} for c in compiles]) is None  # the split's names


def test_a_row_without_a_compile_report_adds_no_compile_lines() -> None:
    assert e2e.compile_lines([{"decode": "cpu", "summary": {"img_per_s": 1.0}}]) == []
    assert e2e.compile_lines([{"decode": "cpu", "compile": {"compile_cudnn_warmup": {"off": "on the CPU"}}}]) == [
        "", "The first epoch's compile (the run's `summary.json`; the helpers' logs beside the record):", "",
        "- cpu: `compile_cudnn_warmup` off (on the CPU)."]


def test_a_split_runs_record_says_what_the_local_views_helper_did() -> None:
    """With the student's call per view size the run's summary has the local views' helper's status and whether the
    run's local views' graph brought its backward: the record says both, and a failed helper's error."""
    par = {"first_step_s": 50.0, "local_brought_backward": True,
           "local_helper": {"ok": True, "local_backward_run": True, "local_s": 9.0, "local_forward_s": 6.5}}
    line = e2e.compile_lines([{"decode": "cpu", "compile": {"compile_parallel": par}}])[-1]
    assert ("the local views' helper wrote its graphs, the local views' backward run once for AOTAutograd's entry "
            "(the forward compiled and run in 6.5 s, the graph written 2.5 s after it); the run's local views' graph "
            "came with its backward from AOTAutograd's cache.") in line, line
    failed = {**par, "local_brought_backward": False, "local_helper": {"ok": False, "error": "RuntimeError: x"}}
    line = e2e.compile_lines([{"decode": "cpu", "compile": {"compile_parallel": failed}}])[-1]
    assert "the local views' helper wrote no entry (RuntimeError: x); the run's local views' graph did not bring" \
        in line, line
    assert "local views" not in e2e.compile_lines([{"decode": "cpu", "compile": {"compile_parallel": {
        "first_step_s": 50.0}}}])[-1]


def test_a_forward_warmup_is_said_before_the_backwards() -> None:
    """With `compile_cudnn_warmup_forward` the run's summary has `forward_s`: the record says how long the forward's
    benchmarks took on the run's thread, then when the backward's last was chosen; without it, only the latter."""
    warm = {"convs": 46, "record_s": 0.7, "done_s": 12.0}
    forward = e2e.compile_lines([{"decode": "cpu", "compile": {"compile_cudnn_warmup": {**warm, "forward_s": 2.1}}}])
    assert forward[-1] == ("- cpu: cuDNN's forward algorithms for 46 convolutions chosen on the run's thread in 2.1 s "
                           "when training started (`compile_cudnn_warmup_forward`); cuDNN's backward algorithms for 46 "
                           "convolutions chosen 12.0 s into training (`compile_cudnn_warmup`).")
    plain = e2e.compile_lines([{"decode": "cpu", "compile": {"compile_cudnn_warmup": warm}}])
    assert plain[-1] == ("- cpu: cuDNN's backward algorithms for 46 convolutions chosen 12.0 s into training "
                         "(`compile_cudnn_warmup`).")


def test_the_record_says_whether_its_compile_cache_was_empty(tmp_path: Path) -> None:
    """A run on a cache an earlier run filled has a second run's first step: the record says which it was."""
    cache = tmp_path / "cache"
    assert e2e.cache_state(cache) == {"dir": str(cache), "empty_at_start": True}  # not there yet
    cache.mkdir()
    assert e2e.cache_state(cache)["empty_at_start"] is True
    (cache / "fxgraph").mkdir()
    warm = e2e.cache_state(cache)
    assert warm["empty_at_start"] is False
    assert e2e.cache_sentence({"compile_cache": warm}) == (
        f" Compile cache: `{cache}`, not empty at the start: the first step loaded what an earlier run compiled (a "
        "second run's first step).")
    assert e2e.cache_sentence({"compile_cache": e2e.cache_state(tmp_path / "none")}).endswith(", empty at the start.")
    assert e2e.cache_sentence({}) == ""


def test_fresh_cache_gives_each_run_an_empty_compile_cache_of_its_own(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--fresh-cache`: each real run compiles into an empty folder of its own (so its first step is cold whatever
    the machine's cache holds), the step benchmark reuses the last run's, and the record says so; without it the
    runs share the caller's cache."""
    src = photos(tmp_path / "photos", 8)
    seen: list[dict] = []

    def fake_run(cmd, log, timeout, env=None, cwd=None):
        env = env or {}
        cache = env.get("TORCHINDUCTOR_CACHE_DIR")
        seen.append({"step": "scfs.bench.step" in " ".join(cmd), "cache": cache,
                     "empty": cache is None or not (Path(cache).is_dir() and any(Path(cache).iterdir())),
                     "triton": env.get("TRITON_CACHE_DIR")})
        if cache:  # the run fills it
            Path(cache).mkdir(parents=True, exist_ok=True)
            (Path(cache) / "fxgraph").write_text("x")
        log.write_text("")
        return 1, 1.0

    monkeypatch.setattr(e2e, "run_logged", fake_run)
    monkeypatch.delenv("COMMIT", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "callers-cache"))
    keep = tmp_path / "work"
    common = ["--device", "cpu", "--tiny", "--photos", str(src), "--tree", str(tmp_path / "tree"), "--batch", "4",
              "--epochs", "2", "--decode", "cpu", "gpu", "--keep", str(keep)]
    e2e.main([*common, "--fresh-cache", "--out", str(tmp_path / "fresh")])
    runs, step = [s for s in seen if not s["step"]], [s for s in seen if s["step"]]
    assert [r["cache"] for r in runs] == [str(keep / "compile-cache-cpu"), str(keep / "compile-cache-gpu")]
    assert all(r["empty"] and r["triton"] == str(Path(r["cache"]) / "triton") for r in runs)
    assert [s["cache"] for s in step] == [str(keep / "compile-cache-gpu")]
    (js,) = (tmp_path / "fresh").glob("*.json")
    meta = json.loads(js.read_text())["meta"]
    assert meta["compile_cache"]["fresh"] is True and meta["compile_cache"]["empty_at_start"] is True
    assert "an empty folder of each run's own (`--fresh-cache`)" in js.with_suffix(".md").read_text()
    seen.clear()
    e2e.main([*common, "--out", str(tmp_path / "shared")])
    assert [s["cache"] for s in seen if not s["step"]] == [None, None]  # the caller's environment, unchanged
    (js,) = (tmp_path / "shared").glob("*.json")
    assert json.loads(js.read_text())["meta"]["compile_cache"]["dir"] == str(tmp_path / "callers-cache")


def test_the_record_names_the_cache_the_runs_use_and_each_runs_own_start(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `--fresh-cache` the runs use the cache the training command picks (`--override compile_cache=...`
    included, not only the shipped folder), and each run's row says whether that cache was empty when it started:
    a second decode mode's run starts from what the first compiled, a second run's first step, and the targets
    do not count it as a cold one."""
    from scfs.bench import targets as tg

    src = photos(tmp_path / "photos", 8)
    mine = tmp_path / "mine"

    def fake_run(cmd, log, timeout, env=None, cwd=None):
        assert f"compile_cache={mine}" in cmd
        mine.mkdir(parents=True, exist_ok=True)
        (mine / "fxgraph").write_text("x")  # the run fills the cache it was given
        log.write_text("")
        return 1, 1.0

    monkeypatch.setattr(e2e, "run_logged", fake_run)
    monkeypatch.delenv("COMMIT", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    e2e.main(["--device", "cpu", "--tiny", "--photos", str(src), "--tree", str(tmp_path / "tree"), "--batch", "4",
              "--epochs", "2", "--decode", "cpu", "gpu", "--override", f"compile_cache={mine}", "--no-step",
              "--out", str(tmp_path / "out")])
    (js,) = (tmp_path / "out").glob("*.json")
    rec = json.loads(js.read_text())
    assert rec["meta"]["compile_cache"] == {"dir": str(mine), "empty_at_start": True}
    assert [r["compile_cache"]["empty_at_start"] for r in rec["rows"]] == [True, False]
    par = {"first_step_s": 12.0}
    assert tg.cold_start(rec["meta"], par, rec["rows"][0]) and not tg.cold_start(rec["meta"], par, rec["rows"][1])
    second = "\n".join(e2e.compile_lines([{**rec["rows"][1], "compile": {"compile_parallel": par}}]))
    assert "the first step took 12.0 s (its compile cache held an earlier run's graphs: a second run's first step)" \
        in second
    first = "\n".join(e2e.compile_lines([{**rec["rows"][0], "compile": {"compile_parallel": par}}]))
    assert "the first step took 12.0 s" in first and "held an earlier run's" not in first


def test_the_runs_cache_is_the_environments_then_the_overrides_then_the_shipped_configs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scfs.training.compile_helpers import torch_default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    shipped = Path("~/.cache/scfs/torch-compile").expanduser()
    assert e2e.run_cache_dir("imagenet", None) == shipped and e2e.run_cache_dir("cifar10", []) == shipped
    assert e2e.run_cache_dir("imagenet", ["compile_cache=/a", "compile=false", "compile_cache=/b"]) == Path("/b")
    assert e2e.run_cache_dir("imagenet", ["compile_cache='~/z'"]) == Path("~/z").expanduser()
    default = e2e.run_cache_dir("imagenet", ["compile_cache=null"])  # torch's own folder
    assert default == Path(torch_default_cache_dir()) and default.name.startswith("torchinductor_")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(default))  # as importing Lightning leaves it: nobody's choice
    assert e2e.run_cache_dir("imagenet", ["compile_cache=/b"]) == Path("/b")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "env"))
    assert e2e.run_cache_dir("imagenet", ["compile_cache=/b"]) == tmp_path / "env"  # the user's own setting wins


def test_on_a_gpu_the_machine_is_primed_before_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-machine work (the fused search kernels' extension) goes to a throwaway process first, so the
    first record of a fresh machine does not charge it to a run's helper; `--no-prime` skips it."""
    import scfs.bench.compile as compile_bench

    calls: list[str] = []
    monkeypatch.setattr(e2e, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(e2e, "build_data", lambda args: (tmp_path / "tree", "a tree"))
    monkeypatch.setattr(e2e, "run_cache_dir", lambda recipe, overrides: tmp_path / "cache")
    monkeypatch.setattr(e2e, "host_info", lambda device: None)
    monkeypatch.setattr(compile_bench, "run_prime",
                        lambda recipe, device, tiny=False, overrides=(): (
                            calls.append(f"prime {recipe} {device} {list(overrides)}"), 3.2)[1])
    monkeypatch.setattr(e2e, "run_logged", lambda cmd, log, timeout, env=None: (calls.append("run"), (1, 0.1))[1])
    base = ["--photos", str(tmp_path), "--no-step", "--decode", "cpu", "--out", str(tmp_path / "r"),
            "--override", "checkpoint.every_n_train_steps=25"]
    assert e2e.main(base) == 1  # the stand-in run fails: the record still says what ran
    assert calls == ["prime imagenet cuda ['checkpoint.every_n_train_steps=25']", "run"]
    (record,) = (tmp_path / "r").glob("imagenet-e2e-h100-*.json")
    assert json.loads(record.read_text())["meta"]["prime_s"] == 3.2
    calls.clear()
    record.unlink()
    assert e2e.main([*base, "--no-prime"]) == 1
    assert calls == ["run"]

"""End-to-end smoke tests of `python -m scfs.train` (in-process through `scfs.train.run`)."""

import json
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from helpers import compose_cfg

from scfs.train import run, summary_line
from scfs.training.setup import find_resume_checkpoint


@pytest.mark.parametrize(
    "overrides",
    [["method=scfs", "search=soft"], ["method=dino"], ["search=hard"], ["search=softmax"], ["search=roi"],
     ["search=none"], ["data.batch_aug=false"]],
    ids=["scfs-soft", "dino", "hard", "softmax", "roi", "none", "per-sample-aug"],
)
def test_two_step_training_smoke(tmp_path, shapes_root, overrides):
    cfg = compose_cfg(overrides, data_root=shapes_root)
    s = run(cfg, tmp_path)
    assert s["steps"] == 2
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
    assert 0 <= s["knn"]["top1_k20"] <= 100 and 0 <= s["knn_init"]["top1_k20"] <= 100
    assert s["loss"] == s["loss"]  # finite, not NaN
    line = summary_line(s, 20)
    assert "random init" in line and "uniform level" in line and "last.ckpt" in line
    # the search mode is named for SCFS only: a DINO run does no search
    assert line.startswith("DINO done in" if "method=dino" in overrides else f"SCFS ({s['search']}) done in")


def test_centred_search_trains_and_is_named(tmp_path, shapes_root, monkeypatch):
    """`search.centre=true`: the local term and the end-of-run searched-regions figure search centred, and the
    run's summary and line say soft-centred."""
    import scfs.search

    calls = []
    real = scfs.search.feature_search

    def spy(*args, **kwargs):
        calls.append(kwargs.get("centre", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(scfs.search, "feature_search", spy)
    s = run(compose_cfg(["search.centre=true", "eval.figure=true"], data_root=shapes_root), tmp_path)
    assert s["steps"] == 2 and s["search"] == "soft-centred" and s["loss"] == s["loss"]
    assert summary_line(s, 20).startswith("SCFS (soft-centred) done in")
    assert calls and all(calls)  # every search of the run (training steps and the figure) was centred
    assert (tmp_path / "searched_regions.png").is_file()


def test_stage_terms_are_logged_for_scfs_only(tmp_path, shapes_root):
    cfg = compose_cfg(["method=scfs"], data_root=shapes_root)
    run(cfg, tmp_path / "scfs")
    metrics = (tmp_path / "scfs" / "csv").rglob("metrics.csv").__next__().read_text().splitlines()[0]
    for key in ("loss/dino", "loss/layer2_global", "loss/layer4_local", "search/layer3_weight_entropy",
                "sched/teacher_temp", "sched/momentum", "sched/lr"):
        assert key in metrics
    cfg = compose_cfg(["method=dino"], data_root=shapes_root)
    run(cfg, tmp_path / "dino")
    metrics = (tmp_path / "dino" / "csv").rglob("metrics.csv").__next__().read_text().splitlines()[0]
    assert "loss/dino" in metrics and "layer2" not in metrics


def test_knn_monitor_curve_says_where_a_pass_goes(tmp_path, shapes_root):
    """eval.knn_every_n_epochs: each curve point has the accuracy and the seconds of the pass by part."""
    run(compose_cfg(["eval.knn_every_n_epochs=1", "eval.knn_at_start=false"], data_root=shapes_root), tmp_path)
    (point,) = json.loads((tmp_path / "knn_curve.json").read_text())
    assert point["epoch"] == 1 and 0 <= point["top1_k20"] <= 100
    sec = point["seconds"]
    assert set(sec) == {"loaders_s", "bank_s", "query_s", "search_s", "total_s"}
    assert all(v >= 0 for v in sec.values()) and sec["bank_s"] > 0
    # each value is rounded to 1 ms, so the parts' sum may exceed the rounded total by half a ms per value
    assert sec["total_s"] >= sum(v for k, v in sec.items() if k != "total_s") - 0.0005 * len(sec)


def test_resume_continues_exactly(tmp_path, shapes_root):
    """2 epochs straight == resume from the same run's epoch-1 checkpoint: same step, teacher, student, centre."""
    common = ["trainer.max_epochs=2", "trainer.deterministic=true", "eval.knn_at_start=false",
              "checkpoint.every_n_epochs=1"]
    straight = run(compose_cfg(common, data_root=shapes_root), tmp_path / "a")
    epoch1 = tmp_path / "a" / "checkpoints" / "epoch000.ckpt"
    assert torch.load(epoch1, weights_only=True, map_location="cpu")["global_step"] == 2
    resumed = compose_cfg([*common, f"resume={epoch1}"], data_root=shapes_root)
    again = run(resumed, tmp_path / "c")
    assert again["steps"] == straight["steps"] == 4
    a = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    c = torch.load(tmp_path / "c" / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert a["state_dict"].keys() == c["state_dict"].keys()
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(c["state_dict"][k], v, rtol=0, atol=0, msg=k)
    assert a["global_step"] == c["global_step"]


def test_fused_optimizer_trains_the_same_model(tmp_path, shapes_root):
    """optim.fused=true (what `auto` picks on CUDA; the CPU's fused SGD here) trains the same weights as the foreach
    default, which `auto` keeps on the CPU."""
    common = ["eval.knn_at_start=false", "trainer.deterministic=true"]
    run(compose_cfg(common, data_root=shapes_root), tmp_path / "auto")
    run(compose_cfg([*common, "optim.fused=true"], data_root=shapes_root), tmp_path / "fused")
    a, f = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
            for d in ("auto", "fused"))
    assert not a["optimizer_states"][0]["param_groups"][0]["fused"]
    assert f["optimizer_states"][0]["param_groups"][0]["fused"] is True
    assert a["global_step"] == f["global_step"] == 2
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(f["state_dict"][k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_resume_auto_finds_latest_and_bad_path_is_clear(tmp_path):
    assert find_resume_checkpoint("auto", "nothing-here", runs_root=tmp_path) is None
    ck = tmp_path / "x" / "2026" / "checkpoints"
    ck.mkdir(parents=True)
    (ck / "last.ckpt").write_bytes(b"0")
    assert find_resume_checkpoint("auto", "x", runs_root=tmp_path) == str(ck / "last.ckpt")
    with pytest.raises(FileNotFoundError, match="resume="):
        find_resume_checkpoint(str(tmp_path / "missing.ckpt"), "x")


def test_knn_runs_on_the_runs_gpu_not_on_the_cpu(monkeypatch):
    """kNN before and after fit runs outside the Trainer (whose teardown moves the module to the CPU): on GPU
    recipes it must pick this process's GPU, or a CIFAR-10 kNN takes minutes on the host (seen on an H200)."""
    import torch
    from omegaconf import OmegaConf

    from scfs.training.setup import eval_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert eval_device(OmegaConf.create({"trainer": {"accelerator": "gpu"}})) == torch.device("cuda", 1)
    assert eval_device(OmegaConf.create({"trainer": {"accelerator": "cpu"}})) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert eval_device(OmegaConf.create({"trainer": {"accelerator": "auto"}})) == torch.device("cpu")


def test_compile_mode_reaches_every_compiled_module(monkeypatch):
    """`compile=true compile_mode=reduce-overhead`: the step's student and teacher calls, the backbones and the
    teacher's stage heads are compiled with that mode (CUDA graphs); `default` passes no mode. Nothing is compiled
    here: torch.compile and nn.Module.compile are recorded."""
    from helpers import compose_cfg
    from torch import nn

    import scfs.methods.base as module_mod
    from scfs.models.heads import StageHead
    from scfs.train import build

    seen: list[dict] = []
    searched: list[dict] = []
    step_fns: list[tuple] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: seen.append(kw))
    monkeypatch.setattr(StageHead, "compile_searched", lambda self, **kw: searched.append(kw))
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: step_fns.append((fn.__name__, kw)) or fn)
    _, model = build(compose_cfg(["compile=true", "compile_mode=reduce-overhead"]))
    n_heads = len(model.teacher["stage_heads"])
    want = {"mode": "reduce-overhead", "dynamic": False}
    # static shapes: one graph per view size, no recompile with symbolic sizes when the second size arrives; the
    # losses' graph without CUDA graphs (its outputs are the logged values)
    assert step_fns == [("student_forward", want), ("teacher_forward", want),
                        ("step_losses", {"mode": None, "dynamic": False})]
    assert seen == [want] * (2 + n_heads)
    assert searched == [want] * n_heads
    seen.clear()
    step_fns.clear()
    build(compose_cfg(["compile=true"]))
    assert seen == [{"dynamic": False}] * (2 + n_heads)
    plain = {"dynamic": False}
    assert step_fns == [("student_forward", plain), ("teacher_forward", plain), ("step_losses", plain)]


def test_chunk_budget_stops_cleanly_and_resume_finishes_like_one_run(tmp_path, shapes_root):
    """`chunk_minutes`: the run stops at the first budget check (every 20 steps; here mid-epoch), writes last.ckpt
    and says how to continue; `resume=` from it ends at the same step, with the same weights, as one run."""
    common = ["trainer.max_epochs=8", "trainer.limit_train_batches=3", "trainer.deterministic=true",
              "eval.knn_at_start=false"]
    whole = run(compose_cfg(common, data_root=shapes_root), tmp_path / "whole")
    first = run(compose_cfg([*common, "chunk_minutes=1e-6"], data_root=shapes_root), tmp_path / "chunk1")
    assert first["stopped_by_chunk_budget"] and first["steps"] == 20 and whole["steps"] == 24
    ckpt = tmp_path / "chunk1" / "checkpoints" / "last.ckpt"
    assert first["resume_with"] == f"resume={ckpt}" and ckpt.is_file()
    second = run(compose_cfg([*common, f"resume={ckpt}"], data_root=shapes_root), tmp_path / "chunk2")
    assert second["steps"] == 24 and "stopped_by_chunk_budget" not in second
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "chunk2" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for k, v in a.items():
        torch.testing.assert_close(b[k], v, rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_a_mid_epoch_max_steps_stop_resumes_at_the_next_batch(tmp_path, shapes_root):
    """The last.ckpt of a run that stops mid-epoch (max_steps here; max_time and the chunk budget alike) is the
    state after that step: resuming runs the remaining batches, not one fewer."""
    common = ["trainer.max_epochs=8", "trainer.limit_train_batches=3", "eval.knn_at_start=false"]
    first = run(compose_cfg([*common, "+trainer.max_steps=20"], data_root=shapes_root), tmp_path / "a")
    assert first["steps"] == 20
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    second = run(compose_cfg([*common, "+trainer.max_steps=22", f"resume={ckpt}"], data_root=shapes_root),
                 tmp_path / "b")
    assert second["steps"] == 22


@pytest.mark.slow
def test_compiled_step_matches_eager(tmp_path, shapes_root):
    """`compile=true` (inductor on the CPU here; static shapes, the searched branch compiled too) trains the same
    model as eager: after 2 steps every weight agrees to float32 rounding (fused kernels reorder sums). 5 min."""
    from torch._dynamo.utils import counters

    common = ["eval.knn_at_start=false", "trainer.deterministic=false"]
    run(compose_cfg(common, data_root=shapes_root), tmp_path / "eager")
    counters.clear()
    run(compose_cfg([*common, "compile=true"], data_root=shapes_root), tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] >= 4  # backbones, heads, stage heads and the searched branches ran
    a, c = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
            for d in ("eager", "compiled"))
    assert a["state_dict"].keys() == c["state_dict"].keys()
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(c["state_dict"][k], v, rtol=1e-3, atol=1e-4, msg=k)


def test_step_terms_are_logged_only_on_written_steps_and_the_last(tmp_path, shapes_root, monkeypatch):
    """The per-step loss terms go through `self.log` only on the steps Lightning writes (every
    `trainer.log_every_n_steps`) and on the run's last step, whose DINO term the summary reports; `loss` itself
    is logged every step (its epoch mean)."""
    import lightning as L

    seen: list[tuple[int, float]] = []
    log_dict = L.LightningModule.log_dict

    def spy(self, metrics, *args, **kwargs):
        if "loss/total" in metrics:
            seen.append((self.global_step, float(metrics["loss/dino"])))
        return log_dict(self, metrics, *args, **kwargs)

    monkeypatch.setattr(L.LightningModule, "log_dict", spy)
    summary = run(compose_cfg(["trainer.max_epochs=4", "trainer.log_every_n_steps=3", "eval.knn_at_start=false"],
                              data_root=shapes_root), tmp_path / "r")
    assert summary["steps"] == 8  # 4 epochs of 2 batches
    assert [step for step, _ in seen] == [2, 5, 7]  # steps 3 and 6 (1-based) are written, and the last one
    assert summary["loss_dino"] == pytest.approx(seen[-1][1])


def test_summary_reports_epoch_seconds_and_steady_images_per_second(tmp_path, shapes_root):
    """summary.json says how long each epoch took and the images per second of the epochs after the first."""
    s = run(compose_cfg(["trainer.max_epochs=3", "eval.knn_at_start=false"], data_root=shapes_root), tmp_path)
    assert len(s["epoch_seconds"]) == 3 and all(v > 0 for v in s["epoch_seconds"])
    assert s["first_epoch_s"] == s["epoch_seconds"][0] and s["img_per_s"] > 0
    openings = s["epoch_openings_s"]
    assert len(openings) == 3 and all(0 < o < e for o, e in zip(openings, s["epoch_seconds"], strict=True))
    assert s["img_per_s_after_openings"] > s["img_per_s"]


def test_epoch_timer_median_leaves_out_the_first_epoch():
    from scfs.training.callbacks import EpochTimer

    t = EpochTimer()
    t.epochs = [{"epoch": 0, "seconds": 100.0, "steps": 10}, {"epoch": 1, "seconds": 2.0, "steps": 10},
                {"epoch": 2, "seconds": 4.0, "steps": 10}, {"epoch": 3, "seconds": 2.5, "steps": 10}]
    rep = t.report(images_per_step=64)
    assert rep["first_epoch_s"] == 100.0 and rep["epoch_seconds"] == [100.0, 2.0, 4.0, 2.5]
    assert rep["img_per_s"] == 256.0  # median of 320, 160, 256 images/s; the compile epoch (6.4) is not among them
    assert EpochTimer().report(64) == {"epoch_seconds": [], "img_per_s": None}
    assert "epoch_openings_s" not in rep  # set by hand without openings: none is made up


def test_epoch_timer_says_how_much_of_each_epoch_ran_beside_a_background_write():
    """A write handed over at epoch 0's end (after the epoch clock stopped) and ending 1.5 s into epoch 1 counts
    there; a write still running when an epoch ends counts up to that end; writes on the training thread (no
    `seconds_writing`) add no key."""
    from scfs.models.checkpoint_io import BackgroundCheckpointIO
    from scfs.training.callbacks import EpochTimer

    io = BackgroundCheckpointIO()
    io.write_spans = [[10.2, 13.0], [21.5, None]]

    class Trainer:
        current_epoch, global_step = 0, 0
        strategy = SimpleNamespace(checkpoint_io=io)

    t, trainer = EpochTimer(), Trainer()
    clock = iter([0.0, 10.0, 11.5, 20.0, 20.5, 22.0])  # start and end of three epochs
    with mock.patch("scfs.training.callbacks.time.perf_counter", lambda: next(clock)):
        for epoch in range(3):
            trainer.current_epoch = epoch
            t.on_train_epoch_start(trainer, None)
            trainer.global_step += 1
            t.on_train_epoch_end(trainer, None)
    report = t.report(images_per_step=8)
    assert report["epoch_background_writes_s"] == [0.0, 1.5, 0.5] and report["checkpoint_writes"] == "background"
    trainer.strategy = SimpleNamespace(checkpoint_io=object())
    plain = EpochTimer()
    plain.on_train_epoch_start(trainer, None)
    plain.on_train_epoch_end(trainer, None)
    report = plain.report(images_per_step=8)
    assert "epoch_background_writes_s" not in report and report["checkpoint_writes"] == "training thread"


def test_epoch_timer_times_each_epochs_opening():
    """The opening is the wait from an epoch's start to its first batch's start; later batches leave it alone,
    and the rate after openings takes it out of each steady epoch."""
    from scfs.training.callbacks import EpochTimer

    class Trainer:
        current_epoch, global_step = 0, 0

    t, trainer = EpochTimer(), Trainer()
    clock = iter([0.0, 0.5, 2.0, 10.0, 10.25, 12.0])  # start, batch 0 (batch 1 reads no clock), end; twice
    with mock.patch("scfs.training.callbacks.time.perf_counter", lambda: next(clock)):
        for epoch in range(2):
            trainer.current_epoch = epoch
            t.on_train_epoch_start(trainer, None)
            for i in range(2):
                t.on_train_batch_start(trainer, None, None, i)
                trainer.global_step += 1
            t.on_train_epoch_end(trainer, None)
    rep = t.report(images_per_step=8)
    assert rep["epoch_seconds"] == [2.0, 2.0] and rep["epoch_openings_s"] == [0.5, 0.25]
    assert rep["img_per_s"] == 8.0 and rep["img_per_s_after_openings"] == round(16 / 1.75, 1)

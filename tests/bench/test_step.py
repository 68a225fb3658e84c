"""`python -m scfs.bench.step --device cpu --tiny` runs the real training step and writes a sane record."""

from __future__ import annotations

import argparse
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
    assert rec["meta"]["processes"] == 1 and rec["meta"]["data"] == "synthetic" and rec["meta"]["host_us_per_op"] > 0
    assert rec["meta"]["commit"]  # the record names the code it measured
    assert {(r["method"], r["B"]) for r in rec["rows"]} == {("scfs", 8), ("dino", 8)}
    for r in rec["rows"]:
        assert r["step_ms"] > 0 and r["img_per_s"] > 0 and r["steps"] == 2 and r["world"] == 1
    scfs = next(r for r in rec["rows"] if r["method"] == "scfs")
    assert scfs["ratio_scfs_dino"] > 0
    assert "| scfs | 8 | fp32 |" in js.with_suffix(".md").read_text()
    assert rec["meta"]["host"]["us_per_op"] == rec["meta"]["host_us_per_op"]  # one measurement, two keys
    assert f"Host: {rec['meta']['host']['cpu']}" in js.with_suffix(".md").read_text()


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
    assert {"student", "teacher", "dino_loss", "backward", "ema"} <= set(prof["dino"]["parts"])
    assert "stage_layer4_local" in prof["scfs"]["parts"] and not any("stage" in k for k in prof["dino"]["parts"])
    parts = prof["scfs"]["parts"]
    assert all(v["cpu_ms"] > 0 for k, v in parts.items() if k != "rest")
    # aten ops per part: nested parts inside the losses, the backward and the loop's ops under rest
    assert all(v["aten_ops"] > 0 for v in parts.values())
    stages = [v["aten_ops"] for k, v in parts.items() if k.startswith("stage_")]
    assert parts["losses"]["aten_ops"] >= sum(stages) + parts["dino_loss"]["aten_ops"]
    assert "rest" in parts and "ops |" in js.with_suffix(".md").read_text()
    assert "Profile (`--profile`)" in js.with_suffix(".md").read_text()


def test_part_op_counts_charges_every_enclosing_part_and_leaves_the_rest_outside() -> None:
    from types import SimpleNamespace

    from scfs.bench.step import part_op_counts

    def ev(name: str, parent=None):
        return SimpleNamespace(name=name, cpu_parent=parent)

    losses = ev("scfs/losses")
    stage = ev("scfs/stage_layer2_local", losses)
    to = ev("aten::to", stage)
    events = [losses, stage, to, ev("aten::_to_copy", to), ev("aten::mul", losses), ev("aten::add_"),
              ev("Optimizer.step"), ev("aten::mm", ev("autograd::engine"))]
    assert part_op_counts(events, n=2) == {"stage_layer2_local": 1.0, "losses": 1.5, "rest": 1.0}


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


def test_profile_summary_counts_each_kernel_once() -> None:
    """key_averages holds, per record_function range, a CPU entry (host time, its kernels) and a GPU annotation (the
    span); the CPU op that launched a kernel also carries that kernel's time. GPU busy must count each kernel once,
    and leave annotations and the Lightning optimizer range (which wraps the whole closure) out."""
    from types import SimpleNamespace as E

    from torch.autograd import DeviceType

    from scfs.bench.step import summarize_profile

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA

    def ev(key: str, dev: DeviceType, count: int = 2, cpu_us: float = 0.0, dev_us: float = 0.0,
           self_dev_us: float | None = None, ann: bool = False) -> E:
        return E(key=key, device_type=dev, count=count, cpu_time_total=cpu_us, self_cpu_time_total=cpu_us,
                 device_time_total=dev_us, self_device_time_total=dev_us if self_dev_us is None else self_dev_us,
                 is_user_annotation=ann)

    events = [
        ev("aten::conv2d", cpu, 8, cpu_us=400, dev_us=6000, self_dev_us=0),       # its child launched the kernel
        ev("aten::cudnn_convolution", cpu, 8, cpu_us=300, dev_us=6000),
        ev("aten::add_", cpu, 20, cpu_us=200, dev_us=1000),
        ev("cudaLaunchKernel", cpu, 28, cpu_us=100),
        ev("sm90_conv_kernel", gpu, 8, dev_us=6000),
        ev("elementwise_kernel", gpu, 20, dev_us=1000),
        ev("scfs/student_backbone", cpu, 2, cpu_us=900, dev_us=6000, ann=True),
        ev("scfs/student_backbone", gpu, 2, dev_us=9000, ann=True),            # span: kernels + gaps
        ev("Optimizer.step#SGD.step", gpu, 2, dev_us=20000, ann=True),
        ev("Optimizer.step#SGD.step", cpu, 2, cpu_us=5000, dev_us=7000, ann=True),
    ]
    out = summarize_profile(events, 2, cuda=True)
    assert out["gpu_busy_ms_per_step"] == 3.5                      # (6000 + 1000) us over 2 steps, once
    assert out["kernel_launches_per_step"] == 14 and out["aten_ops_per_step"] == 18
    part = out["parts"]["student_backbone"]
    assert (part["cpu_ms"], part["gpu_ms"], part["gpu_span_ms"]) == (0.45, 3.0, 4.5)
    assert out["parts"]["rest"]["gpu_ms"] == 0.5                    # busy minus the named parts
    assert [t["op"] for t in out["top"]][:2] == ["aten::cudnn_convolution", "aten::add_"]
    assert not any(t["op"].startswith(("scfs/", "Optimizer")) for t in out["top"])
    assert out["top_kernels"][0] == {"kernel": "sm90_conv_kernel", "count_per_step": 4.0, "ms_per_step": 3.0}
    # host time: ops and runtime calls by their own host time, annotations left out
    assert [t["op"] for t in out["host_top"]][:2] == ["aten::conv2d", "aten::cudnn_convolution"]
    assert out["host_top"][0]["self_cpu_ms_per_step"] == 0.2
    assert not any(t["op"].startswith(("scfs/", "Optimizer")) for t in out["host_top"])


def test_method_filter_and_overrides_reach_the_rows(tmp_path: Path) -> None:
    """--method keeps only those rows; --override reaches every row's config and is recorded in the meta."""
    torch.set_num_threads(1)
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--method", "scfs", "--strict",
                 "--override", "method.stage_pooled_bn=false", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    rec = json.loads(js.read_text())
    assert [r["method"] for r in rec["rows"]] == ["scfs"]
    assert rec["meta"]["overrides"] == ["method.stage_pooled_bn=false"]
    assert "Overrides on every row: `method.stage_pooled_bn=false`" in js.with_suffix(".md").read_text()
    with pytest.raises(Exception, match="stage_pooled_bn"):  # a bad override is the config's error, not a crash
        main(["--device", "cpu", "--tiny", "--method", "scfs", "--strict", "--override",
              "method.stage_pooled_bn=maybe", "--out", str(tmp_path / "bad")])



def test_vary_zips_keys_into_variants_each_row_gets_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated --vary keys are zipped (the n-th values make the n-th variant), every row runs once per variant
    with both keys in its config and in its label; keys with unequal numbers of values are one clear line."""
    import scfs.bench.step as step

    assert step.variants(None) == [()]
    assert step.variants(["optim.fused=true,false"]) == [("optim.fused=true",), ("optim.fused=false",)]
    assert step.variants(["a.b=1,2", "c=x,y"]) == [("a.b=1", "c=x"), ("a.b=2", "c=y")]
    with pytest.raises(SystemExit, match="as many values"):
        step.variants(["a.b=1,2", "c=x"])
    seen = []
    measure = step.measure

    def spy(cfg, *a, **kw):
        seen.append((cfg.method.stage_branch_channels, cfg.method.stage_final_relu))
        return measure(cfg, *a, **kw)

    monkeypatch.setattr(step, "measure", spy)
    torch.set_num_threads(1)
    assert step.main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--method", "scfs", "--strict",
                      "--setting", "fp32", "--vary", "method.stage_branch_channels=null,12",
                      "--vary", "method.stage_final_relu=false,true", "--no-ceiling", "--out", str(tmp_path)]) == 0
    assert seen == [(None, False), (12, True)]
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    labels = [r["setting"] for r in json.loads(js.read_text())["rows"]]
    assert labels == ["fp32 method.stage_branch_channels=null method.stage_final_relu=false",
                      "fp32 method.stage_branch_channels=12 method.stage_final_relu=true"]


def test_a_method_without_a_variants_keys_runs_once_as_it_is(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """DINO has no stage heads: beside SCFS variants of `method.stage_*` it runs once, without those keys, so that the
    SCFS / DINO ratio comes from the same call; a key both configs have still varies both."""
    import scfs.bench.step as step

    seen = []
    monkeypatch.setattr(step, "measure", lambda cfg, *a, **kw: seen.append(
        (cfg.method.name, cfg.method.get("stage_pooled_bn"), cfg.optim.fused)) or {"step_ms": 10.0 + len(seen)})
    assert step.main(["--device", "cpu", "--tiny", "--method", "scfs", "--method", "dino", "--strict",
                      "--setting", "fp32", "--vary", "method.stage_pooled_bn=true,false", "--vary",
                      "optim.fused=false,false", "--no-ceiling", "--out", str(tmp_path)]) == 0
    assert seen == [("scfs", True, False), ("scfs", False, False), ("dino", None, False)]
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    rows = json.loads(js.read_text())["rows"]
    assert [(r["method"], r["setting"]) for r in rows] == [
        ("scfs", "fp32 method.stage_pooled_bn=true optim.fused=false"),
        ("scfs", "fp32 method.stage_pooled_bn=false optim.fused=false"),
        ("dino", "fp32 optim.fused=false")]
    # each SCFS variant against the one DINO row (steps of 11, 12 and 13 ms)
    assert [r.get("ratio_scfs_dino") for r in rows] == [pytest.approx(11 / 13), pytest.approx(12 / 13), None]
    cfg = step.compose("resnet50", "dino", 2, "fp32", argparse.Namespace(data="synthetic", device="cpu", devices=1,
                                                                         tiny=True, override=None))
    assert step.applicable(cfg, ("method.stage_final_relu=true", "++method.x=1", "optim.fused=true")) == (
        "++method.x=1", "optim.fused=true")


def test_each_row_compiles_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows share modules' forward code objects: without a dynamo reset per row, a second batch size in one process
    filled the per-code-object graph limit and its last stage head ran eager (H200, 2026-11-30)."""
    import torch._dynamo

    torch.set_num_threads(1)
    seen: list[int] = []
    real_reset = torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: (seen.append(1), real_reset())[1])
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--method", "scfs", "--batch", "4",
                 "--batch", "8", "--strict", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    assert [r["B"] for r in json.loads(js.read_text())["rows"]] == [4, 8]
    assert len(seen) == 2


def test_markdown_names_host_time_and_provenance() -> None:
    """A committed GPU record's markdown says where host time goes and which command made it."""
    from scfs.bench.step import markdown

    meta = {"suite": "resnet50", "gpu": "NVIDIA H200", "date": "2026-11-30", "torch": "2", "lightning": "2",
            "processes": 1, "data": "synthetic", "warmup": 1, "steps": 2, "made_by": "bash scripts/x.sh",
            "note": "B=64 not measured", "commit": "abc1234", "command": "python -m scfs.bench.step --batch 32"}
    prof = {"aten_ops_per_step": 10, "kernel_launches_per_step": 5, "top": [], "gpu_busy_ms_per_step": 1.0,
            "host_top": [{"op": "cudaGraphLaunch", "count_per_step": 28.0, "self_cpu_ms_per_step": 8.31}]}
    md = markdown({"meta": meta, "rows": [{"method": "scfs", "B": 32, "setting": "bf16_cl_graphs", "step_ms": 2.0,
                                           "img_per_s": 16000.0, "profile": prof}]})
    assert "- scfs B=32 bf16_cl_graphs: cudaGraphLaunch 8.3 ms (28x)" in md
    assert "Made by: bash scripts/x.sh" in md and "Note: B=64 not measured" in md
    assert "Commit `abc1234`; `python -m scfs.bench.step --batch 32`." in md


def test_speed_targets_are_marked_met_or_missed_by_how_much():
    """The record's target table: default path vs 2x the published img/s and its peak memory, SCFS / DINO on the
    default path, eager vs the published step; each met, or missed by the relative shortfall."""
    from scfs.bench.step import targets

    def row(method: str, b: int, setting: str, ms: float, peak: float) -> dict:
        return {"method": method, "B": b, "setting": setting, "step_ms": ms, "img_per_s": b * 1000 / ms,
                "peak_GiB": peak}

    rows = [row("scfs", 32, "bf16_cl_graphs", 39.0, 7.0), row("dino", 32, "bf16_cl_graphs", 36.0, 6.0),
            {**row("scfs", 32, "bf16_cl", 128.0, 7.5), "aug_ms": 8.0}, row("scfs", 64, "bf16_cl_graphs", 64.0, 15.0),
            row("dino", 64, "bf16_cl_graphs", 50.0, 12.0)]
    got = {(c["B"], c["target"].split(" (")[0]): c for c in targets({"meta": {"suite": "resnet50"}, "rows": rows})}
    assert got[(32, "SCFS default >= 2.0x published")]["met"]  # 821 img/s >= 704
    assert got[(32, "SCFS default peak memory <= published")]["met"]  # 7.0 <= 8.0 GiB
    assert got[(32, "SCFS / DINO on the default path <= 1.10")]["met"]  # 1.08
    eager = got[(32, "SCFS eager >= published")]  # 250 img/s against 352: 29 % short
    assert not eager["met"] and eager["verdict"] == "missed by 29 %"
    assert eager["measured"] == "250 img/s (267 without making the views)"  # the published timing had no views
    b64 = got[(64, "SCFS default >= 2.0x published")]  # 1000 img/s against 1122
    assert not b64["met"] and b64["verdict"] == "missed by 11 %"
    assert not got[(64, "SCFS / DINO on the default path <= 1.10")]["met"]  # 1.28
    assert not got[(64, "SCFS default peak memory <= published")]["met"]  # 15.0 > 14.7 GiB
    assert (64, "SCFS eager >= published") not in got  # no eager row at B=64: nothing claimed
    assert targets({"meta": {"suite": "cifar"}, "rows": rows}) == []


def test_backbone_ceiling_is_faster_than_the_step(tmp_path: Path) -> None:
    """The backbones' work alone bounds the step from above: every row's share of its ceiling is in (0, 1]
    (with a little slack for timing noise on a loaded CPU), and rows of one batch and setting share one ceiling."""
    torch.set_num_threads(1)
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "3", "--strict", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    rows = json.loads(js.read_text())["rows"]
    assert all(r["ceiling_img_per_s"] > 0 for r in rows)
    assert len({r["ceiling_img_per_s"] for r in rows}) == 1  # scfs and dino at B=8 fp32: the same backbones' work
    scfs = next(r for r in rows if r["method"] == "scfs")
    assert 0 < scfs["of_ceiling"] < 1.2
    assert "backbone-bound img/s" in js.with_suffix(".md").read_text()


def _dynamo_without_inductor(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.compile through dynamo's eager backend: the compiled rows trace their graphs as on the GPU, without
    inductor's C++ code generation (minutes on this CPU). Returns the compile modes the step asked for."""
    import torch._dynamo
    from torch import nn

    import scfs.methods.base as base

    modes: list[str] = []
    real_compile, real_module_compile = torch.compile, nn.Module.compile

    def compile_fn(fn: object, **kw: object) -> object:
        modes.append(str(kw.get("mode")))
        return real_compile(fn, backend="eager", dynamic=False)

    def compile_module(self: nn.Module, **kw: object) -> None:
        modes.append(str(kw.get("mode")))
        real_module_compile(self, backend="eager", dynamic=False)

    monkeypatch.setattr(base.torch, "compile", compile_fn)
    monkeypatch.setattr(nn.Module, "compile", compile_module)
    return modes


def test_a_compiled_row_gets_a_compiled_ceiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ceiling of a compiled row compiles the backbones' passes in the row's mode (an eager ceiling is itself
    host-bound, and the compiled step beat it: 102 % of it on the H200); an eager row keeps an eager ceiling, so
    the two settings get two ceilings."""
    torch.set_num_threads(1)
    _dynamo_without_inductor(monkeypatch)
    compiled: list[tuple[str, str]] = []
    traced = torch.compile

    def recording(fn: object, **kw: object) -> object:
        compiled.append((getattr(fn, "__name__", ""), str(kw.get("mode"))))
        return traced(fn, **kw)

    monkeypatch.setattr(torch, "compile", recording)
    assert main(["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--strict", "--method", "scfs",
                 "--setting", "bf16_graphs", "--setting", "bf16", "--out", str(tmp_path)]) == 0
    assert [c for c in compiled if c[0].endswith("_pass")] == [("student_pass", "reduce-overhead"),
                                                               ("teacher_pass", "reduce-overhead")]
    (js,) = tmp_path.glob("step-cpu-*-tiny.json")
    rows = json.loads(js.read_text())["rows"]
    assert [r["setting"] for r in rows] == ["bf16_graphs", "bf16"]
    assert all(r["ceiling_img_per_s"] > 0 for r in rows)
    assert rows[0]["ceiling_step_ms"] != rows[1]["ceiling_step_ms"]  # measured twice, not shared


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("inductor", marks=pytest.mark.slow)])
def test_vit_suite_tiny_cpu_runs_default_and_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture, backend: str) -> None:
    """--suite vit: SCFS and DINO, each on the recipe's default path (compiled, CUDA-graph mode, bf16) and eager,
    with the backbone-bound limit of a ViT; the record is named -vit and its published columns say there is none.
    `dynamo`: 15 s; `inductor`, the real compiler: 5 min or more."""
    torch.set_num_threads(1)
    modes = _dynamo_without_inductor(monkeypatch) if backend == "dynamo" else None
    assert main(["--suite", "vit", "--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--strict",
                 "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("step-cpu-*-vit-tiny.json")
    rec = json.loads(js.read_text())
    assert rec["meta"]["suite"] == "vit"
    assert {(r["method"], r["B"], r["setting"]) for r in rec["rows"]} == {
        (m, 8, s) for m in ("scfs", "dino") for s in ("bf16_graphs", "bf16")}
    for r in rec["rows"]:
        assert "error" not in r and "ceiling_error" not in r
        assert 0 < r["step_ms"] < float("inf") and 0 < r["img_per_s"] < float("inf") and r["steps"] == 1
        assert 0 < r["ceiling_img_per_s"] < float("inf") and "published" not in r
    if modes is not None:  # the default rows compiled as the recipe ships (the losses' graph without CUDA graphs)
        assert set(modes) == {"reduce-overhead", "None"}
    md = js.with_suffix(".md").read_text()
    assert "| scfs | 8 | bf16_graphs |" in md and "| dino | 8 | bf16 |" in md
    assert "it has no ViT, so there is none for this suite" in md
    assert md in capsys.readouterr().out


def test_vit_row_plan_and_recipe() -> None:
    """The GPU plan: ViT-S/16 at B=64, both methods, the recipe's shipped path and the eager one; the default
    setting composes exactly what `+experiment=imagenet_vit` ships, the eager one differs only in compile."""
    import argparse

    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from scfs.bench.step import PATHS, compose, suite_rows, synthetic_size
    from scfs.names import CONF_DIR

    assert suite_rows("vit", quick=False, tiny=False, batches=None) == [
        ("scfs", 64, "bf16_graphs"), ("scfs", 64, "bf16"), ("dino", 64, "bf16_graphs"), ("dino", 64, "bf16")]
    assert suite_rows("vit", quick=True, tiny=False, batches=[32]) == [("scfs", 32, "bf16"), ("dino", 32, "bf16")]
    with pytest.raises(ValueError, match="unknown suite 'vitt'"):
        suite_rows("vitt", quick=False, tiny=False, batches=None)
    args = argparse.Namespace(devices=1, data="synthetic", device="cuda", tiny=False, override=None)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        shipped = hcompose(config_name="config", overrides=["+experiment=imagenet_vit", "method=scfs"])
    default, eager = (compose("vit", "scfs", 64, s, args) for s in PATHS["vit"])
    keys = ("trainer.precision", "compile", "compile_mode", "backbone.channels_last", "backbone.name",
            "crops.global_size", "crops.local_size", "crops.n_local", "method.out_dim", "optim.name")
    from omegaconf import OmegaConf

    def pick(c: object) -> list:
        return [OmegaConf.select(c, k) for k in keys]

    assert pick(default) == pick(shipped)
    assert pick(shipped) == ["bf16-mixed", True, "reduce-overhead", False, "vit_small_patch16_224", 224, 96, 10,
                             65536, "adamw"]
    assert (eager.compile, eager.trainer.precision, default.batch_size) == (False, "bf16-mixed", 64)
    # synthetic images big enough for every crop at full resolution: 96 px locals at scale 0.05 need 430 px
    assert synthetic_size("vit", default.crops, tiny=False) == 430
    assert synthetic_size("resnet50", default.crops, tiny=False) == 256
    tiny = compose("vit", "dino", 8, "bf16", argparse.Namespace(**{**vars(args), "tiny": True}))
    assert (tiny.backbone.arch, tiny.backbone.depth, synthetic_size("vit", tiny.crops, tiny=True)) == ("vit", 2, 32)


def test_vit_suite_refuses_channels_last(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A ViT has no channels_last setting in its recipe: one error line naming the settings that apply, no record;
    a suite that does not exist is refused with the ones that do."""
    with pytest.raises(SystemExit) as exc:
        main(["--suite", "vit", "--device", "cpu", "--tiny", "--steps", "1", "--no-ceiling", "--setting", "bf16",
              "--setting", "bf16_cl", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "--suite vit --setting bf16_cl: channels_last" in err
    assert "fp32, bf16, bf16_compile, bf16_graphs" in err
    with pytest.raises(SystemExit) as exc:
        main(["--suite", "vit16", "--device", "cpu", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "'resnet50', 'cifar', 'vit'" in capsys.readouterr().err
    assert not list(tmp_path.glob("step-*"))


def test_markdown_says_why_a_ceiling_is_missing() -> None:
    """A row whose backbone-bound limit could not be measured keeps its step numbers and says why in that cell."""
    from scfs.bench.step import markdown

    meta = {"suite": "vit", "gpu": "cpu", "date": "2026-12-02", "torch": "2", "lightning": "2", "processes": 1,
            "data": "synthetic", "warmup": 1, "steps": 2}
    md = markdown({"meta": meta, "rows": [{"method": "dino", "B": 8, "setting": "bf16", "step_ms": 4.0,
                                           "img_per_s": 2000.0, "ceiling_error": "ValueError: no views"}]})
    assert "| dino | 8 | bf16 | 4.0 | 2000 |" in md and "| - (ValueError: no views) | - |" in md


def test_time_steps_times_each_step_after_the_warmup_and_reads_counters_between() -> None:
    """The clock both step benchmarks share: one gap per timed step (its own sleep, not its neighbours'), the
    warm-up's wall seconds, `after_warmup` once between the warm-up and the first timed step, the last result."""
    import time

    from scfs.bench.timing import time_steps

    naps = [0.05, 0.0, 0.5, 0.1]  # gaps far apart: a loaded machine stretches a nap, not by 0.4 s
    calls: list[str] = []

    def step(i: int) -> int:
        calls.append(f"step{i}")
        time.sleep(naps[i])
        return i

    clock, last = time_steps(step, 2, 2, cuda=False, after_warmup=lambda: calls.append("warm"))
    assert calls == ["step0", "step1", "warm", "step2", "step3"] and last == 3
    gaps = clock.step_ms(2)
    assert len(gaps) == 2 and gaps[0] >= 500 and 100 <= gaps[1] < 500
    assert 0.05 <= clock.warmup_s(2) < 0.5
    calls.clear()
    clock, last = time_steps(step, 2, 0, cuda=False, after_warmup=lambda: calls.append("warm"))
    assert calls == ["step0", "step1", "warm"] and clock.step_ms(2) == [] and clock.warmup_s(2) >= 0.05


def test_every_compiled_row_is_compared_with_the_published_eager_step() -> None:
    from scfs.bench.step import PUBLISHED, add_reference, published_setting

    assert [published_setting(s) for s in ("bf16_cl_graphs", "bf16_cl_cudagraphs", "bf16_cl_compile", "bf16_cl",
                                           "bf16_graphs")] == ["bf16_cl"] * 4 + ["bf16"]
    rows = [{"method": m, "B": 32, "setting": "bf16_cl_cudagraphs", "step_ms": ms, "img_per_s": 32e3 / ms}
            for m, ms in (("scfs", 64.0), ("dino", 51.2))]
    add_reference(rows, "resnet50", None)
    assert rows[0]["published"]["img_per_s"] == PUBLISHED[("resnet50", "scfs", 32, "bf16_cl")][1]
    assert rows[0]["ratio_scfs_dino"] == pytest.approx(1.25)


def test_resnet50_settings_compose_valid_configs_and_follow_the_recipe_views() -> None:
    """Every ResNet-50 setting composes a config the run accepts: the inductor ones keep the recipe's compiled views,
    the cudagraphs one turns them off (inductor alone fuses them), the eager one has nothing to compile."""
    import argparse

    from scfs.bench.step import SETTINGS, compose
    from scfs.config import validate_config

    args = argparse.Namespace(devices=1, data="synthetic", device="cuda", tiny=False, override=None)
    seen = {}
    for setting in ("bf16_cl_graphs", "bf16_cl_cudagraphs", "bf16_cl"):
        assert setting in SETTINGS
        cfg = compose("resnet50", "scfs", 32, setting, args)
        validate_config(cfg)
        seen[setting] = (cfg.compile, cfg.compile_backend, cfg.compile_views)
    assert seen == {"bf16_cl_graphs": (True, "inductor", True), "bf16_cl_cudagraphs": (True, "cudagraphs", False),
                    "bf16_cl": (False, "inductor", True)}

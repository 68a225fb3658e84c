"""`python -m scfs.bench.compile --device cpu --tiny`: a row in a fresh process, its JSON and its table."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from scfs.bench import compile as bench
from scfs.bench import records
from scfs.training import compile_child
from scfs.training import compile_helpers as ch


def test_eager_row_writes_a_table(tmp_path):
    """The eager row (no compile: seconds) goes through the whole harness: the machine primed by a process of its
    own, the row's child process, JSON, record."""
    out = tmp_path / "rec.json"
    assert bench.main(["--device", "cpu", "--tiny", "--recipe", "default", "--rows", "eager", "--first", "1",
                       "--steady", "1", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    (row,) = rec["table"]
    assert row["setting"] == "eager" and row["graphs"] == 0 and row["first_s"] > 0 and row["step_ms"] > 0
    assert row["process_cpu_s"] > 0 and row["loss"] == row["loss"]
    md = out.with_suffix(".md").read_text()
    assert "| default | eager |" in md and row["phases"] == {}
    assert rec["host"]["python_ms"] > 0 and f"Host: {rec['host']['cpu']}" in md  # the host's CPU and speed
    assert row["cudnn_benchmark"] is False and "off (cuDNN's heuristics) in default eager." in md  # the CPU
    assert "Where the first steps' compile went" not in md  # nothing compiled: no phase table
    assert rec["prime_s"] > 0 and f"primed the machine in {rec['prime_s']} s" in md
    assert rec["prime_builds_kernels"] is True and "the fused search kernels' extension built or found" in md


def test_the_prime_builds_the_search_kernels_no_row_should_pay_for(monkeypatch):
    """The prime builds (or finds) the fused search kernels' extension with the recipe's model on its device, so a
    first row's helper does not build it in its first steps' time (a 28.6 s rebuild once, in another tree)."""
    import argparse


    seen = []
    monkeypatch.setattr(compile_child, "prebuild_search_kernels", lambda model, device: seen.append((model, device)))
    args = argparse.Namespace(recipe=["default"], device="cpu", tiny=True, override=[])
    assert bench.prime(args) == 0
    ((model, device),) = seen
    assert device == "cpu" and hasattr(model, "student")


def test_a_record_from_before_the_prime_built_the_kernels_does_not_say_it_did():
    repo = Path(__file__).resolve().parents[2]
    rec = json.loads((repo / "benchmarks/results/compile-h100-2026-12-05-pair-split-r50-5391f9a.json").read_text())
    assert "prime_builds_kernels" not in rec
    md = bench.markdown(rec)
    assert f"primed the machine in {rec['prime_s']} s" in md and "search kernels' extension" not in md


@pytest.mark.parametrize(("recipe", "device", "extra", "expected"), [
    ("cifar10", "cuda", [], True), ("imagenet", "cuda", [], True),  # trainer=gpu benchmarks, as the run's Trainer
    ("cifar10", "cuda", list(bench.HEURISTICS), False),  # the heuristics row
    ("cifar10", "cpu", [], False), ("default", "cpu", [], False)])
def test_a_row_benchmarks_cudnns_algorithms_as_the_recipes_run_would(recipe, device, extra, expected):
    """The rows compose the recipe's Trainer settings: on the GPU recipes cuDNN benchmarks each convolution shape
    at its first call, inside a run's first steps, so the compile rows pay it too; the heuristics row does not."""
    cfg = bench.compose(recipe, device, False, "model", True, extra)
    assert bench.run_cudnn_benchmark(cfg, device) is expected


def test_the_record_says_which_rows_benchmarked_cudnns_algorithms():
    rows = [{"recipe": "cifar10", "setting": "cold", "cudnn_benchmark": True},
            {"recipe": "cifar10", "setting": "heuristics", "cudnn_benchmark": False}]
    assert bench.cudnn_lines(rows)[-1] == ("cuDNN's algorithm benchmarks (`trainer.benchmark`, as the run's Trainer "
                                          "sets them): on in cifar10 cold; off (cuDNN's heuristics) in cifar10 "
                                          "heuristics.")
    assert bench.cudnn_lines([{"recipe": "cifar10", "setting": "cold"}]) == []  # an older record: not said
    warmed = [{"recipe": "imagenet", "setting": "parallel-backward-cudnn-warmup", "cudnn_benchmark": True,
               "cudnn_warmup": {"convs": 46, "record_s": 0.41, "done_s": 21.3}},
              {"recipe": "imagenet", "setting": "cudnn-warmup", "cudnn_benchmark": True,
               "cudnn_warmup": {"convs": 0, "record_s": None, "done_s": None, "error": "RuntimeError: boom"}},
              {"recipe": "imagenet", "setting": "cold", "cudnn_benchmark": True}]
    assert bench.cudnn_lines(warmed)[-1].endswith(
        "The backward's benchmarked on a side thread during the compile (`compile_cudnn_warmup`) in imagenet "
        "parallel-backward-cudnn-warmup (46 convolutions, listed in 0.41 s, the last chosen 21.3 s into the first "
        "step); imagenet cudnn-warmup (0 convolutions, listed in None s; failed: RuntimeError: boom); in no other row.")
    forward = {**warmed[0], "cudnn_warmup": {"convs": 46, "record_s": 0.41, "forward_s": 2.2, "done_s": 21.3}}
    assert bench.warmup_phrase(forward) == (
        "imagenet parallel-backward-cudnn-warmup (46 convolutions, listed in 0.41 s, their forwards benchmarked on the "
        "run's thread in 2.2 s, the last chosen 21.3 s into the first step)")


@pytest.mark.slow
def test_cold_and_carried_rows_hit_the_carried_cache(tmp_path):
    """The tiny step compiled cold, then in a fresh process on an empty cache with the cold row's file: every
    inductor graph is a hit there, and the loss is the cold row's to the bit. 10-20 minutes on 2 shared cores."""
    out = tmp_path / "rec.json"
    bench.main(["--device", "cpu", "--tiny", "--no-prime", "--recipe", "default", "--rows", "cold", "carried",
                "--first", "2", "--steady", "1", "--out", str(out)])
    rows = {r["setting"]: r for r in json.loads(out.read_text())["table"]}
    assert rows["cold"]["fx_cache"].startswith("0 hit") and rows["cold"]["artifacts_mb"] > 0
    assert rows["carried"]["fx_cache"].endswith(" 0 miss") and rows["carried"]["loaded_artifacts"] > 0
    assert rows["carried"]["loss"] == rows["cold"]["loss"]


def test_a_row_is_timed_by_the_step_benchmarks_clock(monkeypatch):
    """`measure` times its steps with `scfs.bench.timing.time_steps` (the step benchmark's measurement), reads the
    graphs right after the first steps, and keeps the row's keys."""
    from scfs.bench import timing

    seen: list[tuple[int, int]] = []
    real = timing.time_steps

    def spy(step, warmup, steps, cuda, after_warmup=None):
        seen.append((warmup, steps))
        return real(step, warmup, steps, cuda, after_warmup)

    monkeypatch.setattr(timing, "time_steps", spy)
    cfg = bench.compose("default", "cpu", True, "model", False, [])
    row = bench.measure(cfg, "cpu", 2, 3, None, None)
    assert seen == [(2, 3)]
    assert set(row) == {"first_s", "step_ms", "lost_s", "graphs", "loss", "loaded_artifacts", "fx_cache", "aot_cache",
                        "phases", "compiles", "graph_breaks", "resumes", "cudnn_benchmark",
                        "host_load"}  # no peak_GiB on the CPU
    assert row["first_s"] > 0 and row["step_ms"] > 0 and row["graphs"] == 0 and isinstance(row["loss"], float)
    assert row["compiles"] == []  # eager: nothing compiled


def test_a_compiled_run_traces_one_loss_graph_for_logging_and_other_steps(eager_backend):
    """The model scope's step is three graphs (student, teacher, losses) over a logging step and the ones after it:
    the loss computes its statistics on every step when compiled, so the first epoch compiles no second loss graph.
    Eager, the statistics stay on the logging steps only. Traced through dynamo's eager backend (no inductor)."""
    import torch

    torch._dynamo.reset()
    row = bench.measure(bench.compose("default", "cpu", True, "model", True, []), "cpu", 2, 1, None, None)
    torch._dynamo.reset()
    assert row["graphs"] == 3
    # the run's own compiles, in order, each of the three graphs once
    assert [c["graph"] for c in row["compiles"]] == ["student_forward", "teacher_forward", "step_losses"]
    assert [c["at_s"] for c in row["compiles"]] == sorted(c["at_s"] for c in row["compiles"])
    from scfs.train import build

    _, eager = build(bench.compose("default", "cpu", True, "model", False, []))
    assert eager.loss_diagnostics(True) and not eager.loss_diagnostics(False)


def test_cudagraphs_row_traces_the_step_without_generating_kernels(tmp_path):
    """`compile_backend=cudagraphs` on the CPU (the traced graphs run without CUDA graphs there): dynamo builds the
    step's graphs, inductor compiles none, and the tiny step ends at the eager row's loss. About 30 s."""
    out = tmp_path / "rec.json"
    assert bench.main(["--device", "cpu", "--tiny", "--no-prime", "--recipe", "default", "--rows", "eager",
                       "cudagraphs", "--first", "2", "--steady", "2", "--out", str(out)]) == 0
    rows = {r["setting"]: r for r in json.loads(out.read_text())["table"]}
    assert rows["cudagraphs"]["graphs"] >= 2 and rows["eager"]["graphs"] == 0
    assert rows["cudagraphs"]["fx_cache"] == "0 hit / 0 miss"
    assert rows["cudagraphs"]["loss"] == pytest.approx(rows["eager"]["loss"], rel=1e-5)
    # where the trace went: dynamo's timers count, inductor's are absent (it compiled nothing)
    phases = rows["cudagraphs"]["phases"]
    assert phases["_compile.compile_inner"] >= phases["bytecode_tracing"] > 0
    assert "GraphLowering.run" not in phases and "Scheduler.codegen" not in phases
    assert rows["cudagraphs"]["graph_breaks"] == {} and rows["cudagraphs"]["resumes"] == {}
    md = out.with_suffix(".md").read_text()
    assert "| phase (timer) | default cudagraphs |" in md
    assert f"| · tracing the bytecode (`bytecode_tracing`) | {phases['bytecode_tracing']:.1f} |" in md


def test_the_phase_table_has_a_column_per_compiled_row_and_a_dash_for_a_missing_timer():
    rows = [{"recipe": "cifar10", "setting": "eager", "phases": {}},
            {"recipe": "cifar10", "setting": "cold",
             "phases": {"_compile.compile_inner": 70.04, "GraphLowering.run": 9.96}},
            {"recipe": "cifar10", "setting": "warm", "phases": {"_compile.compile_inner": 8.0}}]
    lines = bench.phase_table(rows)
    assert "| phase (timer) | cifar10 cold | cifar10 warm |" in lines
    assert "| dynamo: tracing and compiling the forward graphs (`_compile.compile_inner`) | 70.0 | 8.0 |" in lines
    assert "| inductor, forward and backward: lowering (`GraphLowering.run`) | 10.0 | – |" in lines
    assert len([ln for ln in lines if ln.startswith("| ") and "(`" in ln]) == len(bench.PHASES)
    assert bench.phase_table(rows[:1]) == []
    assert not any(ln.startswith("Graph breaks") for ln in lines)


def test_the_helpers_phase_table_has_a_column_per_helper_that_reported_its_timers():
    backward = {"ok": True, "backward_s": 54.2, "phases": {"_compile.compile_inner": 50.04, "GraphLowering.run": 9.96,
                                                           "compile_fx.<locals>.bw_compiler": 32.24}}
    first = {"ok": True, "phases": {"_compile.compile_inner": 30.0}, "backward_helper": backward,
             "local_helper": {"ok": False, "error": "it had not ended"}}
    rows = [{"recipe": "imagenet", "setting": "parallel", "parallel": {"helper": first}},
            {"recipe": "imagenet", "setting": "cold", "phases": {"_compile.compile_inner": 70.0}}]
    lines = bench.helper_phase_table(rows)
    assert ("| phase (timer) | imagenet parallel: the first helper | imagenet parallel: the backward's helper |"
            in lines)
    assert "| dynamo: tracing and compiling the forward graphs (`_compile.compile_inner`) | 30.0 | 50.0 |" in lines
    assert "| inductor, forward and backward: lowering (`GraphLowering.run`) | – | 10.0 |" in lines
    assert any(ln.startswith("| inductor: backward graphs, compiling them") and ln.endswith("| – | 32.2 |")
               for ln in lines)  # the backward's helper compiles its backward with the forward, not lazily
    assert len([ln for ln in lines if ln.startswith("| ") and "(`" in ln]) == len(bench.PHASES)
    assert bench.helper_phase_table(rows[1:]) == []  # no helpers: no table
    assert bench.helper_statuses(rows[0])[2][0] == "the local views' helper"  # named, though it gave no timers


def test_a_graph_break_is_named_with_where_the_code_resumed(eager_backend, monkeypatch):
    """A step that breaks its graph (here a `print` inside the compiled teacher call) says why and where in its
    row and in the record, the extra graph counted. Traced through dynamo's eager backend (no inductor)."""
    import torch

    import scfs.methods.base as base

    real_teacher = base.teacher_forward

    def teacher_with_a_break(teacher, g, stages):
        g = g * 1.0  # a graph before the break, the teacher's after it
        print("a host-side call dynamo cannot trace")
        return real_teacher(teacher, g, stages)

    monkeypatch.setattr(base, "teacher_forward", teacher_with_a_break)
    torch._dynamo.reset()
    row = bench.measure(bench.compose("default", "cpu", True, "model", True, []), "cpu", 2, 1, None, None)
    torch._dynamo.reset()
    assert row["graphs"] > 3 and sum(row["graph_breaks"].values()) >= 1
    assert any("print" in k for k in row["graph_breaks"]) and any("teacher_with_a_break" in k for k in row["resumes"])
    md = "\n".join(bench.phase_table([{"recipe": "default", "setting": "cold", "phases": {"gc": 0.1}, **row}]))
    assert "Graph breaks of default cold: " in md and "resumed in torch_dynamo_resume_in_teacher_with_a_break" in md


def test_the_background_rows_timeline_gets_its_own_table():
    row = {"recipe": "cifar10", "setting": "background", "first_s": 1.2, "step_ms": 32.0, "lost_s": 71.3,
           "graphs": None, "process_cpu_s": 300.0, "fx_cache": "5 hit / 1 miss", "aot_cache": "3 hit / 0 miss",
           "loss": 33.0, "phases": {},
           "background": {"child_s": 118.0, "child_fx_cache": "0 hit / 6 miss", "ready_s": 120.5, "eager_steps": 1800,
                          "eager_step_ms": 64.5, "switch_s": 13.1}}
    cold = {**row, "setting": "cold", "first_s": 106.0, "lost_s": 105.9, "graphs": 3, "background": None}
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "abc", "command": "c", "first_steps": 3,
                         "table": [cold, row]})
    assert "| cifar10 | cold | 106.0 | 105.9 | 300.0 | 32.0 | 3 |" in md
    assert "| cifar10 | background | 1.2 | 71.3 | 300.0 | 32.0 |  |" in md
    assert "| cifar10 | 1.2 | 64.5 | 1800 | 118.0 | 0 hit / 6 miss | 120.5 | 13.1 | 32.0 | 71.3 |" in md


@pytest.mark.slow
def test_the_background_row_trains_eagerly_then_switches_to_the_childs_graphs(tmp_path):
    """The `background` row on the CPU: eager steps while the child compiles the tiny step (C++), then the switch
    to the compiled step, built from the child's cache (inductor hits only). 5-15 minutes on 2 shared cores."""
    out = tmp_path / "rec.json"
    assert bench.main(["--device", "cpu", "--tiny", "--no-prime", "--recipe", "default", "--rows", "background",
                       "--first", "1", "--steady", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["table"]
    bg = row["background"]
    assert bg["eager_steps"] >= 1 and bg["child_fx_cache"].startswith("0 hit") and bg["ready_s"] > 0
    assert row["fx_cache"].endswith(" 0 miss") and not row["fx_cache"].startswith("0 hit"), row
    assert row["step_ms"] > 0 and row["lost_s"] is not None and row["loss"] == row["loss"]


# a stand-in child for the `background` row: writes an ok status (whole) once the row has run 3 eager steps (the
# go file), then stays alive a while (8 s: on a loaded 2-core machine the switch can come seconds after the status)
# and marks its exit
STAND_IN = """
import json, os, sys, time
status = sys.argv[1]
go = os.path.join(os.path.dirname(status), "..", "go")
while not os.path.exists(go):
    time.sleep(0.01)
open(status + ".tmp", "w").write(json.dumps({"ok": True, "seconds": 0.1, "fx_cache": "0 hit / 5 miss"}))
os.replace(status + ".tmp", status)
time.sleep(8)
open(os.path.join(os.path.dirname(status), "..", "exited"), "w").close()
"""


def test_the_background_row_switches_when_the_status_appears_not_when_the_child_exits(tmp_path, monkeypatch,
                                                                                        eager_backend):
    """`measure_background` in this process (dynamo's eager backend for the compile, a stand-in child): eager steps
    until the child's status file appears, the switch then, with the child still alive (its exit is waited for
    after the timed steps), and the timeline's numbers."""
    import tempfile

    import torch

    from scfs.train import build
    from scfs.training.plain_step import make_step

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(compile_child, "child_command", lambda cfg_path, status_path, device, steps=2, helper=False,
                        backward=False, local=False: [sys.executable, "-c", STAND_IN, str(status_path)])
    cfg = bench.compose("default", "cpu", True, "model", True, ["compile_background=true"])
    torch.manual_seed(0)
    _, model = build(cfg)
    step = make_step(model, cfg, "cpu", model.configure_optimizers())
    seen: dict[str, bool] = {}
    real_now = model.compile_now

    def step_then_go(i):
        out = step(i)
        if i == 2:
            (tmp_path / "go").touch()
        return out

    def compile_now():
        seen["child_alive_at_switch"] = not (tmp_path / "exited").exists()
        real_now()

    monkeypatch.setattr(model, "compile_now", compile_now)
    row = bench.measure_background(model, cfg, "cpu", step_then_go, 1, 2)
    bg = row["background"]
    assert seen == {"child_alive_at_switch": True} and (tmp_path / "exited").exists()
    assert bg["eager_steps"] in (3, 4) and bg["child_fx_cache"] == "0 hit / 5 miss" and bg["eager_step_ms"] > 0
    assert 0 < bg["ready_s"] <= bg["ready_s"] + bg["switch_s"] and row["step_ms"] > 0 and row["lost_s"] is not None
    assert row["fx_cache"] == "0 hit / 0 miss" and row["loss"] == row["loss"]  # the eager backend: no inductor


def test_the_parallel_row_waits_for_the_helpers_parts(monkeypatch, eager_backend):
    """The `parallel` row in this process (dynamo's eager backend, a stand-in helper that begins both parts at once
    and writes them after a while, through the real protocol's files): the step asks the gate before the teacher's
    call and the losses and waits for each, the row reports the timeline, and the gate is gone after the row."""
    import scfs.training.background_compile as bgc

    write = ("import sys, time; from pathlib import Path\n"
             "from scfs.training.background_compile import PARTS, part_path, write_status\n"
             "time.sleep(1.0)\n"
             "for part in PARTS:\n"
             "    write_status(part_path(Path(sys.argv[1]), part), {'ok': True})\n"
             "write_status(Path(sys.argv[1]), {'ok': True, 'peak_GiB': 1.5})\n")

    def command(cfg_path, status_path, device, steps=2, helper=False, backward=False, local=False):
        for part in bgc.PARTS:  # begun as it starts, so that the step (faster than its imports) waits for it
            bgc.write_status(bgc.started_path(status_path, part), {"ok": True})
        return [sys.executable, "-c", write, str(status_path)]

    monkeypatch.setattr(compile_child, "child_command", command)
    cfg = bench.compose("default", "cpu", True, "model", True, ["compile_parallel=true"])
    row = bench.measure(cfg, "cpu", 1, 1, None, None)
    par = row["parallel"]
    assert set(par["waited_s"]) == set(par["asked_s"]) == set(par["ready_s"]) == {"teacher", "loss"}
    assert 0 <= par["asked_s"]["teacher"] <= par["asked_s"]["loss"] and row["step_ms"] > 0
    assert all(0 <= v <= par["asked_s"]["loss"] + par["waited_s"]["loss"] + 1 for v in par["ready_s"].values())
    assert set(par["started_s"]) == {"teacher", "loss"} and par["built_here"] == [], par
    assert par["helper"] == {"ok": True, "peak_GiB": 1.5}  # its status, read before its folder went
    assert par["helper_stopped"] is False  # it kept up: left to end by itself
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "c", "command": "x", "first_steps": 1,
                         "table": [{**row, "recipe": "default", "setting": "parallel", "process_cpu_s": 1.0}]})
    assert "default parallel: the first steps waited for the helper's entries: teacher" in md
    assert f"Seconds since the helper started: teacher: asked at {par['asked_s']['teacher']} s, begun by the helper " \
           f"at {par['started_s']['teacher']} s, written by the helper at {par['ready_s']['teacher']} s; loss: " \
           "asked at" in md
    assert "Built by the run itself" not in md and "The helper's peak GPU memory: 1.5 GiB (the run's: – GiB)." in md
    last = round(max(par["asked_s"][k] + par["waited_s"][k] for k in ("teacher", "loss")), 2)
    assert (f"The first step's last wait for a helper ended at {last} s, and the first steps about "
            f"{round(row['first_s'] - last, 1)} s after that.") in md


def test_a_recipe_with_compiled_views_makes_them_in_each_step_and_hands_them_to_the_helper(monkeypatch,
                                                                                           eager_backend):
    """Where the recipe compiles its views (`compile_views`, the `imagenet` recipe), each timed step makes a batch's
    views first, through the method's `on_after_batch_transfer` as a run does: compiled at the first step by the
    row's own process, or, with a helper, eagerly at the first step and asked of the helper at the second. The
    record says which."""
    import scfs.training.background_compile as bgc
    from scfs.methods.base import SelfDistillation

    made: list[str | None] = []
    real = SelfDistillation.on_after_batch_transfer

    def spy(self, batch, idx):
        made.append(self.views_handoff)
        return real(self, batch, idx)

    monkeypatch.setattr(SelfDistillation, "on_after_batch_transfer", spy)
    views = ["data.batch_aug=true", "compile_views=true"]
    row = bench.measure(bench.compose("default", "cpu", True, "model", True, views), "cpu", 2, 1, None, None)
    assert row["views"] == "run" and made == [None, None, None]  # 2 first steps + 1 steady, nothing handed over
    made.clear()
    eager = bench.measure(bench.compose("default", "cpu", True, "model", False, views), "cpu", 1, 1, None, None)
    assert "views" not in eager and made == []  # an eager row compiles nothing: its step stays the step alone

    write = ("import sys; from pathlib import Path\n"
             "from scfs.training.background_compile import PARTS, VIEWS_PART, part_path, write_status\n"
             "for part in (*PARTS, VIEWS_PART):\n"
             "    write_status(part_path(Path(sys.argv[1]), part), {'ok': True})\n"
             "write_status(Path(sys.argv[1]), {'ok': True})\n")

    def command(cfg_path, status_path, device, steps=2, helper=False, backward=False, local=False):
        for part in (*bgc.PARTS, "views"):
            bgc.write_status(bgc.started_path(status_path, part), {"ok": True})
        return [sys.executable, "-c", write, str(status_path)]

    monkeypatch.setattr(compile_child, "child_command", command)
    made.clear()
    cfg = bench.compose("default", "cpu", True, "model", True, [*views, "compile_parallel=true"])
    par_row = bench.measure(cfg, "cpu", 2, 1, None, None)
    assert par_row["views"] == "helper" and made == ["eager", "ask", None]
    assert "views" in par_row["parallel"]["waited_s"] and par_row["parallel"]["built_here"] == []
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "c", "command": "x", "first_steps": 2,
                         "table": [{**r, "recipe": "default", "setting": name, "process_cpu_s": 1.0}
                                   for name, r in (("cold", row), ("parallel", par_row))]})
    assert ("Each step made its batch's views on the device first, as the run does (`compile_views`: their per-pixel "
            "ops compiled), in default cold, default parallel: compiled by the run at its first step in default "
            "cold; made eagerly at the first step while the helper compiled their graphs, which the second step "
            "loaded, in default parallel.") in md
    assert "(the views at the second step)" in md


def test_the_parallel_backward_row_starts_both_helpers_and_reports_the_backwards(monkeypatch, eager_backend):
    """`compile_parallel_backward=true` in a row: a second stand-in helper begins the student's backward at once and
    writes it after a while; the gate (told by the cache counters that the student's call compiled) waits for it
    before the backward, and the record says what the backward's helper did."""
    import scfs.training.background_compile as bgc

    write = ("import sys, time; from pathlib import Path\n"
             "from scfs.training.background_compile import BACKWARD_PART, PARTS, part_path, write_status\n"
             "p, backward = Path(sys.argv[1]), sys.argv[2] == 'backward'\n"
             "time.sleep(1.0)\n"
             "for part in (BACKWARD_PART,) if backward else PARTS:\n"
             "    write_status(part_path(p, part), {'ok': True})\n"
             "write_status(p, {'ok': True, 'backward_s': 0.9, 'fx_cache': '0 hit / 2 miss'} if backward else "
             "{'ok': True})\n")

    def command(cfg_path, status_path, device, steps=2, helper=False, backward=False, local=False):
        for part in (bgc.BACKWARD_PART,) if backward else bgc.PARTS:  # begun as it starts
            bgc.write_status(bgc.started_path(status_path, part), {"ok": True})
        return [sys.executable, "-c", write, str(status_path), "backward" if backward else "parts"]

    monkeypatch.setattr(compile_child, "child_command", command)
    monkeypatch.setattr(bgc, "cache_deltas", lambda since=None: (0, 2, 0, 0))  # the student's call compiled
    cfg = bench.compose("default", "cpu", True, "model", True, ["compile_parallel=true",
                                                                 "compile_parallel_backward=true"])
    row = bench.measure(cfg, "cpu", 1, 1, None, None)
    par = row["parallel"]
    assert set(par["waited_s"]) == set(par["ready_s"]) == {"teacher", "loss", bgc.BACKWARD_PART}, par
    assert par["student_compiled"] is True and par["built_here"] == [] and par["helper_stopped"] is False
    assert par["helper"]["backward_helper"] == {"ok": True, "backward_s": 0.9, "fx_cache": "0 hit / 2 miss"}
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "c", "command": "x", "first_steps": 1,
                         "table": [{**row, "recipe": "default", "setting": "parallel-backward",
                                    "process_cpu_s": 1.0}]})
    assert "The backward's helper: its compile took 0.9 s, inductor cache 0 hit / 2 miss." in md
    assert f"{bgc.BACKWARD_PART}: asked at {par['asked_s'][bgc.BACKWARD_PART]} s" in md


def test_a_table_row_gives_each_timed_column_as_the_median_over_the_repeats():
    rows = [{"first_s": 92.85, "lost_s": 92.8, "process_cpu_s": 240.2, "step_ms": 32.25, "loss": 1.0, "phases": "a"},
            {"first_s": 88.19, "lost_s": 88.1, "process_cpu_s": 227.3, "step_ms": 32.16, "loss": 2.0, "phases": "b"},
            {"first_s": 90.0, "lost_s": 89.0, "process_cpu_s": 230.0, "step_ms": 33.0, "loss": 3.0, "phases": "c"}]
    two = bench.median_row(rows[:2])
    assert (two["first_s"], two["lost_s"], two["process_cpu_s"], two["step_ms"]) == (90.52, 90.45, 233.75, 32.2)
    assert two["first_s_all"] == [92.85, 88.19] and two["phases"] == "b"  # the lower median's own phases
    three = bench.median_row(rows)
    assert (three["first_s"], three["lost_s"], three["step_ms"], three["phases"]) == (90.0, 89.0, 32.25, "c")


OFF = "compile_cudnn_warmup=false"


def test_rows_run_in_the_order_given_and_odd_repeats_reverse_it(monkeypatch, tmp_path):
    """A pair compared in one queue job runs as the command names it, and with repeats each row runs first as
    often as last (a row's place in the queue can move its time); the record says the order."""
    import argparse

    ran: list[tuple[int, str]] = []

    def fake_row(args, recipe, name, cache_dir, scope, **kw):
        ran.append((len(ran), name))
        return {"recipe": recipe, "setting": name, "first_s": 1.0 + len(ran), "lost_s": 1.0, "process_cpu_s": 1.0,
                "step_ms": 1.0, "graphs": 1, "fx_cache": "", "aot_cache": "", "loss": 1.0}

    monkeypatch.setattr(bench, "run_row", fake_row)
    monkeypatch.setattr(bench, "save_record", lambda *a, **k: None)
    args = argparse.Namespace(device="cpu", tiny=True, first=1, steady=1, recipe=["cifar10"], repeats=2, argv=[],
                              rows=["parallel-split", "cold", "warm"], out=str(tmp_path / "c.json"), override=[],
                              prime=False, order="alternate")
    result = bench.run(args)
    assert [n for _, n in ran] == ["parallel-split", "cold", "warm", "cold", "warm", "parallel-split"]
    assert [(r["repeat"], r["position"]) for r in result["rows"]] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert ("The rows ran in this order, one fresh process each: cifar10 repeat 1: parallel-split, cold, warm; "
            "cifar10 repeat 2: cold, warm, parallel-split.") in bench.markdown(result)
    ran.clear()
    bench.run(argparse.Namespace(**{**vars(args), "order": "given"}))
    assert [n for _, n in ran] == ["parallel-split", "cold", "warm"] * 2


@pytest.mark.parametrize("rows, message", [
    (["warm"], "row warm reuses what row cold leaves: name cold before it in --rows"),
    (["carried", "cold"], "row carried reuses what row cold leaves: name cold before it in --rows"),
])
def test_a_row_that_reuses_another_rows_cache_needs_it_first(rows, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--rows", *rows])
    assert message in capsys.readouterr().err


def test_a_row_named_twice_runs_once_and_a_reusing_row_stays_after_its_source():
    assert bench.run_order(["cold", "lean", "cold", "carried", "warm"], 1, "alternate") == [
        "lean", "cold", "carried", "warm"]


def test_every_row_has_a_plan_and_its_name_says_its_settings(monkeypatch, tmp_path):
    """Each named row runs (none is missing from the plan), and a row's name is what it sets: `parallel*` starts the
    helpers, `backward`/`split` start the backward's helper, `split` splits the student's call, `lean` is lean."""
    import argparse

    seen: dict[str, dict] = {}
    order: list[str] = []

    def fake_row(args, recipe, name, cache_dir, scope, **kw):
        seen[name] = kw
        order.append(name)
        return {"recipe": recipe, "setting": name, "first_s": 1.0}

    monkeypatch.setattr(bench, "run_row", fake_row)
    monkeypatch.setattr(bench, "run_prime", lambda *args, **kw: order.append("prime") or 2.0)
    monkeypatch.setattr(bench, "save_record", lambda *a, **k: None)
    monkeypatch.setattr(bench, "table_rows", lambda rows: rows)
    args = argparse.Namespace(device="cpu", tiny=True, first=1, steady=1, recipe=["cifar10"], rows=list(bench.ROWS),
                              repeats=1, argv=[], out=str(tmp_path / "c.json"), override=[], prime=True,
                              order="alternate")
    assert bench.run(args)["prime_s"] == 2.0
    assert set(seen) == set(bench.ROWS)
    assert order.count("prime") == 1 and order[0] == "prime"  # once, before the first row
    for name, kw in seen.items():
        extra = set(kw.get("extra", ()))
        assert bool(kw.get("parallel")) == name.startswith("parallel"), name
        assert (set(bench.BACKWARD) <= extra) == ("backward" in name or "split" in name and "parallel" in name), name
        assert (set(bench.SPLIT) <= extra) == ("split" in name), name
        assert (set(bench.LEAN) <= extra) == (name.endswith("lean") or name == "lean"), name
        assert (set(bench.WARMUP) <= extra) == ("cudnn-warmup" in name), name
        assert (set(bench.COMPILE_TUNE) <= extra) == name.endswith("compile-tune"), name
        assert (set(bench.THREADS) <= extra) == name.endswith("threads"), name
        assert (set(bench.QUICK_TUNE) <= extra) == name.endswith("quick-tune"), name


@pytest.mark.parametrize("parallel, extra, user, expected", [
    (False, (), [], ["compile_parallel=false", "compile_parallel_backward=false", OFF]),
    (True, (), [], ["compile_parallel=true", "compile_parallel_backward=false", OFF]),
    (True, bench.BACKWARD, [], ["compile_parallel=true", "compile_parallel_backward=true", OFF]),
    (True, (*bench.BACKWARD, *bench.WARMUP), [],
     ["compile_parallel=true", "compile_parallel_backward=true", "compile_cudnn_warmup=auto"]),
    (False, bench.WARMUP, [], ["compile_parallel=false", "compile_parallel_backward=false",
                               "compile_cudnn_warmup=auto"]),
    (False, (), ["compile_parallel=auto"], ["compile_parallel=auto", "compile_parallel_backward=false", OFF]),
], ids=["cold", "parallel", "parallel-backward", "parallel-backward-cudnn-warmup", "cudnn-warmup", "user-says"])
def test_each_row_says_whether_it_starts_the_helpers(monkeypatch, tmp_path, parallel, extra, user, expected):
    """The recipes ship `compile_parallel=auto`, which starts the helpers on a GPU machine: every row names the
    helpers' keys and `compile_cudnn_warmup` (unless the row or the user does), so a `cold` row stays one process
    without the warm-up and a `parallel` row starts only the helper it is named for."""
    import argparse
    import subprocess

    seen: list[list[str]] = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"first_s": 1.0}) + "\n", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = argparse.Namespace(device="cpu", first=1, steady=1, tiny=True, override=user)
    bench.run_row(args, "cifar10", "row", tmp_path, "model", parallel=parallel, extra=extra)
    (cmd,) = seen
    given = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--override"]
    assert sorted(o for o in given if o.startswith(("compile_parallel", "compile_cudnn_warmup"))) == sorted(expected)


def test_a_row_gives_the_helpers_started_at_its_processs_start_the_go_at_its_first_step(monkeypatch, tmp_path,
                                                                                        eager_backend):
    """A GPU row starts its helpers when its process starts, as `scfs.train` does (forced here on the CPU): they
    wait for the go, which the row gives at its first step; its parts then come from them, and the record says how
    long before the first step they started and when their models were built."""

    stand_in = ("import sys, time; from pathlib import Path\n"
                "from scfs.training.compile_helpers import PARTS, go_path, part_path, read_status, started_path, "
                "write_status\n"
                "p = Path(sys.argv[1])\n"
                "for part in PARTS:\n"
                "    write_status(started_path(p, part), {'ok': True})\n"
                "while read_status(go_path(p)) is None:\n"
                "    time.sleep(0.02)\n"
                "for part in PARTS:\n"
                "    write_status(part_path(p, part), {'ok': True})\n"
                "write_status(p, {'ok': True, 'early': {'ready_s': 0.5, 'go_s': 1.5}})\n")
    monkeypatch.setattr(ch, "gpu_run", lambda cfg: True)
    monkeypatch.setattr(ch, "early_device", lambda: "cpu")
    monkeypatch.setattr(ch, "helper_command", lambda cfg_path, status_path, *a, **kw:
                        [sys.executable, "-c", stand_in, str(status_path)])
    cfg = bench.compose("default", "cpu", True, "model", True, ["compile_parallel=true",
                                                                 "compile_parallel_backward=false"])
    early = ch.start_early_helpers(cfg, tmp_path, int(cfg.batch_size))
    assert list(early.paths) == ["parts"]
    try:
        row = bench.measure(cfg, "cpu", 1, 1, None, None, early)
    finally:
        early.stop()
    par = row["parallel"]
    assert par["built_here"] == [] and par["helper"]["early_s"] >= 0, par
    assert ch.read_status(ch.go_path(early.paths["parts"]))["settings"] == compile_child.key_settings()
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "c", "command": "x", "first_steps": 1,
                         "table": [{**row, "recipe": "default", "setting": "parallel", "process_cpu_s": 1.0}]})
    assert (f"The helpers were started at the process's start, {par['helper']['early_s']} s before the first step "
            "(as `scfs.train` starts them, before its set-up); each had built its model 0.5 s (the first helper) "
            "after its start.") in md
    assert "Seconds since the helpers' go at the first step: teacher: asked at" in md  # the gates' clock


def test_the_host_load_over_the_first_steps_is_sampled_and_said_per_repeat(monkeypatch):
    """The first steps run with the host's load sampled (`HostLoad`), stopped when they end; the record gives one
    sentence per row and repeat, and none for a record from before."""
    from functools import partial

    from scfs.training import host_load

    monkeypatch.setattr(bench, "HostLoad", partial(host_load.HostLoad, interval_s=0.002))
    cfg = bench.compose("default", "cpu", True, "model", False, [])
    row = bench.measure(cfg, "cpu", 3, 2, None, None)
    if sys.platform.startswith("linux"):
        assert row["host_load"]["samples"] >= 1 and row["host_load"]["cores"] == len(os.sched_getaffinity(0))
    load = {"cores": 16, "samples": 240, "interval_s": 0.25, "busy_mean": 14.2, "busy_p90": 16.0, "busy_max": 16.0,
            "runnable_mean": 21.3, "runnable_max": 40, "oversubscribed_share": 0.62}
    rows = [{"recipe": "imagenet", "setting": "cold", "repeat": 0, "host_load": load},
            {"recipe": "imagenet", "setting": "cold", "repeat": 1, "host_load": None}]
    lines = bench.load_lines(rows)
    assert "- imagenet cold (repeat 1): 14.2 of 16 cores busy on average (p90 16.0), 21.3 runnable threads (max " \
        "40), more runnable threads than cores in 62 % of 240 samples" in lines
    assert len(lines) == 4 and "/proc/stat every 0.25 s" in lines[1]
    assert bench.load_lines([{"recipe": "imagenet", "setting": "cold"}]) == []


def test_a_helpers_start_up_is_named_where_its_status_says_it():
    helper = {"early_s": 18.1, "early": {"imported_s": 6.1, "built_s": 9.0, "on_device_s": 14.2, "ready_s": 18.2},
              "backward_helper": {"early": {"ready_s": 17.8}}}
    assert bench.early_sentence(helper) == (
        "The helpers were started at the process's start, 18.1 s before the first step (as `scfs.train` starts them, "
        "before its set-up); each had built its model 18.2 s (the first helper: imports done at 6.1 s, model built "
        "at 9.0 s, on the device at 14.2 s) and 17.8 s (the backward's) after its start.")


def test_the_parallel_split_row_starts_four_helpers_and_waits_for_each_graph(monkeypatch, eager_backend):
    """`compile_student_graphs=per_view_size` in a `parallel-split` row: stand-ins for the four helpers begin their
    parts at once and write them after a while; the gate waits for the local views' graph and the heads' graph (the
    local views' helper's two parts) before each and for both graphs' backwards before the backward (the counters
    say the run compiled its graphs itself), and the record says what the local views' helpers did."""
    import scfs.training.background_compile as bgc

    write = ("import sys, time, json; from pathlib import Path\n"
             "from scfs.training.background_compile import part_path, write_status\n"
             "p, parts = Path(sys.argv[1]), json.loads(sys.argv[2])\n"
             "time.sleep(1.0)\n"
             "for part in parts:\n"
             "    write_status(part_path(p, part), {'ok': True})\n"
             "write_status(p, {'ok': True, 'local_s': 0.7, 'local_forward_s': 0.3, 'backward_s': 0.8,\n"
             "                 'fx_cache': '0 hit / 1 miss',\n"
             f"                 'local_backward_run': p.name == {ch.LOCAL_STATUS_FILE!r}}})\n")

    def command(cfg_path, status_path, device, steps=2, helper=False, backward=False, local=False):
        role = "parts" if helper else ("local_backward" if local else "backward") if backward else "local"
        parts = ch.ROLES[role].parts[:2] if role == "parts" else ch.ROLES[role].parts  # no views in this recipe
        for part in parts:  # begun as it starts
            bgc.write_status(bgc.started_path(status_path, part), {"ok": True})
        return [sys.executable, "-c", write, str(status_path), json.dumps(list(parts))]

    monkeypatch.setattr(compile_child, "child_command", command)
    monkeypatch.setattr(bgc, "cache_deltas", lambda since=None: (0, 2, 0, 0))  # every graph compiled here
    cfg = bench.compose("default", "cpu", True, "model", True, ["compile_parallel=true", *bench.BACKWARD,
                                                                 *bench.SPLIT])
    row = bench.measure(cfg, "cpu", 1, 1, None, None)
    par = row["parallel"]
    want = {"teacher", "loss", ch.BACKWARD_PART, ch.LOCAL_PART, ch.HEADS_PART, ch.LOCAL_BACKWARD_PART}
    assert set(par["waited_s"]) == set(par["ready_s"]) == want, par
    assert par["built_here"] == [] and par["local_brought_backward"] is False
    assert par["helper"]["local_helper"]["local_s"] == 0.7
    md = bench.markdown({"machine": "m", "torch": "t", "date": "d", "commit": "c", "command": "x", "first_steps": 1,
                         "table": [{**row, "recipe": "default", "setting": "parallel-split", "process_cpu_s": 1.0}]})
    assert ("The local views' helper: its compile took 0.7 s, inductor cache 0 hit / 1 miss, the local views' "
            "backward run once for AOTAutograd's entry (the forward compiled and run in 0.3 s, the graph written "
            "0.4 s after it)." in md)
    assert "The local views' backward's helper: its compile took 0.8 s, inductor cache 0 hit / 1 miss." in md
    assert f"{ch.LOCAL_PART}: asked at {par['asked_s'][ch.LOCAL_PART]} s" in md


def test_the_runs_compiles_are_listed_in_order_with_their_backward_and_caches(tmp_path, monkeypatch):
    """`frame_compiles`: one entry per compiled frame and per backward compiled at its first run, from the given
    moment on (an earlier compile is left out), with inductor's and AOTAutograd's cache outcome; the record shows
    them as a table."""
    import time

    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.compile(lambda x: x.cos() * 3, backend="eager")(torch.randn(3))  # before the moment: not listed
    lin = torch.nn.Linear(4, 4)

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return lin(x).relu().sum()

    wall0 = time.time()
    torch.compile(loss_of)(torch.randn(2, 4)).backward()
    compiles = bench.frame_compiles(wall0)
    torch._dynamo.reset()
    assert [c["graph"] for c in compiles] == ["loss_of", "backward of loss_of"], compiles
    forward = compiles[0]
    assert forward["inductor_cache"] == "miss" and forward["aot_cache"] == "miss" and forward["ops"] >= 2
    assert 0 <= forward["at_s"] <= compiles[1]["at_s"] and forward["s"] > 0
    md = "\n".join(bench.compiles_table([{"recipe": "cifar10", "setting": "cold", "compiles": compiles}]))
    assert f"| cifar10 cold | `loss_of` | compile | {forward['at_s']} | {forward['s']} | {forward['ops']} | miss | " \
        "miss |" in md
    assert not any(c["first_run"] for c in compiles)  # on the CPU: no launch-config benchmark, no CUDA graph


def test_a_graphs_first_run_is_named_with_what_it_spent(monkeypatch):
    """torch counts a compiled graph's first-run work (Triton's launch-config benchmarks, the CUDA graphs'
    recording) as a runtime entry under the graph's compile id: listed as that graph's first run, with the seconds
    of each; an entry from a record made before this is shown without a kind."""
    import time
    from types import SimpleNamespace

    import torch._dynamo.utils as dynamo_utils

    t0 = time.time()
    metrics = [SimpleNamespace(compile_id="0/0", co_name="student_forward", is_forward=True, start_time=t0 + 1,
                               duration_us=60_000_000, graph_op_count=768, inductor_fx_local_cache_miss_count=1,
                               aotautograd_local_cache_miss_count=1),
               SimpleNamespace(compile_id="0/0", co_name=None, is_forward=True, start_time=t0 + 61,
                               duration_us=6_750_000, is_runtime=True, runtime_triton_autotune_time_us=6_500_000,
                               runtime_cudagraphify_time_us=None),
               SimpleNamespace(compile_id="0/0", co_name=None, is_forward=False, start_time=t0 + 70,
                               duration_us=300_000, is_runtime=True, runtime_triton_autotune_time_us=None,
                               runtime_cudagraphify_time_us=250_000)]
    monkeypatch.setattr(dynamo_utils, "get_compilation_metrics", lambda: metrics)
    compiles = bench.frame_compiles(t0)
    assert [(c["graph"], c["first_run"]) for c in compiles] == [
        ("student_forward", False), ("student_forward", True), ("backward of student_forward", True)]
    assert [bench.compile_kind(c) for c in compiles] == [
        "compile", "first run: launch configs 6.5 s", "first run: CUDA graphs 0.25 s"]
    old = {k: v for k, v in compiles[1].items() if k not in ("first_run", "autotune_s", "cudagraphs_s")}
    assert bench.compile_kind(old) == ""


def test_the_record_says_whether_the_local_views_helper_ran_its_backward_and_when():
    """`local_backward_phrase`: the local views' helper's status read back into the record; a status from before
    the backward run existed says nothing of it."""
    assert records.local_backward_phrase({"ok": True, "local_s": 9.0}) == ""
    ran = records.local_backward_phrase({"local_backward_run": True, "local_s": 9.0, "local_forward_s": 6.5})
    assert ran == (", the local views' backward run once for AOTAutograd's entry (the forward compiled and run in "
                   "6.5 s, the graph written 2.5 s after it)")
    assert records.local_backward_phrase({"local_backward_run": False}).startswith(
        ", the local views' backward not run (its entry not written before the run asked")

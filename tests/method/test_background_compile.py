"""`compile_background=true`: eager steps first, a child process compiles the step, the run switches to it."""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_RESNET18, compose_cfg

import scfs.training.background_compile as bgc
import scfs.training.compile_helpers as ch
from scfs.config import ConfigError, validate_config
from scfs.methods.base import step_losses, student_forward
from scfs.train import build, run
from scfs.training import compile_child

# what the method asks its `compile_gate` on the first step (`compile_parallel`), in the step's order
ASKED = ["student", "teacher", "loss", "student_backward"]


@pytest.mark.parametrize("overrides, match", [
    (["compile=false"], "compile_background=true is invalid with compile=false"),
    (["compile=true", "compile_backend=cudagraphs", "compile_mode=default"], "with compile_backend=cudagraphs"),
    (["compile=true", "sync_bn=true"], "with sync_bn=true"),
    (["compile=true", "compile_background=1"], "compile_background"),
], ids=["no-compile", "cudagraphs", "sync-bn", "not-a-bool"])
def test_bad_settings_are_refused_in_one_line(overrides, match):
    extra = [] if any(o.startswith("compile_background") for o in overrides) else ["compile_background=true"]
    with pytest.raises(ConfigError, match=match) as err:
        validate_config(compose_cfg([*overrides, *extra]))
    assert "\n" not in str(err.value)


def test_the_method_starts_eager_and_compile_now_swaps_in_the_compiled_step(eager_backend):
    _, model = build(compose_cfg(["compile=true", "compile_background=true"]))
    assert not model.compile_nets and model._student_fn is student_forward and model._loss_fn is step_losses
    assert model.loss_diagnostics(False) is False  # the eager loss: statistics on the logging steps only
    model.compile_now()
    assert model.compile_nets and model._student_fn is not student_forward and model._loss_fn is not step_losses
    fn = model._student_fn
    model.compile_now()  # idempotent: the compiled calls (and their dynamo caches) are kept
    assert model._student_fn is fn
    assert model.hparams.compile and model.hparams.compile_background  # the checkpoint says how it was trained


def test_the_child_builds_the_runs_method_compiled_and_reports(tmp_path, eager_backend):
    """In-process here (dynamo's eager backend stands in for inductor): the child's config is the run's, resolved,
    at this process's batch, compiled from the start; it runs its steps and writes an `ok` status."""
    cfg = compose_cfg(["compile=true", "compile_background=true", "global_batch_size=8", "compile_artifacts=x.bin"])
    child = ch.child_config(cfg, batch_size=8)
    assert child.compile and not child.compile_background and child.compile_artifacts is None
    assert not child.compile_parallel  # the child itself starts no helper
    assert child.batch_size == 8 and child.global_batch_size is None and child.crops.n_local == cfg.crops.n_local
    path, status_path = tmp_path / "c.yaml", tmp_path / "status.json"
    from omegaconf import OmegaConf

    OmegaConf.save(child, path)
    status = compile_child.compile_in_child(path, status_path, "cpu", steps=2)
    assert status == json.loads(status_path.read_text())
    assert status["ok"] and status["steps"] == 2 and status["loss"] == status["loss"] and status["seconds"] > 0


def test_the_child_takes_the_runs_cache_key_settings(tmp_path, monkeypatch):
    """A run that set the matmul precision or deterministic algorithms compiles under other cache keys than a
    fresh process: the child's command line carries the run's settings, and the child sets them."""
    import subprocess

    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: True)
    was = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # as torch.set_float32_matmul_precision("high")
        cmd = compile_child.child_command(Path("c.yaml"), Path("s.json"), "cpu")
    finally:
        matmul.fp32_precision = was
    sent = json.loads(cmd[cmd.index("--settings") + 1])
    assert sent["fp32_precision"] == "tf32" and sent["deterministic"] and sent["deterministic_warn_only"]
    fresh = subprocess.run([sys.executable, "-c", "import json; from scfs.training import compile_child; "
                            "print(json.dumps(compile_child.key_settings()))"], capture_output=True, text=True,
                           check=True, env=ch.child_env())
    assert json.loads(fresh.stdout.strip().splitlines()[-1]) != sent  # a fresh process's own differ
    # the child itself, from that command line (a missing config: it fails at once, and says what it ran under)
    status_path = tmp_path / "s.json"
    cmd[cmd.index("c.yaml")], cmd[cmd.index("s.json")] = str(tmp_path / "missing.yaml"), str(status_path)
    child = subprocess.run(cmd, capture_output=True, text=True, env=ch.child_env())
    status = json.loads(status_path.read_text())
    assert child.returncode == 1 and not status["ok"] and status["settings"] == sent, child.stdout[-2000:]


@pytest.mark.parametrize("counts, warned", [("0 hit / 5 miss", True), ("5 hit / 0 miss", False)])
def test_a_compiled_step_that_missed_the_childs_entries_says_so(tmp_path, monkeypatch, caplog, counts, warned):
    import time
    from types import SimpleNamespace

    hits, misses = (int(v) for v in counts.replace(" miss", "").split(" hit / "))
    monkeypatch.setattr(bgc, "cache_deltas", lambda since=None: (hits, misses, 0, 0))
    cfg = compose_cfg(["compile=true"])
    bg = bgc.BackgroundCompile(cfg, tmp_path, 8)
    bg._switch_t, bg._counters = time.monotonic(), (0, 0, 0, 0)
    par = bgc.ParallelCompile(cfg, tmp_path, 8)
    par.report, par._first_t, par._counters = {"waited_s": {}}, time.monotonic(), (0, 0, 0, 0)
    par._gate = bgc.HelperGates(bgc.PartGate(tmp_path / "s.json", lambda: True, 1.0, tmp_path / "s.log"))
    for part in bgc.PARTS:  # both parts written by the helper before the run asked: the run used its entries
        bgc.write_status(bgc.part_path(tmp_path / "s.json", part), {"ok": True})
        par._gate(part)
    # a run that built both parts itself (the helper never began them) used none of its entries: nothing to say
    idle = bgc.ParallelCompile(cfg, tmp_path / "idle", 8)
    idle.report, idle._first_t, idle._counters = {"waited_s": {}}, time.monotonic(), (0, 0, 0, 0)
    idle._gate = bgc.HelperGates(bgc.PartGate(tmp_path / "idle.json", lambda: True, 1.0, tmp_path / "idle.log"))
    for part in bgc.PARTS:
        idle._gate(part)
    with caplog.at_level(logging.WARNING, logger="scfs.train"):
        bg.on_train_batch_end(None, None, None, None, 0)
        par.on_train_batch_end(None, SimpleNamespace(compile_gate=print), None, None, 0)
        idle.on_train_batch_end(None, SimpleNamespace(compile_gate=print), None, None, 0)
    assert idle.report["built_here"] == list(bgc.PARTS) and not idle.report["helper_stopped"]  # no helper process
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert said == []
        return
    assert len(said) == 2 and all("\n" not in m for m in said)
    assert said[0].startswith(f"compile_background: the child's cache entries were not this run's (inductor cache "
                              f"{counts})")
    assert said[1].startswith("compile_parallel: the helper's cache entries were not this run's")


def test_a_failing_child_writes_a_failed_status(tmp_path):
    cfg = compose_cfg(["compile=true"])
    cfg.method.name = "no-such-method"
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, tmp_path / "c.yaml")
    status = compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "s.json", "cpu", steps=1)
    assert not status["ok"] and "no-such-method" in status["error"]
    assert json.loads((tmp_path / "s.json").read_text()) == status


def _recorded(base, made, command):
    """`base` (the callback class) that appends each instance to `made` and, unless `command` is None, runs
    `python -c <command> <status path>` as its child."""

    class Recorded(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

        def command(self, device):
            return super().command(device) if command is None else [sys.executable, "-c", command,
                                                                      str(self.status_path)]

    return Recorded


def _run_with(monkeypatch, tmp_path, shapes_root, command, status=None, wait_for_child=False, steps=3,
              extra=()):
    """`scfs.train.run` with compile_background=true, checks every step, the child's command replaced (and its
    status, when `status(steps done)` is given); returns the callback and, per step, whether the method's step was
    compiled when it ran."""
    made: list[bgc.BackgroundCompile] = []
    compiled: list[bool] = []

    class Probe(_recorded(bgc.BackgroundCompile, made, command)):
        def _poll_child(self):
            return status(len(compiled)) if status is not None else super()._poll_child()

        def on_train_start(self, trainer, pl_module):
            if wait_for_child:
                self.proc.wait(timeout=1200)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            compiled.append(pl_module.compile_nets)
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    monkeypatch.setattr(bgc, "BackgroundCompile", Probe)
    monkeypatch.setattr(bgc, "CHECK_EVERY", 1)
    cfg = compose_cfg(["compile=true", "compile_background=true", f"trainer.limit_train_batches={steps}",
                       "eval.knn_at_start=false", *extra], data_root=shapes_root)
    run(cfg, tmp_path)
    return made[0], compiled


def test_the_run_trains_eagerly_then_switches_when_the_child_is_done(tmp_path, shapes_root, monkeypatch,
                                                                     eager_backend):
    from torch._dynamo.utils import counters

    counters["inductor"]["fxgraph_cache_miss"] += 7  # compiled before the switch: not the switch's
    ok = {"ok": True, "seconds": 1.0, "fx_cache": "3 hit / 0 miss"}
    bg, compiled = _run_with(monkeypatch, tmp_path, shapes_root, "import time; time.sleep(600)",
                             status=lambda done: ok if done >= 2 else None)
    assert compiled == [False, False, True] and bg.switched_at == 2
    assert bg.report["child"] == ok and bg.report["switch_step"] == 2
    assert bg.report["fx_cache"] == "0 hit / 0 miss"  # since the switch (dynamo's eager backend: no inductor)
    assert bg.proc.poll() is not None  # the child still compiling at the end was stopped
    assert json.loads((tmp_path / "summary.json").read_text())["compile_background"]["switch_step"] == 2
    assert (tmp_path / bgc.STATUS_FILE).with_suffix(".yaml").is_file()  # the config the child was given


def test_a_failed_child_is_said_in_one_line_and_the_run_compiles_itself(tmp_path, shapes_root, monkeypatch,
                                                                          eager_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="scfs.train"):
        bg, compiled = _run_with(monkeypatch, tmp_path, shapes_root, "import sys; sys.exit(3)",
                                 wait_for_child=True, steps=2)
    assert compiled == [True, True] and bg.switched_at == 0
    (line,) = [r.getMessage() for r in caplog.records if "compile_background" in r.getMessage()]
    assert "failed" in line and "status 3" in line and "compiling the step" in line
    assert bg.log_path == tmp_path / "background_compile.log" and str(bg.log_path) in line


def test_a_child_writes_its_status_whole_and_every_check_reads_it(tmp_path, shapes_root, monkeypatch,
                                                                  eager_backend):
    """The real file protocol: a child that writes an ok status (atomically) and ends; the run switches at the
    first check after it, here the first step."""
    write = ("import json, os, sys; p = sys.argv[1]; open(p + '.tmp', 'w').write(json.dumps({'ok': True, "
             "'seconds': 0.5, 'fx_cache': '1 hit / 0 miss'})); os.replace(p + '.tmp', p)")
    bg, compiled = _run_with(monkeypatch, tmp_path, shapes_root, write, wait_for_child=True, steps=2)
    assert compiled == [True, True] and bg.switched_at == 0 and bg.report["child"]["seconds"] == 0.5


def _hits_only(tmp_path, monkeypatch, shapes_root, extra):
    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    bg, compiled = _run_with(monkeypatch, tmp_path / "run", shapes_root, None, wait_for_child=True, steps=2,
                             extra=extra)
    torch._dynamo.reset()
    assert compiled == [True, True] and bg.report["child"]["ok"], bg.report
    assert bg.report["child"]["fx_cache"].startswith("0 hit")  # the child compiled on an empty cache
    hits, misses = (int(v) for v in bg.report["fx_cache"].replace(" miss", "").split(" hit / "))
    assert hits >= 4 and misses == 0, bg.report
    assert bg.report["aot_cache"].endswith(" 0 miss"), bg.report


@pytest.mark.slow
def test_the_childs_cache_holds_the_runs_graphs(tmp_path, shapes_root, monkeypatch):
    """The claim the switch rests on, with inductor (C++ on the CPU): the child compiles the step (`make_step`) and
    the views' ops (`make_views`) on random inputs into the run's cache folder, and the run's own Lightning step,
    compiled after it, finds every graph there (inductor and AOTAutograd: hits only). The run waits for the child
    before its first step, so it switches at step 0. 5-15 minutes on 2 shared cores."""
    _hits_only(tmp_path, monkeypatch, shapes_root, ["compile_views=true"])


@pytest.mark.gpu
def test_the_childs_cache_holds_the_runs_graphs_on_the_gpu(tmp_path, shapes_root, monkeypatch):
    """The same with what the GPU recipes ship: bf16 autocast, channels_last, CUDA graphs (reduce-overhead), the
    views compiled, on a one-block ResNet-18."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _hits_only(tmp_path, monkeypatch, shapes_root,
               [*TINY_RESNET18, "trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
                "compile_mode=reduce-overhead", "compile_views=true", "++backbone.channels_last=true"])


# ---- compile_parallel: a helper compiles the teacher's call and the losses while the run compiles the student's --
@pytest.mark.parametrize("overrides, match", [
    (["compile=false"], "with compile=false"),
    (["compile=true", "compile_background=true"], "with compile_background=true"),
    (["compile=true", "compile_backend=cudagraphs", "compile_mode=default"], "with compile_backend=cudagraphs"),
    (["compile=true", "compile_scope=blocks"], "with compile_scope=blocks"),
    (["compile=true", "sync_bn=true"], "with sync_bn=true"),
], ids=["no-compile", "background", "cudagraphs", "blocks", "sync-bn"])
def test_bad_parallel_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=f"compile_parallel=true is invalid {match}") as err:
        validate_config(compose_cfg([*overrides, "compile_parallel=true"]))
    assert "\n" not in str(err.value)


def test_the_helper_child_compiles_the_teacher_and_the_losses_and_says_when(tmp_path, eager_backend):
    """In-process (dynamo's eager backend for inductor): the student's call runs eager (no graph of it), the
    teacher's call and the losses are traced, and each part's file is written once it ran."""
    from omegaconf import OmegaConf
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    OmegaConf.save(cfg, tmp_path / "c.yaml")
    counters.clear()
    status = compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "s.json", "cpu", steps=1, helper=True)
    helper_graphs = counters["stats"]["unique_graphs"]
    assert status["ok"] and all(bgc.part_path(tmp_path / "s.json", p).exists() for p in bgc.PARTS)
    begun = [bgc.started_path(tmp_path / "s.json", p).stat().st_mtime for p in bgc.PARTS]
    assert begun[0] <= bgc.part_path(tmp_path / "s.json", "teacher").stat().st_mtime <= begun[1]  # the step's order
    torch._dynamo.reset()
    counters.clear()
    compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "s2.json", "cpu", steps=1)
    assert 0 < helper_graphs < counters["stats"]["unique_graphs"]  # the whole step traces the student's call too
    assert not bgc.part_path(tmp_path / "s2.json", "teacher").exists()  # a whole-step child writes no parts
    torch._dynamo.reset()


def _write_later(path: Path, after_s: float) -> None:
    import threading

    threading.Timer(after_s, lambda: bgc.write_status(path, {"ok": True})).start()


def test_the_gate_waits_only_for_a_part_the_helper_has_begun(tmp_path):
    """A part the helper has not begun is built by the run at once (a warm cache is not held up by the helper's
    start); a begun one is waited for until its entry is written; each part is gated once (the first step's)."""
    status = tmp_path / "s.json"
    gate = bgc.PartGate(status, lambda: False, 60.0, tmp_path / "s.log")
    gate("teacher")  # not begun: no wait
    bgc.write_status(bgc.started_path(status, "loss"), {"ok": True})
    _write_later(bgc.part_path(status, "loss"), 0.5)
    gate("loss")  # begun: waits until it is written
    timeline = gate.timeline()
    assert timeline["waited_s"]["teacher"] < 0.2 and 0.4 <= timeline["waited_s"]["loss"] < 10, timeline
    assert timeline["built_here"] == ["teacher"] and set(timeline["started_s"]) == set(timeline["ready_s"]) == {"loss"}
    assert timeline["asked_s"]["teacher"] <= timeline["asked_s"]["loss"] <= timeline["ready_s"]["loss"] + 0.1
    bgc.write_status(bgc.started_path(status, "teacher"), {"ok": True})
    gate("teacher")  # a later step: passes, the timeline stays the first step's
    assert gate.timeline()["asked_s"] == timeline["asked_s"] and gate.timeline()["built_here"] == ["teacher"]


def test_the_gate_stops_waiting_when_the_helper_ends_or_its_time_is_up(tmp_path):
    status = tmp_path / "s.json"
    for part in bgc.PARTS:
        bgc.write_status(bgc.started_path(status, part), {"ok": True})
    ended = bgc.PartGate(status, lambda: True, 60.0, tmp_path / "s.log")
    ended("teacher")
    bounded = bgc.PartGate(status, lambda: False, 0.3, tmp_path / "s.log")
    bounded("loss")
    assert ended.timeline()["waited_s"]["teacher"] < 0.2 and 0.3 <= bounded.timeline()["waited_s"]["loss"] < 5
    assert ended.timeline()["built_here"] == ["teacher"] and bounded.timeline()["built_here"] == ["loss"]


def test_a_helper_behind_the_run_is_stopped_after_the_first_step_and_one_that_kept_up_is_not(tmp_path):
    status = tmp_path / "s.json"
    for behind in (True, False):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            gate = bgc.PartGate(status, lambda: False, 1.0, tmp_path / "s.log")
            for part in bgc.PARTS:
                if not behind:
                    bgc.write_status(bgc.part_path(status, part), {"ok": True})
                gate(part)
            assert bgc.stop_helper_if_behind(proc, gate) is behind
            assert (proc.poll() is not None) is behind
            # a stopped helper's status says so, for the ranks that only see the file
            assert status.exists() is behind and (not behind or json.loads(status.read_text())["stopped"])
        finally:
            bgc.stop_child(proc)
            for path in (status, *(bgc.part_path(status, part) for part in bgc.PARTS)):
                path.unlink(missing_ok=True)
    assert not bgc.stop_helper_if_behind(None, gate)  # the other ranks hold no helper


def test_a_run_stops_a_helper_that_never_began_after_its_first_step(tmp_path, shapes_root, monkeypatch,
                                                                    eager_backend):
    """A helper that is still starting when the run has built everything (a warm cache, or a slow helper) would
    only take the GPU and the host from the next steps: stopped at the end of the first step."""
    bg, calls = _parallel_run(monkeypatch, tmp_path, shapes_root, "import time; time.sleep(600)")
    assert calls == ASKED and bg.report["built_here"] == ["teacher", "loss"], bg.report
    assert bg.report["helper_stopped"] and max(bg.report["waited_s"].values()) < 1
    helper = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]["helper"]
    assert helper["stopped"] and "the run built teacher, loss without it" in helper["error"]


def test_a_new_helper_starts_without_an_earlier_ones_files(tmp_path):
    """A run folder used before: the earlier helper's begun and written parts and status are gone before the new
    helper starts (a stale begun file would hold the run for a part nobody compiles; a stale written one would let
    it on before the entry exists)."""
    status = tmp_path / "s.json"
    old = [status, *(f(status, part) for part in bgc.PARTS for f in (bgc.part_path, bgc.started_path))]
    for path in old:
        bgc.write_status(path, {"ok": True})
    compile_child.start_child(compose_cfg(["compile=true", "compile_parallel=true"]), 8, status, "cpu", helper=True,
                    command=[sys.executable, "-c", "pass"]).wait(timeout=60)
    assert not [p.name for p in old if p.exists()]


def test_the_helpers_student_outputs_are_the_runs_cut_from_the_student():
    """The helper's student call (`eager_student`) gives the losses the run's inputs (same tensors, shapes, strides,
    dtypes, requires_grad) as leaves cut from the student: the loss is the run's, its backward stops there (no
    student weight gets a gradient), and no student activation is kept for it."""
    from torch.utils._pytree import tree_flatten

    from scfs.training.plain_step import random_views

    cfg = compose_cfg([])
    torch.manual_seed(0)
    _, model = build(cfg)
    model.train()
    g, loc = random_views(cfg, "cpu", model.channels_last)
    b, n_local = int(cfg.batch_size), int(cfg.crops.n_local)
    out = {}
    for helper in (False, True):
        m = copy.deepcopy(model)  # each from the same state (a step moves the losses' centres)
        loss, _, st = m.views_to_loss(g, loc, b, n_local, 0.04, True, eager_student=helper)
        loss.backward()
        out[helper] = loss.detach(), st, [p.grad for p in m.student["backbone"].parameters()]
    (run_loss, run_st, run_grads), (helper_loss, helper_st, helper_grads) = out[False], out[True]
    run_leaves, run_spec = tree_flatten(run_st)
    helper_leaves, helper_spec = tree_flatten(helper_st)
    assert run_spec == helper_spec
    tensors = [(r, h) for r, h in zip(run_leaves, helper_leaves, strict=True) if isinstance(r, torch.Tensor)]
    assert tensors and any(r.requires_grad for r, _ in tensors) and not all(r.requires_grad for r, _ in tensors)
    for r, h in tensors:
        assert (h.shape, h.stride(), h.dtype, h.requires_grad) == (r.shape, r.stride(), r.dtype, r.requires_grad)
        assert h.grad_fn is None and torch.equal(h.detach(), r.detach())
    torch.testing.assert_close(helper_loss, run_loss, rtol=0, atol=0)
    assert all(gr is not None for gr in run_grads) and all(gr is None for gr in helper_grads)


def test_a_forward_under_discard_saved_tensors_keeps_none_for_its_backward():
    from scfs.methods.base import discard_saved_tensors

    w = torch.randn(64, 64, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        with discard_saved_tensors():  # the innermost hooks win: nothing reaches the outer ones
            y = torch.tanh(torch.randn(8, 64) @ w)
        assert y.requires_grad and not packed
        torch.tanh(torch.randn(8, 64) @ w)
    assert packed  # outside it the same forward saves its tensors


def _parallel_run(monkeypatch, tmp_path, shapes_root, command, extra=(), begun=False):
    """A run with compile_parallel=true and the helper's command replaced (`begun`: both parts' begun files written
    as the helper starts, so that the first step, faster than a stand-in's imports, waits for them)."""
    made: list[bgc.ParallelCompile] = []
    calls: list[str] = []

    class Probe(_recorded(bgc.ParallelCompile, made, command)):
        def _start_child(self, trainer):
            super()._start_child(trainer)
            for part in bgc.PARTS if begun else ():
                bgc.write_status(bgc.started_path(self.status_path, part), {"ok": True})

        def wait_for(self, part):
            calls.append(part)
            super().wait_for(part)

    monkeypatch.setattr(bgc, "ParallelCompile", Probe)
    cfg = compose_cfg(["compile=true", "compile_parallel=true", "trainer.limit_train_batches=2",
                       "eval.knn_at_start=false", *extra], data_root=shapes_root)
    run(cfg, tmp_path)
    return made[0], calls


def test_the_run_waits_for_each_part_on_its_first_step_only(tmp_path, shapes_root, monkeypatch, eager_backend):
    write = ("import sys, time; from pathlib import Path\n"
             "from scfs.training.background_compile import PARTS, part_path, started_path, write_status\n"
             "p = Path(sys.argv[1])\n"
             "for part in PARTS:\n"
             "    write_status(started_path(p, part), {'ok': True}); time.sleep(0.3)\n"
             "    write_status(part_path(p, part), {'ok': True})\n"
             "time.sleep(600)")
    # begun as it starts, so the first step waits for both parts whatever the stand-in's imports take
    bg, calls = _parallel_run(monkeypatch, tmp_path, shapes_root, write, begun=True)
    # asked before the student's call, the teacher's, the losses and the backward, on the first step only
    assert calls == ASKED
    assert set(bg.report["waited_s"]) == {"teacher", "loss"} and bg.report["first_step_s"] > 0
    # the timeline: asked for in the step's order, written by the helper 0.3 s apart, all within the first step
    asked, ready = bg.report["asked_s"], bg.report["ready_s"]
    assert asked["teacher"] <= asked["loss"] <= bg.report["first_step_s"] and ready["teacher"] < ready["loss"]
    assert bg.proc.poll() is not None  # the helper, still alive at the end, was stopped
    entry = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]
    assert entry["waited_s"] == bg.report["waited_s"] and bg.report["built_here"] == []
    assert "helper" not in entry and not bg.report["helper_stopped"]  # kept up, still running: no status yet
    # the run's own compiles in its first step, by graph, timed from fit's start (what the first step spent)
    graphs = [c["graph"] for c in entry["compiles"] if not c["first_run"]]
    assert "student_forward" in graphs and "teacher_forward" in graphs, graphs
    assert all(0 <= c["at_s"] <= bg.report["first_step_s"] for c in entry["compiles"])
    # the host's load over the first step (at least the 0.6 s of waits), its sampler stopped with the step
    if sys.platform.startswith("linux"):
        assert entry["host_load"]["samples"] >= 1 and entry["host_load"]["cores"] == len(os.sched_getaffinity(0))
    assert bg._load is None


def test_a_failed_helper_does_not_hold_the_run(tmp_path, shapes_root, monkeypatch, eager_backend):
    # a helper that has begun both parts (the run waits for them) and dies without writing them
    bg, calls = _parallel_run(monkeypatch, tmp_path, shapes_root, "import sys; sys.exit(3)", begun=True)
    assert calls == ASKED and max(bg.report["waited_s"].values()) < 60
    assert not json.loads((tmp_path / bgc.STATUS_FILE).read_text())["ok"]  # said for the other ranks too
    helper = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]["helper"]
    assert not helper["ok"] and "ended with status 3" in helper["error"]  # the summary says how the helper ended


VIEWS = ["data.batch_aug=true", "compile_views=true"]  # views made on the device, their per-pixel ops compiled


def test_views_handed_to_the_helper_are_made_eagerly_once_then_asked_for(eager_backend):
    """`hand_views_to_helper`: the first batch's views run the per-pixel ops eagerly and ask the gate nothing, the
    next batch asks for "views" and then runs them compiled, later ones only compiled; the eager views are the
    compiled ones up to rounding (the same draw: global step 0 each time). Nothing to hand without compiled
    views."""
    _, plain = build(compose_cfg(["compile=true", "data.batch_aug=true"]))
    assert not plain.hand_views_to_helper() and plain.views_handoff is None
    _, model = build(compose_cfg(["compile=true", *VIEWS]))
    model.train()
    asked: list[str] = []
    compiled_calls: list[int] = []
    fn = model.batch_aug._finish_compiled
    model.batch_aug._finish_compiled = lambda *a: (compiled_calls.append(len(asked)), fn(*a))[1]
    model.compile_gate = asked.append
    assert model.hand_views_to_helper() and model.views_handoff == "eager"
    images = torch.randint(0, 256, (4, 3, 40, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    first = model.on_after_batch_transfer(images, 0)
    assert asked == [] and compiled_calls == [] and model.views_handoff == "ask"
    assert model.batch_aug.finish_compiled  # compiled again after the eager batch
    second = model.on_after_batch_transfer(images, 0)
    assert asked == ["views"] and compiled_calls and set(compiled_calls) == {1}  # asked first, then compiled
    model.on_after_batch_transfer(images, 0)
    assert asked == ["views"] and model.views_handoff is None and len(compiled_calls) == 4  # 2 view sizes a batch
    for a, b in zip(first["views"], second["views"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_helper_compiles_the_views_after_its_parts_only_where_the_run_hands_them_over(tmp_path, eager_backend):
    """In-process: a helper whose model makes compiled views writes the views' begun and written files after the
    losses'; one without compiled views writes none."""
    from omegaconf import OmegaConf

    for name, extra in (("views", VIEWS), ("none", ["data.batch_aug=true"])):
        torch._dynamo.reset()
        cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true", *extra]), batch_size=8)
        OmegaConf.save(cfg, tmp_path / f"{name}.yaml")
        status_path = tmp_path / f"{name}.json"
        status = compile_child.compile_in_child(tmp_path / f"{name}.yaml", status_path, "cpu", steps=1, helper=True)
        assert status["ok"], status
        views_file = bgc.part_path(status_path, ch.VIEWS_PART)
        if name == "views":
            begun = bgc.started_path(status_path, ch.VIEWS_PART).stat().st_mtime
            assert bgc.part_path(status_path, "loss").stat().st_mtime <= begun <= views_file.stat().st_mtime
        else:
            assert not views_file.exists() and not bgc.started_path(status_path, ch.VIEWS_PART).exists()
    torch._dynamo.reset()


def test_the_run_asks_for_the_views_at_its_second_batch_and_reports_the_wait(tmp_path, shapes_root, monkeypatch,
                                                                           eager_backend):
    """A run whose views are compiled hands them to the helper: the gate stays after the first step until the
    second batch has asked for "views", whose wait joins the first step's in the report and the summary."""
    write = ("import sys, time; from pathlib import Path\n"
             "from scfs.training.background_compile import PARTS, VIEWS_PART, part_path, started_path, "
             "write_status\n"
             "p = Path(sys.argv[1])\n"
             "for part in (*PARTS, VIEWS_PART):\n"
             "    write_status(started_path(p, part), {'ok': True}); time.sleep(0.3)\n"
             "    write_status(part_path(p, part), {'ok': True})\n"
             "time.sleep(600)")
    made: list = []
    original = bgc.ParallelCompile.on_train_batch_end

    def spy(self, trainer, pl_module, *a):
        original(self, trainer, pl_module, *a)
        made.append(pl_module.compile_gate is not None)

    monkeypatch.setattr(bgc.ParallelCompile, "on_train_batch_end", spy)
    bg, calls = _parallel_run(monkeypatch, tmp_path, shapes_root, write, extra=VIEWS, begun=True)
    assert calls == [*ASKED, "views", *ASKED]  # the second step's repeats pass the gate at once
    assert made == [True, False]  # kept after the first step, gone after the second
    assert "views" in bg.report["waited_s"] and bg.report["asked_s"]["views"] >= bg.report["asked_s"]["loss"]
    entry = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]
    assert "views" in entry["asked_s"] and "views" not in entry["built_here"]
    assert set(entry["through_views"]) == {"fx_cache", "aot_cache"}


@pytest.mark.slow
def test_the_helpers_views_graphs_are_the_runs(tmp_path, shapes_root, monkeypatch):
    """With inductor (C++ on the CPU): the real helper compiles the views' graphs after its parts, and the run's
    second batch builds its compiled views from them: hits for both view sizes, no new miss after the first step.
    5-15 minutes on 2 shared cores."""
    _parallel_hits(tmp_path, monkeypatch, shapes_root, VIEWS)


def _go_once_ready(monkeypatch, timeout_s: float = 900.0) -> None:
    """The run's go to its early helpers held until each says it is ready (`ready_path`) or has ended: then each
    begins its parts at the go, before the run asks for them. Without it, which entries a run uses depends on the
    host: on a GPU the tiny step's own compile can end before a helper's start-up (its imports alone took 14-16 s
    on one H100 host), and the run then builds the parts that helper had not begun (by design)."""
    go = ch.EarlyHelpers.go

    def go_once_ready(self, *args, **kwargs):
        t0 = time.monotonic()
        while (len(self.ready_roles()) < len(self.paths) and time.monotonic() - t0 < timeout_s
               and all(p.poll() is None for p in self.procs.values())):
            time.sleep(0.05)
        return go(self, *args, **kwargs)

    monkeypatch.setattr(ch.EarlyHelpers, "go", go_once_ready)


def _parallel_hits(tmp_path, monkeypatch, shapes_root, extra, backward=False, early=None, split=False):
    """A run with compile_parallel=true and the real helper on an empty cache folder; `backward`: with
    compile_parallel_backward=true and its real helper too; `early`: the helpers started before the run's set-up
    (`scfs.training.compile_helpers.start_early_helpers`), checked: "gpu" as a GPU run starts them, "cpu" the same
    on the CPU, the go held until they are ready (`_go_once_ready`); `split`: the student's call per view size
    (compile_student_graphs=per_view_size), with the local views' helper and, with `backward`, its backward's."""
    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    if early == "cpu":
        monkeypatch.setattr(ch, "gpu_run", lambda cfg: True)
        monkeypatch.setattr(ch, "early_device", lambda: "cpu")
    if early:
        _go_once_ready(monkeypatch)
    views = "compile_views=true" in extra  # then handed to the helper and asked for at the second batch
    extra = [*extra, "compile_parallel_backward=true"] if backward else extra
    extra = [*extra, "compile_student_graphs=per_view_size"] if split else extra
    bg, calls = _parallel_run(monkeypatch, tmp_path / "run", shapes_root, None, extra=extra)
    torch._dynamo.reset()
    asked = ["student", ch.LOCAL_PART, ch.HEADS_PART, *ASKED[1:]] if split else ASKED
    assert calls == ([*asked, "views", *asked] if views else asked), bg.report
    if views:  # the second batch built both view sizes' graphs from the helper's entries: hits, no new miss
        first, through = (tuple(int(v) for v in text.replace(" miss", "").split(" hit / "))
                          for text in (bg.report["fx_cache"], bg.report["through_views"]["fx_cache"]))
        assert "views" not in bg.report["built_here"], bg.report
        assert through[0] >= first[0] + 2 and through[1] == first[1], bg.report
    hits, misses = (int(v) for v in bg.report["fx_cache"].replace(" miss", "").split(" hit / "))
    # the teacher's forward and the losses' forward and backward from the helper; the student's two compiled here,
    # or with the backward's helper its forward here and its backward from that helper. Per view size: the local
    # views' forward and the heads' two graphs from the local views' helper and, with the backward's helpers, both
    # views' backwards; the global views' forward compiled here
    if split:
        assert hits >= 6 + 2 * backward and misses >= 1 + (not backward) * 2, bg.report
        assert ch.LOCAL_PART not in bg.report["built_here"] and ch.HEADS_PART not in bg.report["built_here"], \
            bg.report
        assert json.loads((tmp_path / "run" / ch.LOCAL_STATUS_FILE).read_text())["ok"]
    else:
        assert hits >= 3 + backward and misses >= 2 - backward, bg.report
    aot_hits = int(bg.report["aot_cache"].split(" hit")[0])
    assert aot_hits >= 2, bg.report
    if backward:  # the run compiled its student's forward, so it waited for the backward's entry and used it
        assert bg.report["student_compiled"] and bgc.BACKWARD_PART not in bg.report["built_here"], bg.report
        status = json.loads((tmp_path / "run" / bgc.BACKWARD_STATUS_FILE).read_text())
        assert status["ok"], status
    if backward and split:  # its local views' graph brought its backward exactly where the local views' helper
        # ran that backward (it finds the fourth helper's entry within its short wait, or not), else the run used
        # the fourth helper's entry at its backward
        ran = json.loads((tmp_path / "run" / ch.LOCAL_STATUS_FILE).read_text())["local_backward_run"]
        assert bg.report["local_brought_backward"] is ran, bg.report
        assert (ch.LOCAL_BACKWARD_PART in bg.report["built_here"]) is ran, bg.report
        assert json.loads((tmp_path / "run" / ch.LOCAL_BACKWARD_STATUS_FILE).read_text())["ok"]
    if early:  # the run gave the go to the helpers it started before its set-up, and started no others
        assert bg.report["early_s"] > 0, bg.report
        status = json.loads((tmp_path / "run" / bgc.STATUS_FILE).read_text())
        assert status["ok"] and status["early"]["ready_s"] <= status["early"]["go_s"], status


@pytest.mark.slow
def test_the_helpers_entries_are_the_runs_teacher_and_losses(tmp_path, shapes_root, monkeypatch):
    """With inductor (C++ on the CPU): the run's first step builds the teacher's call and the losses from the
    helper's cache entries (hits) and compiles the student's itself. 5-15 minutes on 2 shared cores."""
    _parallel_hits(tmp_path, monkeypatch, shapes_root, [])


@pytest.mark.gpu
def test_the_helpers_entries_are_the_runs_teacher_and_losses_on_the_gpu(tmp_path, shapes_root, monkeypatch):
    """The same with what the GPU recipes ship (bf16 autocast, channels_last, CUDA graphs) and the views made on the
    GPU with their ops compiled, as `+experiment=imagenet` makes them: those graphs come from the helper too."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _parallel_hits(tmp_path, monkeypatch, shapes_root,
                   [*TINY_RESNET18, "trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
                    "compile_mode=reduce-overhead", "++backbone.channels_last=true", *VIEWS])


# ---- compile_parallel_backward: a second helper compiles the student's backward graph --------------------------
@pytest.mark.slow
def test_the_backward_helpers_entry_is_the_runs_student_backward(tmp_path, shapes_root, monkeypatch):
    """With inductor (C++ on the CPU) and both helpers: the run's first step compiles only the student's forward; the
    teacher's call and the losses come from the first helper, the student's backward from the second.
    5-15 minutes on 2 shared cores."""
    _parallel_hits(tmp_path, monkeypatch, shapes_root, [], backward=True)


@pytest.mark.slow
def test_helpers_started_before_the_set_up_give_the_run_its_entries(tmp_path, shapes_root, monkeypatch):
    """The same with the helpers started before the run's set-up and waiting for its go, as on a GPU run: the real
    `--wait-go` children build the model, wait, and compile under the run's settings and final config."""
    _parallel_hits(tmp_path, monkeypatch, shapes_root, [], backward=True, early="cpu")


@pytest.mark.gpu
def test_the_backward_helpers_entry_is_the_runs_student_backward_on_the_gpu(tmp_path, shapes_root, monkeypatch):
    """The same with what the GPU recipes ship (bf16 autocast, channels_last, CUDA graphs): the backward's cache
    key then also holds the forward's device index and the CUDA-graph flag. The helpers start before the run's
    set-up and wait for its go, as on every GPU run."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _parallel_hits(tmp_path, monkeypatch, shapes_root,
                   [*TINY_RESNET18, "trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
                    "compile_mode=reduce-overhead", "++backbone.channels_last=true"], backward=True, early="gpu")


@pytest.mark.gpu
def test_the_split_student_helpers_entries_are_the_runs_on_the_gpu(tmp_path, shapes_root, monkeypatch):
    """The student's call per view size with all four helpers, started before the set-up, with what the GPU recipes
    ship (bf16 autocast, channels_last, CUDA graphs): the run compiles only its global views' forward; the local
    views' forward, the heads' forward and backward and both views' backwards come from the helpers."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _parallel_hits(tmp_path, monkeypatch, shapes_root,
                   [*TINY_RESNET18, "trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed",
                    "compile_mode=reduce-overhead", "++backbone.channels_last=true"], backward=True, early="gpu",
                   split=True)


@pytest.mark.slow
def test_the_split_student_helpers_entries_are_the_runs(tmp_path, shapes_root, monkeypatch):
    """The same on the CPU (inductor's C++) in a real Lightning run, the helpers started at fit. 5-10 minutes on 2
    shared cores."""
    _parallel_hits(tmp_path, monkeypatch, shapes_root, [], backward=True, split=True)


def test_the_backward_helper_is_refused_without_compile_parallel_in_one_line():
    with pytest.raises(ConfigError, match="compile_parallel_backward=true is invalid with compile_parallel=false") \
            as err:
        validate_config(compose_cfg(["compile=true", "compile_parallel_backward=true"]))
    assert "\n" not in str(err.value)
    validate_config(compose_cfg(["compile=true", "compile_parallel=true", "compile_parallel_backward=true"]))


@pytest.mark.parametrize("student_misses", [2, 0], ids=["student-compiled", "student-from-cache"])
def test_the_run_waits_for_the_students_backward_only_when_it_compiled_the_students_forward(
        tmp_path, monkeypatch, student_misses):
    """A student forward the run compiled (a cache miss during its call) means its backward compiles at the first
    backward: the run waits for the helper's entry. One from the cache brought its backward along: no wait, even for
    a helper that has begun, and the part counts as built here (the helper is stopped after the first step)."""
    monkeypatch.setattr(bgc, "cache_deltas", lambda since=None: (0, student_misses, 0, 0))
    parts = bgc.PartGate(tmp_path / "s.json", lambda: False, 60.0, tmp_path / "s.log")
    back_status = tmp_path / "b.json"
    back = bgc.PartGate(back_status, lambda: False, 60.0, tmp_path / "b.log", parts=(bgc.BACKWARD_PART,))
    gates = bgc.HelperGates(parts, back)
    bgc.write_status(bgc.started_path(back_status, bgc.BACKWARD_PART), {"ok": True})
    _write_later(bgc.part_path(back_status, bgc.BACKWARD_PART), 0.5)
    for part in ASKED:
        gates(part)
    timeline = gates.timeline()
    assert list(timeline["asked_s"]) == ["teacher", "loss", bgc.BACKWARD_PART]  # "student" only marks the counters
    assert timeline["student_compiled"] is (student_misses > 0)
    waited = timeline["waited_s"][bgc.BACKWARD_PART]
    if student_misses:
        assert 0.4 <= waited < 10 and timeline["built_here"] == ["teacher", "loss"], timeline
        assert set(timeline["started_s"]) == set(timeline["ready_s"]) == {bgc.BACKWARD_PART}
    else:
        assert waited == 0.0 and timeline["built_here"] == ["teacher", "loss", bgc.BACKWARD_PART], timeline
    without = bgc.HelperGates(bgc.PartGate(tmp_path / "o.json", lambda: False, 60.0, tmp_path / "o.log"))
    for part in ASKED:
        without(part)
    assert list(without.timeline()["asked_s"]) == ["teacher", "loss"] and "student_compiled" not in without.timeline()


def _backward_run(monkeypatch, tmp_path, shapes_root, backward_command, student_misses=None):
    """`_parallel_run` with compile_parallel_backward=true: the parts' helper a stand-in that never begins, the
    backward's `python -c <backward_command> <its status path>`, begun as it starts; a `.go` file beside its status
    says the run has asked for its part. `student_misses`: the cache misses the gates see during the student's call
    (the eager backend compiles nothing)."""
    if student_misses is not None:
        monkeypatch.setattr(bgc, "cache_deltas", lambda since=None: (0, student_misses, 0, 0))

    class Backward(bgc.ParallelCompile):
        def backward_command(self, device):
            return [sys.executable, "-c", backward_command, str(self.backward_status_path)]

        def on_fit_start(self, trainer, pl_module):
            super().on_fit_start(trainer, pl_module)
            bgc.write_status(bgc.started_path(self.backward_status_path, bgc.BACKWARD_PART), {"ok": True})

        def wait_for(self, part):
            if part == bgc.BACKWARD_PART:  # the stand-in may go on: the run is at its backward
                bgc.write_status(self.backward_status_path.with_suffix(".go"), {"ok": True})
            super().wait_for(part)

    monkeypatch.setattr(bgc, "ParallelCompile", Backward)
    return _parallel_run(monkeypatch, tmp_path, shapes_root, "import time; time.sleep(600)",
                         extra=["compile_parallel_backward=true"])


def test_a_run_waits_for_the_backward_helpers_entry_and_keeps_its_status(tmp_path, shapes_root, monkeypatch,
                                                                         eager_backend):
    write = ("import sys, time; from pathlib import Path\n"
             "from scfs.training.background_compile import BACKWARD_PART, part_path, write_status\n"
             "p = Path(sys.argv[1])\n"
             "while not p.with_suffix('.go').exists(): time.sleep(0.05)\n"
             "time.sleep(0.5)\n"
             "write_status(part_path(p, BACKWARD_PART), {'ok': True})\n"
             "write_status(p, {'ok': True, 'steps': 0, 'backward_s': 0.9})\n")
    bg, calls = _backward_run(monkeypatch, tmp_path, shapes_root, write, student_misses=3)
    assert calls == ASKED and bg.report["student_compiled"] is True
    assert bg.report["waited_s"][bgc.BACKWARD_PART] >= 0.4 and bgc.BACKWARD_PART not in bg.report["built_here"]
    assert bg.report["backward_helper_stopped"] is False and bg.report["helper_stopped"] is True
    entry = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]
    assert entry["backward_helper"] == {"ok": True, "steps": 0, "backward_s": 0.9}
    assert (tmp_path / bgc.BACKWARD_STATUS_FILE).with_suffix(".yaml").is_file()  # the config it was given


def test_a_run_whose_student_came_from_the_cache_stops_the_backward_helper(tmp_path, shapes_root, monkeypatch,
                                                                           eager_backend):
    """Nothing compiled during the student's call (dynamo's eager backend stands in for a warm cache): the run does
    not wait for the backward's helper, which has begun, and stops it after the first step; the summary says so."""
    bg, calls = _backward_run(monkeypatch, tmp_path, shapes_root, "import time; time.sleep(600)")
    assert calls == ASKED and bg.report["student_compiled"] is False
    assert bg.report["waited_s"][bgc.BACKWARD_PART] == 0.0 and bgc.BACKWARD_PART in bg.report["built_here"]
    assert bg.report["backward_helper_stopped"] and bg.backward_proc.poll() is not None
    back = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]["backward_helper"]
    assert back["stopped"] and "student_backward" in back["error"]


def test_each_node_of_a_multi_node_run_gates_on_its_own_helpers_files(tmp_path):
    """In a shared run folder each node's helpers write their own files (`node<r>-...`), and the gates of that node's
    ranks read those, not another node's."""
    from types import SimpleNamespace

    strategy = SimpleNamespace(barrier=lambda name=None: None, root_device=torch.device("cpu"))
    trainer = SimpleNamespace(num_nodes=2, node_rank=1, local_rank=1, strategy=strategy)  # no helper started here
    par = bgc.ParallelCompile(compose_cfg(["compile=true", "compile_parallel=true"]), tmp_path, 8, backward=True)
    module = SimpleNamespace(compile_gate=None)
    par.on_fit_start(trainer, module)
    assert par.proc is None and par.backward_proc is None and module.compile_gate == par.wait_for
    assert par._gate.parts.status_path == tmp_path / f"node1-{bgc.STATUS_FILE}"
    assert par._gate.backward.status_path == tmp_path / f"node1-{bgc.BACKWARD_STATUS_FILE}"


# ---- compile_parallel=auto (the GPU recipes): the helpers where they apply, off by themselves elsewhere ------------
@pytest.mark.parametrize("overrides, cuda, cores, expected", [
    ([], True, 16, (True, True)),
    (["compile_parallel_backward=false"], True, 16, (True, False)),
    ([], False, 16, (False, False)),
    ([], True, ch.AUTO_MIN_CORES - 1, (False, False)),
    (["compile=false"], True, 16, (False, False)),
    (["compile_scope=blocks"], True, 16, (False, False)),
    (["compile_background=true"], True, 16, (False, False)),
    (["sync_bn=true"], True, 16, (False, False)),
    (["compile_backend=cudagraphs", "compile_mode=default"], True, 16, (False, False)),
    (["compile_parallel=true"], False, 2, (True, True)),
    (["compile_parallel=false"], True, 16, (False, False)),
], ids=["gpu", "gpu-no-backward", "no-cuda", "few-cores", "eager", "blocks", "background", "sync-bn", "cudagraphs",
        "true-anywhere", "false"])
def test_auto_starts_the_helpers_only_where_they_apply(overrides, cuda, cores, expected):
    cfg = compose_cfg(["compile=true", "compile_parallel=auto", "compile_parallel_backward=auto", *overrides])
    validate_config(cfg)  # auto is never refused: it resolves to off where it does not apply
    assert ch.parallel_helpers(cfg, cuda, cores) == expected
    if not any(o.startswith("compile_parallel=") for o in overrides):  # auto's own verdict
        assert (ch.auto_parallel_off_reason(cfg, cuda, cores) is None) == expected[0]


def test_auto_values_are_checked_and_an_explicit_true_still_refused_in_one_line():
    validate_config(compose_cfg(["compile=true", "compile_parallel=auto", "compile_parallel_backward=true"]))
    for key in ("compile_parallel", "compile_parallel_backward"):
        with pytest.raises(ConfigError, match=f"{key}='maybe' is invalid: expected true, false or auto"):
            validate_config(compose_cfg(["compile=true", f"{key}=maybe"]))
    with pytest.raises(ConfigError, match="compile_parallel_backward=true is invalid with compile_parallel=false.*"
                                          "set compile_parallel=true or auto"):
        validate_config(compose_cfg(["compile=true", "compile_parallel=false", "compile_parallel_backward=true"]))


@pytest.mark.parametrize("recipe", ["cifar10", "imagenet"])
def test_the_gpu_recipes_ship_auto_and_stay_eager_or_single_process_where_it_does_not_apply(recipe):
    from helpers import CONF
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        recipe_ov = [f"+experiment={recipe}", "data=shapes"]  # data the test machine has
        cfg = compose(config_name="config", overrides=recipe_ov)
        eager = compose(config_name="config", overrides=[*recipe_ov, "compile=false"])
        ddp = compose(config_name="config", overrides=[*recipe_ov, "trainer=ddp", "sync_bn=true"])
    assert (cfg.compile_parallel, cfg.compile_parallel_backward) == ("auto", "auto")
    assert ch.parallel_helpers(cfg, cuda=True, cores=16) == (True, True)
    validate_config(eager)  # "compile=false for eager", as the recipes say, needs no third key
    for other in (eager, ddp):
        assert ch.parallel_helpers(other, cuda=True, cores=16) == (False, False)


def test_the_run_resolves_auto_for_its_machine_and_says_why_it_left_the_helpers_off(tmp_path, monkeypatch, caplog):
    from scfs.training import setup

    cfg = compose_cfg(["compile=true", "compile_parallel=auto", "compile_parallel_backward=auto"])
    caplog.set_level(logging.INFO, logger="scfs.train")
    monkeypatch.setattr(setup, "eval_device", lambda cfg: torch.device("cpu"))
    assert setup.parallel_compile_callbacks(cfg, tmp_path, 8) == []
    assert any(r.getMessage() == "compile_parallel=auto: off here (no CUDA device); the run compiles its step alone"
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    monkeypatch.setattr(setup, "eval_device", lambda cfg: torch.device("cuda", 0))
    monkeypatch.setattr(ch, "cpu_cores", lambda: 16)
    (cb,) = setup.parallel_compile_callbacks(cfg, tmp_path, 8)
    assert isinstance(cb, bgc.ParallelCompile) and cb.backward and cb.batch_size == 8
    monkeypatch.setattr(ch, "cpu_cores", lambda: 4)
    assert setup.parallel_compile_callbacks(cfg, tmp_path, 8) == []
    assert "compile_parallel=auto: off here (4 CPU cores (it needs 8))" in caplog.text

"""`compile_parallel_backward`: a helper process compiles the student's backward graph, the run's backward loads it."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from helpers import TINY_RESNET18, compose_cfg

import scfs.training.background_compile as bgc
import scfs.training.compile_helpers as ch
from scfs.training import backward_helper as bh
from scfs.training import compile_child


def test_the_helper_compiles_under_the_runs_compile_mode():
    assert bh.inductor_patches(None) == {}
    assert bh.inductor_patches("reduce-overhead")["triton.cudagraphs"] is True  # CUDA graphs: in the cache key


def test_a_call_that_ran_or_failed_is_not_taken_for_a_compiled_one():
    with pytest.raises(RuntimeError, match="the call ran"):
        bh.call_until_compiled(lambda x: x + 1, 1)
    with pytest.raises(ZeroDivisionError):
        bh.call_until_compiled(lambda x: x / 0, 1)
    bh.call_until_compiled(bh.stop_before_running, [])  # stopped before running: compiled


def test_a_failing_backward_helper_says_so_and_writes_no_entry_file(tmp_path, monkeypatch):
    """The run waits for a begun part until it is written or the helper ended: a failure must end the helper with
    a failed status (read by every rank) and never write the part's file."""
    from omegaconf import OmegaConf

    def boom(model, cfg, device, graph):
        raise RuntimeError("lowering failed")

    monkeypatch.setattr(bh, "compile_student_backward", boom)
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true", "compile_parallel_backward=true"]),
                           batch_size=8)
    assert not cfg.compile_parallel_backward  # the child starts no helper of its own
    OmegaConf.save(cfg, tmp_path / "c.yaml")
    status_path = tmp_path / "b.json"
    status = compile_child.compile_in_child(tmp_path / "c.yaml", status_path, "cpu", steps=0, backward=True)
    assert not status["ok"] and status["error"] == "RuntimeError: lowering failed"
    assert json.loads(status_path.read_text()) == status
    assert bgc.started_path(status_path, bgc.BACKWARD_PART).exists()
    assert not bgc.part_path(status_path, bgc.BACKWARD_PART).exists()


def test_the_backward_helpers_command_line_says_backward(tmp_path):
    cmd = compile_child.child_command(tmp_path / "c.yaml", tmp_path / "b.json", "cuda:0", 0, backward=True)
    assert "--backward" in cmd and "--helper" not in cmd
    assert "--backward" not in compile_child.child_command(tmp_path / "c.yaml", tmp_path / "s.json", "cpu", 1,
                                                           helper=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_the_runs_student_backward_loads_the_backward_helpers_entry(tmp_path, monkeypatch, mode):
    """What the option rests on, with inductor (C++ on the CPU) on the tiny default: the helper process, run first on
    an empty cache folder, compiles the student's backward graph without running the call; the run's own step in
    this process then compiles everything before its backward (misses only), and its backward finds exactly one
    entry, the student's backward (the losses' backward, which no helper compiled here, misses).
    `reduce-overhead` on the CPU: the run's forward turns CUDA graphs off (CPU nodes), which the backward's key
    records, so the helper must turn them off too (`forward_disables_cudagraphs`). 2-4 minutes each on 2 shared
    cores."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose_cfg(["compile=true", "compile_parallel=true", "compile_parallel_backward=true",
                       f"compile_mode={mode}"])
    status_path = tmp_path / "b.json"
    proc = compile_child.start_child(cfg, int(cfg.batch_size), status_path, "cpu", steps=0, backward=True)
    assert proc.wait(timeout=1500) == 0, status_path.with_suffix(".log").read_text()[-3000:]
    status = json.loads(status_path.read_text())
    assert status["ok"] and status["steps"] == 0 and status["backward_s"] > 0, status
    assert bgc.part_path(status_path, bgc.BACKWARD_PART).exists()

    marks, start, end = _first_step_marks(cfg)
    before = dict(marks)["student_backward"]
    assert before[0] - start[0] == 0 and before[1] - start[1] >= 3, (start, before)  # student, teacher, losses
    assert (end[0] - before[0], end[1] - before[1]) == (1, 1), (before, end)  # its entry, the losses' backward


def _first_step_marks(cfg, device: str = "cpu"):
    """The run's first step of `cfg` on `device` in this process (a fresh dynamo), compiled: what its gate was asked,
    each with the cache counters then, and the counters before and after the step."""
    import torch._dynamo

    from scfs.train import build
    from scfs.training.plain_step import cache_counters, make_step

    torch._dynamo.reset()
    torch.manual_seed(int(cfg.seed))
    model = build(cfg)[1].to(device).train()
    step = make_step(model, cfg, device, model.configure_optimizers())
    marks = []
    model.compile_gate = lambda part: marks.append((part, cache_counters()))
    start = cache_counters()
    step(0)
    end = cache_counters()
    torch._dynamo.reset()
    return marks, start, end


def test_the_helper_turns_cuda_graphs_off_where_the_compiled_forward_would():
    """The checks inductor's compiled forward makes after its lowering, on a lowered graph's fields: CUDA graphs stay
    on for one CUDA device and tensor inputs; a reason found while lowering, a CPU node or a non-tensor input turns
    them off."""
    from types import SimpleNamespace

    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    node = next(iter(gm.graph.nodes))
    cuda = {torch.device("cuda", 0): node}
    x = torch.zeros(4)

    def lowered(reason=None, devices=cuda):
        return SimpleNamespace(disable_cudagraphs_reason=reason, module=gm, device_node_mapping=devices)

    assert not bh.forward_disables_cudagraphs(lowered(), [x])
    assert bh.forward_disables_cudagraphs(lowered(reason="incompatible op"), [x])
    assert bh.forward_disables_cudagraphs(lowered(devices={torch.device("cpu"): node}), [x])
    assert bh.forward_disables_cudagraphs(lowered(), [x, 3.0])


@pytest.mark.slow
def test_the_split_student_calls_helpers_write_the_runs_local_forward_and_both_backwards(tmp_path, monkeypatch):
    """`compile_student_graphs=per_view_size` with inductor (C++ on the CPU) on the tiny default, on an empty cache
    folder: the backward's helper compiles the global views' graph's backward and the local backward's helper the
    local one's; then the local views' helper compiles that graph's forward, runs its backward from the local
    backward's entry (which completes AOTAutograd's entry of the graph), and compiles the heads' graph, forward and
    backward. The run's own step then compiles its global views' graph (misses), builds the local views' graph,
    forward and backward, from AOTAutograd's entry (one hit; two inductor hits, no miss), the heads' likewise, and
    at the backward finds the global views' backward (one hit; the losses' backward, which no helper compiled,
    misses). The local helper starts once the backwards' helpers are done, so that it finds the local backward's
    entry within its short wait on these shared cores. 5-8 minutes on 2 shared cores."""
    _split_helpers_then_first_step(tmp_path, monkeypatch, [], "cpu")


@pytest.mark.gpu
def test_the_split_student_calls_helpers_write_the_runs_local_forward_and_both_backwards_on_the_gpu(
        tmp_path, monkeypatch):
    """The same with what the GPU recipes ship (bf16 autocast, channels_last, CUDA graphs): there the local views'
    helper's backward ends its graph's CUDA-graph step, so the heads' graph after it must not read that graph's
    outputs in place (`owned_copies`)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _split_helpers_then_first_step(tmp_path, monkeypatch,
                                   [*TINY_RESNET18, "trainer.accelerator=gpu", "trainer.devices=1",
                                    "trainer.precision=bf16-mixed", "compile_mode=reduce-overhead",
                                    "++backbone.channels_last=true"], ch.early_device())


def _split_helpers_then_first_step(tmp_path, monkeypatch, overrides: list[str], device: str) -> None:
    """The helpers of the student's call per view size on `device` (the backwards' two, then the local views'),
    then the run's first step in this process, checked as the tests above say."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose_cfg([*overrides, "compile=true", "compile_parallel=true", "compile_parallel_backward=true",
                       "compile_student_graphs=per_view_size"])
    roles = ch.helper_roles(True, True, ch.splits_student(cfg))
    assert roles == ("backward", "local_backward", "local", "parts")
    for group in (roles[:2], roles[2:3]):  # the backwards' helpers, then the local views' helper
        procs = {}
        for role in group:
            path = tmp_path / ch.ROLES[role].status_file
            command = functools.partial(compile_child.role_child_command, role, path, device)
            procs[role] = (path, compile_child.start_child(cfg, int(cfg.batch_size), path, device, command=command))
        for role, (path, proc) in procs.items():
            assert proc.wait(timeout=1500) == 0, path.with_suffix(".log").read_text()[-3000:]
            status = json.loads(path.read_text())
            assert status["ok"] and status["steps"] == 0, status
            assert status.get("graph", "local") == {"backward": "global", "local_backward": "local",
                                                    "local": "local"}[role], status
            assert all(bgc.part_path(path, part).exists() for part in ch.ROLES[role].parts), role
            if role == "local":  # the seconds each of its two parts took, and the local backward run
                assert status["local_s"] > 0 and status["heads_s"] > 0 and status["local_backward_run"], status

    marks, start, end = _first_step_marks(cfg, device)
    at = dict(marks)
    assert [p for p, _ in marks] == ["student", ch.LOCAL_PART, ch.HEADS_PART, "teacher", "loss", "student_backward"]
    local, heads, teacher, back = at[ch.LOCAL_PART], at[ch.HEADS_PART], at["teacher"], at["student_backward"]
    assert local[0] - start[0] == 0 and local[1] - start[1] >= 1, (start, local)  # the global views' graph
    # the local views' forward and backward from the local helper's AOTAutograd entry
    assert tuple(h - lo for h, lo in zip(heads, local, strict=True)) == (2, 0, 1, 0), (local, heads)
    # the heads' forward and backward from the local helper's AOTAutograd entry
    assert tuple(t - h for t, h in zip(teacher, heads, strict=True)) == (2, 0, 1, 0), (heads, teacher)
    assert (end[0] - back[0], end[1] - back[1]) == (1, 1), (back, end)  # the global views' backward; the losses' missed

"""`compile_parallel` with the student's call per view size (`compile_student_graphs=per_view_size`): the helpers
of the local views' graph and of both graphs' backwards, their files, command lines and the run's gates."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import compose_cfg

import scfs.training.background_compile as bgc
import scfs.training.compile_helpers as ch
from scfs.training import compile_child

SPLIT = "compile_student_graphs=per_view_size"
# what the method asks its gate for in a split step, in order
ASKED_SPLIT = ["student", ch.LOCAL_PART, ch.HEADS_PART, "teacher", "loss", ch.BACKWARD_PART]


@pytest.mark.parametrize("overrides, expected", [
    ([SPLIT], True),
    ([], False),
    ([SPLIT, "crops.n_local=0"], False),
], ids=["split", "one-graph", "no-local-views"])
def test_a_run_splits_the_student_call_only_per_view_size_with_local_views(overrides, expected):
    assert ch.splits_student(compose_cfg(overrides)) is expected


def test_the_helpers_roles_and_files_follow_the_options(tmp_path):
    assert ch.helper_roles(False, True, True) == ()
    assert ch.helper_roles(True, False, False) == ("parts",)
    assert ch.helper_roles(True, True, False) == ("backward", "parts")
    assert ch.helper_roles(True, False, True) == ("local", "parts")
    assert ch.helper_roles(True, True, True) == ("backward", "local_backward", "local", "parts")
    paths = ch.early_paths(tmp_path, backward=True, split=True)
    assert list(paths) == ["backward", "local_backward", "local", "parts"]
    assert len({p.name for p in paths.values()}) == 4 and paths["parts"] == tmp_path / ch.STATUS_FILE
    assert ch.early_paths(tmp_path, backward=True) == {"backward": tmp_path / ch.BACKWARD_STATUS_FILE,
                                                        "parts": tmp_path / ch.STATUS_FILE}


@pytest.mark.parametrize("role, flags", [
    ("parts", {"--helper"}), ("backward", {"--backward"}), ("local", {"--local"}),
    ("local_backward", {"--backward", "--local"}),
])
def test_each_roles_command_line_names_its_part_and_carries_the_runs_settings(tmp_path, role, flags):
    cmd = compile_child.role_child_command(role, tmp_path / "s.json", "cuda:0")
    assert {f for f in cmd if f in ("--helper", "--backward", "--local")} == flags
    assert cmd[cmd.index("--steps") + 1] == str(ch.ROLES[role].steps) and "--settings" in cmd
    early = ch.role_command(role, tmp_path / "s.json", "cuda:0", wait_go=True)
    assert "--wait-go" in early and "--settings" not in early


def test_the_local_views_helper_refuses_a_one_graph_config_in_its_status(tmp_path):
    """A local views' helper started for a config that compiles the student's call as one graph has no such graph
    to compile: it fails with one line in its status and writes no part file (the run then compiles it)."""
    from omegaconf import OmegaConf

    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    OmegaConf.save(cfg, tmp_path / "c.yaml")
    status = compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "l.json", "cpu", steps=0, local=True)
    assert not status["ok"] and "compile_student_graphs=per_view_size" in status["error"]
    assert not bgc.part_path(tmp_path / "l.json", ch.LOCAL_PART).exists()


def test_the_local_views_helper_traces_only_the_graphs_the_run_asks_for(tmp_path, monkeypatch):
    """The local views' helper traces two graphs: the student's call on the local views and the heads'. The global
    views' features it feeds the heads run eager, although the backbone is compiled in place as well: a third,
    backbone-sized graph there would hold the heads' entry back while the run waits for it. Dynamo's own tracing,
    with a backend that records each graph and runs it as traced, so no kernel is generated."""
    from helpers import TINY_RESNET18

    from scfs.training.build import build

    traced: list = []

    def record(gm, example_inputs):
        traced.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    compile_ = torch.compile

    def compile_recorded(fn=None, **kw):
        kw.pop("mode", None)
        return compile_(fn, **{**kw, "backend": record})

    monkeypatch.setattr(torch, "compile", compile_recorded)
    torch._dynamo.reset()
    cfg = compose_cfg([*TINY_RESNET18, "compile=true", SPLIT, "compile_mode=default"])
    torch.manual_seed(0)
    model = build(cfg)[1].train()
    status = compile_child._compile_local_graphs(model, cfg, "cpu", tmp_path / "l.json")
    torch._dynamo.reset()
    assert set(status) == {"steps", "local_s", "local_forward_s", "heads_s", "local_backward_run"}
    assert not status["local_backward_run"]
    assert len(traced) == 2, [names[:2] for names in traced]
    backbone, heads = traced
    assert "l_x_" in backbone and backbone[0].startswith("l_student_modules_backbone_"), backbone[:3]
    assert heads[0] == "l_f_l_pooled_", heads[:3]
    assert bgc.part_path(tmp_path / "l.json", ch.HEADS_PART).exists()


def _gates(tmp_path: Path, begun: tuple[str, ...], wait_s: float = 60.0) -> bgc.HelperGates:
    """The run's gates beside the four helpers of a split step (none of them ends); `begun`: the roles whose
    part has begun."""
    paths = {role: tmp_path / ch.ROLES[role].status_file for role in ch.helper_roles(True, True, True)}
    for role in begun:
        for part in ch.ROLES[role].parts:
            bgc.write_status(bgc.started_path(paths[role], part), {"ok": True})
    return bgc.HelperGates.for_helpers(paths, {role: (lambda: False) for role in paths}, wait_s)


def _later(path: Path, after_s: float) -> None:
    threading.Timer(after_s, lambda: bgc.write_status(path, {"ok": True})).start()


@pytest.mark.parametrize("local_backward, expected", [
    ("absent", False), ("begun", False), ("written", True), ("written later", True), ("ended without it", False),
    ("written, the run asked", False), ("begun, the run asks", False),
])
def test_the_local_helper_runs_the_local_backward_only_once_its_entry_is_written_before_the_run_asks(
        tmp_path, local_backward, expected):
    """`runs_local_backward`: the local views' helper runs that graph's backward (for AOTAutograd's entry) only
    where the local backward's helper has written its entry, now or within the short wait, and the run has not yet
    asked for the local views' graph (`asked_path`); a helper that never began it, ended without it or is still at
    it when the wait ends, or a run that asks, means no backward run, at once where nothing is coming."""
    local = tmp_path / ch.LOCAL_STATUS_FILE
    other = tmp_path / ch.LOCAL_BACKWARD_STATUS_FILE
    if local_backward != "absent":
        bgc.write_status(bgc.started_path(other, ch.LOCAL_BACKWARD_PART), {"ok": True})
    if local_backward in ("written", "written, the run asked"):
        bgc.write_status(bgc.part_path(other, ch.LOCAL_BACKWARD_PART), {"ok": True})
    if local_backward == "written later":
        _later(bgc.part_path(other, ch.LOCAL_BACKWARD_PART), 0.3)
    if local_backward == "ended without it":
        bgc.write_status(other, {"ok": False, "error": "RuntimeError: x"})
    if local_backward == "written, the run asked":
        bgc.write_status(ch.asked_path(local, ch.LOCAL_PART), {"ok": True})
    if local_backward == "begun, the run asks":
        _later(ch.asked_path(local, ch.LOCAL_PART), 0.3)
    t0 = time.monotonic()
    wait_s = 1.5 if expected else 0.5 + 1.5 * ("asks" in local_backward)
    assert compile_child.runs_local_backward(local, timeout_s=wait_s) is expected
    took = time.monotonic() - t0
    if local_backward in ("absent", "written", "ended without it", "written, the run asked"):
        assert took < 0.2, took
    elif local_backward == "begun":
        assert 0.5 <= took < 1.5, took
    elif local_backward == "begun, the run asks":  # the wait ends at the ask, well before its 2 s
        assert 0.25 <= took < 1.0, took
    # the local backward's own helper never waits on itself
    assert compile_child.runs_local_backward(other, timeout_s=0.5) is False


def test_the_runs_gate_marks_each_part_asked_and_a_new_helper_starts_without_the_marks(tmp_path):
    """The run's gate writes `asked_path` for each part it asks for, before waiting (the local views' helper reads
    it, `runs_local_backward`); starting a helper clears an earlier run's marks with its other files."""
    gates = _gates(tmp_path, begun=())
    for part in ("student", ch.LOCAL_PART, ch.HEADS_PART):
        gates(part)
    local = tmp_path / ch.LOCAL_STATUS_FILE
    assert ch.asked_path(local, ch.LOCAL_PART).exists() and ch.asked_path(local, ch.HEADS_PART).exists()
    ch.launch(compose_cfg([SPLIT]), 8, local, ["true"]).wait()
    assert not ch.asked_path(local, ch.LOCAL_PART).exists() and not ch.asked_path(local, ch.HEADS_PART).exists()


def test_the_heads_inputs_are_copies_with_the_graphs_strides_in_memory_of_their_own():
    """`owned_copies`: what the local views' helper hands the heads' graph once its own graph's backward has run (CUDA
    graphs may then overwrite that graph's outputs): each tensor in new memory, equal, with the original's shape,
    strides, dtype and `requires_grad` (the heads' graph's cache key), cut from the original's autograd graph."""
    base = torch.randn(4, 6, requires_grad=True)
    maps = (base.view(4, 6, 1, 1).expand(4, 6, 3, 3) * 1).contiguous(memory_format=torch.channels_last)
    tree = {"pooled": base * 2, "gaps": {"layer3": base.t() * 1, "layer4": maps}, "size": {"layer4": 3},
            "kept": torch.arange(5)}
    copies = compile_child.owned_copies(tree)
    assert copies["size"] == {"layer4": 3}
    for name, t, c in [("pooled", tree["pooled"], copies["pooled"]), ("kept", tree["kept"], copies["kept"]),
                       *[(k, v, copies["gaps"][k]) for k, v in tree["gaps"].items()]]:
        assert torch.equal(c, t) and (c.shape, c.stride(), c.dtype) == (t.shape, t.stride(), t.dtype), name
        assert c.data_ptr() != t.data_ptr() and c.is_leaf and c.requires_grad is t.requires_grad, name
    assert tree["gaps"]["layer3"].stride() == (1, 6)  # a transposed output keeps its strides, not made contiguous
    copies["pooled"].sum().backward()
    assert base.grad is None and copies["pooled"].grad is not None


@pytest.mark.parametrize("local_aot_hits", [0, 1], ids=["local-built-here", "local-from-aot-cache"])
def test_the_run_waits_for_the_local_views_graph_and_its_backward_only_when_needed(tmp_path, monkeypatch,
                                                                                   local_aot_hits):
    """The run waits for the local helper's forward (begun), and at the backward for the local backward's helper
    unless AOTAutograd's cache brought that graph's backward along (a hit during the local views' graph); the
    global views' backward is waited for because the run compiled that graph (misses during it)."""
    deltas = {"n": 0}

    def fake_deltas(since=None):  # first read: the global views' graph (2 misses); second: the local one's
        deltas["n"] += 1
        return (0, 2, 0, 0) if deltas["n"] == 1 else (1, 0, local_aot_hits, 0)

    monkeypatch.setattr(bgc, "cache_deltas", fake_deltas)
    gates = _gates(tmp_path, begun=("local", "local_backward", "backward"))
    path = {role: tmp_path / ch.ROLES[role].status_file for role in ch.ROLES}
    _later(bgc.part_path(path["local"], ch.LOCAL_PART), 0.3)
    _later(bgc.part_path(path["local"], ch.HEADS_PART), 0.45)
    _later(bgc.part_path(path["backward"], ch.BACKWARD_PART), 0.8)
    _later(bgc.part_path(path["local_backward"], ch.LOCAL_BACKWARD_PART), 1.1)
    for part in ASKED_SPLIT:
        gates(part)
    timeline = gates.timeline()
    assert timeline["student_compiled"] is True and timeline["local_brought_backward"] is bool(local_aot_hits)
    assert list(timeline["asked_s"]) == ["teacher", "loss", ch.BACKWARD_PART, ch.LOCAL_PART, ch.HEADS_PART,
                                         ch.LOCAL_BACKWARD_PART]
    assert timeline["waited_s"][ch.LOCAL_PART] >= 0.2
    assert timeline["waited_s"][ch.HEADS_PART] >= 0.05  # written 0.15 s after the local views' graph
    assert timeline["waited_s"][ch.BACKWARD_PART] >= 0.2
    if local_aot_hits:
        assert timeline["waited_s"][ch.LOCAL_BACKWARD_PART] == 0.0
        assert ch.LOCAL_BACKWARD_PART in timeline["built_here"]
    else:
        assert timeline["waited_s"][ch.LOCAL_BACKWARD_PART] >= 0.1  # written 0.3 s after the global one's
        assert ch.LOCAL_BACKWARD_PART not in timeline["built_here"]
    assert ch.LOCAL_PART not in timeline["built_here"] and ch.HEADS_PART not in timeline["built_here"]
    stopped = gates.stop_behind({})
    assert set(stopped) == {"parts", "backward", "local", "local_backward"} and not any(stopped.values())


def test_the_heads_graph_is_waited_for_only_once_the_local_helper_has_begun_it(tmp_path):
    """"student_heads" is the local views' helper's second part: the run waits for it once that helper has begun it;
    a heads' graph it has not begun is built here at once, and the helper is then stopped after the first step."""
    gates = _gates(tmp_path, begun=())
    for part in ("student", ch.LOCAL_PART, ch.HEADS_PART):
        gates(part)
    timeline = gates.timeline()
    assert timeline["waited_s"][ch.HEADS_PART] < 0.05
    assert timeline["built_here"] == [ch.LOCAL_PART, ch.HEADS_PART]  # neither begun by the helper
    stopped = gates.stop_behind({"local": None})
    assert stopped["local"] is False  # no process to stop here; `stop_helper_if_behind` is tested on its own
    (tmp_path / "begun").mkdir()
    gates = _gates(tmp_path / "begun", begun=("local",))
    path = tmp_path / "begun" / ch.ROLES["local"].status_file
    bgc.write_status(bgc.part_path(path, ch.LOCAL_PART), {"ok": True})
    _later(bgc.part_path(path, ch.HEADS_PART), 0.3)
    for part in ("student", ch.LOCAL_PART, ch.HEADS_PART):
        gates(part)
    timeline = gates.timeline()
    assert timeline["waited_s"][ch.HEADS_PART] >= 0.2 and timeline["built_here"] == [], timeline


def test_the_callback_starts_all_four_helpers_and_reports_each(tmp_path, monkeypatch):
    """`ParallelCompile` of a split run names the four helpers' files (per node), starts the three besides the parts'
    one with their roles' command lines, and puts each one's status in the summary under its own key."""
    from types import SimpleNamespace

    import torch

    started: list[tuple[Path, list[str]]] = []

    class Proc:
        pid, returncode = 1, None

        def poll(self):
            return None

    def start_child(cfg, batch_size, status_path, device, command=None, **kw):
        started.append((status_path, command() if callable(command) else command))
        return Proc()

    monkeypatch.setattr(bgc, "start_child", start_child)
    monkeypatch.setattr(bgc.ChildCompile, "_start_child", lambda self, trainer: None)
    strategy = SimpleNamespace(barrier=lambda name=None: None, root_device=torch.device("cpu"))
    trainer = SimpleNamespace(num_nodes=1, node_rank=0, local_rank=0, strategy=strategy)
    cfg = compose_cfg(["compile=true", "compile_parallel=true", "compile_parallel_backward=true", SPLIT])
    par = bgc.ParallelCompile(cfg, tmp_path, 8, backward=True)
    module = SimpleNamespace(compile_gate=None)
    par.on_fit_start(trainer, module)
    assert [p.name for p, _ in started] == [ch.BACKWARD_STATUS_FILE, ch.LOCAL_BACKWARD_STATUS_FILE,
                                            ch.LOCAL_STATUS_FILE]
    assert ["--local" in cmd for _, cmd in started] == [False, True, True]
    assert set(par._gate.gates()) == {"parts", "backward", "local", "local_backward"}
    bgc.write_status(tmp_path / ch.LOCAL_STATUS_FILE, {"ok": True, "local_s": 1.0})
    assert par.summary_entry()["local_helper"] == {"ok": True, "local_s": 1.0}

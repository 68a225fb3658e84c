"""Compiled SCFS step: every stage head's call stays compiled (dynamo's per-code-object graph limit)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.config as dynamo_config

from scfs.methods.networks import GRAPHS_PER_STAGE, RECOMPILE_SLACK, raise_recompile_limit
from scfs.models import StageHead


def _run_stage_heads(n_stages: int) -> None:
    """The calls a training step makes into `StageHead.forward`: per stage, the teacher's global maps without
    grad, the student's global and local maps with grad (own channels and map sizes per stage)."""
    for i in range(n_stages):
        student = StageHead(8 * (i + 1), out_dim=12, hidden_dim=16, bottleneck_dim=8)
        teacher = copy.deepcopy(student)
        for head in (student, teacher):
            head.compile(backend="eager", dynamic=False)
        size = 8 >> i
        with torch.no_grad():
            teacher(torch.randn(2, 8 * (i + 1), size, size))
        student(torch.randn(2, 8 * (i + 1), size, size)).sum().backward()
        student(torch.randn(4, 8 * (i + 1), max(size // 2, 1), max(size // 2, 1))).sum().backward()


def test_default_limit_drops_the_last_stage_head_to_eager():
    """Without raising the limit, three stages exceed dynamo's default of 8 graphs for `StageHead.forward` (the
    H200 run's 'hit config.recompile_limit (8)'): here made a hard failure so it cannot pass silently."""
    torch._dynamo.reset()
    with (dynamo_config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True),
          pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit)):
        _run_stage_heads(3)
    torch._dynamo.reset()


def test_raised_limit_keeps_every_stage_head_compiled():
    torch._dynamo.reset()
    with dynamo_config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        assert raise_recompile_limit(3) == GRAPHS_PER_STAGE * 3 + RECOMPILE_SLACK
        _run_stage_heads(3)
    torch._dynamo.reset()


def test_limit_is_never_lowered():
    with dynamo_config.patch(recompile_limit=100):
        assert raise_recompile_limit(3) == 100
        assert dynamo_config.recompile_limit == 100


def _tiny_network():
    from scfs.methods.networks import build_network

    method = {"out_dim": 16, "hidden_dim": 16, "bottleneck_dim": 8, "stage_out_dim": 12, "stage_hidden_dim": 16,
              "stage_bottleneck_dim": 8}
    backbone = {"name": "resnet18", "cifar_stem": True, "layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16]}
    return build_network(backbone, method, ("layer2", "layer3", "layer4"))


# The tracing tests on the CPU and, under `-m gpu`, on CUDA: a code path taken only on the GPU (the search's CUDA
# kernel, a device check) or the GPU machine's torch release can break a graph that traces whole on the CPU.
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_student_and_teacher_calls_trace_as_one_graph_each(device):
    """The step's student call (backbone on both view sizes, DINO head, stage heads) and teacher call compile
    to one graph each, without graph breaks: a break would split them into several graphs again, each a CUDA
    graph launch under reduce-overhead, and sum the shared weights' gradients outside the compiled backward."""
    from scfs.methods.networks import student_forward, teacher_forward

    net = _tiny_network().to(device)
    stages = ("layer2", "layer3", "layer4")
    g, loc = torch.randn(4, 3, 32, 32, device=device), torch.randn(8, 3, 16, 16, device=device)
    torch._dynamo.reset()
    student = torch._dynamo.explain(student_forward)(net, g, loc, stages, True)
    assert (student.graph_count, student.graph_break_count) == (1, 0), student.break_reasons
    with torch.no_grad():
        teacher = torch._dynamo.explain(teacher_forward)(net, g, stages)
    assert (teacher.graph_count, teacher.graph_break_count) == (1, 0), teacher.break_reasons
    torch._dynamo.reset()


def test_compiled_student_call_matches_eager_with_gradients():
    """`student_forward` compiled (inductor, static shapes) gives the eager outputs and weight gradients."""
    from scfs.methods.networks import student_forward

    torch.manual_seed(0)
    eager_net = _tiny_network()
    compiled_net = copy.deepcopy(eager_net)
    torch._dynamo.reset()
    _assert_same_call_and_gradients(eager_net, compiled_net, torch.compile(student_forward, dynamic=False), True)
    torch._dynamo.reset()


def _assert_same_call_and_gradients(eager_net, other_net, other_call, local_heads: bool) -> None:
    """`other_call` on `other_net` (a copy of `eager_net`) gives eager `student_forward`'s outputs on `eager_net`,
    and a loss on them the same weight gradients, on one batch of global and local views."""
    from scfs.methods.networks import student_forward

    stages = ("layer2", "layer3", "layer4")
    g, loc = torch.randn(4, 3, 32, 32), torch.randn(8, 3, 16, 16)
    outs = []
    for net, fn in ((eager_net, student_forward), (other_net, other_call)):
        out = fn(net, g, loc, stages, local_heads)
        loss = out["logits"].square().mean() + sum(v.square().mean() for k in ("stage_global", "stage_local")
                                                   for v in out[k].values())
        loss.backward()
        outs.append(out)
    for k in ("pooled_global", "logits"):
        torch.testing.assert_close(outs[1][k], outs[0][k], rtol=1e-4, atol=1e-5)
    assert outs[1]["stage_local"].keys() == outs[0]["stage_local"].keys() == (set(stages) if local_heads else set())
    for k in ("stage_global", "stage_local", "queries"):
        for s in outs[0][k]:
            torch.testing.assert_close(outs[1][k][s], outs[0][k][s], rtol=1e-4, atol=1e-5, msg=f"{k}.{s}")
    assert set(outs[0]["queries"]) == set(outs[0]["stage_global"]) == set(stages)
    assert outs[1]["local_size"] == outs[0]["local_size"] == {"layer2": 8, "layer3": 4, "layer4": 2}
    grads = 0
    for (name, p), q in zip(eager_net.named_parameters(), other_net.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            grads += 1
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert grads > 0


def _split_call(backend: str | object = "inductor"):
    """`SelfDistillation.split_student_call` as `compile_student_graphs=per_view_size` builds it, on a stand-in for
    the method (the two compiled functions and a gate that records what it was asked)."""
    from types import SimpleNamespace

    from scfs.methods.base import SelfDistillation
    from scfs.methods.networks import student_head_outputs, student_view_features

    asked: list[str] = []
    me = SimpleNamespace(_features_fn=torch.compile(student_view_features, backend=backend, dynamic=False),
                         _heads_fn=torch.compile(student_head_outputs, backend=backend, dynamic=False),
                         compile_gate=asked.append)
    return (lambda *args: SelfDistillation.split_student_call(me, *args)), asked


def test_the_split_student_call_is_three_graphs_and_asks_the_gate_between_them():
    """Per view size, the student's call is one graph per view batch (the same code at two shapes) and one for
    the heads, with no graph break; the gate is asked for the local views' graph and for the heads, in order."""
    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    net = _tiny_network()
    stages = ("layer2", "layer3", "layer4")
    g, loc = torch.randn(4, 3, 32, 32), torch.randn(8, 3, 16, 16)
    torch._dynamo.reset()
    call, asked = _split_call(counting)
    call(net, g, loc, stages, True)
    assert len(graphs) == 3 and asked == ["student_local", "student_heads"], (graphs, asked)
    call(net, g, loc, stages, True)  # the second step: no recompile
    assert len(graphs) == 3
    torch._dynamo.reset()


@pytest.mark.parametrize("local_heads", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_the_split_student_call_matches_the_eager_call_with_gradients(local_heads):
    """The three graphs of `compile_student_graphs=per_view_size` (inductor) give `student_forward`'s eager
    outputs and weight gradients, with and without the stage heads on the local views."""

    torch.manual_seed(0)
    eager_net = _tiny_network()
    split_net = copy.deepcopy(eager_net)
    torch._dynamo.reset()
    call, _ = _split_call()
    _assert_same_call_and_gradients(eager_net, split_net, call, local_heads)
    torch._dynamo.reset()


def _method_and_outputs(overrides: list[str], device: str = "cpu"):
    """A tiny method from the real config and one step's student (with grad) and teacher outputs."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import compose_cfg

    from scfs.methods.networks import student_forward, teacher_forward
    from scfs.train import build

    torch.manual_seed(0)
    _, method = build(compose_cfg(overrides))
    method = method.to(device)
    g = torch.randn(8, 3, 32, 32, device=device)
    loc = torch.randn(12, 3, 16, 16, device=device)  # B=4, 3 local views
    st = student_forward(method.student, g, loc, method.stages, method._local_heads)
    with torch.no_grad():
        te = teacher_forward(method.teacher, g, method.stages)
    method.prepare_loss(st, te)
    return method, st, te


PRESETS = [["method=dino"], ["search=soft"], ["search=hard"], ["search=softmax"], ["search=roi"], ["search=none"],
           ["search.centre=true"], ["search.centre=true", "search.backend=triton"]]
IDS = [" ".join(o) for o in PRESETS]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("overrides", PRESETS, ids=IDS)
def test_losses_trace_as_one_graph(overrides, device):
    """`compile=true` compiles a step's losses (DINO's, and SCFS's stage terms with the searched targets) as one
    graph, on logging steps (search diagnostics) and the others: a break would bring back the host-bound eager
    loss of a CUDA-graph step."""
    from scfs.methods.base import step_losses

    method, st, te = _method_and_outputs(overrides, device)
    torch._dynamo.reset()
    for diagnostics in (False, True):
        got = torch._dynamo.explain(step_losses)(method, st, te, 4, 3, torch.tensor(0.04, device=device),
                                                 diagnostics)
        assert (got.graph_count, got.graph_break_count) == (1, 0), got.break_reasons
    torch._dynamo.reset()


@pytest.mark.parametrize("overrides", [["method=dino"], ["search=soft"], ["search=hard"],
                                       ["search=hard", "search.centre=true", "search.backend=triton"]],
                         ids=lambda o: " ".join(o))
def test_compiled_losses_match_eager(overrides):
    """The traced losses (temperature as a device tensor, the centre update functionalised) give the eager loss,
    logged terms, gradients into the student's outputs and centre buffers."""
    from scfs.methods.base import step_losses

    method, st, te = _method_and_outputs(overrides)
    twin = copy.deepcopy(method)
    st_twin = {k: ({s: t.detach().clone().requires_grad_(t.requires_grad) for s, t in v.items()}
                   if isinstance(v, dict) and v and isinstance(next(iter(v.values())), torch.Tensor) else
                   v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
               for k, v in st.items()}
    st_eager = {k: v for k, v in st.items()}
    torch._dynamo.reset()
    loss_e, logs_e = step_losses(method, st_eager, te, 4, 3, 0.05, True)
    compiled = torch.compile(step_losses, backend="aot_eager", dynamic=False)
    loss_c, logs_c = compiled(twin, st_twin, te, 4, 3, torch.tensor(0.05), True)
    torch._dynamo.reset()
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    assert logs_c.keys() == logs_e.keys()
    for k in logs_e:
        torch.testing.assert_close(logs_c[k], logs_e[k], rtol=1e-5, atol=1e-6, msg=k)
    leaves_e = [st_eager["logits"], *st_eager["stage_global"].values(), *st_eager["stage_local"].values()]
    leaves_c = [st_twin["logits"], *st_twin["stage_global"].values(), *st_twin["stage_local"].values()]
    for e, c in zip(torch.autograd.grad(loss_e, leaves_e), torch.autograd.grad(loss_c, leaves_c)):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-7)
    for (name, b_e), b_c in zip(method.named_buffers(), twin.buffers()):
        if name.endswith("center"):
            assert b_e.abs().sum() > 0, name  # the step did update the centre
            torch.testing.assert_close(b_c, b_e, rtol=1e-5, atol=1e-7, msg=name)


def test_a_new_teacher_temperature_does_not_recompile_the_losses():
    """The temperature schedule changes every step of a warm-up: the compiled losses take it as one 0-d device
    tensor refilled in place, so a new value reuses the graph (a Python float would be a constant: a recompile
    per value, past dynamo's limit within the warm-up)."""
    from torch._dynamo.testing import CompileCounter

    from scfs.methods.base import step_losses

    method, st, te = _method_and_outputs(["search=soft"])
    counter = CompileCounter()
    method._loss_fn = torch.compile(step_losses, backend=counter, dynamic=False)
    torch._dynamo.reset()
    first = method._temp_arg(0.04, torch.device("cpu"))
    losses = []
    for temp in (0.04, 0.05, 0.06):
        arg = method._temp_arg(temp, torch.device("cpu"))
        assert arg is first and float(arg) == pytest.approx(temp)
        losses.append(float(method._loss_fn(method, st, te, 4, 3, arg, False)[0].detach()))
    torch._dynamo.reset()
    assert counter.frame_count == 1
    assert len(set(losses)) == 3  # the new value did reach the graph

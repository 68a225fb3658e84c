"""`compile_backend=cudagraphs`: the step's calls traced by dynamo and AOTAutograd without inductor's kernel
generation (on a GPU replayed as CUDA graphs; on the CPU the traced graphs run as they are), the loss eager. And
`compile_views`: the views' per-pixel ops fused by inductor, outside CUDA graphs."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from helpers import TINY_RESNET18, assert_compiled_build_refused, compose_cfg, train_losses
from torch import nn

from scfs.methods.base import step_losses
from scfs.methods.networks import student_forward, teacher_forward


def _build(overrides: list[str]):
    from scfs.train import build

    torch.manual_seed(0)
    cfg = compose_cfg(overrides)
    return cfg, build(cfg)[1]


def test_cudagraphs_backend_compiles_the_step_calls_with_it_and_leaves_the_loss_eager(monkeypatch):
    import scfs.methods.base as module_mod

    fns: list[tuple[str, dict]] = []
    mods: list[dict] = []
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: fns.append((fn.__name__, kw)) or fn)
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: mods.append(kw))
    _, model = _build(["compile=true", "compile_backend=cudagraphs", "compile_mode=default"])
    want = {"dynamic": False, "backend": "cudagraphs"}
    step = [(name, kw) for name, kw in fns if name in ("student_forward", "teacher_forward", "step_losses")]
    assert step == [("student_forward", want), ("teacher_forward", want)]
    assert all(kw == want for _, kw in fns)  # the teacher's searched branch too
    assert model._loss_fn is step_losses
    assert mods and all(kw == want for kw in mods)  # both backbones, the teacher's stage heads and searched branch
    assert model.loss_diagnostics(False) is False  # an eager loss: statistics on the logging steps only
    assert model._temp_arg(0.04, torch.device("cpu")) == 0.04


def test_inductor_stays_the_default_and_keeps_its_mode(monkeypatch):
    import scfs.methods.base as module_mod

    fns: list[tuple[str, dict]] = []
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: fns.append((fn.__name__, kw)) or fn)
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: None)
    _build(["compile=true", "compile_mode=reduce-overhead"])
    step = dict((name, kw) for name, kw in fns if name in ("student_forward", "teacher_forward", "step_losses"))
    assert list(step) == ["student_forward", "teacher_forward", "step_losses"]
    assert step["student_forward"] == {"dynamic": False, "mode": "reduce-overhead"}
    assert step["step_losses"] == {"dynamic": False, "mode": None}  # the loss graph without CUDA graphs


@pytest.mark.parametrize(("overrides", "match"), [
    (["compile_backend=cudagraphs", "compile_mode=reduce-overhead"], "compile_mode=reduce-overhead is invalid with "
     "compile_backend=cudagraphs.*set compile_mode=default"),
    (["compile_backend=tvm"], "compile_backend='tvm' is invalid.*one of inductor, cudagraphs"),
])
def test_bad_backend_settings_are_refused_in_one_line(overrides, match):
    assert_compiled_build_refused(overrides, match)


def test_the_method_refuses_an_inductor_mode_with_another_backend():
    from scfs.methods.dino import DINO

    with pytest.raises(ValueError, match="compile_mode='max-autotune' is inductor's"):
        DINO({"name": "resnet18"}, {"out_dim": 8}, {}, {}, batch_size=2, n_local=0, compile=True,
             compile_mode="max-autotune", compile_backend="cudagraphs")


def test_cudagraphs_backend_trains_as_the_eager_step():
    """Three real training steps of the tiny SCFS through the traced (AOTAutograd) student and teacher match the
    eager steps' losses in float32, and the two calls are traced whole: no graph breaks."""
    from torch._dynamo.utils import counters

    cfg_e, eager = _build(TINY_RESNET18)
    torch._dynamo.reset()
    counters.clear()
    cfg_c, traced = _build([*TINY_RESNET18, "compile=true", "compile_backend=cudagraphs", "compile_mode=default"])
    assert traced._student_fn is not student_forward and traced._teacher_fn is not teacher_forward
    want = train_losses(eager, cfg_e, 3)
    got = train_losses(traced, cfg_c, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] >= 2
    torch._dynamo.reset()


@pytest.mark.gpu
def test_cudagraphs_backend_replays_cuda_graphs_and_trains_as_eager_on_the_gpu(monkeypatch):
    """On a GPU the traced student and teacher are replayed as CUDA graphs (no call falls back to running without
    them) and four float32 steps end at the eager steps' losses: the graphs read the current weights, inputs and
    BatchNorm statistics on every replay, not the ones they were recorded with."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch._dynamo.utils import counters

    gpu = ["trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=32-true"]
    cfg_e, eager = _build([*TINY_RESNET18, *gpu])
    torch._dynamo.reset()
    counters.clear()
    cfg_c, traced = _build([*TINY_RESNET18, *gpu, "compile=true", "compile_backend=cudagraphs",
                            "compile_mode=default"])
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    want = train_losses(eager, cfg_e, 4)
    got = train_losses(traced, cfg_c, 4)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-3, atol=1e-3)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    torch._dynamo.reset()


def test_compile_views_fuses_the_view_ops_without_cuda_graphs(monkeypatch):
    import scfs.methods.base as module_mod

    fns: list[tuple[str, dict]] = []
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: fns.append((fn.__name__, kw)) or fn)
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: None)
    _, model = _build(["data.batch_aug=true", "compile=true", "compile_mode=reduce-overhead", "compile_views=true"])
    assert ("_finish_normalised", {"dynamic": False, "mode": None}) in fns
    assert model.batch_aug._finish_compiled is not None
    fns.clear()
    _, model = _build(["data.batch_aug=true", "compile=true", "compile_mode=reduce-overhead"])
    assert "_finish_normalised" not in [name for name, _ in fns] and model.batch_aug._finish_compiled is None


def test_compile_views_needs_inductor():
    from scfs.config import ConfigError
    from scfs.train import build

    with pytest.raises(ConfigError, match="compile_views=true is invalid with compile_backend=cudagraphs"):
        build(compose_cfg(["compile=true", "compile_backend=cudagraphs", "compile_views=true"]))

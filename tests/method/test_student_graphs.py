"""`compile_student_graphs=per_view_size`: the student's call compiled as one graph per view size and one for the
heads (`SelfDistillation.split_student_call`), training as the one-graph step does."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from helpers import CONF, TINY, TINY_RESNET18, assert_compiled_build_refused, compose_cfg, train_losses
from hydra import compose, initialize_config_dir
from torch import nn

SPLIT = "compile_student_graphs=per_view_size"


VIT = ["backbone=vit_micro", "search.stages=[block1,last]"]


def _build(overrides: list[str]):
    """The tests' tiny config with `overrides` and its method; with the micro ViT (`VIT` in `overrides`) without
    the CNN width keys of the tiny config."""
    from scfs.train import build

    torch.manual_seed(0)
    if VIT[0] in overrides:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config",
                          overrides=[*(o for o in TINY if not o.startswith("backbone.")), *overrides])
    else:
        cfg = compose_cfg(overrides)
    return cfg, build(cfg)[1]


def test_per_view_size_compiles_the_pieces_of_the_student_call_with_the_steps_options(monkeypatch):
    import scfs.methods.base as module_mod

    fns: list[tuple[str, dict]] = []
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: fns.append((fn.__name__, kw)) or fn)
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: None)
    _, model = _build(["compile=true", "compile_mode=reduce-overhead", SPLIT])
    step = dict(fns)
    assert "student_forward" not in step
    for name in ("student_view_features", "student_head_outputs", "teacher_forward"):
        assert step[name] == {"dynamic": False, "mode": "reduce-overhead"}, name
    assert model._student_fn == model.split_student_call


def test_one_graph_stays_the_default():
    from scfs.methods.networks import student_forward

    _, model = _build([])
    assert model.compile_student_graphs == "one" and model._student_fn is student_forward


@pytest.mark.parametrize("backbone", [TINY_RESNET18, VIT], ids=["resnet", "vit"])
def test_per_view_size_trains_as_the_eager_step(backbone):
    """Three real training steps of the tiny SCFS (ResNet and ViT) through the split student call (traced by
    dynamo and AOTAutograd, `compile_backend=cudagraphs`, which on the CPU runs the traced graphs as they are) match
    the eager steps' losses in float32, with no graph break."""
    from torch._dynamo.utils import counters

    cfg_e, eager = _build(backbone)
    torch._dynamo.reset()
    counters.clear()
    cfg_c, split = _build([*backbone, "compile=true", "compile_backend=cudagraphs", "compile_mode=default", SPLIT])
    want = train_losses(eager, cfg_e, 3)
    got = train_losses(split, cfg_c, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] >= 4  # global features, local features, heads, teacher
    torch._dynamo.reset()


@pytest.mark.parametrize(("overrides", "match"), [
    (["compile_student_graphs=two"], "compile_student_graphs='two' is invalid.*one of one, per_view_size"),
    (["compile_scope=blocks", SPLIT], "compile_student_graphs=per_view_size is invalid with compile_scope=blocks.*"
     "set compile_scope=model or compile_student_graphs=one"),
])
def test_bad_student_graph_settings_are_refused_in_one_line(overrides, match):
    assert_compiled_build_refused(overrides, match)


def test_the_method_refuses_an_unknown_student_graph_setting():
    from scfs.methods.dino import DINO

    with pytest.raises(ValueError, match="compile_student_graphs='two': allowed are one, per_view_size"):
        DINO({"name": "resnet18"}, {"out_dim": 8}, {}, {}, batch_size=2, n_local=0, compile_student_graphs="two")

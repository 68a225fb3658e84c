"""SCFS and DINO on a ViT: a tiny ViT (2 blocks, width 64, patch 8) trains both methods on the shapes data, its
checkpoint evaluates as a ViT, the step's calls compile to one graph each, and the optimiser keeps weight decay off
norms, biases, the position embedding and the CLS token."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import CONF, TINY  # noqa: E402

from scfs.config import ConfigError, validate_config  # noqa: E402

VIT = ["backbone=vit_micro", "search.stages=[block1,last]"]


def vit_cfg(overrides: list[str] | None = None, data_root: str | Path | None = None):
    """The tests' tiny config with the micro ViT (the CNN width keys of TINY do not apply to it)."""
    tiny = [o for o in TINY if not o.startswith("backbone.")]
    extra = [f"data.root={data_root}"] if data_root else []
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=[*tiny, *VIT, *extra, *(overrides or [])])


@pytest.mark.parametrize("method", ["scfs", "dino"])
def test_a_tiny_vit_trains_and_evaluates_as_a_vit(tmp_path, shapes_root, method):
    from scfs.models import ViTBackbone
    from scfs.models.backbone import load_backbone
    from scfs.train import run

    cfg = vit_cfg([f"method={method}", "optim=adamw", "optim.weight_decay=0.04", "optim.weight_decay_end=0.4",
                   "trainer.gradient_clip_val=3.0", "method.freeze_last_layer_epochs=1", "eval.figure=true"],
                  shapes_root)
    s = run(cfg, tmp_path)
    assert s["steps"] == 2 and s["loss"] == s["loss"]
    assert s["figure"] and (tmp_path / "searched_regions.png").is_file()  # the search on the ViT's blocks
    assert 0 <= s["knn"]["top1_k20"] <= 100
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    keys = ckpt["state_dict"]
    if method == "scfs":
        for s in ("block1", "last"):  # a stage head per searched block, as wide as the tokens
            assert keys[f"teacher.stage_heads.{s}.conv1.weight"].shape[1] == 64
    else:
        assert not any(".stage_heads." in k for k in keys)
    teacher = load_backbone(tmp_path / "checkpoints" / "last.ckpt")
    assert isinstance(teacher, ViTBackbone) and teacher.embed_dim == 64
    got = {k[len("teacher.backbone."):]: v for k, v in keys.items() if k.startswith("teacher.backbone.")}
    for k, v in teacher.state_dict().items():
        torch.testing.assert_close(v, got[k], rtol=0, atol=0, msg=k)


def test_the_search_runs_on_the_teachers_patch_tokens(shapes_root):
    """A step's searched maps are the teacher's block maps of global view 1 (C = width, H x W = the patch grid);
    the queries are the student's mean patch tokens of the local views at the same block."""
    from scfs.methods.networks import student_forward, teacher_forward
    from scfs.train import build

    torch.manual_seed(0)
    _, method = build(vit_cfg(["method=scfs"], shapes_root))
    g, loc = torch.randn(4, 3, 32, 32), torch.randn(6, 3, 16, 16)
    st = student_forward(method.student, g, loc, method.stages, method._local_heads)
    with torch.no_grad():
        te = teacher_forward(method.teacher, g, method.stages)
    assert method.stages == ("block1", "last")
    for s in method.stages:
        assert te["maps"][s].shape == (4, 64, 4, 4) and st["queries"][s].shape == (6, 64)
        want = method.student["backbone"](loc)[s].mean(dim=(2, 3))
        torch.testing.assert_close(st["queries"][s], want.detach(), rtol=1e-5, atol=1e-6)
    assert st["local_size"] == {"block1": 2, "last": 2}
    loss, logs = method._loss_fn(method, st, te, 2, 3, 0.04, True)
    assert torch.isfinite(loss) and "loss/block1_local" in logs and "loss/last_global" in logs


def test_student_and_teacher_calls_of_a_vit_trace_as_one_graph_each(shapes_root):
    from scfs.methods.base import step_losses
    from scfs.methods.networks import student_forward, teacher_forward
    from scfs.train import build

    torch.manual_seed(0)
    _, method = build(vit_cfg(["method=scfs"], shapes_root))
    g, loc = torch.randn(4, 3, 32, 32), torch.randn(6, 3, 16, 16)
    torch._dynamo.reset()
    student = torch._dynamo.explain(student_forward)(method.student, g, loc, method.stages, True)
    assert (student.graph_count, student.graph_break_count) == (1, 0), student.break_reasons
    with torch.no_grad():
        teacher = torch._dynamo.explain(teacher_forward)(method.teacher, g, method.stages)
    assert (teacher.graph_count, teacher.graph_break_count) == (1, 0), teacher.break_reasons
    st = student_forward(method.student, g, loc, method.stages, True)
    with torch.no_grad():
        te = teacher_forward(method.teacher, g, method.stages)
    method.prepare_loss(st, te)
    losses = torch._dynamo.explain(step_losses)(method, st, te, 2, 3, torch.tensor(0.04), True)
    assert (losses.graph_count, losses.graph_break_count) == (1, 0), losses.break_reasons
    torch._dynamo.reset()


def test_no_weight_decay_on_norms_biases_position_embedding_and_cls_token(shapes_root):
    from scfs.train import build

    _, method = build(vit_cfg(["method=scfs", "optim=adamw"], shapes_root))
    opt = method.configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW)
    names = {id(p): n for n, p in method.student.named_parameters()}
    decay = {names[id(p)] for g in opt.param_groups if g["apply_wd"] for p in g["params"]}
    no_decay = {names[id(p)] for g in opt.param_groups if not g["apply_wd"] for p in g["params"]}
    for n in ("backbone.body.pos_embed", "backbone.body.cls_token", "backbone.body.blocks.0.norm1.weight",
              "backbone.body.blocks.0.attn.qkv.bias", "backbone.body.norm.weight"):
        assert n in no_decay, n
    for n in ("backbone.body.patch_embed.proj.weight", "backbone.body.blocks.1.mlp.fc1.weight",
              "backbone.body.blocks.0.attn.qkv.weight"):
        assert n in decay, n
    assert len(decay) + len(no_decay) == sum(1 for p in method.student.parameters() if p.requires_grad)
    _, dino_rule = build(vit_cfg(["method=scfs", "optim=adamw", "optim.decay_tokens=true"], shapes_root))
    groups = dino_rule.configure_optimizers().param_groups
    names = {id(p): n for n, p in dino_rule.student.named_parameters()}
    decay = {names[id(p)] for g in groups if g["apply_wd"] for p in g["params"]}
    assert {"backbone.body.pos_embed", "backbone.body.cls_token"} <= decay  # DINO's get_params_groups


@pytest.mark.parametrize(("stages", "match"), [("[layer2,layer4]", "ViT blocks"), ("[block0]", "ViT blocks")])
def test_cnn_stage_names_on_a_vit_are_one_clear_line(stages, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(vit_cfg([f"search.stages={stages}"]))


def test_a_block_past_the_depth_names_the_range(shapes_root):
    from scfs.train import build

    with pytest.raises(ValueError, match=r"this ViT has 2 blocks \(block1..block2"):
        build(vit_cfg(["search.stages=[block3]"], shapes_root))


@pytest.mark.parametrize("experiment", ["cifar10_vit", "imagenet_vit"])
@pytest.mark.parametrize("method", ["scfs", "dino"])
def test_vit_experiments_compose_validate_and_build(tmp_path, experiment, method):
    """The recipes as configs (the GPU runs them; here they compose, validate, build their networks, and the
    ImageNet ViT-S/16 is checked against DINO's published numbers)."""
    from omegaconf import OmegaConf

    from scfs.methods.networks import build_network

    root = tmp_path / "data"
    for split in ("train", "val"):
        (root / split / "class0").mkdir(parents=True)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}", f"method={method}",
                                                        f"data.root={root}", "trainer=cpu"])
    validate_config(cfg)
    stages = tuple(cfg.search.stages) if method == "scfs" else ()
    net = build_network(OmegaConf.to_container(cfg.backbone), OmegaConf.to_container(cfg.method), stages)
    width = 384 if experiment == "imagenet_vit" else 192
    assert net["backbone"].embed_dim == width and net["backbone"].depth == 12
    assert {s: h.conv1.in_channels for s, h in net["stage_heads"].items()} == {s: width for s in stages}
    assert cfg.backbone.arch == "vit" and cfg.optim.name == "adamw" and cfg.trainer.gradient_clip_val == 3.0
    assert cfg.trainer.precision == "bf16-mixed" and cfg.optim.fused == "auto"
    if experiment == "imagenet_vit":
        assert cfg.backbone.name == "vit_small_patch16_224" and cfg.backbone.drop_path_rate == 0.1
        assert (cfg.crops.global_size, cfg.crops.local_size, cfg.crops.n_local) == (224, 96, 10)
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.weight_decay_end) == (5e-4, 0.04, 0.4)
        assert (cfg.method.warmup_teacher_temp, cfg.method.teacher_temp, cfg.method.momentum_teacher) == (
            0.04, 0.07, 0.996)
        assert cfg.method.out_dim == 65536 and cfg.method.freeze_last_layer_epochs == 1
    else:
        assert cfg.backbone.patch_size == 4 and cfg.crops.global_size == 32


@pytest.mark.parametrize("method_name", ["scfs", "dino"])
def test_the_teacher_has_no_stochastic_depth(shapes_root, method_name):
    """The teacher runs in train mode (batch statistics, as in DINO) but, like DINO's teacher, without drop path:
    with `drop_path_rate=0.5` its outputs repeat exactly from call to call while the student's still vary."""
    from scfs.methods.networks import student_forward, teacher_forward
    from scfs.train import build

    torch.manual_seed(0)
    _, method = build(vit_cfg([f"method={method_name}", "backbone.drop_path_rate=0.5"], shapes_root))
    method.train()
    g, loc = torch.randn(4, 3, 32, 32), torch.randn(6, 3, 16, 16)
    with torch.no_grad():
        t1, t2 = (teacher_forward(method.teacher, g, method.stages) for _ in range(2))
        s1, s2 = (student_forward(method.student, g, loc, method.stages, method._local_heads) for _ in range(2))
    torch.testing.assert_close(t1["logits"], t2["logits"], rtol=0, atol=0)
    assert not torch.equal(s1["logits"], s2["logits"])  # the student keeps its stochastic depth

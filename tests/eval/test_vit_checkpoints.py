"""Evaluation of ViT checkpoints: kNN and the linear probe read the CLS token of the checkpoint's ViT, search
precision runs on its blocks, and detection puts ViTDet's simple feature pyramid over the last block (strides
patch/4 .. 4 x patch, the pyramid width everywhere) with the checkpoint's ViT, tensor by tensor, as the trunk."""

from __future__ import annotations

import math

import pytest
import torch

from scfs.eval.common import compose_eval_cfg, load_eval_backbone
from scfs.eval.detect import run_detect
from scfs.eval.detection_model import build_detector, trunk_state
from scfs.eval.vit_pyramid import SimpleFeaturePyramid
from scfs.models.backbone import build_backbone
from scfs.models.checkpoint import safe_load
from tests.eval.test_detect import DET_TINY
from tests.method.test_vit_methods import vit_cfg

MICRO = {"arch": "vit", "name": "vit_tiny_patch16_224", "patch_size": 8, "img_size": 32, "embed_dim": 64, "depth": 2,
         "num_heads": 2}


@pytest.fixture(scope="module")
def vit_ckpt(shapes_root, tmp_path_factory):
    from scfs.train import run

    out = tmp_path_factory.mktemp("vit-pretrain")
    run(vit_cfg(["eval.knn_at_start=false"], shapes_root), out)
    return out / "checkpoints" / "last.ckpt"


def test_pyramid_levels_and_gradients():
    torch.manual_seed(0)
    vit = build_backbone(MICRO).body
    fp = SimpleFeaturePyramid(vit, out_channels=32)
    out = fp(torch.randn(2, 3, 64, 96))
    assert list(out) == ["0", "1", "2", "3", "pool"]
    strides = {k: 64 // v.shape[-2] for k, v in out.items()}
    assert strides == {"0": 2, "1": 4, "2": 8, "3": 16, "pool": 32}  # patch 8: patch/4 .. 4 x patch
    assert all(v.shape[1] == 32 and v.shape[-1] * 64 == v.shape[-2] * 96 for v in out.values())
    sum(v.square().mean() for v in out.values()).backward()
    assert vit.pos_embed.grad is not None and vit.blocks[-1].mlp.fc2.weight.grad.abs().sum() > 0
    frozen = SimpleFeaturePyramid(build_backbone(MICRO).body, 32, trainable=False)
    assert not any(p.requires_grad for p in frozen.body.parameters())


def test_detector_trunk_is_the_checkpoints_vit(vit_ckpt, shapes_root):
    cfg = compose_eval_cfg("detect", [f"data.root={shapes_root}", f"ckpt={vit_ckpt}", *DET_TINY])
    backbone, _ = load_eval_backbone(cfg)
    trunk = trunk_state(build_detector(backbone.body, 10, dict(cfg.model)))
    prefix = "teacher.backbone.body."
    ref = {k[len(prefix):]: v for k, v in safe_load(vit_ckpt)["state_dict"].items() if k.startswith(prefix)}
    assert trunk.keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(trunk[k], v, rtol=0, atol=0, msg=k)


def test_a_vit_checkpoint_fine_tunes_and_evaluates(vit_ckpt, shapes_root, tmp_path):
    cfg = compose_eval_cfg("detect", [f"data.root={shapes_root}", f"ckpt={vit_ckpt}", *DET_TINY, "logger.wandb=false"])
    doc = run_detect(cfg, tmp_path)
    assert math.isfinite(doc["train"]["final_loss"]) and doc["train"]["iters"] == 3
    assert doc["metrics"]["bbox/AP"] is not None and 0.0 <= doc["metrics"]["bbox/AP"] <= 100.0


def test_knn_and_linear_read_the_vits_cls_token(vit_ckpt, eval_cfg, tmp_path):
    from scfs.eval.knn import run_knn
    from scfs.eval.linear import run_linear
    from scfs.models import ViTBackbone

    backbone, info = load_eval_backbone(eval_cfg("knn", f"ckpt={vit_ckpt}"))
    assert isinstance(backbone, ViTBackbone) and info.backbone["arch"] == "vit"
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(backbone.pooled(x), backbone(x)["cls"], rtol=0, atol=0)
    knn = run_knn(eval_cfg("knn", f"ckpt={vit_ckpt}"), tmp_path / "knn")
    assert 0.0 <= knn["metrics"]["top1_k20"] <= 100.0
    for extra in (["fast=true", "probe.epochs=2"], ["probe.epochs=1", "probe.batch_size=16"]):
        lin = run_linear(eval_cfg("linear", f"ckpt={vit_ckpt}", *extra), tmp_path / extra[0])
        assert 0.0 <= lin["metrics"]["top1"] <= 100.0


def test_precision_searches_the_vits_blocks(vit_ckpt, shapes_root, tmp_path):
    from scfs.config import ConfigError
    from scfs.eval.precision import main

    common = ["--data-root", str(shapes_root), "--n-train", "48", "--n-val", "24", "--image-size", "32", "--limit", "8"]
    doc = main([f"SCFS={vit_ckpt}", "random", *common, "--out", str(tmp_path / "p")])
    assert doc["stages"] == ["block1", "last"]
    from scfs.eval.precision import default_stages
    from scfs.models import Backbone

    cnn = Backbone("resnet18", layers=[1, 1, 1, 1], channels=[8, 8, 8, 8])
    assert default_stages({"cnn": cnn}) == ["layer2", "layer3", "layer4"]
    with pytest.raises(ConfigError, match="no stages in common"):
        default_stages({"cnn": cnn, "vit": build_backbone(MICRO)})


def test_a_published_dino_vit_file_evaluates_with_its_backbone_config(vit_ckpt, shapes_root, tmp_path):
    """`dino_deitsmall16_pretrain.pth`'s layout (the teacher's flat timm state dict) with `backbone=vit_*`."""
    from scfs.eval.knn import run_knn
    from scfs.models import ViTBackbone
    from tests.eval.conftest import TINY_EVAL

    def eval_cfg(kind: str, *overrides: str):
        tiny = [o for o in TINY_EVAL if not o.startswith("backbone.")]  # the CNN's width keys
        return compose_eval_cfg(kind, [f"data.root={shapes_root}", *tiny, "logger.wandb=false",
                                       f"feature_cache={tmp_path / 'cache'}", *overrides])

    prefix = "teacher.backbone.body."
    flat = {k[len(prefix):]: v for k, v in safe_load(vit_ckpt)["state_dict"].items() if k.startswith(prefix)}
    path = tmp_path / "dino_deitsmall16_pretrain.pth"
    torch.save(flat, path)
    backbone, info = load_eval_backbone(eval_cfg("knn", f"ckpt={path}", "backbone=vit_micro"))
    assert isinstance(backbone, ViTBackbone) and info.format == "state-dict"
    for k, v in flat.items():
        torch.testing.assert_close(backbone.body.state_dict()[k], v, rtol=0, atol=0, msg=k)
    doc = run_knn(eval_cfg("knn", f"ckpt={path}", "backbone=vit_micro"), tmp_path / "knn")
    assert 0.0 <= doc["metrics"]["top1_k20"] <= 100.0

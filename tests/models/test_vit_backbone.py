"""The ViT backbone: block maps against timm's own forward, views of several sizes, stage names, and checkpoints in
the published DINO ViT layouts (built here from a timm ViT under DINO's key names; nothing is downloaded).

DINO's `vision_transformer.py` names its parameters as timm does (`cls_token`, `pos_embed`, `patch_embed.proj.*`,
`blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*`, `norm.*`), so a published file is our timm model's
state dict under DINO's wrappers:
* `dino_deitsmall16_pretrain.pth`: the teacher backbone's flat state dict;
* the full checkpoint: {'student': {'module.backbone.*', 'module.head.*'}, 'teacher': {'backbone.*', 'head.*'}, ...}
  (the ViT teacher is not DDP-wrapped: it has no BatchNorm to sync).
"""

from __future__ import annotations

import argparse

import pytest
import timm
import torch

from scfs.config import ConfigError
from scfs.models import ViTBackbone
from scfs.models.backbone import build_backbone, load_backbone
from scfs.models.vit import CLS_KEY, block_index

MICRO = dict(arch="vit", name="vit_tiny_patch16_224", patch_size=8, img_size=32, embed_dim=64, depth=2, num_heads=2)
DINO_VIT_KEYS = ("cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "blocks.0.norm1.weight",
                 "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                 "blocks.0.norm2.bias", "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.bias", "norm.weight", "norm.bias")


def _micro(seed: int = 0, **kw) -> ViTBackbone:
    torch.manual_seed(seed)
    cfg = {**MICRO, **kw}
    cfg.pop("arch")
    return ViTBackbone(cfg.pop("name"), **cfg).eval()


def _tokens_by_hand(bb: ViTBackbone, x: torch.Tensor) -> list[torch.Tensor]:
    """The reference: timm's modules called one by one, each block's output through the final norm."""
    body = bb.body
    t = body.norm_pre(body._pos_embed(body.patch_embed(x)))
    outs = []
    for blk in body.blocks:
        t = blk(t)
        outs.append(body.norm(t))
    return outs


@pytest.mark.parametrize("size", [32, 16, 24])
def test_block_maps_and_cls_match_timms_modules(size):
    bb = _micro(stages=("block1", "last"))
    x = torch.randn(3, 3, size, size)
    out = bb(x)
    ref = _tokens_by_hand(bb, x)
    g = size // 8
    for stage, i in (("block1", 0), ("last", 1)):
        want = ref[i][:, 1:].transpose(1, 2).reshape(3, 64, g, g)  # patch tokens, row-major grid, as NCHW
        torch.testing.assert_close(out[stage], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[CLS_KEY], ref[-1][:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bb.pooled(x), bb.body.forward_head(bb.body.forward_features(x), pre_logits=True),
                               rtol=1e-5, atol=1e-5)  # timm's own token pooling (global_pool='token')
    assert bb.channels == {"block1": 64, "last": 64} and bb.embed_dim == 64


def test_gradients_reach_every_parameter():
    bb = _micro(stages=("block1", "last")).train()
    out = bb(torch.randn(2, 3, 32, 32))
    (out["block1"].square().mean() + out["last"].mean() + out[CLS_KEY].sum()).backward()
    missing = [n for n, p in bb.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


def test_stage_names():
    assert block_index("block1", 12) == 0 and block_index("block12", 12) == 11 and block_index("last", 12) == 11
    for bad in ("block0", "block13", "layer4", "blocks3", "3"):
        with pytest.raises(ValueError, match="ViT stage"):
            block_index(bad, 12)


def test_config_keys_reach_timm():
    bb = _micro(drop_path_rate=0.1, init_values=1e-5)
    assert bb.patch_size == 8 and bb.depth == 2
    assert float(bb.body.blocks[-1].drop_path1.drop_prob) == pytest.approx(0.1)
    torch.testing.assert_close(bb.body.blocks[0].ls1.gamma, torch.full((64,), 1e-5))


def test_a_cnn_name_with_arch_vit_is_one_clear_line():
    with pytest.raises(ConfigError, match="not a timm VisionTransformer"):
        build_backbone({**MICRO, "name": "resnet18"})


def test_published_dino_vit_names_are_timms():
    keys = set(_micro().body.state_dict())
    assert set(DINO_VIT_KEYS) <= keys


def _published_files(tmp_path, net: ViTBackbone) -> dict[str, str]:
    bb = {k: v.clone() for k, v in net.body.state_dict().items()}
    head = {"mlp.0.weight": torch.randn(32, 64), "mlp.0.bias": torch.randn(32), "last_layer.weight_g": torch.ones(1, 8),
            "last_layer.weight_v": torch.randn(8, 16)}
    student = {**{f"module.backbone.{k}": v + 1.0 for k, v in bb.items()},  # a different network, to tell them apart
               **{f"module.head.{k}": v for k, v in head.items()}}
    teacher = {**{f"backbone.{k}": v for k, v in bb.items()}, **{f"head.{k}": v for k, v in head.items()}}
    full = {"student": student, "teacher": teacher, "optimizer": {}, "epoch": 100,
            "args": argparse.Namespace(arch="vit_small", patch_size=16), "dino_loss": {"center": torch.zeros(1, 8)}}
    paths = {"pretrain": str(tmp_path / "dino_deitsmall16_pretrain.pth"),
             "full": str(tmp_path / "dino_deitsmall16_pretrain_full_checkpoint.pth")}
    torch.save(bb, paths["pretrain"])
    torch.save(full, paths["full"])
    return paths


@pytest.mark.parametrize("fmt", ["pretrain", "full"])
def test_published_dino_vit_layouts_load_weights_only(tmp_path, fmt):
    net = _micro(seed=1)
    path = _published_files(tmp_path, net)[fmt]
    got = load_backbone(path, backbone_cfg=MICRO)
    assert isinstance(got, ViTBackbone)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(got.pooled(x), net.pooled(x), rtol=0, atol=0)
    if fmt == "full":
        student = load_backbone(path, which="student", backbone_cfg=MICRO)
        want = net.body.state_dict()["blocks.0.attn.qkv.weight"] + 1.0
        torch.testing.assert_close(student.body.state_dict()["blocks.0.attn.qkv.weight"], want, rtol=0, atol=0)


def test_published_dino_vit_starts_a_run(tmp_path):
    net = _micro(seed=2)
    path = _published_files(tmp_path, net)["pretrain"]
    got = build_backbone({**MICRO, "pretrained_path": None})
    cfg = {**MICRO, "pretrained_path": path}
    cfg.pop("arch")
    started = ViTBackbone(cfg.pop("name"), **cfg).eval()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(started.pooled(x), net.pooled(x), rtol=0, atol=0)
    assert not torch.equal(got.eval().pooled(x), net.pooled(x))


def test_a_wrong_vit_is_one_clear_line(tmp_path):
    path = _published_files(tmp_path, _micro())["pretrain"]
    with pytest.raises(Exception, match="does not match the backbone"):
        load_backbone(path, backbone_cfg={**MICRO, "embed_dim": 32})


def test_timm_vits_by_name_build_offline():
    for name in ("vit_tiny_patch16_224", "vit_small_patch16_224"):
        bb = build_backbone({"arch": "vit", "name": name, "img_size": 64})
        assert bb.embed_dim == timm.create_model(name, pretrained=False, img_size=64).embed_dim


def test_a_vit_without_a_class_token_is_represented_by_timms_pooling():
    bb = _micro(class_token=False, global_pool="avg")
    x = torch.randn(2, 3, 32, 32)
    ref = _tokens_by_hand(bb, x)[-1]
    torch.testing.assert_close(bb.pooled(x), bb.body.fc_norm(ref.mean(dim=1)), rtol=1e-5, atol=1e-5)  # timm's
    assert bb(x)["last"].shape == (2, 64, 4, 4)
    with pytest.raises(ValueError, match="no CLS token"):
        bb.cls_attention(x)

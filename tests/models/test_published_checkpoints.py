"""Checkpoints of the published SCFS and DINO training scripts load as ResNet-50 backbones everywhere a checkpoint
is accepted (load_backbone, the eval CLIs' loader, the detector trunk, notebook 02's call, backbone.pretrained_path).

The files are built here with the key layouts those scripts save (nothing is downloaded; random weights):
* SCFS (skyoux/scfs `main_scfs.py`): {'student', 'teacher', 'optimizer', 'epoch', 'arch', 'dino_loss_fn',
  'dino_loss_l2_fn', 'dino_loss_l3_fn', 'dino_loss_l4_fn'}. Both networks are DDP-wrapped (`module.`; the teacher
  too, because a ResNet has BatchNorm), the torchvision ResNet sits in a torchextractor `Extractor`
  (`backbone.model.`, its fc replaced by Identity, so no fc keys), next to a DINO head (`head.mlp.*`,
  `head.last_layer.weight_g/_v`) and three per-stage heads `layer{2,3,4}_head.*` (1x1-3x3-1x1 bottleneck with
  BatchNorm, then Linear-BN1d-ReLU-Linear-BN1d).
* DINO (facebookresearch/dino `main_dino.py`): {'student', 'teacher', 'optimizer', 'epoch', 'args', 'dino_loss'};
  student `module.backbone.*` / `module.head.*` (DDP around the multi-crop wrapper); the teacher `backbone.*` /
  `head.*` when it is not DDP-wrapped, `module.backbone.*` when it is (DINO wraps it for SyncBatchNorm).
"""

from __future__ import annotations

import argparse

import pytest
import torch
import torchvision

from scfs.models import Backbone
from scfs.models.backbone import load_backbone
from scfs.models.checkpoint import load_into, normalize_keys, select_state_dict

OUT_DIM = 512  # the DINO head's output (65536 in the papers; the size is irrelevant to the key layout)


def _resnet50(seed: int) -> torchvision.models.ResNet:
    torch.manual_seed(seed)
    net = torchvision.models.resnet50(weights=None)
    with torch.no_grad():  # non-trivial BN statistics, so a mix-up of running stats shows in the features
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _trunk(net: torchvision.models.ResNet) -> dict[str, torch.Tensor]:
    return {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}  # fc is Identity in both


def _bn(prefix: str, n: int) -> dict[str, torch.Tensor]:
    return {f"{prefix}.weight": torch.ones(n), f"{prefix}.bias": torch.zeros(n), f"{prefix}.running_mean":
            torch.zeros(n), f"{prefix}.running_var": torch.ones(n), f"{prefix}.num_batches_tracked": torch.tensor(7)}


def _dino_head(in_dim: int = 2048, hidden: int = 2048, bottleneck: int = 256) -> dict[str, torch.Tensor]:
    """DINOHead(nlayers=3, use_bn=False): mlp = Linear, GELU, Linear, GELU, Linear; weight-normed last layer."""
    return {"mlp.0.weight": torch.zeros(hidden, in_dim), "mlp.0.bias": torch.zeros(hidden),
            "mlp.2.weight": torch.zeros(hidden, hidden), "mlp.2.bias": torch.zeros(hidden),
            "mlp.4.weight": torch.zeros(bottleneck, hidden), "mlp.4.bias": torch.zeros(bottleneck),
            "last_layer.weight_g": torch.ones(OUT_DIM, 1), "last_layer.weight_v": torch.zeros(OUT_DIM, bottleneck)}


def _stage_head(in_dim: int, bottleneck: int = 256, hidden: int = 2048, out: int = 256) -> dict[str, torch.Tensor]:
    """The published per-stage head: conv1 1x1 / bn1 / conv2 3x3 / bn2 / conv3 1x1 / bn3 (no conv bias), then
    mlp = Linear(0), BatchNorm1d(1), ReLU(2), Linear(3), BatchNorm1d(4)."""
    sd = {"conv1.weight": torch.zeros(bottleneck, in_dim, 1, 1),
          "conv2.weight": torch.zeros(bottleneck, bottleneck, 3, 3),
          "conv3.weight": torch.zeros(in_dim, bottleneck, 1, 1), **_bn("bn1", bottleneck), **_bn("bn2", bottleneck),
          **_bn("bn3", in_dim), "mlp.0.weight": torch.zeros(hidden, in_dim), "mlp.0.bias": torch.zeros(hidden),
          **_bn("mlp.1", hidden), "mlp.3.weight": torch.zeros(out, hidden), "mlp.3.bias": torch.zeros(out),
          **_bn("mlp.4", out)}
    return sd


def _prefixed(prefix: str, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": v for k, v in sd.items()}


def _scfs_network(net: torchvision.models.ResNet) -> dict[str, torch.Tensor]:
    sd = _prefixed("module.backbone.model.", _trunk(net)) | _prefixed("module.head.", _dino_head())
    for stage, ch in (("layer2", 512), ("layer3", 1024), ("layer4", 2048)):
        sd |= _prefixed(f"module.{stage}_head.", _stage_head(ch))
    return sd


def _optimizer_state(n_params: int) -> dict:
    return {"state": {}, "param_groups": [{"lr": 0.0, "momentum": 0.9, "weight_decay": 0.04, "params":
                                           list(range(n_params))}]}


@pytest.fixture(scope="module")
def nets() -> dict[str, torchvision.models.ResNet]:
    return {"teacher": _resnet50(0), "student": _resnet50(1)}


@pytest.fixture(scope="module")
def published(nets, tmp_path_factory) -> dict[str, object]:
    """{'scfs': path, 'dino': path, 'dino_ddp_teacher': path} in the published layouts."""
    d = tmp_path_factory.mktemp("published")
    loss = {"center": torch.zeros(1, OUT_DIM)}
    scfs = {"student": _scfs_network(nets["student"]), "teacher": _scfs_network(nets["teacher"]),
            "optimizer": _optimizer_state(10), "epoch": 200, "arch": "resnet50", "dino_loss_fn": loss,
            "dino_loss_l2_fn": {"center": torch.zeros(1, 256)}, "dino_loss_l3_fn": {"center": torch.zeros(1, 256)},
            "dino_loss_l4_fn": {"center": torch.zeros(1, 256)}}
    torch.save(scfs, d / "scfs_resnet50_pretrain_exp_0199_ckpt.pth")
    student = _prefixed("module.backbone.", _trunk(nets["student"])) | _prefixed("module.head.", _dino_head())
    args = argparse.Namespace(arch="resnet50", out_dim=OUT_DIM, epochs=800, lr=0.3)
    paths: dict[str, object] = {"scfs": d / "scfs_resnet50_pretrain_exp_0199_ckpt.pth"}
    for name, teacher_prefix in (("dino", ""), ("dino_ddp_teacher", "module.")):
        teacher = _prefixed(f"{teacher_prefix}backbone.", _trunk(nets["teacher"])) | \
            _prefixed(f"{teacher_prefix}head.", _dino_head())
        torch.save({"student": student, "teacher": teacher, "optimizer": _optimizer_state(10), "epoch": 800,
                    "args": args, "dino_loss": loss}, d / f"{name}_checkpoint.pth")
        paths[name] = d / f"{name}_checkpoint.pth"
    return paths


def _tv_features(net: torchvision.models.ResNet, x: torch.Tensor) -> torch.Tensor:
    trunk = torch.nn.Sequential(*list(net.children())[:-2])
    with torch.no_grad():
        return trunk(x).mean((2, 3))


X = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(("fmt", "which"), [
    ("scfs", "teacher"), ("scfs", "student"), ("dino", "teacher"), ("dino", "student"),
    pytest.param("dino_ddp_teacher", "teacher", marks=pytest.mark.slow),  # the same normalisation as scfs'
])
def test_published_checkpoint_loads_with_torchvisions_features(published, nets, fmt, which):
    """The loaded backbone computes what torchvision's ResNet-50 computes with the same weights (the published
    SCFS teacher used to be refused: unexpected keys: 96 (layer2_head.bn1.bias, ...))."""
    backbone = load_backbone(published[fmt], which, {"name": "resnet50"})
    with torch.no_grad():
        ours = backbone.pooled(X)
    torch.testing.assert_close(ours, _tv_features(nets[which], X), rtol=1e-4, atol=1e-5)
    other = "student" if which == "teacher" else "teacher"
    assert not torch.allclose(ours, _tv_features(nets[other], X), atol=1e-3)  # the right network was picked


def test_notebook_call_without_a_config_takes_resnet50(published, nets):
    """Notebook 02 calls `load_backbone(PHOTO_CKPT)`: a published file needs no config (ResNet-50 assumed)."""
    backbone = load_backbone(published["scfs"])
    assert backbone.embed_dim == 2048
    torch.testing.assert_close(backbone.pooled(X).detach(), _tv_features(nets["teacher"], X), rtol=1e-4, atol=1e-5)


def test_pretrained_path_starts_from_the_published_teacher(published, nets):
    """`backbone.pretrained_path=<published file>`: the Backbone's weights are the teacher's, tensor for tensor."""
    b = Backbone("resnet50", stages=("layer2", "layer3", "layer4"), pretrained_path=published["scfs"])
    ref = _trunk(nets["teacher"])
    for k, v in b.body.state_dict().items():
        assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize(("kind", "fmt"), [("knn", "scfs"), pytest.param("linear", "dino", marks=pytest.mark.slow),
                                         pytest.param("detect", "scfs", marks=pytest.mark.slow)])
def test_eval_clis_load_the_published_files(published, nets, kind, fmt):
    """scfs.eval.knn / linear / detect build their backbone with `load_eval_backbone` (detect then copies it into
    the detector's trunk): with backbone=resnet50 the published formats load, as format 'published'."""
    from scfs.eval.common import compose_eval_cfg, load_eval_backbone

    cfg = compose_eval_cfg(kind, [f"ckpt={published[fmt]}", "backbone=resnet50", "logger.wandb=false"])
    backbone, info = load_eval_backbone(cfg)
    assert info.format == "published" and info.which == "teacher"
    torch.testing.assert_close(backbone.pooled(X).detach(), _tv_features(nets["teacher"], X), rtol=1e-4, atol=1e-5)
    if kind == "detect":
        from scfs.eval.detection_model import build_detector, trunk_state

        trunk = trunk_state(build_detector(backbone.body, 3, dict(cfg.model)))
        for k, v in _trunk(nets["teacher"]).items():
            if "num_batches_tracked" not in k:
                assert torch.equal(trunk[k], v), k


def test_only_head_and_wrapper_keys_are_dropped(published, nets):
    """The normalisation drops exactly the heads (DINO head, per-stage heads): every ResNet key is kept."""
    from scfs.models.checkpoint import safe_load

    raw = safe_load(published["scfs"])
    kept = normalize_keys(select_state_dict(raw, "teacher"))
    assert set(kept) == set(_trunk(nets["teacher"]))
    body = Backbone("resnet50", stages=("layer4",)).body
    load_into(body, select_state_dict(raw, "student"))  # strict: no missing / unexpected key

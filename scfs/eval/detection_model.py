"""torchvision Faster / Mask R-CNN with an FPN over the trunk of an SCFS / DINO / torchvision ResNet.

Why the timm body is used as is, instead of rebuilding a torchvision ResNet: our checkpoints hold a timm
`features_only` ResNet (`Backbone.body`) whose children are ``conv1, bn1, act1, maxpool, layer1..layer4`` - the
module names of torchvision's ResNet. torchvision's `BackboneWithFPN` takes any module with such children (its
`IntermediateLayerGetter` runs them in order and returns the named stages), so the very modules whose weights
the checkpoint filled become the detector's trunk: no key mapping to get wrong, and the same code serves the
narrow CIFAR-stem nets of the CPU default and a standard ResNet-50 (whose timm and torchvision graphs are the
same network; the tests check that a torchvision ResNet with our weights computes the same stage maps). A
supervised torchvision ``resnet50-*.pth`` loads into it through `scfs.models.checkpoint` (``fc`` dropped).

Detector state-dict keys are torchvision's: ``backbone.body.layer1.0.conv1.weight``, ``backbone.fpn.*``,
``rpn.*``, ``roi_heads.*``.

Normalisation (``norm``): ``frozen`` turns every trunk BatchNorm into torchvision's `FrozenBatchNorm2d` with the
checkpoint's statistics (the detectron2 / torchvision default for small per-GPU batches); ``sync`` uses
`SyncBatchNorm` in the trained stages (multi-GPU, CUDA only when distributed); ``bn`` plain BatchNorm. Stages
that are not trained (``trainable_layers``, torchvision's semantics: 0..5 counting from layer4 back to the stem)
always get frozen BN: their weights do not move, so neither should their statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool
from torchvision.ops.misc import FrozenBatchNorm2d

from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD
from scfs.eval.vit_pyramid import SimpleFeaturePyramid, is_vit

ARCHS = ("faster_rcnn", "mask_rcnn")
NORMS = ("frozen", "sync", "bn")
TRAINABLE_ORDER = ("layer4", "layer3", "layer2", "layer1", "conv1")  # torchvision's order for trainable_layers
STEM = ("conv1", "bn1")


def trainable_prefixes(trainable_layers: int) -> tuple[str, ...]:
    """Top-level trunk modules that train for `trainable_layers` (torchvision's rule: 5 adds the stem's bn1)."""
    if not 0 <= int(trainable_layers) <= 5:
        raise ValueError(f"model.trainable_layers={trainable_layers}: allowed are 0..5 (layer4, +layer3, +layer2, "
                         "+layer1, +stem)")
    out = list(TRAINABLE_ORDER[: int(trainable_layers)])
    if trainable_layers == 5:
        out.append("bn1")
    return tuple(out)


def _top_name(name: str) -> str:
    return name.split(".", 1)[0]


def frozen_bn_from(bn: nn.BatchNorm2d) -> FrozenBatchNorm2d:
    """A `FrozenBatchNorm2d` holding exactly `bn`'s affine parameters and running statistics."""
    frozen = FrozenBatchNorm2d(bn.num_features, eps=bn.eps)
    with torch.no_grad():
        if bn.affine:
            frozen.weight.copy_(bn.weight)
            frozen.bias.copy_(bn.bias)
        if bn.running_mean is not None:
            frozen.running_mean.copy_(bn.running_mean)
            frozen.running_var.copy_(bn.running_var)
    return frozen.to(bn.weight.device if bn.affine else bn.running_mean.device)


def convert_norm(module: nn.Module, frozen: bool, sync: bool) -> nn.Module:
    """Replace the BatchNorms inside `module` (recursively): frozen -> `FrozenBatchNorm2d`, sync -> `SyncBatchNorm`."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if frozen:
            return frozen_bn_from(module)
        if sync and not isinstance(module, nn.SyncBatchNorm):
            return nn.SyncBatchNorm.convert_sync_batchnorm(module)
        return module
    for name, child in module.named_children():
        new = convert_norm(child, frozen, sync)
        if new is not child:
            setattr(module, name, new)
    return module


def prepare_trunk(body: nn.Module, trainable_layers: int, norm: str = "frozen") -> nn.Module:
    """Set the trunk up for fine-tuning, in place: BN conversion per stage and `requires_grad` per stage."""
    if norm not in NORMS:
        raise ValueError(f"model.norm={norm!r}: allowed are {', '.join(NORMS)}")
    train = trainable_prefixes(trainable_layers)
    names = [n for n, _ in body.named_children()]
    missing = [n for n in ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4") if n not in names]
    if missing:
        raise ValueError(f"the trunk ({type(body).__name__}) has no {missing}: detection needs a ResNet-like "
                         f"network with conv1/bn1/layer1..4 children (found {names})")
    for name, child in list(body.named_children()):
        trained = name in train
        new = convert_norm(child, frozen=norm == "frozen" or not trained, sync=norm == "sync" and trained)
        if new is not child:  # the stem's bn1 is itself a BatchNorm
            setattr(body, name, new)
    for name, p in body.named_parameters():
        p.requires_grad_(_top_name(name) in train)
    return body


@torch.no_grad()
def stage_channels(body: nn.Module, stages: Sequence[str], size: int = 64) -> list[int]:
    """Channels of the named stages, from one dummy forward (any ResNet variant: basic / bottleneck / narrow)."""
    was = body.training
    body.eval()
    x = torch.zeros(1, 3, size, size, device=next(body.parameters()).device)
    out: dict[str, int] = {}
    for name, child in body.named_children():
        x = child(x)
        if name in stages:
            out[name] = int(x.shape[1])
        if len(out) == len(stages):
            break
    body.train(was)
    return [out[s] for s in stages]


def _levels(values: Any, n_levels: int, what: str) -> tuple[tuple[Any, ...], ...]:
    """One tuple per feature level: `[a, b, ...]` (one value per level) or `[[...], [...]]`."""
    vals = list(values)
    if len(vals) != n_levels:
        raise ValueError(f"model.{what} has {len(vals)} entries but the FPN has {n_levels} levels "
                         f"(returned_layers + the max-pool level)")
    return tuple(tuple(v) if isinstance(v, (list, tuple)) else (v,) for v in vals)


def build_detector(body: nn.Module, num_classes: int, model_cfg: Mapping[str, Any]) -> GeneralizedRCNN:
    """Faster / Mask R-CNN (``model_cfg['arch']``) over `body` (a ResNet trunk with loaded weights), for
    `num_classes` object classes (+ torchvision's background class 0). `body` becomes the detector's
    ``backbone.body`` (same modules, shared weights); see conf/eval/detect.yaml `model` for the keys. A ViT trunk
    gets ViTDet's simple feature pyramid instead of the FPN (`scfs.eval.vit_pyramid`; `returned_layers` and `norm`
    are the CNN's and do not apply; `trainable_layers=0` freezes the ViT, any other value trains all of it)."""
    cfg = dict(model_cfg)
    arch = cfg.get("arch", "faster_rcnn")
    if arch not in ARCHS:
        raise ValueError(f"model.arch={arch!r}: allowed are {', '.join(ARCHS)}")
    fpn_ch = int(cfg.get("fpn_channels", 256))
    trunk: nn.Module
    if is_vit(body):  # ViTDet: the pyramid from the last block's map; the whole ViT trains unless 0 is asked for
        trunk = SimpleFeaturePyramid(body, fpn_ch, trainable=int(cfg.get("trainable_layers", 3)) > 0)
        n_levels = len(trunk.stages) + 1
    else:
        prepare_trunk(body, int(cfg.get("trainable_layers", 3)), str(cfg.get("norm", "frozen")))
        returned = [int(k) for k in cfg.get("returned_layers", [1, 2, 3, 4])]
        if not returned or sorted(set(returned)) != returned or not all(1 <= k <= 4 for k in returned):
            raise ValueError(f"model.returned_layers={returned}: increasing stage numbers in 1..4")
        stages = [f"layer{k}" for k in returned]
        trunk = BackboneWithFPN(body, {s: str(i) for i, s in enumerate(stages)}, stage_channels(body, stages),
                                fpn_ch, extra_blocks=LastLevelMaxPool())
        n_levels = len(stages) + 1
    sizes = _levels(cfg.get("anchor_sizes", [32, 64, 128, 256, 512][-n_levels:]), n_levels, "anchor_sizes")
    ratios = cfg.get("aspect_ratios", [0.5, 1.0, 2.0])
    ratios = _levels(ratios, n_levels, "aspect_ratios") if isinstance(ratios[0], (list, tuple)) \
        else (tuple(float(r) for r in ratios),) * n_levels
    names = [str(i) for i in range(n_levels - 1)]
    # RoIAlign samples per bin: 0 = adaptive, ceil(RoI size / output size) (detectron2's default); torchvision's
    # detectors use 2. On the CPU the RoIAlign backward is the most expensive op of a small detector.
    ratio = int(cfg.get("roi_sampling_ratio", 2))
    rep = int(cfg.get("box_representation", 1024))
    min_size = cfg.get("min_size", 800)
    kwargs: dict[str, Any] = {
        "min_size": tuple(int(s) for s in min_size) if isinstance(min_size, (list, tuple)) else int(min_size),
        "max_size": int(cfg.get("max_size", 1333)),
        "image_mean": list(cfg.get("image_mean") or IMAGENET_MEAN),
        "image_std": list(cfg.get("image_std") or IMAGENET_STD),
        "rpn_anchor_generator": AnchorGenerator(sizes, ratios),
        "box_roi_pool": MultiScaleRoIAlign(names, output_size=7, sampling_ratio=ratio),
        "box_head": TwoMLPHead(fpn_ch * 7 * 7, rep),
        "box_predictor": FastRCNNPredictor(rep, num_classes + 1),
    }
    for key in ("rpn_pre_nms_top_n_train", "rpn_pre_nms_top_n_test", "rpn_post_nms_top_n_train",
                "rpn_post_nms_top_n_test", "rpn_batch_size_per_image", "box_batch_size_per_image",
                "box_detections_per_img"):
        if cfg.get(key) is not None:
            kwargs[key] = int(cfg[key])
    for key in ("box_score_thresh", "rpn_nms_thresh", "box_nms_thresh"):
        if cfg.get(key) is not None:
            kwargs[key] = float(cfg[key])
    if arch == "faster_rcnn":
        detector: GeneralizedRCNN = FasterRCNN(trunk, num_classes=None, **kwargs)
    else:
        mask_ch = int(cfg.get("mask_head_channels", 256))
        detector = MaskRCNN(trunk, num_classes=None, mask_head=MaskRCNNHeads(fpn_ch, (mask_ch,) * 4, 1),
                            mask_roi_pool=MultiScaleRoIAlign(names, output_size=14, sampling_ratio=ratio),
                            mask_predictor=MaskRCNNPredictor(mask_ch, mask_ch, num_classes + 1), **kwargs)
    # the trunk arrives in eval mode (load_backbone); Lightning keeps submodule modes, so set training mode here
    return detector.train()


def trunk_state(detector: GeneralizedRCNN) -> dict[str, torch.Tensor]:
    """The trunk's tensors under bare ResNet names (``layer1.0.conv1.weight``): what came from the checkpoint."""
    prefix = "backbone.body."
    return {k[len(prefix):]: v for k, v in detector.state_dict().items() if k.startswith(prefix)}


def parameter_groups(model: nn.Module, weight_decay: float, weight_decay_norm: float = 0.0) -> list[dict[str, Any]]:
    """Trainable parameters with weight decay, except normalisation layers' (detectron2's WEIGHT_DECAY_NORM = 0)."""
    norm_types = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            (no_decay if isinstance(module, norm_types) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": weight_decay_norm})
    return groups

"""ViTDet's simple feature pyramid (Li et al., ECCV 2022) over a ViT's last block, as the detector's backbone.

A plain ViT has one map, at stride = patch size. ViTDet builds the pyramid from it alone: strides /4 and /2 by
transposed convolutions (with a LayerNorm and GELU between the two of /4), /1 as is, x2 by max-pooling; each level
then a 1x1 and a 3x3 convolution to the pyramid width, each followed by a LayerNorm; torchvision's
`LastLevelMaxPool` adds the coarsest level ("pool") the RPN anchors expect. The module returns torchvision's
`OrderedDict` of levels and has `out_channels`, so Faster / Mask R-CNN take it as they take `BackboneWithFPN`; its
`body` is the checkpoint's timm ViT itself (the detector's ``backbone.body.*`` keys hold the loaded tensors).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from timm.layers import LayerNorm2d
from torch import nn
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

SCALES = (4.0, 2.0, 1.0, 0.5)  # ViTDet's: strides patch/4, patch/2, patch, 2 x patch (+ the max-pooled level)


def _resample(dim: int, scale: float) -> tuple[nn.Module, int]:
    """The stage that brings the stride-p map to stride p/scale, and its channels (ViTDet's halving per x2)."""
    if scale == 4.0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), LayerNorm2d(dim // 2), nn.GELU(),
                             nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)), dim // 4
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale == 0.5:
        return nn.MaxPool2d(2, stride=2), dim
    raise ValueError(f"scale {scale}: ViTDet's pyramid has {SCALES}")


class SimpleFeaturePyramid(nn.Module):
    """`body` (a timm VisionTransformer with `dynamic_img_size`) -> {"0": p/4, "1": p/2, "2": p, "3": 2p, "pool": 4p}
    maps of `out_channels`. `trainable=False` freezes the ViT (a linear-probe-like transfer of the trunk)."""

    def __init__(self, body: nn.Module, out_channels: int = 256, trainable: bool = True) -> None:
        super().__init__()
        self.body = body
        dim = int(body.embed_dim)
        stages = []
        for scale in SCALES:
            resample, ch = _resample(dim, scale)
            stages.append(nn.Sequential(resample, nn.Conv2d(ch, out_channels, 1, bias=False), LayerNorm2d(out_channels),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                                        LayerNorm2d(out_channels)))
        self.stages = nn.ModuleList(stages)
        self.top = LastLevelMaxPool()
        self.out_channels = out_channels
        for p in self.body.parameters():
            p.requires_grad_(trainable)

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        (last,) = self.body.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True)
        feats = [stage(last) for stage in self.stages]
        names = [str(i) for i in range(len(feats))]
        feats, names = self.top(feats, feats, names)
        return OrderedDict(zip(names, feats))


def is_vit(body: nn.Module) -> bool:
    """Whether a trunk is a timm ViT (blocks of tokens), not a ResNet-like CNN."""
    return hasattr(body, "blocks") and hasattr(body, "forward_intermediates") and hasattr(body, "patch_embed")

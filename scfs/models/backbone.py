"""timm CNN backbone exposing named stage maps, so the search can pick which stages it works on; and the
Backbone built from a config or loaded from a checkpoint file (the file formats are `scfs.models.checkpoint`'s)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import timm
import torch
from torch import nn

from scfs.models.checkpoint import (
    backbone_config_from,
    is_lightning_checkpoint,
    load_into,
    safe_load,
    select_state_dict,
)
from scfs.models.vit import ViTBackbone
from scfs.names import VIT_LAST_STAGE, backbone_arch

log = logging.getLogger("scfs.checkpoint")  # the loader's messages, under one name wherever they come from
STAGE_NAMES = ("layer1", "layer2", "layer3", "layer4")


def stage_index(name: str | int) -> int:
    """Map `layer2` / `2` to timm's feature index (1..4)."""
    if isinstance(name, int) or (isinstance(name, str) and name.isdigit()):
        idx = int(name)
    elif name in STAGE_NAMES:
        idx = STAGE_NAMES.index(name) + 1
    else:
        raise ValueError(f"unknown backbone stage {name!r}: allowed are {', '.join(STAGE_NAMES)} (or 1..4)")
    if not 1 <= idx <= 4:
        raise ValueError(f"backbone stage index {idx} out of range: allowed are 1..4 ({', '.join(STAGE_NAMES)})")
    return idx


class Backbone(nn.Module):
    """A timm CNN with `features_only=True`, returning `{stage_name: map}` for the stages asked for.

    The last stage (`layer4`) is always computed: its global-average pool is the representation that kNN and
    the linear probe evaluate. `cifar_stem=True` swaps the stride-4 stem for a 3x3 stride-1 conv without
    max-pool, as is usual for 32-px images (otherwise layer4 of a 32-px image is 1x1 and the search is moot);
    `stem_stride=2` halves the resolution once (4x cheaper, for the CPU default).
    """

    def __init__(
        self,
        name: str = "resnet18",
        stages: Sequence[str | int] = ("layer2", "layer3", "layer4"),
        cifar_stem: bool = False,
        stem_stride: int = 1,
        pretrained_path: str | None = None,
        **timm_kwargs,
    ) -> None:
        super().__init__()
        idx = sorted({stage_index(s) for s in stages} | {4})
        self.stage_names = tuple(STAGE_NAMES[i - 1] for i in idx)
        try:
            self.body = timm.create_model(
                name, pretrained=False, features_only=True, out_indices=tuple(idx), **timm_kwargs
            )
        except RuntimeError as err:  # timm: "Unknown model (...)"; a ConfigError so the CLIs say it in one line
            import difflib

            from scfs.config import ConfigError

            close = difflib.get_close_matches(str(name), timm.list_models(), n=5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"config key backbone.name={name!r} is invalid: not a timm model ({err}); pick one "
                              f"from timm.list_models(), e.g. resnet18 or resnet50{hint}") from err
        if cifar_stem:
            self._make_cifar_stem(stem_stride)
        self.channels = dict(zip(self.stage_names, self.body.feature_info.channels()))
        self.embed_dim = self.channels["layer4"]
        if pretrained_path:
            load_state_dict_file(self, pretrained_path)

    def _make_cifar_stem(self, stride: int = 1) -> None:
        if not hasattr(self.body, "conv1") or not hasattr(self.body, "maxpool"):
            raise ValueError("backbone.cifar_stem=true needs a ResNet-like model with conv1/maxpool")
        bn1 = self.body.bn1  # BatchNorm2d, or a GroupNorm with backbone.norm_layer=groupnorm1 (CPU DDP test)
        stem_out = getattr(bn1, "num_features", None) or bn1.num_channels
        self.body.conv1 = nn.Conv2d(3, stem_out, kernel_size=3, stride=stride, padding=1, bias=False)
        self.body.maxpool = nn.Identity()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.stage_names, self.body(x)))

    pool_stage = "layer4"  # the stage whose GAP, `maps[pool_stage].mean(dim=(2, 3))`, is `pool`

    @staticmethod
    def pool(maps: dict[str, torch.Tensor]) -> torch.Tensor:
        """Global-average pool of the last stage: the image representation."""
        return maps["layer4"].mean(dim=(2, 3))

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self(x))


def load_state_dict_file(module: nn.Module, path: str | os.PathLike, which: str = "teacher") -> None:
    """Load the weights in `path` (any supported format) into `module` (a `Backbone`, or a bare timm ResNet)."""
    state = select_state_dict(safe_load(path), which)
    body = module.body if isinstance(module, (Backbone, ViTBackbone)) else module
    load_into(body, state, source=f"checkpoint {path} ({which})")
    log.info("loaded %s weights from %s", which, path)


def make_backbone(name: str, stages: Sequence[str], **cfg: Any) -> Backbone | ViTBackbone:
    """The backbone of `backbone.arch`: a CNN `Backbone` (stages layer1..4) or a `ViTBackbone` (blocks)."""
    if cfg.pop("arch", "cnn") == "vit":
        return ViTBackbone(name, stages=stages, **cfg)
    return Backbone(name, stages=stages, **cfg)


def build_backbone(backbone_cfg: Mapping[str, Any]) -> Backbone | ViTBackbone:
    """A backbone from a config dict (as in conf/backbone/*.yaml); only the last stage is needed for eval."""
    cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in dict(backbone_cfg).items()}
    cfg.pop("channels_last", None)
    cfg.pop("stages", None)
    cfg.pop("pretrained_path", None)  # the init of the run: its weights are replaced by the checkpoint's anyway
    name = cfg.pop("name", "resnet50")
    last = VIT_LAST_STAGE if backbone_arch(cfg) == "vit" else "layer4"
    return make_backbone(name, stages=(last,), **cfg)


def load_backbone(path: str | os.PathLike, which: str = "teacher",
                  backbone_cfg: Mapping[str, Any] | None = None) -> Backbone | ViTBackbone:
    """A `Backbone` with the weights of `path` loaded, in eval mode.

    Ours rebuild the network from the checkpoint's own config (`backbone_cfg` overrides it). Published and
    plain state dicts need `backbone_cfg`; without one they are taken as ResNet-50 (the published models).
    `path="random"` gives the randomly initialised network of `backbone_cfg` (seed it before calling).
    """
    if str(path) == "random":
        if backbone_cfg is None:
            raise ValueError("ckpt=random needs a backbone config (backbone_cfg)")
        return build_backbone(backbone_cfg).eval()
    ckpt = safe_load(path)
    if backbone_cfg is None:
        if is_lightning_checkpoint(ckpt):
            backbone_cfg = backbone_config_from(ckpt)
        else:
            log.info("%s is not an scfs Lightning checkpoint and no backbone config was given: assuming resnet50",
                     path)
            backbone_cfg = {"name": "resnet50"}
    backbone = build_backbone(backbone_cfg)
    load_into(backbone.body, select_state_dict(ckpt, which), source=f"checkpoint {path} ({which})")
    return backbone.eval()

"""timm Vision Transformer backbone with named block maps, so SCFS can search a ViT's patch tokens as it searches a
ResNet's stage maps.

A stage of a ViT is a block: `block1` .. `block<depth>` (1-based), or `last`. Its map is the block's patch tokens
as an NCHW map (C = embed dim, H x W = the patch grid) from timm's `forward_intermediates`, after the final norm:
DINO's `get_intermediate_layers` normalises every block it returns the same way, and the raw residual stream has a
few channels of large magnitude that would dominate the cosine similarity of the search. The image representation
(kNN, linear probe, DINO head) is the CLS token of the last block after the final norm, DINO's protocol.

Views of any size go through the same network (`dynamic_img_size=True`: position embeddings interpolated to the
grid), so 2 global + N local views of different sizes work as with the CNN. (A timm ViT built without a CLS token
has its final norm in `fc_norm` after pooling: its block maps are then the unnormalised tokens, its representation
timm's pooled one.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import timm
import torch
from torch import nn

from scfs.models.checkpoint import load_into, safe_load, select_state_dict
from scfs.names import VIT_LAST_STAGE, VIT_STAGE_PATTERN

CLS_KEY = "cls"  # the representation (the CLS token) in the dict `ViTBackbone.forward` returns, beside the maps


def block_index(name: str, depth: int) -> int:
    """0-based block index of stage `blockN` (1-based N) or `last` in a ViT of `depth` blocks."""
    if name == VIT_LAST_STAGE:
        return depth - 1
    match = re.fullmatch(VIT_STAGE_PATTERN, str(name))
    if match is None:
        raise ValueError(f"unknown ViT stage {name!r}: allowed are block1..block{depth} or {VIT_LAST_STAGE}")
    idx = int(match.group(1)) - 1
    if not 0 <= idx < depth:
        raise ValueError(f"ViT stage {name!r} out of range: this ViT has {depth} blocks (block1..block{depth}, "
                         f"or {VIT_LAST_STAGE})")
    return idx


def default_search_stages(depth: int) -> tuple[str, ...]:
    """The middle block and the last one (a lower and the top level of the same network): what the figures and
    the precision report search on a ViT unless told otherwise."""
    return (f"block{(depth + 1) // 2}", VIT_LAST_STAGE) if depth > 1 else (VIT_LAST_STAGE,)


class ViTBackbone(nn.Module):
    """A timm ViT (any by name, never pretrained from the internet) returning `{stage: NCHW patch map, "cls": CLS}`.

    `patch_size`, `drop_path_rate` and `init_values` (layer scale) are timm's arguments, here from
    conf/backbone/vit_*.yaml; `img_size` is the size the position embeddings are laid out for (views of other sizes
    interpolate them). `.channels` maps each stage to the embed dim (what SCFS's stage heads take), `.embed_dim` is
    the width of the representation, `.body` the timm model (checkpoints load into it).
    """

    def __init__(
        self,
        name: str = "vit_small_patch16_224",
        stages: Sequence[str] = (VIT_LAST_STAGE,),
        pretrained_path: str | None = None,
        **timm_kwargs,
    ) -> None:
        super().__init__()
        timm_kwargs.pop("arch", None)
        timm_kwargs.pop("cifar_stem", None)
        try:
            self.body = timm.create_model(name, pretrained=False, num_classes=0, dynamic_img_size=True,
                                          **timm_kwargs)
        except RuntimeError as err:
            from scfs.config import ConfigError

            raise ConfigError(f"config key backbone.name={name!r} is invalid: not a timm model ({err}); pick a ViT "
                              "from timm.list_models('vit_*'), e.g. vit_small_patch16_224") from err
        except TypeError as err:  # a CNN's constructor refuses the ViT arguments (dynamic_img_size, patch_size ...)
            from scfs.config import ConfigError

            raise ConfigError(f"config key backbone.name={name!r} is invalid with backbone.arch=vit: not a timm "
                              f"VisionTransformer ({err}); use a vit_* model, or backbone.arch=cnn") from err
        if not hasattr(self.body, "blocks") or not hasattr(self.body, "forward_intermediates"):
            from scfs.config import ConfigError

            raise ConfigError(f"config key backbone.name={name!r} is invalid with backbone.arch=vit: not a timm "
                              "VisionTransformer; use a vit_* model, or arch=cnn for a CNN")
        depth = len(self.body.blocks)
        self.depth = depth
        self.stage_names = tuple(dict.fromkeys(str(s) for s in stages)) or (VIT_LAST_STAGE,)
        self.block_of = {s: block_index(s, depth) for s in self.stage_names}
        self.embed_dim = int(self.body.embed_dim)
        self.patch_size = int(self.body.patch_embed.patch_size[0])
        self.channels = {s: self.embed_dim for s in self.stage_names}
        if pretrained_path:
            load_into(self.body, select_state_dict(safe_load(pretrained_path), "teacher"),
                      source=f"checkpoint {pretrained_path} (teacher)")

    def maps_at(self, x: torch.Tensor, stages: Sequence[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """`{stage: (B, C, H/p, W/p)}` for any blocks (also ones this backbone was not built to return) and the CLS
        token after the final norm (B, C): one pass through the blocks."""
        idx = sorted({block_index(s, self.depth) for s in stages})
        final, inter = self.body.forward_intermediates(x, indices=idx, norm=True, output_fmt="NCHW")
        by_block = dict(zip(idx, inter))
        # timm's own pooling of the final tokens: the CLS token for DINO's ViTs (global_pool='token'), the model's
        # global_pool / fc_norm for ViTs built without one
        return {s: by_block[block_index(s, self.depth)] for s in stages}, self.body.forward_head(final, pre_logits=True)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        maps, cls = self.maps_at(x, self.stage_names)
        return {**maps, CLS_KEY: cls}

    @staticmethod
    def pool(maps: dict[str, torch.Tensor]) -> torch.Tensor:
        """The image representation: the CLS token of the last block after the final norm."""
        return maps[CLS_KEY]

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self(x))

    @torch.no_grad()
    def last_self_attention(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's self-attention weights (B, heads, T, T) over all T tokens (prefix tokens first: CLS,
        registers), as DINO's `get_last_selfattention`: timm's fused attention never forms them, so the last
        block's attention is recomputed here from its own qkv projection, norms and scale."""
        body = self.body
        t = body.norm_pre(body.patch_drop(body._pos_embed(body.patch_embed(x))))
        for blk in body.blocks[:-1]:
            t = blk(t)
        last = body.blocks[-1]
        attn = last.attn
        b, n, _ = t.shape
        qkv = attn.qkv(last.norm1(t)).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
        return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)

    def cls_attention(self, x: torch.Tensor) -> torch.Tensor:
        """Per head, the CLS token's attention to the patch tokens in the last block, as maps (B, heads, H, W)
        over the patch grid (DINO's attention figures)."""
        if getattr(self.body, "cls_token", None) is None:
            raise ValueError(f"{type(self.body).__name__} has no CLS token (class_token=False): its attention maps "
                             "have no CLS row to show; use a ViT with a class token (DINO's, timm's vit_* default)")
        a = self.last_self_attention(x)
        gh, gw = self.body.patch_embed.dynamic_feat_size(x.shape[-2:])
        return a[:, :, 0, self.body.num_prefix_tokens:].reshape(x.shape[0], a.shape[1], gh, gw)

    def no_weight_decay_names(self) -> set[str]:
        """Parameter names (relative to this module) that take no weight decay: timm's `no_weight_decay()` set
        (position embedding, CLS and register tokens), the convention of timm's and DeiT's optimisers."""
        return {f"body.{n}" for n in self.body.no_weight_decay()}

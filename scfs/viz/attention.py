"""DINO's attention maps beside SCFS's search, for a ViT: where the last block's CLS token looks, per head, and which
positions a local crop's query picks on the same image.

Same colour rules as the searched-regions figures (`scfs.viz.figures`): heat over the greyed image, nearest-neighbour
blocks = patch cells, one colour scale per row with its colour bar on the right; attention is a weighting (it sums
to 1 over the patches), drawn in the weights' colour map, the search's similarity in the similarity's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from scfs.data.images import normalize_images
from scfs.eval.search_maps import compute_search_maps, eval_mode, module_device
from scfs.models.vit import ViTBackbone, default_search_stages
from scfs.viz.draw import display_factor, overlay_map, upscale
from scfs.viz.figures import (
    SIM_CMAP,
    WEIGHT_CMAP,
    _Block,
    _single,
    crop_panel,
    global_panel,
    grey,
    map_panel,
    row_range,
)

CAPTION = ("Top row of each image: the self-attention of the last block's CLS token (the image representation) to "
           "every patch, per head and averaged over the heads, as DINO shows it; it sums to 1 over the patches. "
           "Bottom row: the SCFS search on the same image: the local crop (yellow box) is the query, its mean patch "
           "token is compared with every patch token of the whole image at each block (heat = cosine similarity = "
           "the soft search's weight). One colour scale per row (colour bar on the right); blocks are patch cells.")


@torch.no_grad()
def cls_attention_maps(backbone: ViTBackbone, images: np.ndarray) -> np.ndarray:
    """(B, heads, H, W) float32 CLS attention of the last block for uint8 (B, H, W, 3) images."""
    with eval_mode(backbone):
        x = normalize_images(images).to(module_device(backbone))
        return backbone.cls_attention(x).float().cpu().numpy()


def _heat_panel(image: np.ndarray, heat: np.ndarray, lo: float, hi: float) -> np.ndarray:
    f = display_factor(max(image.shape[:2]))
    return overlay_map(grey(upscale(image, f)), heat, alpha=0.65, cmap=WEIGHT_CMAP, vmin=lo, vmax=hi)


def attention_figure(backbone: ViTBackbone, images: np.ndarray, names: Sequence[str] | None = None, *,
                     stages: Sequence[str] | None = None, boxes: np.ndarray | None = None, n_crops: int = 4,
                     scale: tuple[float, float] = (0.1, 0.3), local_size: int | None = None, crop: int = 0,
                     title: str = "ViT"):
    """Per image two rows: the CLS attention of each head of the last block and their mean; the image with its
    crops, the query crop and the search's similarity at `stages` (default: the middle and the last block)."""
    if not isinstance(backbone, ViTBackbone):
        raise TypeError(f"the attention figure needs a ViT backbone (backbone.arch=vit), got {type(backbone).__name__}")
    imgs = np.asarray(images)
    stages = tuple(stages or default_search_stages(backbone.depth))
    size = imgs.shape[1]
    p = backbone.patch_size
    local = local_size or max(p, size * 3 // 7 // p * p)  # a crop of about 0.2 of the image, whole patches
    for what, px in (("image size", size), ("local crop size", local)):
        if px % p:
            raise ValueError(f"{what} {px} px is not a multiple of the ViT's patch size {p}: pick a multiple")
    attn = cls_attention_maps(backbone, imgs)
    maps = compute_search_maps(backbone, imgs, boxes, stages=stages, modes=("soft",), n_crops=n_crops, scale=scale,
                               local_size=local, names=list(names or []))
    rows, bars = [], []
    for i in range(len(imgs)):
        name = maps.names[i] if maps.names else f"image {i}"
        heads = [*attn[i], attn[i].mean(axis=0)]
        lo, hi = float(min(h.min() for h in heads)), float(max(h.max() for h in heads))
        hi = hi if hi > lo else lo + 1e-6
        row = [(upscale(imgs[i], display_factor(size)), f"{name}\n{size} px, patch {backbone.patch_size}")]
        row += [(_heat_panel(imgs[i], h, lo, hi), f"head {k + 1}\nCLS attention") for k, h in enumerate(heads[:-1])]
        row.append((_heat_panel(imgs[i], heads[-1], lo, hi), "mean of the heads\nCLS attention"))
        rows.append(row)
        bars.append((WEIGHT_CMAP, lo, hi, "attention"))
        slo, shi = row_range([maps], i, crop, stages)
        row = [(global_panel(maps, i, crop), "global view + crops"), (crop_panel(maps, i, crop), "local crop\n(query)")]
        row += [(map_panel(maps, i, crop, maps.similarity[s][i, crop], SIM_CMAP, vmin=slo, vmax=shi),
                 f"{s} search\nsimilarity = soft weight") for s in stages]
        rows.append(row)
        bars.append((SIM_CMAP, slo, shi, "similarity"))
    return _single(_Block(f"{title}: last block's CLS attention per head, and the SCFS search", rows, bars), CAPTION)

"""What the search finds: similarity and searched weights of local-crop queries on a global view, per stage.

The protocol mirrors one SCFS training step on clean inputs: the global view is the whole image (so feature
positions line up with pixels), each local crop is cut from a box of the image and resized to the local size,
the query of a crop at stage s is the global-average-pooled stage-s feature of the crop, and `feature_search`
(reference backend) compares it with every position of the global view's stage-s map. Training uses the
student for queries and the EMA teacher for maps; by default both come from one backbone here (a checkpoint's
teacher), `query_backbone` gives the training-time pairing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torchvision.ops import roi_align

from scfs.data.images import as_hwc_uint8, denormalize, normalize_images
from scfs.names import SEARCH_STAGES, WEIGHTINGS, search_centred, search_settings


# ---- backbones ------------------------------------------------------------------------------------------------
def resolve_backbones(model: nn.Module, query: str = "same") -> tuple[nn.Module, nn.Module]:
    """(map backbone, query backbone) from a method module of `scfs.methods` (teacher maps; queries from the teacher,
    or the student with `query="student"` as in training) or from a `Backbone` / bare timm features model (used for
    both)."""
    teacher = getattr(model, "teacher", None)
    if isinstance(teacher, nn.ModuleDict) and "backbone" in teacher:
        maps = teacher["backbone"]
        return maps, (model.student["backbone"] if query == "student" else maps)
    if not hasattr(model, "body") and not hasattr(model, "items"):
        raise TypeError(f"expected a method module (scfs.methods) or a scfs Backbone, got {type(model).__name__}")
    return model, model


@contextlib.contextmanager
def eval_mode(*modules: nn.Module) -> Iterator[None]:
    """Eval mode, no grad and eager for the duration, then every submodule's previous train/eval flag restored (the
    training-end figure must not leave the teacher's BatchNorm in another mode).

    Eager even where training compiled the backbones in place (`compile=true`): BatchNorm in eval mode, no grad and
    the figure's few images each fail the training graphs' guards, so a compiled pass would trace and lower new
    graphs (CUDA graphs too, in a pool of their own) for one pass over a handful of images: a CIFAR-10 run's
    end-of-training figure took 53 s on an H100 that way."""
    flags = [[(m, m.training) for m in mod.modules()] for mod in modules]
    try:
        for mod in modules:
            mod.eval()
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            yield
    finally:
        for fl in flags:
            for m, was in fl:
                m.training = was


def stage_maps(backbone: nn.Module, x: torch.Tensor, stages: Sequence[str]) -> dict[str, torch.Tensor]:
    """`{stage: map}` for any stage of a scfs `Backbone`, even ones it was not built to return (a checkpoint's
    eval backbone keeps only layer4): the timm features body is run module by module and the named outputs kept."""
    names = tuple(getattr(backbone, "stage_names", ()))
    if hasattr(backbone, "maps_at"):  # a ViTBackbone: any block in one pass
        return backbone.maps_at(x, stages)[0]
    if names and all(s in names for s in stages):
        out = backbone(x)
        return {s: out[s] for s in stages}
    body = getattr(backbone, "body", backbone)
    if not hasattr(body, "items"):
        raise TypeError(f"cannot take stage maps from {type(backbone).__name__}: no timm features body")
    want, out = set(stages), {}
    for name, module in body.items():
        x = module(x)
        if name in want:
            out[name] = x
            if len(out) == len(want):
                break
    missing = want - set(out)
    if missing:
        raise ValueError(f"the backbone has no stage(s) {sorted(missing)}; it has {list(body.keys())}")
    return out


def module_device(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


# ---- crops ----------------------------------------------------------------------------------------------------
def sample_crop_boxes(n_images: int, n_crops: int, height: int, width: int,
                      scale: Sequence[float] = (0.1, 0.35), ratio: Sequence[float] = (3 / 4, 4 / 3),
                      seed: int = 0) -> np.ndarray:
    """(n_images, n_crops, 4) integer boxes (x0, y0, x1, y1), x1/y1 exclusive, drawn like the training local crops
    (RandomResizedCrop's rule: area share in `scale`, log-uniform aspect ratio in `ratio`, 10 tries, then a
    centred fallback), deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    area = height * width
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    out = np.zeros((n_images, n_crops, 4), dtype=np.int64)
    for i in range(n_images):
        for n in range(n_crops):
            for _ in range(10):
                target = area * rng.uniform(scale[0], scale[1])
                ar = math.exp(rng.uniform(*log_r))
                w = int(round(math.sqrt(target * ar)))
                h = int(round(math.sqrt(target / ar)))
                if 0 < w <= width and 0 < h <= height:
                    top = int(rng.integers(0, height - h + 1))
                    left = int(rng.integers(0, width - w + 1))
                    break
            else:
                w = h = max(1, int(round(math.sqrt(area * scale[0]))))
                top, left = (height - h) // 2, (width - w) // 2
            out[i, n] = (left, top, left + w, top + h)
    return out


def foreground_first(boxes: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Reorder each image's crops so that the one covering most object pixels comes first (figures show crop 0)."""
    out = boxes.copy()
    for i in range(len(boxes)):
        fg = [(masks[i, y0:y1, x0:x1] > 0).mean() if (x1 > x0 and y1 > y0) else 0.0 for x0, y0, x1, y1 in boxes[i]]
        out[i] = boxes[i][np.argsort(fg, kind="stable")[::-1]]
    return out


def crop_views(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Local views: (B,3,H,W) float images, (B,N,4) boxes -> (N*B, 3, size, size), n-major (the order of the
    search op's queries), resized by roi_align with adaptive sampling (as `BatchMultiCrop` does)."""
    b, n = boxes.shape[:2]
    rois = torch.cat([torch.arange(b, dtype=boxes.dtype, device=boxes.device).repeat(n)[:, None],
                      boxes.transpose(0, 1).reshape(n * b, 4)], dim=1)
    return roi_align(images, rois.to(images.dtype), output_size=(size, size), spatial_scale=1.0, sampling_ratio=-1,
                     aligned=True)


# ---- the search on a batch ------------------------------------------------------------------------------------
@dataclass
class SearchMaps:
    """Search results for B images x N crops.

    images (B,H,W,3) uint8 global views; boxes (B,N,4) crop boxes in their pixels; crops (B,N,s,s,3) uint8 local
    views; similarity[stage] (B,N,h,w); weights[mode][stage] (B,N,h,w) (soft = similarity, hard = similarity on
    the top-k positions, softmax = H*W*softmax(sim/T)); names optional per-image captions; centre: whether the
    similarity was centred on each image's mean feature (`feature_search(centre=True)`).
    """

    images: np.ndarray
    boxes: np.ndarray
    crops: np.ndarray
    similarity: dict[str, np.ndarray]
    weights: dict[str, dict[str, np.ndarray]]
    stages: tuple[str, ...]
    modes: tuple[str, ...]
    topk: float = 0.25
    temperature: float = 0.1
    names: list[str] = field(default_factory=list)
    centre: bool = False

    def __len__(self) -> int:
        return len(self.images)

    @property
    def n_crops(self) -> int:
        return self.boxes.shape[1]


@torch.no_grad()
def search_batch(maps_backbone: nn.Module, images: np.ndarray | torch.Tensor, boxes: np.ndarray | torch.Tensor,
                 stages: Sequence[str] = SEARCH_STAGES, modes: Sequence[str] = WEIGHTINGS, local_size: int = 16,
                 query_backbone: nn.Module | None = None, topk: float = 0.25, temperature: float = 0.1,
                 centre: bool = False,
                 ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], torch.Tensor]:
    """The search for one batch: similarity {stage: (B,N,h,w)}, weights {mode: {stage: (B,N,h,w)}} (CPU float32)
    and the local views (N*B,3,s,s); `centre`: the centred similarity. Modules must already be in eval mode (see
    `eval_mode`)."""
    from scfs.search import feature_search

    query_backbone = query_backbone or maps_backbone
    device = module_device(maps_backbone)
    x = normalize_images(images).to(device)
    bx = torch.as_tensor(np.asarray(boxes), dtype=torch.float32, device=device)
    b, n = bx.shape[:2]
    local = crop_views(x, bx, local_size)
    g_maps = stage_maps(maps_backbone, x, stages)
    l_maps = stage_maps(query_backbone, local.to(module_device(query_backbone)), stages)
    sims: dict[str, torch.Tensor] = {}
    weights: dict[str, dict[str, torch.Tensor]] = {m: {} for m in modes}
    for s in stages:
        feats = g_maps[s].float()
        queries = l_maps[s].float().mean(dim=(2, 3)).view(n, b, -1).to(feats.device)
        # a 1-channel projection: the searched features (N*B copies of the map) are not needed here, only the
        # similarity and weights, which the projection does not change
        proj = torch.zeros(1, feats.shape[1], device=feats.device)
        for m in modes or ("soft",):
            out = feature_search(feats, queries, mode=m, weight=proj, topk=topk, temperature=temperature,
                                 backend="reference", centre=centre)
            sims[s] = out.similarity.transpose(0, 1).cpu()
            if m in weights:
                weights[m][s] = out.weights.transpose(0, 1).cpu()
    return sims, weights, local.cpu()


def compute_search_maps(model: nn.Module, images: np.ndarray | Sequence[Any], boxes: np.ndarray | None = None, *,
                        stages: Sequence[str] = SEARCH_STAGES, modes: Sequence[str] = WEIGHTINGS, local_size: int = 16,
                        n_crops: int = 4, scale: Sequence[float] = (0.1, 0.35), seed: int = 0,
                        masks: np.ndarray | None = None, query: str = "same", topk: float = 0.25,
                        temperature: float = 0.1, names: Sequence[str] | None = None,
                        batch_size: int = 64, centre: bool | None = None) -> SearchMaps:
    """Run the search of `model` (a method module or a Backbone) on `images` (uint8 (B,H,W,3), all one size; use
    `scfs.data.images.prepare_image` for photos) with crop `boxes` (B,N,4), or `n_crops` sampled ones
    (object-covering crops first when `masks` are given). `centre`: the centred similarity; None follows a method
    module's `search.centre` (raw for a Backbone)."""
    if centre is None:
        centre = centre_of(model)
    imgs = np.stack([as_hwc_uint8(im) for im in images]) if not isinstance(images, np.ndarray) else images
    if imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"images must be (B,H,W,3) uint8, got {imgs.shape}")
    b, h, w = imgs.shape[:3]
    if boxes is None:
        boxes = sample_crop_boxes(b, n_crops, h, w, scale, seed=seed)
        if masks is not None:
            boxes = foreground_first(boxes, np.asarray(masks))
    boxes = np.asarray(boxes)
    if boxes.shape[:1] != (b,) or boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"boxes must be (B={b}, N, 4), got {boxes.shape}")
    maps_bb, query_bb = resolve_backbones(model, query)
    sims: dict[str, list[torch.Tensor]] = {s: [] for s in stages}
    weights: dict[str, dict[str, list[torch.Tensor]]] = {m: {s: [] for s in stages} for m in modes}
    crops = []
    with eval_mode(maps_bb, query_bb):
        for i in range(0, b, batch_size):
            sl = slice(i, i + batch_size)
            s_b, w_b, local = search_batch(maps_bb, imgs[sl], boxes[sl], stages, modes, local_size, query_bb, topk,
                                           temperature, centre)
            for s in stages:
                sims[s].append(s_b[s])
                for m in modes:
                    weights[m][s].append(w_b[m][s])
            nb = len(imgs[sl])
            crops.append(np.stack([denormalize(v) for v in local]).reshape(boxes.shape[1], nb, local_size,
                                                                           local_size, 3).transpose(1, 0, 2, 3, 4))
    return SearchMaps(imgs, boxes, np.concatenate(crops), {s: torch.cat(v).numpy() for s, v in sims.items()},
                      {m: {s: torch.cat(v).numpy() for s, v in d.items()} for m, d in weights.items()},
                      tuple(stages), tuple(modes), topk, temperature, list(names or []), bool(centre))


def stages_of(model: nn.Module, default: Sequence[str] = SEARCH_STAGES) -> tuple[str, ...]:
    """The searched stages of a method module (its config), else `default` (a ViT's: its middle and last block)."""
    stages = tuple(getattr(model, "stages", ()) or ())
    if stages:
        return stages
    from scfs.models.vit import ViTBackbone, default_search_stages

    teacher = getattr(model, "teacher", None)
    backbone = teacher["backbone"] if isinstance(teacher, nn.ModuleDict) and "backbone" in teacher else model
    return default_search_stages(backbone.depth) if isinstance(backbone, ViTBackbone) else tuple(default)


def centre_of(model: nn.Module | Mapping[str, Any] | None) -> bool:
    """Whether a method module (or its search config) searches with the centred similarity (`search.centre`);
    False for anything without a search config."""
    cfg = getattr(model, "search_cfg", None) if not isinstance(model, Mapping) else model
    return search_centred(cfg)


def mode_of(model: nn.Module | Mapping[str, Any] | None, default: str = "soft") -> str:
    """The search weighting a method module trains with (`search.weighting`; checkpoints of the single `mode` key
    read too), `default` when it has no search config."""
    cfg = getattr(model, "search_cfg", None) if not isinstance(model, Mapping) else model
    if not cfg:
        return default
    weighting = search_settings(cfg)[0]
    return weighting if weighting in WEIGHTINGS else default

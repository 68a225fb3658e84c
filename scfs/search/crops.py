"""Random feature-map crops: the naive feature-level augmentation baseline that SCFS is compared against."""

from __future__ import annotations

import torch
from torchvision.ops import roi_align


def random_feature_crops(
    feats: torch.Tensor,
    n: int,
    out_size: int,
    scale: tuple[float, float] = (0.05, 0.4),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """n random square-ish boxes per image, resampled to out_size x out_size with roi_align.

    `scale` is the range of the box area as a fraction of the map area. Returns (n*B, C, s, s), n-major
    (crop i of image b at index i*B + b), matching `feature_search`'s ordering.
    """
    if feats.dim() != 4:
        raise ValueError(f"feats must be (B, C, H, W), got shape {tuple(feats.shape)}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if out_size < 1:
        raise ValueError(f"out_size must be >= 1, got {out_size}")
    lo, hi = scale
    if not (0.0 < lo <= hi <= 1.0):
        raise ValueError(f"scale must satisfy 0 < lo <= hi <= 1, got {scale}")
    if not feats.is_floating_point():
        raise ValueError(f"feats must be floating point, got dtype {feats.dtype}")
    b, _, h, w = feats.shape
    u = torch.rand((n, b, 4), generator=generator, dtype=torch.float64)
    area = (lo + (hi - lo) * u[..., 0]) * h * w
    log_r = (2 * u[..., 1] - 1) * torch.log(torch.tensor(4.0 / 3.0, dtype=torch.float64))
    ratio = torch.exp(log_r)
    bw = torch.sqrt(area * ratio).clamp(max=float(w))
    bh = torch.sqrt(area / ratio).clamp(max=float(h))
    x0 = u[..., 2] * (w - bw)
    y0 = u[..., 3] * (h - bh)
    idx = torch.arange(b, dtype=torch.float64).expand(n, b)
    boxes = torch.stack([idx, x0, y0, x0 + bw, y0 + bh], dim=-1).reshape(n * b, 5)
    x = feats if feats.dtype in (torch.float32, torch.float64) else feats.float()
    boxes = boxes.to(device=feats.device, dtype=x.dtype)
    out = roi_align(x, boxes, output_size=(out_size, out_size), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    return out.to(feats.dtype)

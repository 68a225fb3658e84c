"""Raster helpers for searched-region figures: images as uint8 (H,W,3) numpy arrays in, new arrays out.

Figures are composed as rasters (upscale -> overlay heat -> draw boxes) rather than with matplotlib patches, so the
very same picture can go to a PNG, a W&B image or a test's pixel check, and tiny 32-px images stay crisp.
Conversions between model input and pictures live in `scfs.data.images`, the figure canvas in `scfs.plotting`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from scfs.data.images import as_hwc_uint8

Color = tuple[int, int, int]
YELLOW: Color = (255, 221, 0)
WHITE: Color = (255, 255, 255)
CYAN: Color = (0, 220, 255)
MAGENTA: Color = (255, 0, 255)


def upscale(image: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscaling by an integer factor (keeps pixels and feature cells honest)."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    return np.ascontiguousarray(np.repeat(np.repeat(image, factor, axis=0), factor, axis=1))


def display_factor(size: int, target: int = 160) -> int:
    """Integer upscale factor that brings a `size`-px image to about `target` px for display."""
    return max(1, round(target / max(size, 1)))


def draw_boxes(image: np.ndarray, boxes: np.ndarray | Sequence[Sequence[float]],
               colors: Color | Sequence[Color] = YELLOW, width: int = 1) -> np.ndarray:
    """Rectangle outlines on a copy of `image` (H,W,3) uint8.

    boxes (K,4) are (x0, y0, x1, y1) in pixels with exclusive x1/y1 (the dataset convention); the outline is drawn
    inside the box, `width` pixels thick, clipped to the image. Fractional boxes are rounded.
    """
    out = as_hwc_uint8(image).copy()
    h, w = out.shape[:2]
    bxs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(colors) == 3 and all(isinstance(c, (int, np.integer)) for c in colors):
        cols = [tuple(colors)] * len(bxs)  # type: ignore[arg-type]
    else:
        cols = list(colors)  # type: ignore[arg-type]
        if len(cols) != len(bxs):
            raise ValueError(f"{len(cols)} colours for {len(bxs)} boxes")
    for (x0, y0, x1, y1), col in zip(np.round(bxs).astype(int), cols):
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
        if x1 <= x0 or y1 <= y0:
            continue
        t = max(1, min(width, (x1 - x0 + 1) // 2, (y1 - y0 + 1) // 2))
        c = np.asarray(col, dtype=np.uint8)
        out[y0:y0 + t, x0:x1] = c
        out[y1 - t:y1, x0:x1] = c
        out[y0:y1, x0:x0 + t] = c
        out[y0:y1, x1 - t:x1] = c
    return out


def draw_outline(image: np.ndarray, mask: np.ndarray, color: Color = (255, 0, 255), width: int = 1) -> np.ndarray:
    """The boundary of a (H,W) bool `mask` (its pixels with a neighbour outside it, `width` px thick) drawn on a
    copy of `image` (H,W,3) uint8 of the same size."""
    out = as_hwc_uint8(image).copy()
    m = np.asarray(mask, dtype=bool)
    if m.shape != out.shape[:2]:
        raise ValueError(f"mask {m.shape} and image {out.shape[:2]} must have the same size")
    inner = m.copy()
    for _ in range(max(1, int(width))):  # erode by one pixel (4-neighbourhood) per step
        pad = np.pad(inner, 1, constant_values=False)
        inner = inner & pad[:-2, 1:-1] & pad[2:, 1:-1] & pad[1:-1, :-2] & pad[1:-1, 2:]
    out[m & ~inner] = np.asarray(color, dtype=np.uint8)
    return out


def resize_map(heat: np.ndarray | torch.Tensor, size: tuple[int, int], mode: str = "nearest") -> np.ndarray:
    """A (h,w) map resized to `size` = (H, W): nearest (each feature cell as a block) or bilinear."""
    t = torch.as_tensor(np.asarray(heat, dtype=np.float32))[None, None]
    kw = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(t, size=size, mode=mode, **kw)[0, 0].numpy()


def colorize(heat: np.ndarray, cmap: str = "inferno", vmin: float | None = None,
             vmax: float | None = None) -> np.ndarray:
    """A 2-D map to (H,W,3) uint8 colours; the range is the map's own min/max unless given."""
    from matplotlib import colormaps

    lo = float(np.min(heat)) if vmin is None else float(vmin)
    hi = float(np.max(heat)) if vmax is None else float(vmax)
    scaled = (np.asarray(heat, dtype=np.float64) - lo) / (hi - lo) if hi > lo else np.zeros_like(heat, np.float64)
    rgba = colormaps[cmap](np.clip(scaled, 0.0, 1.0))
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def overlay_map(image: np.ndarray, heat: np.ndarray | torch.Tensor, alpha: float = 0.55, cmap: str = "inferno",
                vmin: float | None = None, vmax: float | None = None, mode: str = "nearest") -> np.ndarray:
    """`heat` (h,w), resized to the image, coloured and blended over `image` (H,W,3) uint8 -> (H,W,3) uint8."""
    img = as_hwc_uint8(image)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    heat = np.asarray(heat.detach().cpu() if isinstance(heat, torch.Tensor) else heat, dtype=np.float32)
    if heat.ndim != 2:
        raise ValueError(f"heat must be a 2-D (h,w) map, got shape {heat.shape}")
    big = resize_map(heat, img.shape[:2], mode)
    col = colorize(big, cmap, vmin, vmax).astype(np.float32)
    return ((1.0 - alpha) * img.astype(np.float32) + alpha * col).round().clip(0, 255).astype(np.uint8)

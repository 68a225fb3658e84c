"""DINO multi-crop augmentation that also reports where each view came from.

SCFS needs to know each crop's box in the original image (to relate local views to regions of the teacher's
global feature maps, and to draw searched regions), so the crop parameters are sampled explicitly with
``v2.RandomResizedCrop.get_params`` and applied with ``v2.functional.resized_crop`` instead of hiding them in
a Compose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def as_uint8_chw(img: torch.Tensor | Image.Image) -> torch.Tensor:
    if isinstance(img, Image.Image):
        img = F.pil_to_tensor(img.convert("RGB"))
    if not isinstance(img, torch.Tensor) or img.ndim != 3 or img.shape[0] not in (1, 3):
        raise ValueError(f"expected a (3,H,W) or (1,H,W) image tensor or a PIL image, got "
                         f"{type(img).__name__} {tuple(getattr(img, 'shape', ()))}")
    if img.dtype != torch.uint8:
        raise ValueError(f"expected a uint8 image tensor, got {img.dtype}")
    img = img.as_subclass(torch.Tensor)  # plain tensor in, plain tensors out (tv_tensors.Image also accepted)
    return img.repeat(3, 1, 1) if img.shape[0] == 1 else img


def _check_scale(name: str, scale: Sequence[float]) -> tuple[float, float]:
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"{name} must be (lo, hi) with 0 < lo <= hi <= 1, got {tuple(scale)}")
    return float(scale[0]), float(scale[1])


def _check_prob(name: str, p: float) -> float:
    if not 0 <= p <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
    return float(p)


def blur_for_size(size: int, sigma: tuple[float, float], ref_size: int | None) -> v2.GaussianBlur:
    """Gaussian blur whose sigma (given at ``ref_size`` px, DINO: (0.1, 2.0) at 224) scales with the crop
    size, and whose kernel covers +-3 sigma: a 23 px DINO kernel would flatten a 16 px crop."""
    f = 1.0 if ref_size is None else size / ref_size
    lo, hi = sigma[0] * f, sigma[1] * f
    k = min(2 * math.ceil(3 * hi) + 1, size if size % 2 else size - 1)
    return v2.GaussianBlur(kernel_size=max(k, 3), sigma=(lo, hi))


class MultiCrop:
    """Two global + ``n_local`` local views with DINO's augmentations, plus their boxes.

    Returns ``dict(views=[Tensor(3,h,w) float, normalised], boxes=Tensor(V,4) float (x0,y0,x1,y1) in original
    image pixels, before flipping), flips=Tensor(V) bool)``; views 0,1 are global. Works with default_collate:
    views -> list of (B,3,h,w), boxes -> (B,V,4).
    """

    def __init__(self, global_size: int = 64, local_size: int = 32, n_local: int = 6,
                 global_scale: Sequence[float] = (0.25, 1.0), local_scale: Sequence[float] = (0.05, 0.25),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), flip_p: float = 0.5,
                 jitter: Sequence[float] = (0.4, 0.4, 0.2, 0.1), jitter_p: float = 0.8, gray_p: float = 0.2,
                 blur_p: Sequence[float] = (1.0, 0.1, 0.5), blur_sigma: Sequence[float] = (0.1, 2.0),
                 blur_ref_size: int | None = 224, solarize_p: float = 0.2,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        if global_size <= 0 or local_size <= 0:
            raise ValueError(
                f"crop sizes must be > 0, got global_size={global_size}, local_size={local_size}")
        if n_local < 0:
            raise ValueError(f"n_local must be >= 0, got {n_local}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {tuple(ratio)}")
        if len(jitter) != 4 or min(jitter) < 0:
            raise ValueError("jitter must be 4 non-negative numbers (brightness, contrast, saturation, "
                             f"hue), got {tuple(jitter)}")
        if len(blur_p) != 3:
            raise ValueError(f"blur_p must be (global1, global2, local) probabilities, got {tuple(blur_p)}")
        if len(blur_sigma) != 2 or not 0 < blur_sigma[0] <= blur_sigma[1]:
            raise ValueError(f"blur_sigma must be (lo, hi) with 0 < lo <= hi, got {tuple(blur_sigma)}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean/std must have 3 entries and std > 0, got {tuple(mean)}, {tuple(std)}")
        self.global_size, self.local_size, self.n_local = int(global_size), int(local_size), int(n_local)
        self.global_scale = _check_scale("global_scale", global_scale)
        self.local_scale = _check_scale("local_scale", local_scale)
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip_p = _check_prob("flip_p", flip_p)
        self.jitter_p = _check_prob("jitter_p", jitter_p)
        self.gray_p = _check_prob("gray_p", gray_p)
        self.blur_p = tuple(_check_prob("blur_p", p) for p in blur_p)
        self.solarize_p = _check_prob("solarize_p", solarize_p)
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self._jitter = v2.ColorJitter(*jitter)
        sigma = (float(blur_sigma[0]), float(blur_sigma[1]))
        self._blur_global = blur_for_size(self.global_size, sigma, blur_ref_size)
        self._blur_local = blur_for_size(self.local_size, sigma, blur_ref_size)

    @property
    def n_views(self) -> int:
        return 2 + self.n_local

    def _view(self, img: torch.Tensor, size: int, scale: tuple[float, float], blur: v2.GaussianBlur,
              blur_p: float, solarize_p: float) -> tuple[torch.Tensor, list[float], bool]:
        top, left, h, w = v2.RandomResizedCrop.get_params(img, list(scale), list(self.ratio))
        out = F.resized_crop(img, top, left, h, w, [size, size], antialias=True)
        flip = bool(torch.rand(()) < self.flip_p)
        if flip:
            out = F.horizontal_flip(out)
        if torch.rand(()) < self.jitter_p:
            out = self._jitter(out)
        if torch.rand(()) < self.gray_p:
            out = F.rgb_to_grayscale(out, num_output_channels=3)
        if torch.rand(()) < blur_p:
            out = blur(out)
        if torch.rand(()) < solarize_p:
            out = F.solarize(out, threshold=128)
        out = F.normalize(F.to_dtype(out, torch.float32, scale=True), self.mean, self.std)
        return out, [float(left), float(top), float(left + w), float(top + h)], flip

    def __call__(self, img: torch.Tensor | Image.Image) -> dict[str, Any]:
        img = as_uint8_chw(img)
        specs = [
            (self.global_size, self.global_scale, self._blur_global, self.blur_p[0], 0.0),
            (self.global_size, self.global_scale, self._blur_global, self.blur_p[1], self.solarize_p),
        ] + [(self.local_size, self.local_scale, self._blur_local, self.blur_p[2], 0.0)] * self.n_local
        views, boxes, flips = [], [], []
        for s in specs:
            v, b, f = self._view(img, *s)
            views.append(v)
            boxes.append(b)
            flips.append(f)
        return {"views": views, "boxes": torch.tensor(boxes, dtype=torch.float32),
                "flips": torch.tensor(flips, dtype=torch.bool)}

    def __repr__(self) -> str:
        return (f"MultiCrop(global={self.global_size}x2 {self.global_scale}, "
                f"local={self.local_size}x{self.n_local} {self.local_scale})")


class MultiCropGeometry(MultiCrop):
    """``MultiCrop``'s crops alone: RandomResizedCrop + antialiased resize, uint8 views, boxes; no flip, colour or
    normalisation. With ``data.colour_on_device`` the DataLoader workers run this and the training module
    finishes the views on its device for the whole batch (``BatchMultiCrop.colour``): at ImageNet sizes the
    colour ops are ~90 % of the per-sample host time (one 256x341 photo, one core: decode 0.9 ms, crops 3.6 ms,
    full ``MultiCrop`` 36.8 ms), so a worker then feeds ~8x more images per second.

    Returns ``dict(views=[uint8 (3,s,s)], boxes=(V,4) float32 (x0,y0,x1,y1) original pixels)``."""

    def __call__(self, img: torch.Tensor | Image.Image) -> dict[str, Any]:
        img = as_uint8_chw(img)
        specs = [(self.global_size, self.global_scale)] * 2 + [(self.local_size, self.local_scale)] * self.n_local
        views, boxes = [], []
        for size, scale in specs:
            top, left, h, w = v2.RandomResizedCrop.get_params(img, list(scale), list(self.ratio))
            views.append(F.resized_crop(img, top, left, h, w, [size, size], antialias=True))
            boxes.append([float(left), float(top), float(left + w), float(top + h)])
        return {"views": views, "boxes": torch.tensor(boxes, dtype=torch.float32)}

    def __repr__(self) -> str:
        return "MultiCropGeometry" + super().__repr__()[len("MultiCrop"):]


class EvalTransform:
    """Deterministic view for kNN / linear eval: resize shorter side to ``resize`` (default ``size``), center
    crop ``size``, normalise -> float (3,size,size)."""

    def __init__(self, size: int, resize: int | None = None, mean: Sequence[float] = IMAGENET_MEAN,
                 std: Sequence[float] = IMAGENET_STD) -> None:
        resize = size if resize is None else resize
        if size <= 0 or resize <= 0:
            raise ValueError(f"size and resize must be > 0, got size={size}, resize={resize}")
        if resize < size:
            raise ValueError(f"resize ({resize}) must be >= size ({size}) so the center crop stays inside")
        self.size, self.resize = int(size), int(resize)
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]

    def __call__(self, img: torch.Tensor | Image.Image) -> torch.Tensor:
        img = as_uint8_chw(img)
        img = F.resize(img, [self.resize], antialias=True)
        img = F.center_crop(img, [self.size, self.size])
        return F.normalize(F.to_dtype(img, torch.float32, scale=True), self.mean, self.std)

    def __repr__(self) -> str:
        return f"EvalTransform(size={self.size}, resize={self.resize})"

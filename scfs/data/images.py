"""Images in and out of the model's layout: uint8 (H,W,3) pictures <-> ImageNet-normalised float tensors, and
photos from a folder as square global views.

Search maps, figures and notebooks all meet images in several layouts (dataset CHW tensors, shapes HWC arrays,
PIL, files); converting in one place keeps what the model sees and what a figure shows the same pixels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD

log = logging.getLogger("scfs.data.images")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def as_hwc_uint8(image: np.ndarray | torch.Tensor) -> np.ndarray:
    """A (H,W,3) uint8 numpy image from a uint8 image: torch tensors are CHW (the datasets' layout), numpy arrays
    HWC (the shapes arrays', PIL's) unless only the CHW reading fits."""
    is_torch = isinstance(image, torch.Tensor)
    arr = image.detach().cpu().numpy() if is_torch else np.asarray(image)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3:
        raise ValueError(f"expected an (H,W,3) or (3,H,W) image, got shape {arr.shape}")
    if arr.shape[0] in (1, 3) and (is_torch or arr.shape[2] not in (1, 3)):
        arr = arr.transpose(1, 2, 0)
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    if arr.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {arr.dtype}")
    return np.ascontiguousarray(arr)


def denormalize(view: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN,
                std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """A normalised float (3,H,W) view (as the model sees it) back to a displayable (H,W,3) uint8 image."""
    m = torch.tensor(mean, dtype=view.dtype, device=view.device)[:, None, None]
    s = torch.tensor(std, dtype=view.dtype, device=view.device)[:, None, None]
    img = ((view * s + m).clamp(0, 1) * 255).round().to(torch.uint8)
    return img.permute(1, 2, 0).cpu().numpy()


def normalize_images(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(B,H,W,3) uint8 -> (B,3,H,W) float32 normalised with the ImageNet statistics (the training transform's)."""
    # np.array copies: memory-mapped arrays are read-only and torch warns about them
    x = torch.from_numpy(np.array(images, dtype=np.uint8)).permute(0, 3, 1, 2).float().div(255)
    m = torch.tensor(IMAGENET_MEAN)[:, None, None]
    s = torch.tensor(IMAGENET_STD)[:, None, None]
    return (x - m) / s


def prepare_image(image: Any, size: int) -> np.ndarray:
    """Any image (path, PIL, uint8 HWC/CHW array or tensor) -> (size, size, 3) uint8: shorter side resized to
    `size`, then centre-cropped, as the global view of a photo."""
    import torchvision.transforms.v2.functional as TF

    if isinstance(image, (str, Path)):
        from scfs.data.datasets import decode_rgb

        t = decode_rgb(image)
    elif hasattr(image, "convert"):  # PIL
        t = TF.pil_to_tensor(image.convert("RGB"))
    else:
        t = torch.from_numpy(as_hwc_uint8(image)).permute(2, 0, 1)
    if t.shape[-2:] != (size, size):
        t = TF.center_crop(TF.resize(t, [size], antialias=True), [size, size])
    return t.permute(1, 2, 0).contiguous().numpy()


def list_images(folder: str | Path, limit: int | None = None) -> list[Path]:
    """Image files under `folder` (recursive, sorted): the 'any folder of photos' input of the notebooks."""
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    return files[:limit] if limit else files


def load_image_folder(folder: str | Path, size: int, limit: int | None = None) -> tuple[np.ndarray, list[str]]:
    """(N, size, size, 3) uint8 global views of the photos in `folder` and their file stems; unreadable files are
    skipped with a warning."""
    images, names = [], []
    for p in list_images(folder):
        try:
            images.append(prepare_image(p, size))
        except Exception as err:  # a bad photo must not stop the figure
            log.warning("skipping %s: %s", p, err)
            continue
        names.append(p.stem)
        if limit and len(images) >= limit:
            break
    if not images:
        raise FileNotFoundError(f"no readable images under {folder}")
    return np.stack(images), names

"""Training images that reach the training device still encoded (`data.decode=gpu`).

Why: on the ImageNet recipe the DataLoader workers spend most of their time decoding JPEGs and cutting crops, and
the GPU waits for them. With `data.decode=gpu` a worker only reads each file's bytes; the training module decodes
the whole batch at once on its device (torchvision's `decode_jpeg(list, device=...)` through
`scfs.data.image_decode`: nvJPEG on CUDA, libjpeg on the CPU, so the same code path runs and is tested on a
CPU-only machine) and makes every view there
(`BatchMultiCrop` on a list of images of different sizes, `scfs.data.batch_aug.pack_images`).

Which files travel encoded: JPEGs with three colour components (YCbCr) and no EXIF rotation, i.e. the files whose
device decode gives the pixels the CPU path gives. Every other file (PNG, WebP, ...; grayscale, CMYK and YCCK
JPEGs; EXIF-rotated photos) is decoded in the worker by `decode_rgb`, exactly as `data.decode=cpu` decodes it at
full size, and travels as a uint8 (3,H,W) image: nvJPEG has no CMYK conversion, torchvision's device decoder
ignores EXIF orientation, and keeping the device path to one case keeps it exact. Those files are rare in photo
collections (ImageNet: ~2 % grayscale, 22 CMYK, 1 PNG), so the workers' share of decoding stays small.

Unreadable files: a file whose header PIL cannot parse is an unreadable file of the dataset like on the CPU path
(`ImageFileDataset`: skipped with a warning, or with `data.strict=true` an error). A JPEG with a readable header
whose data the device decoder rejects is decoded again on the host (libjpeg, then PIL, `decode_rgb`); if that
fails too, `data.strict=true` stops the run with one line naming the file, otherwise one warning line names it and
its neighbour in the batch (image and label) takes its place.
"""

from __future__ import annotations

import functools
import io
import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from PIL import Image

from scfs.data.datasets import ImageDecodeError, ImageFileDataset, decode_rgb, shown_path
from scfs.data.image_decode import decode_jpeg_rgb

JPEG_MAGIC = b"\xff\xd8\xff"


class EncodedFile(NamedTuple):
    """One training sample's image as a worker delivers it: `data` is the file's bytes (1-D uint8, a JPEG the
    device decodes) or the decoded uint8 (3,H,W) image (every other file); `path` names it in errors."""

    data: torch.Tensor
    path: str

    def image(self) -> torch.Tensor:
        """The uint8 (3,H,W) image on the host, the JPEG decoded as the device path decodes it: for code that
        looks at a sample outside the training step (the end-of-run figure, notebooks)."""
        return decode_jpeg_rgb(self.data) if self.data.ndim == 1 else self.data


class EncodedImages:
    """A batch of `EncodedFile`s packed into one flat uint8 tensor (one shared-memory transfer from a worker,
    not one per image): `shapes[i]` is sample i's shape, (n,) for JPEG bytes or (3,H,W) for a decoded image.

    Deliberately neither a tensor collection nor an object with a `to` method: Lightning's
    `transfer_batch_to_device` then leaves it on the host, where `decode_jpeg` wants its input for every
    device; the module decodes it in `on_after_batch_transfer`."""

    def __init__(self, flat: torch.Tensor, shapes: Sequence[tuple[int, ...]], paths: Sequence[str],
                 strict: bool = False) -> None:
        self.flat, self.shapes, self.paths, self.strict = flat, [tuple(s) for s in shapes], list(paths), strict

    def __len__(self) -> int:
        return len(self.shapes)

    def tensors(self) -> list[torch.Tensor]:
        """Per sample: 1-D JPEG bytes or a uint8 (3,H,W) image (views of `flat`, no copy)."""
        sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        return [t.view(s) for t, s in zip(self.flat.split(sizes), self.shapes)]

    def __repr__(self) -> str:
        n_enc = sum(len(s) == 1 for s in self.shapes)
        return f"EncodedImages({len(self)} images, {n_enc} encoded JPEGs, {self.flat.numel()} bytes)"


def device_decodable(raw: bytes | bytearray) -> bool:
    """Whether `raw` is a JPEG that travels encoded: three components, no EXIF rotation (PIL reads the header
    only, ~0.1 ms). Raises what PIL raises for a header it cannot parse."""
    if bytes(raw[:3]) != JPEG_MAGIC:
        return False
    with Image.open(io.BytesIO(raw)) as im:
        return im.format == "JPEG" and im.mode == "RGB" and im.getexif().get(0x0112, 1) in (1, None)


def read_for_device(path: str | os.PathLike) -> torch.Tensor:
    """A worker's share of `data.decode=gpu`: the file's bytes as a 1-D uint8 tensor when the device decodes
    it, else the image decoded here as the CPU path decodes it (`decode_rgb`, full size; raises
    `ImageDecodeError` for an unreadable file)."""
    with open(path, "rb") as f:
        raw = bytearray(os.fstat(f.fileno()).st_size)
        n = f.readinto(raw)
    del raw[n:]
    try:
        if device_decodable(raw):
            return torch.frombuffer(raw, dtype=torch.uint8)
    except Exception:  # noqa: BLE001 - a header PIL cannot parse: decode_rgb tries torchvision, then says why not
        pass
    return decode_rgb(path)


class EncodedImageFiles(ImageFileDataset):
    """The training split of an image folder for `data.decode=gpu`: samples are `(EncodedFile, label)`; the
    unreadable-file handling (skip a neighbour in, or strict) is `ImageFileDataset`'s."""

    @classmethod
    def of(cls, files: ImageFileDataset) -> EncodedImageFiles:
        return cls(files.samples, files.classes, None, files.strict)

    def _load(self, index: int) -> tuple[EncodedFile, int]:
        path, label = self.samples[index]
        return EncodedFile(read_for_device(path), path), label


def collate_encoded(batch: Sequence[tuple[EncodedFile, int]], strict: bool = False
                    ) -> tuple[EncodedImages, torch.Tensor]:
    """`(EncodedImages, int64 labels)` of a list of samples; runs in the worker."""
    files = [f for f, _ in batch]
    flat = torch.cat([f.data.reshape(-1) for f in files])
    labels = torch.tensor([int(y) for _, y in batch], dtype=torch.int64)
    return EncodedImages(flat, [tuple(f.data.shape) for f in files], [f.path for f in files], strict), labels


def encoded_collate(strict: bool) -> Any:
    """The DataLoader's `collate_fn` (picklable, for worker processes)."""
    return functools.partial(collate_encoded, strict=strict)


def decode_images(batch: EncodedImages, labels: torch.Tensor | None, device: torch.device | str
                  ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The batch's images as uint8 (3,H,W) tensors on `device`: the JPEGs in one batched `decode_jpeg` call,
    the images the workers decoded copied over. Returns the images and the labels (changed only where an
    undecodable image was replaced by its neighbour, see the module doc)."""
    device = torch.device(device)
    items = batch.tensors()
    out: list[torch.Tensor | None] = [t.to(device, non_blocking=True) if t.ndim == 3 else None for t in items]
    jpegs = [i for i, t in enumerate(items) if t.ndim == 1]
    errors: dict[int, str] = {}
    if jpegs:
        try:
            decoded = decode_jpeg_rgb([items[i] for i in jpegs], device)
        except RuntimeError:  # the batched call names no file: find the culprit(s) one by one
            decoded = [_decode_one(items[i], batch.paths[i], device, errors, i) for i in jpegs]
        for i, img in zip(jpegs, decoded):
            out[i] = img
    if not errors:
        return out, labels  # type: ignore[return-value]
    bad = sorted(errors)
    if batch.strict:
        i = bad[0]
        raise ImageDecodeError(f"unreadable image {shown_path(batch.paths[i])} (strict mode): {errors[i]}")
    good = [i for i in range(len(out)) if i not in errors]
    if not good:
        raise ImageDecodeError(f"no decodable image in a batch of {len(out)}: "
                               + "; ".join(f"{shown_path(batch.paths[i])}: {errors[i]}" for i in bad[:5]))
    labels = labels.clone() if labels is not None else None
    for i in bad:
        j = min(good, key=lambda k: (abs(k - i), k))
        out[i] = out[j]
        if labels is not None:
            labels[i] = labels[j]
        warnings.warn(f"skipping unreadable image {shown_path(batch.paths[i])} and using {shown_path(batch.paths[j])} "
                      f"of the same batch instead: {errors[i]}", RuntimeWarning, stacklevel=2)
    return out, labels  # type: ignore[return-value]


def _decode_one(data: torch.Tensor, path: str, device: torch.device, errors: dict[int, str], index: int
                ) -> torch.Tensor | None:
    """One JPEG on `device`; if the device decoder rejects it, on the host (`decode_rgb`: libjpeg, then PIL);
    None (and `errors[index]` set) when neither reads it."""
    try:
        return decode_jpeg_rgb(data, device)
    except RuntimeError as dev_err:
        try:
            img = decode_rgb(path)
        except ImageDecodeError as err:
            errors[index] = f"{_first_line(dev_err)}; {_first_line(err)}"
            return None
        warnings.warn(f"the {device.type} JPEG decoder failed on {shown_path(path)} ({_first_line(dev_err)}); "
                      "decoded on the host instead", RuntimeWarning, stacklevel=3)
        return img.to(device)


def _first_line(err: BaseException) -> str:
    """An exception's message on one line (torchvision's carry the C++ source location first)."""
    text = " ".join(str(err).split())
    return text.split(".cpp:")[-1].split(", ", 1)[-1] if ".cpp:" in text else text

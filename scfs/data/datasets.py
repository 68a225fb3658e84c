"""Datasets: shapes (generated), ImageFolder trees (folder / cifar10 / imagenet) and CIFAR-10 python batches.

All return ``(transform(img), label)`` with ``img`` a uint8 CHW RGB tensor, and carry ``classes``,
``num_classes`` and ``targets``. File-backed datasets decode lazily and survive unreadable files: the bad path
is recorded and warned about, and a readable neighbour is returned instead, so one corrupt JPEG cannot kill a
multi-hour run (``strict: true`` raises instead).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image, ImageOps
from torch.utils.data import Dataset
from torchvision.datasets import CIFAR10
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from scfs.data.image_decode import decode_file_rgb
from scfs.data.shapes import ShapesSpec, ensure_shapes, load_shapes
from scfs.errors import ReportedError

Transform = Callable[[torch.Tensor], Any] | None
DATASETS = ("shapes", "folder", "cifar10", "imagenet")
SHARED_CIFAR = "../shared/data/cifar10-jpeg.tar.xz"


class ImageDecodeError(ReportedError, OSError):
    """A file that neither torchvision nor PIL can decode."""


class NoReadableImageError(ImageDecodeError, RuntimeError):
    """Every file tried in a row is unreadable: the run stops with one line. Also a RuntimeError, the type that
    generic decode-failure handlers catch."""


class ImageFolderLayoutError(ReportedError, ValueError):
    """The ImageFolder tree is not laid out as train/<class>/<image> (+ val/<class>/<image>); the message says how."""


def shown_path(path: str | os.PathLike) -> str:
    """A path as text that any log handler can write: a file name that is not valid UTF-8 (kept by Python as
    lone surrogates, which a UTF-8 log file refuses with "surrogates not allowed") shows its raw bytes as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _within(real: str, ancestor: str) -> bool:
    return real == ancestor or real.startswith(ancestor.rstrip(os.sep) + os.sep)


def list_image_files(top: str | os.PathLike, seen: set[str], skipped: list[str], first_only: bool = False
                     ) -> list[str]:
    """Image files under `top`, in torchvision's ImageFolder order (folders sorted by path, files by name).

    Symlinked folders are followed once per real folder: a link to a folder that encloses it (a loop such as
    `dirloop -> ..`) or to a folder already listed (`seen`, shared by all classes of a split, so a link from one
    class into another cannot repeat images under a second label) is not entered; it is appended to `skipped` as
    "link -> target". File links (also dangling ones: they are reported as unreadable when read) are kept."""
    found: list[tuple[str, list[str]]] = []
    top = os.fspath(top)
    seen.add(os.path.realpath(top))
    stack = [top]
    while stack:
        d = stack.pop()
        real_d = os.path.realpath(d)
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        names = []
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if not is_dir:
                if _is_image(e.name):
                    names.append(e.name)
                    if first_only:
                        return [e.path]
                continue
            real = os.path.realpath(e.path)
            if e.is_symlink() and (_within(real_d, real) or real in seen):
                skipped.append(f"{e.path} -> {real}")
                continue
            seen.add(real)
            stack.append(e.path)
        found.append((d, names))
    return [os.path.join(d, n) for d, names in sorted(found) for n in names]


def _pil_to_rgb(im: Image.Image) -> Image.Image:
    """PIL image of any mode -> RGB; 16/32-bit integer grey is rescaled (PIL's convert would clip at 255)."""
    im = ImageOps.exif_transpose(im)
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(im).astype(np.int64)
        scale = 257 if arr.max(initial=0) > 255 else 1  # 16-bit data stored in 'I' mode too
        im = Image.fromarray(np.clip(arr // scale, 0, 255).astype(np.uint8), "L")
    elif im.mode == "F":
        im = Image.fromarray(np.clip(np.asarray(im), 0, 255).astype(np.uint8), "L")
    elif im.mode in ("P", "PA") and "transparency" in im.info:
        im = im.convert("RGBA")  # PIL asks for this route for palette images with transparency
    return im.convert("RGB")


def decode_rgb(path: str | os.PathLike, min_side: int | None = None) -> torch.Tensor:
    """Decode an image file to a uint8 (3,H,W) RGB tensor: torchvision first (fast), PIL as the fallback.

    `min_side`: the smallest shorter side the caller needs. A JPEG at least twice that size is decoded at a reduced
    scale (libjpeg's DCT scaling through PIL's `draft`, 1/2 to 1/8, shorter side kept >= min_side): a 3000x2250
    photo decodes in 8.6 ms instead of 24 ms, and the crops that follow work on 16x fewer pixels."""
    if min_side:
        reduced = _decode_jpeg_reduced(path, int(min_side))
        if reduced is not None:
            return reduced
    try:
        img = decode_file_rgb(path)
        if img.dtype != torch.uint8:  # 16-bit PNG
            img = F.to_dtype(img, torch.uint8, scale=True)
        if img.ndim == 3 and img.shape[0] == 3 and img.numel() > 0:
            return img
        tv_error: Exception = ValueError(f"unexpected decoded shape {tuple(img.shape)}")
    except Exception as e:  # any decoder failure: try PIL
        tv_error = e
    try:
        with Image.open(path) as im:
            return F.pil_to_tensor(_pil_to_rgb(im))
    except Exception as e:
        raise ImageDecodeError(f"cannot decode {shown_path(path)}: torchvision: {tv_error}; PIL: {e}") from e


def _decode_jpeg_reduced(path: str | os.PathLike, min_side: int) -> torch.Tensor | None:
    """A JPEG of shorter side >= 2 * min_side decoded at the largest DCT reduction that keeps the shorter side >=
    min_side; None for anything else (other formats, small images, errors: the normal decoder then decides)."""
    try:
        with Image.open(path) as im:
            if im.format != "JPEG" or min(im.size) < 2 * min_side:
                return None
            exif_rotated = im.getexif().get(0x0112, 1) not in (1, None)
            if exif_rotated:
                return None  # keep torchvision's EXIF orientation handling
            im.draft("RGB", (min_side, min_side))
            return F.pil_to_tensor(_pil_to_rgb(im))
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the normal decoder
        return None


def _missing(path: Path, name: str, root: Path, hint: str | None = None) -> FileNotFoundError:
    prep = {
        "cifar10": f"python -m scfs.data.prepare cifar10 --archive {SHARED_CIFAR} --out {root}",
        "imagenet": f"python -m scfs.data.prepare extract --archive <imagenet-archive> --out {root}",
        "folder": f"python -m scfs.data.prepare extract --archive <archive> --out {root}",
    }[name]
    return FileNotFoundError(
        f"{name} dataset not found: {path} does not exist{hint or ''}; prepare it with: {prep}")


class ImageFileDataset(Dataset):
    """Image files with integer labels, decoded on access; unreadable files are skipped (see module doc)."""

    MAX_SUBSTITUTE_TRIES = 100

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], transform: Transform = None,
                 strict: bool = False, min_side: int | None = None) -> None:
        if not samples:
            raise FileNotFoundError("no image files found")
        self.samples = samples
        self.targets = [y for _, y in samples]
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        self.transform = transform
        self.strict = strict
        self.min_side = min_side  # decode large JPEGs at a reduced scale (see decode_rgb)
        self.bad_files: dict[str, str] = {}  # path -> reason (per process: DataLoader workers keep their own)

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return decode_rgb(path, self.min_side), label

    def __getitem__(self, index: int) -> tuple[Any, int]:
        n = len(self.samples)
        for attempt in range(min(n, self.MAX_SUBSTITUTE_TRIES)):
            i = (index + attempt) % n
            path = self.samples[i][0]
            if path in self.bad_files:
                continue
            try:
                img, label = self._load(i)
            except (OSError, ValueError, RuntimeError) as e:
                if self.strict:
                    raise ImageDecodeError(f"unreadable image {shown_path(path)} (strict mode): {e}") from e
                self.bad_files[path] = str(e)
                shown = ", ".join(shown_path(p) for p in list(self.bad_files)[:10]) + (
                    " ..." if len(self.bad_files) > 10 else "")
                warnings.warn(f"skipping unreadable image {shown_path(path)} and returning a neighbour instead; "
                              f"{len(self.bad_files)} bad file(s) so far: {shown}", RuntimeWarning,
                              stacklevel=2)
                continue
            return (self.transform(img) if self.transform is not None else img), label
        tried = min(n, self.MAX_SUBSTITUTE_TRIES)
        raise NoReadableImageError(f"no readable image among {tried} files from index {index}; bad files: "
                                   f"{list(self.bad_files)[:10]}: the data folder holds no decodable images there; "
                                   "replace the broken files or re-run python -m scfs.data.prepare")


def image_folder(split_dir: Path, transform: Transform = None, strict: bool = False,
                 classes_from: Path | None = None, min_side: int | None = None) -> ImageFileDataset:
    """ImageFolder tree ``split_dir/<class>/<file>``; class indices from ``classes_from`` (the train split) so
    train and val agree even if val lacks a class.

    A class folder of the train split without any image file is not a class (a warning names it): a class with
    no sample would count in num_classes (the linear probe's outputs, chance level) without ever being seen.
    Symlinked folders are followed once per real folder (see `list_image_files`); loops and repeats are warned
    about once per split."""
    base = Path(classes_from or split_dir)
    try:
        all_classes = find_classes(str(base))[0]
        split_classes = find_classes(str(split_dir))[0]
    except FileNotFoundError as err:  # torchvision: "Couldn't find any class folder in X."
        raise ImageFolderLayoutError(f"{err} An ImageFolder split holds one sub-folder per class: "
                                     f"{split_dir}/<class>/<image>.jpg") from err
    probe_seen: set[str] = {os.path.realpath(base)}
    empty = [c for c in all_classes if not list_image_files(base / c, set(probe_seen), [], first_only=True)]
    classes = [c for c in all_classes if c not in empty]
    if empty and base == Path(split_dir):  # said once, when the train split itself is listed
        warnings.warn(f"{len(empty)} class folder(s) of {shown_path(base)} hold no image file and are not used as "
                      f"classes: {', '.join(shown_path(c) for c in empty[:10])}{' ...' if len(empty) > 10 else ''}; "
                      "add images or remove the folder(s)", RuntimeWarning, stacklevel=2)
    class_to_idx = {c: i for i, c in enumerate(classes)}
    # every class folder counts as listed from the start: a link from class a into class b's folder must not
    # list b's images under label a too, whichever class comes first
    seen = {os.path.realpath(split_dir)} | {os.path.realpath(Path(split_dir) / c) for c in split_classes}
    skipped: list[str] = []
    samples: list[tuple[str, int]] = []
    extra: list[str] = []
    for c in split_classes:
        files = list_image_files(Path(split_dir) / c, seen, skipped)
        if c in class_to_idx:
            samples.extend((f, class_to_idx[c]) for f in files)
        elif files:
            extra.append(c)
    if extra:
        why = "has no images of" if set(extra) & set(empty) else "lacks"
        raise ImageFolderLayoutError(f"{shown_path(split_dir)} has classes that {shown_path(base)} {why}: "
                                     f"{sorted(extra)[:10]}; the class folders of val must be a subset of train's "
                                     "non-empty ones (same names)")
    if skipped:
        warnings.warn(f"{shown_path(split_dir)}: {len(skipped)} symlinked folder(s) not entered, as they loop back "
                      f"to a folder above them or repeat one already listed (each real folder is listed once): "
                      f"{'; '.join(shown_path(s) for s in skipped[:5])}{' ...' if len(skipped) > 5 else ''}",
                      RuntimeWarning, stacklevel=2)
    if not samples:
        raise FileNotFoundError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {shown_path(split_dir)}")
    return ImageFileDataset(samples, classes, transform, strict, min_side)


class ShapesDataset(Dataset):
    """One split of the generated shapes data, held in memory (arrays also exposed for masks/boxes)."""

    def __init__(self, folder: Path, split: str, transform: Transform = None, mmap: bool = False) -> None:
        self.folder = Path(folder)
        self.data = load_shapes(folder, split, mmap=mmap)
        self.classes = list(self.data.classes)
        self.num_classes = len(self.classes)
        self.targets = self.data.labels.tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = torch.from_numpy(np.ascontiguousarray(self.data.images[index].transpose(2, 0, 1)))
        label = int(self.data.labels[index])
        return (self.transform(img) if self.transform is not None else img), label


class CIFAR10Batches(Dataset):
    """torchvision's ``cifar-10-batches-py`` (never downloads), as uint8 CHW tensors."""

    def __init__(self, root: Path, train: bool, transform: Transform = None) -> None:
        self.base = CIFAR10(str(root), train=train, download=False)
        self.classes = list(self.base.classes)
        self.num_classes = len(self.classes)
        self.targets = list(self.base.targets)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = torch.from_numpy(self.base.data[index]).permute(2, 0, 1).contiguous()
        label = self.targets[index]
        return (self.transform(img) if self.transform is not None else img), label


def _split_dir(root: Path, name: str, candidates: tuple[str, ...]) -> Path:
    for c in candidates:
        if (root / c).is_dir():
            return root / c
    if not root.exists():
        raise _missing(root, name, root)
    if not root.is_dir():
        raise NotADirectoryError(f"{name} data root {shown_path(root)} is a file, not a folder: data.root must be the "
                                 f"folder holding {' / '.join(candidates)}/<class>/<image> (unpack an archive with "
                                 "python -m scfs.data.prepare extract --archive <file> --out <folder>)")
    raise _missing(root / candidates[0], name, root, f" (looked for {' or '.join(candidates)} in {root})")


def build_dataset(cfg: Mapping[str, Any], split: str, transform: Transform = None) -> Dataset:
    """Dataset named by ``cfg['name']`` for ``split`` in {train, val}; extra cfg keys are ignored.

    shapes: root, image_size, n_train, n_val, num_classes, max_objects, seed (generated on first use).
    folder / imagenet: root with ``train/`` and ``val/`` (folder also accepts ``test/``).
    cifar10: root with ``train/`` and ``test/`` (an ImageFolder tree from ``scfs.data.prepare``) or
    torchvision's ``cifar-10-batches-py`` (root may be that folder or its parent); val means test.
    Optional: strict (raise on unreadable files instead of skipping them); decode_min_side (image files: decode
    large JPEGs at a reduced scale keeping the shorter side >= it; null/0 = full size).
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    name = cfg.get("name")
    if name not in DATASETS:
        raise ValueError(f"unknown dataset name {name!r}; expected one of {DATASETS}")
    if cfg.get("root") is None:
        raise ValueError(f"dataset {name!r} needs a 'root' entry in its config")
    root = Path(os.path.expanduser(str(cfg["root"])))
    strict = bool(cfg.get("strict", False))

    if name == "shapes":
        defaults = ShapesSpec()
        fields = {f: int(cfg.get(f, getattr(defaults, f))) for f in
                  ("image_size", "n_train", "n_val", "num_classes", "max_objects", "seed")}
        fields["clutter"] = float(cfg.get("clutter", defaults.clutter))
        fields["object_scale"] = tuple(float(v) for v in cfg.get("object_scale", defaults.object_scale))
        spec = ShapesSpec(**fields)
        return ShapesDataset(ensure_shapes(root, spec), split, transform)

    if name == "cifar10":
        batches = root if root.name == "cifar-10-batches-py" else root / "cifar-10-batches-py"
        if batches.is_dir():
            return CIFAR10Batches(batches.parent, train=split == "train", transform=transform)
        candidates = ("train",) if split == "train" else ("test", "val")
    elif name == "imagenet":
        candidates = ("train",) if split == "train" else ("val",)
    else:
        candidates = ("train",) if split == "train" else ("val", "test")

    split_dir = _split_dir(root, name, candidates)
    train_dir = root / "train"
    return image_folder(split_dir, transform, strict, classes_from=train_dir if train_dir.is_dir() else None,
                        min_side=int(cfg.get("decode_min_side") or 0) or None)

"""torchvision's image decoders, the project's only door to them, without their deprecation warning.

torchvision 0.29 deprecates all of `torchvision.io`'s image decoding, `decode_image` as much as `decode_jpeg`, in
favour of TorchCodec (`torchcodec.decoders`, torchcodec 0.16 and later), and warns on every call: once per image in
the data path, in every DataLoader worker. TorchCodec is not a dependency of the project; torchvision's decoders
are the ones whose pixels the tests check against PIL, and their batched call (a list of JPEG byte tensors with
`device="cuda"`: one nvJPEG batch) is what `data.decode=gpu` is built on. So the project keeps them and calls them
only through here, which silences exactly that warning; moving to TorchCodec is a change of these two functions.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import overload

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg

DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


@contextmanager
def _deprecation_silenced() -> Iterator[None]:
    """torchvision's codec deprecation warning ignored for the duration, every other warning as before (a
    corrupt file's own warnings still reach the caller)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape(DEPRECATION), category=DeprecationWarning)
        yield


def decode_file_rgb(path: str | os.PathLike) -> torch.Tensor:
    """The image file at `path` (any format torchvision reads) as RGB with its EXIF orientation applied; uint8,
    or uint16 for a 16-bit PNG. Raises what torchvision raises for a file it cannot decode."""
    with _deprecation_silenced():
        return decode_image(str(path), mode=ImageReadMode.RGB, apply_exif_orientation=True)


@overload
def decode_jpeg_rgb(data: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor: ...


@overload
def decode_jpeg_rgb(data: list[torch.Tensor], device: torch.device | str = "cpu") -> list[torch.Tensor]: ...


def decode_jpeg_rgb(data: torch.Tensor | list[torch.Tensor], device: torch.device | str = "cpu"
                    ) -> torch.Tensor | list[torch.Tensor]:
    """JPEG bytes (a 1-D uint8 CPU tensor, or a list of them) as uint8 (3,H,W) RGB on `device`: libjpeg on the CPU,
    nvJPEG on CUDA, where a list is decoded as one batch. No EXIF orientation (callers send only unrotated files).
    Raises RuntimeError for data the decoder rejects; for a list it names no file (nor returns partial results)."""
    with _deprecation_silenced():
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)

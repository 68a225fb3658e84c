"""Data: shapes generator, datasets, multi-crop transform, archive preparation.

Exports resolve lazily (PEP 562), so ``python -m scfs.data.prepare`` and ``scfs.data.shapes`` do not pay for
importing torch/torchvision (and the datamodule's Lightning) until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CLASS_NAMES": "shapes", "ShapesSpec": "shapes", "ShapesSplit": "shapes", "ensure_shapes": "shapes",
    "load_shapes": "shapes", "generate_split": "shapes", "export_coco": "shapes",
    "build_dataset": "datasets", "decode_rgb": "datasets", "ImageFileDataset": "datasets",
    "ShapesDataset": "datasets", "CIFAR10Batches": "datasets", "ImageDecodeError": "datasets",
    "MultiCrop": "multicrop", "EvalTransform": "multicrop",
    "extract_archive": "prepare", "prepare_cifar10": "prepare", "PrepareError": "prepare",
}
__all__ = [
    "CIFAR10Batches", "CLASS_NAMES", "EvalTransform", "ImageDecodeError", "ImageFileDataset", "MultiCrop",
    "PrepareError", "ShapesDataset", "ShapesSpec", "ShapesSplit", "build_dataset", "decode_rgb",
    "ensure_shapes", "export_coco", "extract_archive", "generate_split", "load_shapes", "prepare_cifar10",
]

if TYPE_CHECKING:
    from scfs.data.datasets import (
        CIFAR10Batches,
        ImageDecodeError,
        ImageFileDataset,
        ShapesDataset,
        build_dataset,
        decode_rgb,
    )
    from scfs.data.multicrop import EvalTransform, MultiCrop
    from scfs.data.prepare import PrepareError, extract_archive, prepare_cifar10
    from scfs.data.shapes import (
        CLASS_NAMES,
        ShapesSpec,
        ShapesSplit,
        ensure_shapes,
        export_coco,
        generate_split,
        load_shapes,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'scfs.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scfs.data.{_EXPORTS[name]}"), name)

"""Searched-region figures, search precision plots and notebook helpers (used by notebooks/ and by train).

Names resolve lazily (PEP 562): `from scfs.viz import save_training_figure` at the end of a run does not import
ipywidgets or Hydra, and nothing here imports pyplot (figures are Agg-canvas `Figure`s; notebooks keep their
inline backend).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "as_hwc_uint8": "draw", "colorize": "draw", "denormalize": "draw", "draw_boxes": "draw", "new_figure": "draw",
    "overlay_map": "draw", "resize_map": "draw", "upscale": "draw", "draw_outline": "draw",
    "SearchMaps": "regions", "compute_search_maps": "regions", "load_image_folder": "regions",
    "prepare_image": "regions", "sample_crop_boxes": "regions", "stage_maps": "regions",
    "caption": "figures", "default_selections": "figures", "explore": "figures", "search_modes_figure": "figures",
    "row_range": "figures",
    "searched_regions_figure": "figures",
    "save_training_figure": "training",
    "load_bench_results": "bench", "bench_figure": "bench", "bench_table": "bench",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'scfs.viz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scfs.viz.{_EXPORTS[name]}"), name)

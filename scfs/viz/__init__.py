"""Figures: searched regions (drawn from `scfs.eval.search_maps`), the training-end figure, benchmark plots and
the evaluation report's plots. viz only draws: the numbers come from eval (and bench records); running training
or evaluations for the notebooks is `scfs.workbench`.

Names resolve lazily (PEP 562): `from scfs.viz import save_training_figure` at the end of a run does not import
ipywidgets or Hydra, and nothing here imports pyplot (figures are Agg-canvas `Figure`s; notebooks keep their
inline backend).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "colorize": "draw", "draw_boxes": "draw", "overlay_map": "draw", "resize_map": "draw", "upscale": "draw",
    "draw_outline": "draw",
    "caption": "figures", "default_selections": "figures", "explore": "figures", "search_modes_figure": "figures",
    "row_range": "figures", "row_scales": "figures",
    "searched_regions_figure": "figures", "searched_regions_stack": "figures", "searched_regions_by_image": "figures",
    "save_training_figure": "training",
    "load_bench_results": "bench", "bench_figure": "bench", "bench_table": "bench",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'scfs.viz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scfs.viz.{_EXPORTS[name]}"), name)

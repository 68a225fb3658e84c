"""Searched-region figures: which positions of the teacher's map a local crop's query picks, per stage and mode.

Every figure carries a caption for readers who never read the paper. Functions return a matplotlib `Figure`
(Agg canvas, no pyplot): notebooks display it inline, scripts call `fig.savefig(path)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from scfs.eval.search_maps import SearchMaps, compute_search_maps
from scfs.names import SEARCH_STAGES
from scfs.plotting import new_figure
from scfs.viz.draw import (
    CYAN,
    MAGENTA,
    WHITE,
    YELLOW,
    display_factor,
    draw_boxes,
    draw_outline,
    overlay_map,
    upscale,
)

SIM_CMAP = "inferno"
WEIGHT_CMAP = "viridis"
MODE_TEXT = {
    "soft": "soft: weight = the similarity itself (published SCFS)",
    "hard": "hard: keep the top {topk:.0%} most similar positions",
    "softmax": "softmax: spatial softmax of similarity / {temperature:g}",
}


def similarity_word(maps: SearchMaps) -> str:
    """What the heat panels show: "similarity", or "centred similarity" for a centred search."""
    return "centred similarity" if maps.centre else "similarity"


def caption(maps: SearchMaps, modes: Sequence[str], masks: bool = True) -> str:
    """The plain-language explanation printed under every searched-regions figure; `masks=False` (real photos:
    no object masks) leaves out the object's outline and its share of the weights."""
    mode_lines = "; ".join(MODE_TEXT[m].format(topk=maps.topk, temperature=maps.temperature) for m in modes)
    heat = ("centred cosine similarity (the image's mean feature over positions subtracted from the map and from the "
            "query first: a Pearson correlation; the weights still multiply the uncentred map)" if maps.centre
            else "cosine similarity")
    where = "the global view; the object the crop covers is outlined in magenta" if masks else "the global view"
    text = ("The local crop (yellow box) is the query: its pooled feature is compared with every position of the "
            f"teacher's feature map of the whole image ({where}). Heat = {heat} of each teacher feature position "
            f"to it; weights = what the search keeps for the crop's training target ({mode_lines}). One colour "
            "scale per row (colour bar on the right), shared by every model compared on that image; blocks are "
            "feature-map cells.")
    if masks:
        text += (" 'x % on the crop's object' = share of the positive weight mass inside the outline; chance = what "
                 "uniform weights would score (the object's share of the image).")
    return text


def _target(maps: SearchMaps) -> int:
    return max(maps.images.shape[1], maps.images.shape[2])


def global_panel(maps: SearchMaps, i: int, crop: int, all_boxes: bool = True,
                 masks: np.ndarray | None = None) -> np.ndarray:
    """The global view (upscaled) with every crop's box (white), the query crop's box (yellow) and, with `masks`,
    the outline of the object the query crop covers (magenta)."""
    f = display_factor(_target(maps))
    img = upscale(maps.images[i], f)
    t = max(1, f // 2)
    if masks is not None:
        k = _covered(masks, maps, i, crop)
        if k:
            img = draw_outline(img, upscale((np.asarray(masks[i]) == k).astype(np.uint8), f).astype(bool), MAGENTA,
                               width=max(1, t // 2))
    if all_boxes:
        others = [b for n, b in enumerate(maps.boxes[i]) if n != crop]
        if others:
            img = draw_boxes(img, np.asarray(others) * f, WHITE, width=max(2, t // 2))
    return draw_boxes(img, maps.boxes[i][crop][None] * f, YELLOW, width=t + 1)  # drawn last: on top


def _covered(masks: np.ndarray, maps: SearchMaps, i: int, crop: int) -> int:
    from scfs.eval.precision import covered_object

    return covered_object(masks[i], maps.boxes[i][crop])


def crop_panel(maps: SearchMaps, i: int, crop: int) -> np.ndarray:
    """The local view the query comes from, at about the global panel's display size."""
    c = maps.crops[i, crop]
    return draw_boxes(upscale(c, display_factor(c.shape[0])), [[0, 0, 10**6, 10**6]], YELLOW, width=2)


def grey(image: np.ndarray) -> np.ndarray:
    """Luma of an RGB image as a 3-channel uint8 image: heat colours read better over a colourless picture."""
    y = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return np.repeat(y.round().clip(0, 255).astype(np.uint8)[..., None], 3, axis=2)


def map_panel(maps: SearchMaps, i: int, crop: int, heat: np.ndarray, cmap: str, vmin: float | None = None,
              alpha: float = 0.65, vmax: float | None = None) -> np.ndarray:
    """`heat` over the greyed global view, with the query crop's box for orientation; colours span [vmin, vmax]
    (the map's own range where not given)."""
    f = display_factor(_target(maps))
    img = overlay_map(grey(upscale(maps.images[i], f)), heat, alpha=alpha, cmap=cmap, vmin=vmin, vmax=vmax)
    return draw_boxes(img, maps.boxes[i][crop][None] * f, CYAN if cmap == WEIGHT_CMAP else YELLOW,
                      width=max(2, f // 2))


def row_range(maps_list: Sequence[SearchMaps], i: int, crop: int, stages: Sequence[str],
              mode: str | None = None) -> tuple[float, float]:
    """(low, high) of one figure row: the similarity maps (or, with `mode`, that mode's positive weights) of image
    `i`, crop `crop`, over `stages` and over every model in `maps_list`, so their panels share one colour scale.
    Hard weights are similarities on the kept positions: their scale is the similarity's."""
    vals = []
    for m in maps_list:
        for s in stages:
            if s not in m.stages:
                continue
            if mode is None or mode in ("soft", "hard"):
                vals.append(np.asarray(m.similarity[s][i, crop]).ravel())
            else:
                vals.append(np.clip(np.asarray(m.weights[mode][s][i, crop]), 0, None).ravel())
    v = np.concatenate(vals) if vals else np.zeros(1)
    lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
    return (lo, hi) if hi > lo else (lo, lo + 1e-6)


def row_scales(maps_list: Sequence[SearchMaps], crop: int, stages: Sequence[str],
               mode: str) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per image row, the (low, high) of its similarity panels and of its `mode` weight panels over every model in
    `maps_list`: computed once, so each model's row uses the same colour scale. Soft and hard weights are
    similarities (on all or on the kept positions), so they share the similarity's scale."""
    scales = []
    for i in range(len(maps_list[0])):
        sim = row_range(maps_list, i, crop, stages)
        scales.append((sim, sim if mode in ("soft", "hard") else row_range(maps_list, i, crop, stages, mode)))
    return scales


def _colorbar(fig: Any, ax: Any, cmap: str, lo: float, hi: float, label: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    cax = ax.inset_axes([1.06, 0.0, 0.08, 1.0])
    cb = fig.colorbar(ScalarMappable(Normalize(lo, hi), cmap), cax=cax)
    cb.ax.tick_params(labelsize=6)
    cb.set_label(label, fontsize=6)


def _show(ax: Any, raster: np.ndarray, title: str) -> None:
    ax.imshow(raster, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


# Sizes in inches. A panel title line at 8 pt is 0.139 in high (measured with DejaVu Sans); the title sits 6 pt
# (0.083 in) above its panel; the rest is margin, so a title never reaches the panel above it.
PANEL, GAP, TOP, BOTTOM, BAR = 1.55, 0.08, 0.45, 0.12, 0.75
TITLE_LINE, TITLE_PAD = 0.145, 0.14


@dataclass(frozen=True)
class _Block:
    """A suptitle over rows of square panels, each row's panels under their titles, with a colour bar per row
    on the right (`bars`). Its size follows from its content, and it draws into a Figure or a SubFigure, so one
    model's block looks the same alone or stacked with other models' blocks."""

    title: str
    rows: list[list[tuple[np.ndarray, str]]]
    bars: list[tuple[str, float, float, str]] | None = None  # cmap, low, high, label per row

    @property
    def title_h(self) -> float:
        lines = max(t.count("\n") + 1 for row in self.rows for _, t in row)
        return TITLE_LINE * lines + TITLE_PAD

    @property
    def width(self) -> float:
        n_cols = max(len(r) for r in self.rows)
        return PANEL * n_cols + GAP * (n_cols + 1) + (BAR if self.bars else 0.0)

    def height(self, title_h: float | None = None) -> float:
        """Inches, with its own panel-title height or the given one (stacked blocks use the tallest)."""
        return TOP + len(self.rows) * (PANEL + (self.title_h if title_h is None else title_h)) + BOTTOM

    def draw(self, target: Any, title_h: float | None = None) -> np.ndarray:
        """Panels laid out by hand in inches from the top-left corner of `target` (no tight/constrained layout,
        which measures every text and costs seconds on big grids); what is below them is left free."""
        title_h = self.title_h if title_h is None else title_h
        w = target.bbox.width / target.dpi
        h = target.bbox.height / target.dpi
        n_rows, n_cols = len(self.rows), max(len(r) for r in self.rows)
        top = TOP + title_h
        bottom_edge = top + n_rows * PANEL + (n_rows - 1) * title_h
        axes = target.subplots(n_rows, n_cols, squeeze=False, gridspec_kw={
            "left": GAP / w, "right": n_cols * (PANEL + GAP) / w, "top": 1 - top / h, "bottom": 1 - bottom_edge / h,
            "wspace": GAP / PANEL, "hspace": title_h / PANEL})
        target.suptitle(self.title, fontsize=10, y=1 - 0.12 / h, va="top")
        for i, row in enumerate(self.rows):
            for j, (raster, text) in enumerate(row):
                _show(axes[i, j], raster, text)
            for j in range(len(row), n_cols):
                axes[i, j].axis("off")
            if self.bars:
                _colorbar(target, axes[i, len(row) - 1], *self.bars[i])
        return axes


def _caption_lines(text: str, width: float) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=max(60, int(width * 15)))


def _caption_height(lines: Sequence[str]) -> float:
    return 0.14 * len(lines) + 0.2


def _put_caption(target: Any, lines: Sequence[str]) -> None:
    """The wrapped caption at the bottom of `target`, 0.1 in above its lower edge."""
    h = target.bbox.height / target.dpi
    target.text(0.01, 0.1 / h, "\n".join(lines), fontsize=7.5, ha="left", va="bottom", color="#333333")


def _single(block: _Block, text: str):
    """One block and its caption as a Figure of their own size."""
    lines = _caption_lines(text, block.width)
    fig = new_figure(block.width, block.height() + _caption_height(lines))
    block.draw(fig)
    _put_caption(fig, lines)
    return fig


def _in_object(masks: np.ndarray | None, maps: SearchMaps, i: int, crop: int, weights: np.ndarray) -> str:
    if masks is None:
        return ""
    from scfs.eval.precision import mass_inside

    k = _covered(masks, maps, i, crop)
    if k == 0:
        return "\n(crop on background)"
    obj = np.asarray(masks[i]) == k
    return f"\n{100 * mass_inside(weights, obj):.0f}% on the crop's object\n(chance {100 * obj.mean():.0f}%)"


def _regions_block(maps: SearchMaps, *, crop: int, mode: str, stages: Sequence[str], masks: np.ndarray | None,
                   title: str, row_labels: Sequence[str] | None,
                   scales: Sequence[tuple[tuple[float, float], tuple[float, float]]]) -> _Block:
    """The panels of `searched_regions_figure` for one model, coloured on the given per-row `scales`."""
    soft = mode == "soft"
    word = similarity_word(maps)
    rows, bars = [], []
    for i in range(len(maps)):
        name = (row_labels[i] if row_labels else (maps.names[i] if maps.names else f"image {i}"))
        row = [(global_panel(maps, i, crop, masks=masks), f"{name}\nglobal view + crops"),
               (crop_panel(maps, i, crop), f"local crop {crop}\n(the query)")]
        (lo, hi), (wlo, whi) = scales[i]
        for s in stages:
            sim = maps.similarity[s][i, crop]
            w = maps.weights[mode][s][i, crop]
            sim_panel = map_panel(maps, i, crop, sim, SIM_CMAP, vmin=lo, vmax=hi)
            if soft:
                row.append((sim_panel, f"{s} {word}\n= soft weight" + _in_object(masks, maps, i, crop, w)))
                continue
            row.append((sim_panel, f"{s} {word}"))
            row.append((map_panel(maps, i, crop, np.clip(w, 0, None), WEIGHT_CMAP, vmin=wlo, vmax=whi),
                        f"{s} {mode} weights" + (f"\n[{wlo:.2g}, {whi:.2g}]" if mode == "softmax" else "")
                        + _in_object(masks, maps, i, crop, w)))
        rows.append(row)
        bars.append((SIM_CMAP, lo, hi, word) if mode in ("soft", "hard")
                    else (WEIGHT_CMAP, wlo, whi, f"{mode} weight"))
    return _Block(title, rows, bars)


def _check_regions(maps: SearchMaps, mode: str, shared_with: Sequence[SearchMaps]) -> None:
    """Every model's maps have `mode`, and the others are of `maps`' images and crops (or scales would compare
    different queries)."""
    for m in (maps, *shared_with):
        if mode not in m.modes:
            raise ValueError(f"mode {mode!r} was not computed; the maps have {m.modes}")
    for other in shared_with:
        if other.images.shape != maps.images.shape or not np.array_equal(other.boxes, maps.boxes):
            raise ValueError("shared_with maps must be of the same images and crop boxes")
        if other.centre != maps.centre:
            raise ValueError("shared_with maps must all be raw or all centred: one colour scale cannot compare both")


def searched_regions_figure(model_or_maps: nn.Module | SearchMaps, images: np.ndarray | None = None,
                            boxes: np.ndarray | None = None, *, crop: int = 0, mode: str = "soft",
                            stages: Sequence[str] = SEARCH_STAGES, masks: np.ndarray | None = None,
                            title: str | None = None, row_labels: Sequence[str] | None = None,
                            shared_with: Sequence[SearchMaps] = (), **search_kwargs: Any):
    """Rows = images; columns = global view with the crops' boxes (and the crop's object outlined, with `masks`),
    the query crop, then per stage the similarity map and the searched weights of `mode` (soft weights *are* the
    similarity: one panel per stage). Takes a method module / Backbone with `images` (B,H,W,3) uint8 (the search is
    run, see `compute_search_maps` for keywords) or precomputed `SearchMaps`.

    Each row has one colour scale (colour bar on the right) for all its panels; `shared_with` = the maps of other
    models on the same images and crops, so the scale is also the same across the models' figures
    (`searched_regions_stack` draws them all in one figure)."""
    if isinstance(model_or_maps, SearchMaps):
        maps = model_or_maps
    else:
        if images is None:
            raise ValueError("images are needed when a model is given")
        maps = compute_search_maps(model_or_maps, images, boxes, stages=stages, modes=(mode,), masks=masks,
                                   **search_kwargs)
    stages = [s for s in stages if s in maps.stages]
    _check_regions(maps, mode, shared_with)
    block = _regions_block(maps, crop=crop, mode=mode, stages=stages, masks=masks, row_labels=row_labels,
                           title=title or f"What the search picks: local crop -> teacher feature map, per stage "
                           f"({mode} search)", scales=row_scales([maps, *shared_with], crop, stages, mode))
    return _single(block, caption(maps, (mode,)))


def _models_on_one_scale(maps_by_model: Mapping[str, SearchMaps], crop: int, mode: str, stages: Sequence[str]
                         ) -> tuple[SearchMaps, list[str], list]:
    """(the first model's maps, the stages all have, each image row's colour scale over every model): the maps
    of several models drawn side by side must be of the same images and crops, and share their colours."""
    models = list(maps_by_model.values())
    if not models:
        raise ValueError("no maps to draw")
    first = models[0]
    _check_regions(first, mode, models[1:])
    stages = [s for s in stages if s in first.stages]
    return first, stages, row_scales(models, crop, stages, mode)


def searched_regions_stack(maps_by_model: Mapping[str, SearchMaps], *, crop: int = 0, mode: str = "soft",
                           stages: Sequence[str] = SEARCH_STAGES, masks: np.ndarray | None = None,
                           title: str = "{model} teacher: what the {mode} search picks"):
    """`searched_regions_figure` of every model (same images and crops), stacked in one Figure: one SubFigure per
    model drawn by the same code, one caption at the bottom. Each image row's colour scale is computed once over
    all the models, so equal colours mean equal values across the models. `title` is formatted with `model`
    (the mapping's key) and `mode`."""
    from matplotlib.lines import Line2D

    first, stages, scales = _models_on_one_scale(maps_by_model, crop, mode, stages)
    blocks = [_regions_block(m, crop=crop, mode=mode, stages=stages, masks=masks, row_labels=None, scales=scales,
                             title=title.format(model=name, mode=mode)) for name, m in maps_by_model.items()]
    title_h = max(b.title_h for b in blocks)  # one title height for all: the blocks line up
    width = max(b.width for b in blocks)
    lines = _caption_lines(caption(first, (mode,)), width)
    heights = [b.height(title_h) for b in blocks] + [_caption_height(lines)]
    fig = new_figure(width, sum(heights))
    subs = fig.subfigures(len(heights), 1, height_ratios=heights, hspace=0.0)
    for k, (block, sub) in enumerate(zip(blocks, subs)):
        block.draw(sub, title_h=title_h)
        if k:  # a rule between two models' blocks
            sub.add_artist(Line2D([0.01, 0.99], [0.995, 0.995], transform=sub.transSubfigure, color="#aaaaaa", lw=0.8))
    _put_caption(subs[-1], lines)
    return fig


def searched_regions_by_image(maps_by_model: Mapping[str, SearchMaps], *, crop: int = 0, mode: str = "soft",
                              stages: Sequence[str] = SEARCH_STAGES, title: str | None = None):
    """The models side by side on each image: one row per image (global view with the crops, the query crop),
    then one column group per model (the mapping's order) with a panel per stage, all the row's panels on one
    colour scale (colour bar on the right), so equal colours mean equal values across the models of that image.
    Soft: the similarity (= the soft weight); hard: the similarity on the kept positions; softmax: its weights.
    The maps must be of the same images and crops, all raw or all centred."""
    first, stages, scales = _models_on_one_scale(maps_by_model, crop, mode, stages)
    word = similarity_word(first)
    rows, bars = [], []
    for i in range(len(first)):
        name = first.names[i] if first.names else f"image {i}"
        row = [(global_panel(first, i, crop), f"{name}\nglobal view + crops"),
               (crop_panel(first, i, crop), f"local crop {crop}\n(the query)")]
        (lo, hi), (wlo, whi) = scales[i]
        for label, maps in maps_by_model.items():
            for s in stages:
                if mode == "soft":
                    heat, cmap, vmin, vmax, what = maps.similarity[s][i, crop], SIM_CMAP, lo, hi, word
                elif mode == "hard":  # the similarity on the kept positions, 0 elsewhere: the similarity's scale
                    heat, cmap, vmin, vmax, what = maps.weights[mode][s][i, crop], SIM_CMAP, lo, hi, f"hard ({word})"
                else:
                    heat = np.clip(maps.weights[mode][s][i, crop], 0, None)
                    cmap, vmin, vmax, what = WEIGHT_CMAP, wlo, whi, f"{mode} weights"
                row.append((map_panel(maps, i, crop, heat, cmap, vmin=vmin, vmax=vmax), f"{label} {s}\n{what}"))
        rows.append(row)
        bars.append((SIM_CMAP, lo, hi, word) if mode in ("soft", "hard") else (WEIGHT_CMAP, wlo, whi,
                                                                                f"{mode} weight"))
    block = _Block(title or f"What the {mode} search picks, models side by side ({', '.join(maps_by_model)}; "
                   f"{word}, one colour scale per row)", rows, bars)
    return _single(block, caption(first, (mode,), masks=False))


def search_modes_figure(maps: SearchMaps, selections: Sequence[tuple[int, int, str]],
                        modes: Sequence[str] | None = None, masks: np.ndarray | None = None,
                        title: str | None = None):
    """One row per (image, crop, stage) selection: global view + crops, the query crop, the similarity map and
    the weights of every mode side by side: how soft / hard / softmax search differ on the same query."""
    # soft weights are the similarity panel itself: not repeated
    modes = [m for m in (modes or maps.modes) if m in maps.modes and m != "soft"]
    rows = []
    for i, crop, s in selections:
        name = maps.names[i] if maps.names else f"image {i}"
        sim = maps.similarity[s][i, crop]
        lo, hi = row_range([maps], i, crop, [s])
        row = [(global_panel(maps, i, crop, masks=masks), f"{name}\nglobal view + crops"),
               (crop_panel(maps, i, crop), f"local crop {crop}\n(the query)"),
               (map_panel(maps, i, crop, sim, SIM_CMAP, vmin=lo, vmax=hi),
                f"{s} similarity\n(= soft weights)\n[{sim.min():.2f}, {sim.max():.2f}]")]
        for m in modes:
            w = maps.weights[m][s][i, crop]
            wlo, whi = row_range([maps], i, crop, [s], m)
            row.append((map_panel(maps, i, crop, np.clip(w, 0, None), WEIGHT_CMAP, vmin=wlo, vmax=whi),
                        f"{s} {m} weights\n[{wlo:.2g}, {whi:.2g}]" + _in_object(masks, maps, i, crop, w)))
        rows.append(row)
    block = _Block(title or "Search modes on the same query: similarity, then what each mode keeps", rows)
    return _single(block, caption(maps, modes))


def default_selections(maps: SearchMaps, n_images: int = 2, crop: int = 0) -> list[tuple[int, int, str]]:
    """The fixed grid of the static fallback: the first images, crop `crop`, every stage."""
    return [(i, crop, s) for i in range(min(n_images, len(maps))) for s in maps.stages]


def _kernel() -> Any:
    """The running IPython kernel, or None (plain Python, a terminal IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "kernel", None)


def explore(maps: SearchMaps, masks: np.ndarray | None = None, static: bool | None = None,
            static_images: int = 2, save: Any = None) -> Any:
    """Choose image, crop and stage interactively (ipywidgets `interact`) in a live kernel; otherwise (no widgets,
    no IPython kernel, or `static=True` / env SCFS_NB_STATIC=1) render a fixed grid of the same panels.

    With `save` (a path) the static grid is also written there in every case, so a headless run (nbclient,
    papermill) leaves a picture even where the widget shows nothing. In a kernel the result is displayed here;
    returns the widget, or the static Figure.
    """
    import os

    if save is not None:
        from pathlib import Path

        grid = search_modes_figure(maps, default_selections(maps, static_images), masks=masks,
                                   title="Search modes (static grid: first images, crop 0, every stage)")
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        grid.savefig(save, dpi=90)

    if static is None:
        static = os.environ.get("SCFS_NB_STATIC", "0").lower() in ("1", "true", "yes")
    widgets = None
    if not static and _kernel() is not None:
        try:
            import ipywidgets as widgets
        except ImportError:
            widgets = None
    if widgets is None:
        fig = search_modes_figure(maps, default_selections(maps, static_images), masks=masks,
                                  title="Search modes (static grid: first images, crop 0, every stage)")
        if _kernel() is not None:
            from IPython.display import display

            display(fig)
        return fig
    from IPython.display import display

    def show(image: int, crop: int, stage: str) -> None:
        display(search_modes_figure(maps, [(image, crop, stage)], masks=masks))

    ui = widgets.interactive(show, image=widgets.IntSlider(0, 0, len(maps) - 1, description="image"),
                             crop=widgets.IntSlider(0, 0, maps.n_crops - 1, description="crop"),
                             stage=widgets.Dropdown(options=list(maps.stages), value=maps.stages[-1],
                                                    description="stage"))
    display(ui)
    return ui


__all__ = ["caption", "default_selections", "explore", "row_range", "row_scales", "search_modes_figure",
           "searched_regions_figure", "searched_regions_stack"]

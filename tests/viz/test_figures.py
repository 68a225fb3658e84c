"""Figures: layout (one panel per image x column), captions, the static fallback of the explorer, PNG output."""

import numpy as np
import pytest
import torch

from scfs.eval.search_maps import compute_search_maps
from scfs.models import Backbone
from scfs.viz import explore, search_modes_figure, searched_regions_figure
from scfs.viz.figures import default_selections


def maps_backbone() -> Backbone:
    """A tiny random-init backbone, the same weights on every call."""
    torch.manual_seed(0)
    return Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))


@pytest.fixture(scope="module")
def maps():
    bb = maps_backbone()
    images = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3)).astype(np.uint8)
    return compute_search_maps(bb, images, n_crops=2, local_size=16)


def _bars(fig):
    return [c for ax in fig.axes for c in ax.child_axes]


def _texts(fig):
    return [t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]


def test_searched_regions_figure_layout_and_caption(maps, tmp_path):
    fig = searched_regions_figure(maps, mode="hard", crop=1)
    # images x (global, crop, 3 stages x (similarity, weights)), and a colour bar per row
    assert len(fig.axes) == 3 * (2 + 2 * 3) and len(_bars(fig)) == 3
    texts = " ".join(_texts(fig))
    assert "yellow box" in texts and "cosine similarity" in texts and "top 25%" in texts
    assert "layer3 hard weights" in texts and "local crop 1" in texts
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_searched_regions_figure_runs_the_search_from_a_model():
    torch.manual_seed(0)
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))
    images = np.random.default_rng(1).integers(0, 255, (2, 32, 32, 3)).astype(np.uint8)
    masks = np.zeros((2, 32, 32), np.uint8)
    masks[:, 8:24, 8:24] = 1
    fig = searched_regions_figure(bb, images, mode="softmax", stages=("layer3", "layer4"), masks=masks,
                                  local_size=16, n_crops=3)
    assert len(fig.axes) == 2 * (2 + 2 * 2)
    assert any("on the crop's object\n(chance 25%)" in t or "background" in t for t in _texts(fig))
    with pytest.raises(ValueError):
        searched_regions_figure(bb)


def test_modes_figure_and_static_explorer(maps, monkeypatch):
    sel = default_selections(maps, n_images=2)
    assert sel == [(i, 0, s) for i in range(2) for s in ("layer2", "layer3", "layer4")]
    fig = search_modes_figure(maps, sel[:2])
    assert len(fig.axes) == 2 * (3 + 2)  # soft weights are the similarity panel: hard and softmax only
    out = explore(maps)  # no IPython kernel under pytest: the fixed grid
    assert len(out.axes) == len(sel) * 5
    monkeypatch.setenv("SCFS_NB_STATIC", "1")
    assert len(explore(maps, static_images=1).axes) == 3 * 5


def test_figures_do_not_switch_the_matplotlib_backend(maps):
    import matplotlib

    before = matplotlib.get_backend()
    searched_regions_figure(maps)
    assert matplotlib.get_backend() == before


def test_soft_figure_has_one_panel_per_stage_and_a_row_scale_shared_across_models(maps):
    from dataclasses import replace

    from scfs.viz.figures import row_range

    fig = searched_regions_figure(maps, mode="soft")
    assert len(fig.axes) == 3 * (2 + 3)  # soft weights = similarity: no duplicate panel
    assert any("similarity\n= soft weight" in t for t in _texts(fig))
    # another "model": the same maps with similarities scaled into [0.3, 0.9]; the row scale spans both models
    sims = {s: 0.3 + 0.6 * (v - v.min()) / (v.max() - v.min()) for s, v in maps.similarity.items()}
    other = replace(maps, similarity=sims)
    lo, hi = row_range([maps, other], 0, 0, maps.stages)
    own = row_range([maps], 0, 0, maps.stages)
    assert lo == pytest.approx(min(own[0], min(s[0, 0].min() for s in sims.values())))
    assert hi == pytest.approx(max(own[1], max(s[0, 0].max() for s in sims.values())))
    assert row_range([other], 0, 0, other.stages)[0] >= 0.3 - 1e-6  # weights in [0.3, 0.9] are not scaled from 0
    fig = searched_regions_figure(other, mode="soft", shared_with=[maps])
    bars = _bars(fig)
    assert len(bars) == 3 and bars[0].get_ylim() == pytest.approx((lo, hi))
    with pytest.raises(ValueError, match="same images"):
        searched_regions_figure(other, mode="soft", shared_with=[replace(maps, boxes=maps.boxes + 1)])


def test_global_panel_outlines_the_crops_object():
    from scfs.viz.draw import MAGENTA
    from scfs.viz.figures import global_panel

    torch.manual_seed(0)
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))
    images = np.zeros((1, 32, 32, 3), np.uint8)
    masks = np.zeros((1, 32, 32), np.uint8)
    masks[0, 4:20, 4:20] = 1
    m = compute_search_maps(bb, images, boxes=np.array([[[6, 6, 14, 14]]]), local_size=8)
    with_outline = global_panel(m, 0, 0, all_boxes=False, masks=masks)
    without = global_panel(m, 0, 0, all_boxes=False)
    magenta = (with_outline == np.array(MAGENTA, np.uint8)).all(-1)
    assert magenta.any() and not (without == np.array(MAGENTA, np.uint8)).all(-1).any()


def _in_range(maps, lo, hi):
    """The same maps with every similarity rescaled into [lo, hi]: another "model" on the same images and crops."""
    from dataclasses import replace

    return replace(maps, similarity={s: lo + (hi - lo) * (v - v.min()) / (v.max() - v.min())
                                     for s, v in maps.similarity.items()})


def _blocks(fig):
    """The colour bars of each model's SubFigure of a stacked figure (the last SubFigure holds the caption)."""
    return [[c for ax in sub.axes for c in ax.child_axes] for sub in fig.subfigs[:-1]]


def test_stacked_figure_shares_each_rows_colour_limits_across_models(maps):
    from dataclasses import replace

    from scfs.viz import searched_regions_stack
    from scfs.viz.figures import row_range, row_scales

    other = _in_range(maps, 0.3, 0.9)
    fig = searched_regions_stack({"A": maps, "B": other, "C": maps}, mode="soft")
    assert len(fig.subfigs) == 3 + 1  # a block per model, then the caption
    assert [sub.get_suptitle() for sub in fig.subfigs[:-1]] == [
        f"{m} teacher: what the soft search picks" for m in "ABC"]
    blocks = _blocks(fig)
    assert [len(b) for b in blocks] == [len(maps)] * 3
    scales = row_scales([maps, other, maps], 0, maps.stages, "soft")
    for i, (sim, _) in enumerate(scales):
        assert sim == row_range([maps, other], i, 0, maps.stages)
        for bars in blocks:
            assert bars[i].get_ylim() == pytest.approx(sim)
    # real photos: two models whose similarities sit in [0.3, 0.9] share a scale that does not start at 0
    both = row_scales([other, _in_range(maps, 0.35, 0.8)], 0, maps.stages, "soft")
    assert all(0.3 - 1e-6 <= lo < hi <= 0.9 + 1e-6 for (lo, hi), _ in both)
    softmax = row_scales([maps, other], 0, maps.stages, "softmax")
    assert softmax[0][0] == scales[0][0] and softmax[0][1] != softmax[0][0]  # weights: their own scale
    with pytest.raises(ValueError, match="same images"):
        searched_regions_stack({"A": maps, "B": replace(maps, boxes=maps.boxes + 1)})


@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
def test_by_image_figure_puts_the_models_side_by_side_on_one_scale_per_row(maps, mode):
    """One row per image: global view, query crop, then one column group per model (in order) with a panel per
    stage; one colour bar per row whose limits span every model's panels of that row."""
    from dataclasses import replace

    from scfs.viz import searched_regions_by_image
    from scfs.viz.figures import row_scales

    full = maps
    other = _in_range(full, 0.3, 0.9)
    fig = searched_regions_by_image({"A": full, "B": other, "C": full}, mode=mode)
    n_stages = len(full.stages)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(full) * (2 + 3 * n_stages) and len(_bars(fig)) == len(full)
    for i in range(len(full)):
        row = panels[i * (2 + 3 * n_stages):(i + 1) * (2 + 3 * n_stages)]
        assert [t.get_title().split()[0] for t in row[2:]] == [m for m in "ABC" for _ in range(n_stages)]
    sim, weights = zip(*row_scales([full, other, full], 0, full.stages, mode))
    want = weights if mode == "softmax" else sim
    assert [b.get_ylim() for b in _bars(fig)] == [pytest.approx(w) for w in want]
    assert _overlapping(fig) == []
    # photos have no object masks: the caption promises no outline and no share on the object
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "yellow box" in caption and "magenta" not in caption and "on the crop's object" not in caption
    with pytest.raises(ValueError, match="raw or all centred"):
        searched_regions_by_image({"A": full, "B": replace(full, centre=True)}, mode=mode)


def test_centred_maps_say_so_in_titles_caption_and_colour_bar():
    from scfs.viz import searched_regions_by_image

    images = np.random.default_rng(1).integers(0, 255, (2, 32, 32, 3)).astype(np.uint8)
    centred = compute_search_maps(maps_backbone(), images, n_crops=2, local_size=16, centre=True)
    raw = compute_search_maps(maps_backbone(), images, centred.boxes, local_size=16)
    assert centred.centre and not raw.centre
    assert not np.allclose(centred.similarity["layer4"], raw.similarity["layer4"])
    texts = " ".join(_texts(searched_regions_by_image({"M": centred})))
    assert "centred cosine similarity" in texts and "layer4\ncentred similarity" in texts
    texts = " ".join(_texts(searched_regions_figure(centred)))
    assert "centred cosine similarity" in texts and "layer4 centred similarity" in texts
    assert "centred" not in " ".join(_texts(searched_regions_by_image({"M": raw})))


def _overlapping(fig):
    """Pairs of laid-out boxes (panels, panel titles, suptitles, caption, colour bars with their ticks and label)
    that overlap by more than a pixel, after drawing the figure."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = []
    for f in [fig, *fig.subfigs]:  # a (sub)figure's texts: its suptitle, the caption
        boxes += [(f"text {t.get_text()[:30]!r}", t.get_window_extent(r)) for t in f.texts if t.get_text()]
    for ax in fig.axes:  # every SubFigure's panels; colour bars are their panels' child axes
        boxes.append((f"panel {ax.get_title()!r}", ax.get_window_extent(r)))
        if ax.get_title():
            boxes.append((f"title {ax.get_title()!r}", ax.title.get_window_extent(r)))
        boxes += [("colour bar", c.get_tightbbox(r)) for c in ax.child_axes]
    boxes = [(n, b.expanded(1, 1).padded(-1)) for n, b in boxes]
    return [(a, b) for k, (a, ba) in enumerate(boxes) for b, bb in boxes[k + 1:] if ba.overlaps(bb)]


@pytest.mark.parametrize("mode", ["soft", "softmax"])
def test_titles_panels_captions_and_colour_bars_do_not_overlap(maps, mode):
    from scfs.viz import searched_regions_stack

    masks = np.zeros((3, 32, 32), np.uint8)
    masks[:, 4:28, 4:28] = 1  # four-line titles: "x% on the crop's object (chance y%)"
    assert _overlapping(searched_regions_stack({"SCFS": maps, "random init": maps}, mode=mode, masks=masks)) == []
    assert _overlapping(searched_regions_figure(maps, mode=mode, masks=masks)) == []
    assert _overlapping(search_modes_figure(maps, default_selections(maps, 1), masks=masks)) == []

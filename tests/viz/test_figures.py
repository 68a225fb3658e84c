"""Figures: layout (one panel per image x column), captions, the static fallback of the explorer, PNG output."""

import numpy as np
import pytest
import torch

from scfs.eval.search_maps import compute_search_maps
from scfs.models import Backbone
from scfs.viz import explore, search_modes_figure, searched_regions_figure
from scfs.viz.figures import default_selections


@pytest.fixture(scope="module")
def maps():
    torch.manual_seed(0)
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))
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

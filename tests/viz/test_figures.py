"""Figures: layout (one panel per image x column), captions, the static fallback of the explorer, PNG output."""

import numpy as np
import pytest
import torch

from scfs.models import Backbone
from scfs.viz import explore, search_modes_figure, searched_regions_figure
from scfs.viz.figures import default_selections
from scfs.viz.regions import compute_search_maps


@pytest.fixture(scope="module")
def maps():
    torch.manual_seed(0)
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))
    images = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3)).astype(np.uint8)
    return compute_search_maps(bb, images, n_crops=2, local_size=16)


def _texts(fig):
    return [t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]


def test_searched_regions_figure_layout_and_caption(maps, tmp_path):
    fig = searched_regions_figure(maps, mode="hard", crop=1)
    assert len(fig.axes) == 3 * (2 + 2 * 3)  # images x (global, crop, 3 stages x (similarity, weights))
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
    assert any("on the crop's object" in t or "background" in t for t in _texts(fig))
    with pytest.raises(ValueError):
        searched_regions_figure(bb)


def test_modes_figure_and_static_explorer(maps, monkeypatch):
    sel = default_selections(maps, n_images=2)
    assert sel == [(i, 0, s) for i in range(2) for s in ("layer2", "layer3", "layer4")]
    fig = search_modes_figure(maps, sel[:2])
    assert len(fig.axes) == 2 * (3 + 3)
    out = explore(maps)  # no IPython kernel under pytest: the fixed grid
    assert len(out.axes) == len(sel) * 6
    monkeypatch.setenv("SCFS_NB_STATIC", "1")
    assert len(explore(maps, static_images=1).axes) == 3 * 6


def test_figures_do_not_switch_the_matplotlib_backend(maps):
    import matplotlib

    before = matplotlib.get_backend()
    searched_regions_figure(maps)
    assert matplotlib.get_backend() == before

"""The searched-regions computation: stage maps of any stage, crops like training, output shapes and order."""

import numpy as np
import pytest
import torch

from scfs.eval.search_maps import (
    compute_search_maps,
    crop_views,
    eval_mode,
    foreground_first,
    sample_crop_boxes,
    stage_maps,
)
from scfs.models import Backbone

TINY = {"cifar_stem": True, "layers": (1, 1, 1, 1), "channels": (8, 8, 16, 16)}


@pytest.fixture(scope="module")
def backbone() -> Backbone:
    torch.manual_seed(0)
    return Backbone("resnet18", stages=("layer2", "layer3", "layer4"), **TINY).eval()


def test_stage_maps_of_stages_the_backbone_does_not_return(backbone):
    only_last = Backbone("resnet18", stages=("layer4",), **TINY).eval()
    only_last.load_state_dict(backbone.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = backbone(x)
        got = stage_maps(only_last, x, ("layer2", "layer3", "layer4"))
    for s in want:
        torch.testing.assert_close(got[s], want[s])
    with pytest.raises(ValueError, match="no stage"):
        stage_maps(only_last, x, ("layer9",))


def test_sample_crop_boxes_follow_the_training_rule():
    boxes = sample_crop_boxes(50, 6, 32, 40, scale=(0.1, 0.35), seed=3)
    assert boxes.shape == (50, 6, 4) and boxes.dtype == np.int64
    x0, y0, x1, y1 = boxes.reshape(-1, 4).T
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x1 <= 40).all() and (y1 <= 32).all()
    area = (x1 - x0) * (y1 - y0) / (32 * 40)
    assert area.min() > 0.07 and area.max() < 0.4  # scale range up to rounding
    np.testing.assert_array_equal(boxes, sample_crop_boxes(50, 6, 32, 40, scale=(0.1, 0.35), seed=3))


def test_crop_views_are_n_major():
    imgs = torch.stack([torch.full((3, 8, 8), float(b)) for b in range(3)])  # image b is constant b
    boxes = torch.tensor([[[0, 0, 4, 4], [2, 2, 8, 8]]] * 3, dtype=torch.float32)
    views = crop_views(imgs, boxes, 4)
    assert views.shape == (6, 3, 4, 4)
    assert [round(v.mean().item()) for v in views] == [0, 1, 2, 0, 1, 2]  # index n*B + b


def test_foreground_first_puts_the_object_crop_first():
    masks = np.zeros((1, 10, 10), np.uint8)
    masks[0, 5:, 5:] = 1
    boxes = np.array([[[0, 0, 4, 4], [5, 5, 10, 10], [3, 3, 7, 7]]])
    np.testing.assert_array_equal(foreground_first(boxes, masks)[0, 0], [5, 5, 10, 10])


def test_compute_search_maps_shapes_and_restores_train_mode(backbone):
    backbone.train()
    images = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3)).astype(np.uint8)
    maps = compute_search_maps(backbone, images, n_crops=2, local_size=16, names=["a", "b", "c"])
    assert backbone.training and all(m.training for m in backbone.modules())
    assert maps.images.shape == (3, 32, 32, 3) and maps.boxes.shape == (3, 2, 4)
    assert maps.crops.shape == (3, 2, 16, 16, 3) and maps.crops.dtype == np.uint8
    for s, hw in {"layer2": 16, "layer3": 8, "layer4": 4}.items():
        assert maps.similarity[s].shape == (3, 2, hw, hw)
        assert np.abs(maps.similarity[s]).max() <= 1 + 1e-5
        for m in ("soft", "hard", "softmax"):
            assert maps.weights[m][s].shape == (3, 2, hw, hw)
        np.testing.assert_allclose(maps.weights["soft"][s], maps.similarity[s])
        kept = (maps.weights["hard"][s] != 0).reshape(6, -1).sum(1)
        assert (kept <= int(np.ceil(0.25 * hw * hw))).all()
        np.testing.assert_allclose(maps.weights["softmax"][s].reshape(6, -1).sum(1), hw * hw, rtol=1e-4)


def test_query_from_the_crop_itself_is_most_similar_where_the_crop_is():
    """An untrained network still sees colour: a crop of a red square on grey is most similar inside the square."""
    torch.manual_seed(1)
    bb = Backbone("resnet18", stages=("layer2",), **TINY)
    img = np.full((1, 32, 32, 3), 128, np.uint8)
    img[0, 16:, 16:] = (220, 20, 20)
    maps = compute_search_maps(bb, img, boxes=np.array([[[18, 18, 30, 30]]]), stages=("layer2",), local_size=16)
    sim = maps.similarity["layer2"][0, 0]  # 16 x 16 map: the square is the bottom-right 8 x 8 cells
    assert sim[10:14, 10:14].mean() > sim[:6, :6].mean()


def test_eval_mode_restores_flags_after_errors(backbone):
    backbone.train()
    backbone.body.layer1.eval()
    with pytest.raises(RuntimeError), eval_mode(backbone):
        assert not backbone.training
        raise RuntimeError("boom")
    assert backbone.training and not backbone.body.layer1.training


def test_compute_search_maps_follows_a_modules_search_centre(backbone):
    """A method module's `search.centre` decides the similarity unless `centre=` says otherwise; a Backbone is raw."""
    from torch import nn

    from scfs.eval.search_maps import centre_of

    class Module(nn.Module):  # the two attributes of a scfs.methods module that the search maps read
        def __init__(self, centre: bool) -> None:
            super().__init__()
            self.teacher = nn.ModuleDict({"backbone": backbone})
            self.search_cfg = {"weighting": "soft", "local_target": "search", "centre": centre}

    images = np.random.default_rng(0).integers(0, 255, (2, 32, 32, 3)).astype(np.uint8)
    raw = compute_search_maps(backbone, images, n_crops=2, local_size=16, modes=("soft",))
    centred = compute_search_maps(Module(True), images, raw.boxes, local_size=16, modes=("soft",))
    assert not raw.centre and centred.centre and centre_of(Module(True)) and not centre_of(backbone)
    assert not np.allclose(raw.similarity["layer4"], centred.similarity["layer4"])
    assert not compute_search_maps(Module(True), images, raw.boxes, local_size=16, modes=("soft",),
                                   centre=False).centre
    same = compute_search_maps(Module(False), images, raw.boxes, local_size=16, modes=("soft",))
    np.testing.assert_array_equal(same.similarity["layer4"], raw.similarity["layer4"])

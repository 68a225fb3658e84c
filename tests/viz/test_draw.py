"""Raster helpers: boxes land on the right pixels, overlays keep the image's shape and blend as documented."""

import numpy as np
import pytest

from scfs.viz.draw import (
    colorize,
    draw_boxes,
    overlay_map,
    resize_map,
    upscale,
)


def test_draw_boxes_outline_is_inside_the_box_and_nowhere_else():
    img = np.zeros((10, 12, 3), np.uint8)
    out = draw_boxes(img, [[2, 3, 7, 9]], colors=(255, 0, 0), width=1)  # x0, y0, x1 (excl.), y1 (excl.)
    red = (out == [255, 0, 0]).all(-1)
    expected = np.zeros((10, 12), bool)
    expected[3, 2:7] = expected[8, 2:7] = True  # top row y0, bottom row y1 - 1
    expected[3:9, 2] = expected[3:9, 6] = True  # left column x0, right column x1 - 1
    np.testing.assert_array_equal(red, expected)
    assert img.sum() == 0  # the input is not modified


def test_draw_boxes_width_colours_clipping():
    img = np.full((8, 8, 3), 7, np.uint8)
    out = draw_boxes(img, [[0, 0, 8, 8], [6, 6, 20, 20]], colors=[(1, 2, 3), (9, 9, 9)], width=2)
    assert (out[0, 3] == [1, 2, 3]).all() and (out[1, 3] == [1, 2, 3]).all()  # 2 px thick
    assert (out[3, 3] == 7).all()  # the inside stays untouched
    assert (out[7, 7] == 9).all()  # second box clipped to the image, drawn last
    with pytest.raises(ValueError):
        draw_boxes(img, [[0, 0, 4, 4]], colors=[(1, 1, 1), (2, 2, 2)])


def test_overlay_shapes_and_blend_extremes():
    img = np.random.default_rng(0).integers(0, 255, (30, 48, 3)).astype(np.uint8)
    heat = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = overlay_map(img, heat, alpha=0.5)
    assert out.shape == img.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(overlay_map(img, heat, alpha=0.0), img)
    full = overlay_map(img, heat, alpha=1.0, cmap="gray")
    # nearest upsampling: each feature cell is a 10 x 12 block; grey colormap min -> black, max -> white
    assert (full[:10, :12] == 0).all() and (full[20:, 36:] == 255).all()
    with pytest.raises(ValueError):
        overlay_map(img, heat[None])


def test_resize_colorize_upscale():
    assert resize_map(np.ones((2, 2)), (8, 6)).shape == (8, 6)
    assert resize_map(np.ones((2, 2)), (8, 6), mode="bilinear").shape == (8, 6)
    assert (colorize(np.full((3, 3), 5.0)) == colorize(np.zeros((3, 3)))).all()  # constant map: no division by 0
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    up = upscale(img, 4)
    assert up.shape == (8, 12, 3) and (up[:4, :4] == img[0, 0]).all()

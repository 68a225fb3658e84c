"""Images between the model's layout and pictures: layouts read right, normalisation round-trips, photos from a
folder become square global views."""

import numpy as np
import pytest
import torch

from scfs.data.images import as_hwc_uint8, denormalize, load_image_folder, normalize_images, prepare_image


def test_conversions_round_trip():
    img = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    chw = torch.from_numpy(img).permute(2, 0, 1)
    np.testing.assert_array_equal(as_hwc_uint8(chw), img)
    batch = np.random.default_rng(1).integers(0, 255, (2, 5, 5, 3)).astype(np.uint8)
    x = normalize_images(batch)
    assert x.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(denormalize(x[1]).astype(int), batch[1].astype(int), atol=1)


def test_photos_are_centre_cropped(tmp_path):
    from PIL import Image

    Image.new("RGB", (60, 30), (10, 200, 30)).save(tmp_path / "a.jpg")
    Image.new("RGB", (20, 50), (200, 10, 30)).save(tmp_path / "b.png")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    images, names = load_image_folder(tmp_path, 24)
    assert images.shape == (2, 24, 24, 3) and names == ["a", "b"]
    assert prepare_image(np.zeros((40, 30, 3), np.uint8), 16).shape == (16, 16, 3)
    with pytest.raises(FileNotFoundError):
        load_image_folder(tmp_path / "missing", 24)

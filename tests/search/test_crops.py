"""Tests of the random feature-crop baseline."""

from __future__ import annotations

import pytest
import torch

from scfs.search import random_feature_crops


def test_crops_shape_order_and_determinism():
    feats = torch.randn(3, 4, 8, 8)
    out = random_feature_crops(feats, 2, 5, generator=torch.Generator().manual_seed(0))
    again = random_feature_crops(feats, 2, 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (6, 4, 5, 5)
    assert torch.equal(out, again)
    # n-major: crops of image b come from image b only; a constant-per-image map proves it
    const = torch.arange(3.0)[:, None, None, None].expand(3, 4, 8, 8).contiguous()
    crops = random_feature_crops(const, 2, 3, generator=torch.Generator().manual_seed(1))
    expect = torch.arange(3.0).repeat(2)[:, None, None, None].expand_as(crops)
    torch.testing.assert_close(crops, expect)


def test_full_scale_crop_of_linear_ramp_is_inside_range():
    x = torch.linspace(0, 1, 16).expand(1, 1, 16, 16).contiguous()
    crops = random_feature_crops(x, 4, 4, scale=(0.1, 0.2), generator=torch.Generator().manual_seed(2))
    assert crops.min() >= 0 and crops.max() <= 1
    assert not torch.allclose(crops[0], crops[1])


def test_crops_gradient_and_dtype():
    feats = torch.randn(2, 3, 6, 6, requires_grad=True)
    random_feature_crops(feats, 3, 2).sum().backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0
    assert random_feature_crops(feats.detach().bfloat16(), 1, 2).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kw, match", [(dict(n=0), "n must be"), (dict(out_size=0), "out_size"), (dict(scale=(0.5, 0.1)), "scale")]
)
def test_crops_errors(kw, match):
    args = dict(n=1, out_size=2) | kw
    with pytest.raises(ValueError, match=match):
        random_feature_crops(torch.randn(1, 2, 4, 4), **args)

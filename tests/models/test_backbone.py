import pytest
import torch

from scfs.models import Backbone
from scfs.models.backbone import stage_index


def test_stage_maps_and_pool_shapes():
    b = Backbone("resnet18", stages=("layer2", "layer3"), layers=(1, 1, 1, 1), channels=(8, 16, 32, 64))
    out = b(torch.randn(2, 3, 64, 64))
    assert set(out) == {"layer2", "layer3", "layer4"}  # layer4 always present: it is the representation
    assert out["layer2"].shape == (2, 16, 8, 8)
    assert out["layer4"].shape == (2, 64, 2, 2)
    assert b.pooled(torch.randn(3, 3, 64, 64)).shape == (3, 64)
    assert b.channels == {"layer2": 16, "layer3": 32, "layer4": 64}


def test_cifar_stem_keeps_resolution():
    b = Backbone("resnet18", stages=("layer2",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 16, 32, 64))
    out = b(torch.randn(1, 3, 32, 32))
    assert out["layer2"].shape[-1] == 16 and out["layer4"].shape[-1] == 4
    assert b.body.conv1.kernel_size == (3, 3) and b.body.conv1.stride == (1, 1)


@pytest.mark.parametrize("bad", ["layer5", "conv1", 0, 7])
def test_unknown_stage_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="stage"):
        stage_index(bad)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="not a timm model"):
        Backbone("resnet_does_not_exist")

import pytest
import torch

from scfs.models import DINOHead, StageHead
from scfs.search import feature_search


def test_dino_head_shapes_and_fixed_norm():
    h = DINOHead(32, out_dim=50, hidden_dim=16, bottleneck_dim=8)
    assert h(torch.randn(4, 32)).shape == (4, 50)
    g = h.last_layer.parametrizations.weight.original0
    assert not g.requires_grad and torch.all(g == 1)


@pytest.mark.parametrize("norm", ["batchnorm", "groupnorm1"])
@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
def test_stage_head_commuted_search_equals_materialised(mode, norm):
    """The commuted path (1x1 conv in front of the weighting, GAP of x by a matmul) is exact, with either norm."""
    torch.manual_seed(0)
    head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, norm=norm).double()
    torch.nn.init.normal_(head.bn3.weight)  # make the residual branch non-trivial
    head.eval()
    feats = torch.randn(3, 16, 5, 7, dtype=torch.float64)
    queries = torch.randn(4, 3, 16, dtype=torch.float64)
    fast, out = head.forward_searched(feats, queries, mode=mode, backend="reference")
    slow = head(feature_search(feats, queries, mode=mode, backend="reference").features)
    assert out.features.shape == (12, head.conv1.out_channels, 5, 7)
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-9)


def test_stage_head_final_relu_path_materialises():
    torch.manual_seed(0)
    head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, final_relu=True).double().eval()
    feats, queries = torch.randn(2, 16, 4, 4, dtype=torch.float64), torch.randn(3, 2, 16, dtype=torch.float64)
    fast, out = head.forward_searched(feats, queries, backend="reference")
    assert out.features.shape == (6, 16, 4, 4)
    torch.testing.assert_close(fast, head(out.features))


def test_bottleneck_bn_removes_the_shared_component():
    """With bottleneck BN the teacher's prototype scores differ between images even when the inputs share a big
    common component (the start-up regime), which is what keeps the centred teacher from being uniform."""
    torch.manual_seed(0)
    x = torch.randn(64, 32) * 0.01 + torch.randn(1, 32) * 5.0  # nearly identical inputs
    plain = DINOHead(32, out_dim=128, hidden_dim=64, bottleneck_dim=16)
    bn = DINOHead(32, out_dim=128, hidden_dim=64, bottleneck_dim=16, bottleneck_bn=True)
    bn.mlp.load_state_dict(plain.mlp.state_dict())
    bn.last_layer.load_state_dict(plain.last_layer.state_dict())
    spread_plain = plain(x).std(0).mean()
    spread_bn = bn(x).std(0).mean()
    assert spread_bn > 20 * spread_plain


def test_norm_last_layer_false_makes_the_norm_trainable():
    h = DINOHead(8, out_dim=10, hidden_dim=8, bottleneck_dim=4, norm_last_layer=False)
    assert h.last_layer.parametrizations.weight.original0.requires_grad


def test_stage_head_unknown_norm_is_refused():
    with pytest.raises(ValueError, match="norm='layernorm'.*batchnorm, groupnorm1"):
        StageHead(16, norm="layernorm")

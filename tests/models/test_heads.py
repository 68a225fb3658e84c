import pytest
import torch

from scfs.models import DINOHead, StageHead
from scfs.models.heads import pooled_conv_bn
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


@pytest.mark.parametrize("channels_last", [False, True])
def test_stage_head_commuted_search_gradients_equal_materialised(channels_last):
    """The commuted path in training mode, in both memory formats: values and the gradients of the map, the
    queries and every head parameter equal those of the head on the materialised searched maps."""
    torch.manual_seed(3)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    fast_head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8).double().to(memory_format=fmt)
    torch.nn.init.normal_(fast_head.bn3.weight)
    slow_head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, pooled_bn=False).double()
    slow_head.load_state_dict(fast_head.state_dict())
    feats = torch.randn(3, 16, 5, 7, dtype=torch.float64).contiguous(memory_format=fmt)
    queries = torch.randn(4, 3, 16, dtype=torch.float64)
    f1, q1 = feats.clone().requires_grad_(), queries.clone().requires_grad_()
    f2, q2 = feats.clone().requires_grad_(), queries.clone().requires_grad_()
    fast, _ = fast_head.forward_searched(f1, q1, backend="reference")
    slow = slow_head(feature_search(f2, q2, backend="reference").features)
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-9)
    g = torch.randn_like(slow)
    fast.backward(g)
    slow.backward(g)
    torch.testing.assert_close(f1.grad, f2.grad, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(q1.grad, q2.grad, rtol=1e-8, atol=1e-10)
    slow_params = dict(slow_head.named_parameters())
    for name, p in fast_head.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, slow_params[name].grad, rtol=1e-8, atol=1e-10, msg=name)


@pytest.mark.parametrize("branch_channels", [None, 6, 24])
def test_stage_head_branch_width_and_its_commuted_search(branch_channels):
    """`branch_channels` sets the residual branch's width (None: a quarter of the map's channels), and the commuted
    searched path stays exact at any width, narrower or wider than the default."""
    torch.manual_seed(5)
    head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, branch_channels=branch_channels).double()
    mid = 8 if branch_channels is None else branch_channels  # max(16 // 4, 8)
    assert (head.conv1.out_channels, head.conv2.in_channels, head.conv2.out_channels, head.conv3.in_channels,
            head.conv3.out_channels) == (mid, mid, mid, mid, 16)
    torch.nn.init.normal_(head.bn3.weight)
    feats = torch.randn(3, 16, 5, 7, dtype=torch.float64)
    queries = torch.randn(4, 3, 16, dtype=torch.float64)
    fast, out = head.forward_searched(feats, queries, backend="reference")
    slow = head(feature_search(feats, queries, backend="reference").features)
    assert out.features.shape == (12, mid, 5, 7)
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


def _conv_bn(mid: int, c: int, momentum: float | None, dtype=torch.float64):
    conv = torch.nn.Conv2d(mid, c, 1, bias=False).to(dtype)
    bn = torch.nn.BatchNorm2d(c, momentum=momentum).to(dtype)
    torch.nn.init.normal_(bn.weight)
    torch.nn.init.normal_(bn.bias)
    return conv, bn


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_pooled_conv_bn_equals_materialised_in_training(momentum, channels_last):
    """Closed-form GAP(bn(conv1x1(z))): same output, every gradient and the same running statistics as the
    materialised ops, over two steps (the second starts from updated running stats)."""
    torch.manual_seed(1)
    conv, bn = _conv_bn(6, 10, momentum)
    conv2, bn2 = _conv_bn(6, 10, momentum)
    conv2.load_state_dict(conv.state_dict())
    bn2.load_state_dict(bn.state_dict())
    for step in range(2):
        z = (torch.randn(5, 6, 4, 3, dtype=torch.float64) + 0.5 * step).relu()  # post-ReLU maps, non-zero mean
        if channels_last:
            z = z.contiguous(memory_format=torch.channels_last)
        z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
        fast = pooled_conv_bn(z1, conv, bn)
        slow = bn2(conv2(z2)).mean(dim=(2, 3))
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
        g = torch.randn_like(slow)
        fast.backward(g)
        slow.backward(g)
        torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-10)
        for a, b in [(conv.weight, conv2.weight), (bn.weight, bn2.weight), (bn.bias, bn2.bias)]:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(bn.running_mean, bn2.running_mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(bn.running_var, bn2.running_var, rtol=1e-10, atol=1e-12)
        assert int(bn.num_batches_tracked) == int(bn2.num_batches_tracked) == step + 1
    bn.eval(), bn2.eval()
    z = torch.randn(3, 6, 4, 3, dtype=torch.float64).relu()
    torch.testing.assert_close(pooled_conv_bn(z, conv, bn), bn2(conv2(z)).mean(dim=(2, 3)), rtol=1e-10, atol=1e-10)


def test_pooled_conv_bn_under_bf16_autocast_is_float32_accurate():
    """Under bf16 autocast the materialised path rounds conv3's output to bf16; the closed form keeps float32 and
    stays within bf16 rounding of the float64 result, and returns the autocast dtype."""
    torch.manual_seed(2)
    conv, bn = _conv_bn(16, 32, 0.1, torch.float32)
    z = torch.randn(8, 16, 7, 7).relu().to(torch.bfloat16)
    with torch.no_grad():
        ref = torch.nn.functional.batch_norm(
            torch.nn.functional.conv2d(z.double(), conv.weight.double()), None, None, bn.weight.double(),
            bn.bias.double(), training=True, eps=bn.eps).mean(dim=(2, 3))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = pooled_conv_bn(z, conv, bn)
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.double(), ref, rtol=1e-2, atol=1e-2)


def test_pooled_conv_bn_refuses_a_single_value_per_channel():
    conv, bn = _conv_bn(4, 8, 0.1)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        pooled_conv_bn(torch.randn(1, 4, 1, 1, dtype=torch.float64), conv, bn)


@pytest.mark.parametrize("norm", ["batchnorm", "groupnorm1"])
def test_stage_head_pooled_bn_matches_materialised_head(norm):
    """StageHead.pool and forward_searched in training mode, closed form (pooled_bn) against the materialised
    head: outputs, gradients of every parameter, running stats. GroupNorm has no closed form: same path, bitwise."""
    torch.manual_seed(3)
    a = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, norm=norm).double().train()
    torch.nn.init.normal_(a.bn3.weight)
    b = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8, norm=norm).double().train()
    b.load_state_dict(a.state_dict())
    b.pooled_bn = False
    x = torch.randn(6, 16, 5, 5, dtype=torch.float64)
    feats, queries = torch.randn(3, 16, 5, 5, dtype=torch.float64), torch.randn(4, 3, 16, dtype=torch.float64)
    outs = []
    for head in (a, b):
        out = head(x).sum() + head.forward_searched(feats, queries, backend="reference")[0].square().sum()
        out.backward()
        outs.append(out.detach())
    exact = norm == "groupnorm1"
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-9, "atol": 1e-10}
    torch.testing.assert_close(outs[0], outs[1], **tol)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        if pa.grad is not None:
            torch.testing.assert_close(pa.grad, pb.grad, msg=name, **tol)
    for (name, ba), bb in zip(a.named_buffers(), b.buffers()):
        torch.testing.assert_close(ba, bb, msg=name, **tol)


def test_stage_head_pool_with_a_given_gap_is_the_plain_pool():
    """The step hands the stage heads the maps' GAPs it has already (`scfs.methods.networks.stage_gaps`): the same
    pooled feature, bit for bit."""
    torch.manual_seed(4)
    head = StageHead(16, out_dim=20, hidden_dim=16, bottleneck_dim=8)
    torch.nn.init.normal_(head.bn3.weight)
    x = torch.randn(3, 16, 5, 4).contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(head.pool(x, x.mean(dim=(2, 3))), head.pool(x), rtol=0, atol=0)


def test_stage_gaps_reuse_the_backbone_pool_where_it_is_the_gap():
    from scfs.methods.networks import stage_gaps
    from scfs.models.backbone import make_backbone

    torch.manual_seed(5)
    bb = make_backbone("resnet18", stages=("layer3", "layer4"), layers=[1, 1, 1, 1], channels=[8, 8, 16, 16])
    maps = bb(torch.randn(2, 3, 32, 32))
    pooled = bb.pool(maps)
    gaps = stage_gaps(bb, maps, pooled, ("layer3", "layer4"))
    assert gaps["layer4"] is pooled
    for s in ("layer3", "layer4"):
        torch.testing.assert_close(gaps[s], maps[s].mean(dim=(2, 3)), rtol=0, atol=0)


@pytest.mark.parametrize("norm_last_layer", [True, False])
@pytest.mark.parametrize("nlayers", [1, 3])
def test_stacked_dino_heads_equal_per_head_calls_values_and_gradients(norm_last_layer, nlayers):
    """Heads of one architecture but different input sizes (SCFS's stage projections) as one stacked call: the
    logits and the gradients of the inputs and of every parameter (the last layer's magnitude when it trains
    too) equal those of one call per head."""
    from scfs.models.heads import stacked_dino_heads

    torch.manual_seed(6)
    kw = {"out_dim": 12, "hidden_dim": 10, "bottleneck_dim": 6, "nlayers": nlayers, "norm_last_layer": norm_last_layer}
    heads = [DINOHead(d, **kw).double() for d in (5, 7, 9)]
    for h in heads:
        with torch.no_grad():
            h.last_layer.parametrizations.weight.original0.uniform_(0.5, 2.0)
    xs = [torch.randn(4, d, dtype=torch.float64, requires_grad=True) for d in (5, 7, 9)]
    got = stacked_dino_heads(heads, xs)
    g = torch.randn_like(got)
    fast = torch.autograd.grad((got * g).sum(), xs + [p for h in heads for p in h.parameters() if p.requires_grad])
    want = torch.stack([h(x) for h, x in zip(heads, xs)])
    slow = torch.autograd.grad((want * g).sum(), xs + [p for h in heads for p in h.parameters() if p.requires_grad])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_stacked_dino_heads_under_bf16_autocast_and_fallback():
    """Under bf16 autocast the stacked call gives the per-head logits to bf16 rounding; heads with BatchNorm (or
    inputs of different row counts) fall back to one call per head, exactly."""
    from scfs.models.heads import stacked_dino_heads

    torch.manual_seed(7)
    heads = [DINOHead(d, out_dim=32, hidden_dim=16, bottleneck_dim=8) for d in (8, 16)]
    xs = [torch.randn(6, 8), torch.randn(6, 16)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = stacked_dino_heads(heads, xs)
        want = torch.stack([h(x) for h, x in zip(heads, xs)])
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    bn_heads = [DINOHead(d, out_dim=32, hidden_dim=16, bottleneck_dim=8, use_bn=True) for d in (8, 16)]
    torch.testing.assert_close(stacked_dino_heads(bn_heads, xs), torch.stack([h(x) for h, x in zip(bn_heads, xs)]),
                               rtol=0, atol=0)
    uneven = [torch.randn(6, 8), torch.randn(5, 16)]
    with pytest.raises(RuntimeError):  # the per-head fallback: logits of 6 and 5 rows cannot be stacked
        stacked_dino_heads(heads, uneven)


@pytest.mark.parametrize("width", [None, 12])
def test_the_config_sets_every_stage_heads_branch_width(width):
    """`method.stage_branch_channels` reaches every stage head of the built network (the teacher is its copy);
    null keeps a quarter of each stage's channels."""
    from omegaconf import OmegaConf

    from scfs.config import validate_config
    from scfs.methods.networks import build_network
    from tests.helpers import compose_cfg

    cfg = compose_cfg(["method=scfs"] + ([] if width is None else [f"method.stage_branch_channels={width}"]))
    validate_config(cfg)
    stages = tuple(cfg.search.stages)
    net = build_network(OmegaConf.to_container(cfg.backbone), OmegaConf.to_container(cfg.method), stages)
    widths = {s: h.conv2.out_channels for s, h in net["stage_heads"].items()}
    channels = {s: h.conv1.in_channels for s, h in net["stage_heads"].items()}
    assert set(widths) == set(stages)
    assert widths == {s: (max(c // 4, 8) if width is None else width) for s, c in channels.items()}

"""Projection heads: DINO's head on the pooled image feature, and SCFS's per-stage heads on region features."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from scfs.search.reference import as_dtype


def _mlp(in_dim: int, hidden_dim: int, out_dim: int, nlayers: int, use_bn: bool) -> nn.Sequential:
    if nlayers == 1:
        return nn.Sequential(nn.Linear(in_dim, out_dim))
    layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim)]
    if use_bn:
        layers.append(nn.BatchNorm1d(hidden_dim))
    layers.append(nn.GELU())
    for _ in range(nlayers - 2):
        layers.append(nn.Linear(hidden_dim, hidden_dim))
        if use_bn:
            layers.append(nn.BatchNorm1d(hidden_dim))
        layers.append(nn.GELU())
    layers.append(nn.Linear(hidden_dim, out_dim))
    return nn.Sequential(*layers)


class DINOHead(nn.Module):
    """DINO's head: MLP -> L2-normalised bottleneck -> weight-normalised prototypes (logits over out_dim).

    The last layer's norm is fixed to 1 (`norm_last_layer`), which DINO found stabilises training; the method
    freezes the last layer during the first epoch(s) (see `scfs.methods.base.SelfDistillation`).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int = 65536,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
        bottleneck_bn: bool = False,
    ) -> None:
        super().__init__()
        self.mlp = _mlp(in_dim, hidden_dim, bottleneck_dim, max(nlayers, 1), use_bn)
        # Optional non-affine BN on the bottleneck: removes the component shared by all images before the L2
        # norm, so the teacher's prototype scores differ between images from the first step (a start-up aid
        # against the uniform plateau; off in the published recipe).
        self.bottleneck_norm = nn.BatchNorm1d(bottleneck_dim, affine=False) if bottleneck_bn else nn.Identity()
        self.apply(self._init_weights)
        self.last_layer = weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.parametrizations.weight.original0.data.fill_(1.0)
        if norm_last_layer:
            self.last_layer.parametrizations.weight.original0.requires_grad = False
        self.out_dim = out_dim
        # no BatchNorm: each row's logits depend on that row alone, so callers may run several batches as one
        self.rows_independent = not (use_bn or bottleneck_bn)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bottleneck_norm(self.mlp(x))
        # F.normalize(x, dim=-1, eps=1e-6) with the norm broadcast by the division instead of an expand_as op
        x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-6)
        return self.last_layer(x)


def _stackable(heads: Sequence[DINOHead], xs: Sequence[torch.Tensor]) -> bool:
    """Whether `stacked_dino_heads` can run these heads as one: no BatchNorm, the same layers and shapes after the
    first linear layer, the same number of rows, one dtype and one device."""
    h0 = heads[0]
    if len(heads) < 2 or not all(h.rows_independent for h in heads) or len({x.shape[0] for x in xs}) != 1:
        return False
    if len({(x.dtype, x.device) for x in xs}) != 1:
        return False

    def layout(h: DINOHead) -> list[Any]:
        return [type(m) if not isinstance(m, nn.Linear) else (m.weight.shape, m.bias is not None)
                for m in list(h.mlp)[1:]] + [h.last_layer.parametrizations.weight.original1.shape, type(h.mlp[0])]
    return all(layout(h) == layout(h0) for h in heads[1:])


def stacked_dino_heads(heads: Sequence[DINOHead], xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """`torch.stack([h(x) for h, x in zip(heads, xs)])` for heads of one architecture (SCFS's stage heads, whose
    input sizes alone differ): each head's first linear layer runs on its own input, every later layer once for
    all heads as a batched matmul of their stacked weights (the weight-normalised last layers too). The eager
    step is host-bound: one op instead of one per head, for the forward and the backward. Falls back to the
    per-head calls where the heads or the inputs differ (`_stackable`)."""
    if not _stackable(heads, xs):
        return torch.stack([h(x) for h, x in zip(heads, xs, strict=True)])
    mlps = [h.mlp for h in heads]
    y = torch.stack([m[0](x) for m, x in zip(mlps, xs, strict=True)])  # (S, R, hidden)
    for i in range(1, len(mlps[0])):
        layer = mlps[0][i]
        if isinstance(layer, nn.Linear):
            w = torch.stack([m[i].weight for m in mlps]).transpose(1, 2)  # (S, in, out)
            if layer.bias is None:
                y = torch.bmm(y, w)
            else:
                y = torch.baddbmm(torch.stack([m[i].bias for m in mlps]).unsqueeze(1), y, w)
        else:  # the activation, the same module kind in every head
            y = layer(y)
    y = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(1e-6)
    wn = [h.last_layer.parametrizations.weight for h in heads]
    v = torch.stack([p.original1 for p in wn])  # (S, out, in): each row normalised to its magnitude g
    g = torch.stack([p.original0 for p in wn])  # (S, out, 1)
    w = torch._weight_norm(v.flatten(0, 1), g.flatten(0, 1), 0).view_as(v)
    return torch.bmm(y, w.transpose(1, 2))


def pooled_conv_bn(z: torch.Tensor, conv: nn.Conv2d, bn: nn.BatchNorm2d) -> torch.Tensor:
    """`bn(conv(z)).mean((2, 3))` for a bias-free 1x1 `conv`, without materialising conv's (M, C, H, W) output.

    Both ops are affine per pixel, so the pooled output needs only the per-map mean of z and, in training, the
    batch moments of y = W z over all maps and pixels: mean W m and E[y_c^2] = w_c^T S w_c with m, S the first
    and second moments of z (a mid x mid matrix). That replaces the widest tensors of an SCFS stage head (the
    C-channel conv3 output and bn3's output over all N*B searched maps, read and written again by the backward)
    by one mid x mid Gram matrix. Same statistics and running-stat updates as `nn.BatchNorm2d` (momentum or
    cumulative average, unbiased running variance), computed in float32 (float64 for float64 maps) whatever
    the autocast dtype; with TF32 matmuls allowed (`torch.set_float32_matmul_precision("high")`) the moments
    carry TF32 rounding, like any float32 matmul."""
    n, mid, h, w = z.shape
    training = bn.training or bn.running_mean is None
    acc = torch.float64 if z.dtype == torch.float64 else torch.float32  # torch.promote_types would dispatch an op
    # mm / mv rather than `@`: the same kernels without matmul's own dispatch (the eager step is host-bound)
    with torch.autocast(device_type=z.device.type, enabled=False):
        zf = as_dtype(z, acc).permute(0, 2, 3, 1).reshape(n, h * w, mid)  # a view for channels_last maps
        w3 = as_dtype(conv.weight, acc).flatten(1)  # (C, mid)
        ybar = torch.mm(zf.mean(1), w3.t())  # (n, C): the pooled conv output
        if training:
            m_count = n * h * w
            if m_count < 2:
                raise ValueError("Expected more than 1 value per channel when training, got input size "
                                 f"{tuple(z.shape)}")
            flat = zf.reshape(-1, mid)
            mean_z = flat.mean(0)
            mean = torch.mv(w3, mean_z)
            second = torch.mm(flat.t(), flat) / m_count  # (mid, mid)
            var = ((torch.mm(w3, second) * w3).sum(1) - mean * mean).clamp_min(0)
            if bn.training and bn.track_running_stats and bn.running_mean is not None:
                with torch.no_grad():
                    factor = 0.0 if bn.momentum is None else bn.momentum
                    if bn.num_batches_tracked is not None:
                        bn.num_batches_tracked.add_(1)
                        if bn.momentum is None:
                            factor = 1.0 / float(bn.num_batches_tracked)
                    # both running stats in two foreach ops (the same elementwise arithmetic as mul_ then add_)
                    stats = [bn.running_mean, bn.running_var]
                    torch._foreach_mul_(stats, 1 - factor)
                    torch._foreach_add_(stats, [mean, var * (m_count / (m_count - 1))], alpha=factor)
        else:
            mean, var = as_dtype(bn.running_mean, acc), as_dtype(bn.running_var, acc)
        out = (ybar - mean) * torch.rsqrt(var + bn.eps)
        if bn.affine:
            out = out * as_dtype(bn.weight, acc) + as_dtype(bn.bias, acc)
    return as_dtype(out, z.dtype)


# The residual branch's norm layers: BatchNorm as published; GroupNorm(1, C) (per-sample statistics, as timm's
# `groupnorm1`) where batch statistics must not depend on how the batch is split, e.g. the CPU DDP test.
STAGE_NORMS = {"batchnorm": nn.BatchNorm2d, "groupnorm1": lambda c: nn.GroupNorm(1, c)}


class StageHead(nn.Module):
    """Per-stage SCFS head: residual 1x1-3x3-1x1 bottleneck on a region map, GAP, then a DINO head.

    Applied to the student's local-view maps, to the teacher's searched features and to both sides' global
    maps. The residual sum is *not* followed by a ReLU (the published head has one; `final_relu=True` restores
    it). Without it, GAP(x + branch(x)) = GAP(x) + GAP(branch(x)), so `forward_searched` never materialises
    the N full-width searched copies: the branch's bias-free first 1x1 conv is commuted in front of the
    weighting (the search op's `weight` argument) and GAP(x) is one small batched matmul of the weights with
    the map.
    """

    def __init__(
        self,
        channels: int,
        out_dim: int = 4096,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
        branch_channels: int | None = None,
        final_relu: bool = False,
        use_bn: bool = False,
        bottleneck_bn: bool = False,
        norm_last_layer: bool = True,
        norm: str = "batchnorm",
        pooled_bn: bool = True,
    ) -> None:
        super().__init__()
        # the residual branch's width: a quarter of the stage's channels by default; the published head uses 256
        # at every stage (`branch_channels=256`), which makes layer2's 3x3 conv over the searched maps 4x the work
        mid = branch_channels if branch_channels is not None else max(channels // 4, 8)
        if norm not in STAGE_NORMS:
            raise ValueError(f"StageHead norm={norm!r}: allowed are {', '.join(STAGE_NORMS)}")
        make = STAGE_NORMS[norm]
        self.conv1 = nn.Conv2d(channels, mid, 1, bias=False)
        self.bn1 = make(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.bn2 = make(mid)
        self.conv3 = nn.Conv2d(mid, channels, 1, bias=False)
        self.bn3 = make(channels)
        nn.init.zeros_(self.bn3.weight)  # start as identity: the residual branch is learnt on top of GAP(x)
        self.final_relu = final_relu
        self.pooled_bn = pooled_bn  # pool conv3 + bn3 in closed form (exact; False materialises them, to compare)
        self.proj = DINOHead(channels, out_dim, hidden_dim, bottleneck_dim, nlayers, use_bn=use_bn,
                             norm_last_layer=norm_last_layer, bottleneck_bn=bottleneck_bn)

    def _mid(self, y: torch.Tensor) -> torch.Tensor:
        """The residual branch between its first conv's output and its last conv's input."""
        y = F.relu(self.bn1(y))
        return F.relu(self.bn2(self.conv2(y)))

    def _branch_after_conv1(self, y: torch.Tensor) -> torch.Tensor:
        return self.bn3(self.conv3(self._mid(y)))

    def branch_pool(self, y: torch.Tensor) -> torch.Tensor:
        """GAP of the residual branch from its first conv's output on: the part of `forward_searched` that runs
        over all N·B projected searched maps (`compile_searched` compiles it). With plain BatchNorm (not SyncBN,
        not GroupNorm) and `pooled_bn` on, conv3 + bn3 are pooled in closed form (`pooled_conv_bn`)."""
        if self.pooled_bn and type(self.bn3) is nn.BatchNorm2d:
            return pooled_conv_bn(self._mid(y), self.conv3, self.bn3)
        return self._branch_after_conv1(y).mean(dim=(2, 3))

    def compile_searched(self, **kwargs: Any) -> None:
        """`torch.compile` the searched path's branch (`branch_pool`) with `kwargs`: `nn.Module.compile` only
        covers `forward`, and `forward_searched` does not go through it."""
        self._branch_pool = torch.compile(self.branch_pool, **kwargs)

    def pool(self, x: torch.Tensor, gap: torch.Tensor | None = None) -> torch.Tensor:
        """The pooled (pre-MLP) feature of a map batch: GAP(x) + GAP(branch(x)) when no ReLU follows the sum.
        `gap`: GAP(x), `x.mean(dim=(2, 3))`, when the caller has it already (the step pools each map once)."""
        if self.final_relu:
            return F.relu(x + self._branch_after_conv1(self.conv1(x))).mean(dim=(2, 3))
        return (x.mean(dim=(2, 3)) if gap is None else gap) + self.branch_pool(self.conv1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pool(x))

    def forward_searched(self, feats: torch.Tensor, queries: torch.Tensor, **search_kwargs):
        """Head output for the searched features of `feats` by `queries`, as `forward(search(...).features)`.

        Returns `(logits (N*B, out_dim), SearchOutput)`; the SearchOutput's `features` are the *projected*
        weighted maps when the commuted path is used.
        """
        pooled, out = self.pool_searched(feats, queries, **search_kwargs)
        return self.proj(pooled), out

    def pool_searched(self, feats: torch.Tensor, queries: torch.Tensor, **search_kwargs):
        """`pool` of the searched features of `feats` by `queries` (the pre-projection part of `forward_searched`):
        `(pooled (N*B, C), SearchOutput)`."""
        from scfs.search import feature_search

        if self.final_relu:
            out = feature_search(feats, queries, **search_kwargs)
            return self.pool(out.features), out
        out = feature_search(feats, queries, weight=self.conv1.weight.flatten(1), **search_kwargs)
        n, b = queries.shape[:2]
        h, w = feats.shape[-2:]
        branch = getattr(self, "_branch_pool", self.branch_pool)(out.features)
        # GAP of the searched map itself: mean_hw a[n,b,h,w] * feats[b,:,h,w], one matmul per image (B, N, C);
        # added to the n-major branch first, so the sum comes out n-major without a copy of the (B, N, C) product
        a = as_dtype(out.weights, feats.dtype).flatten(2)  # (N,B,HW)
        gap_x = torch.bmm(a.transpose(0, 1), feats.flatten(2).transpose(1, 2)) / (h * w)  # (B, N, C)
        return (branch.view(n, b, -1) + as_dtype(gap_x, branch.dtype).transpose(0, 1)).view(n * b, -1), out

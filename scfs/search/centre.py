"""The centred search on the kernel backends: a rank-one correction around the unchanged fused kernels.

Why: post-ReLU stage maps share a large positive mean direction, so the raw cosine of any query with any position
sits in a narrow band and searched-region maps look flat. Centring the map and the queries on the image's mean
feature mu[b] = mean_hw F[b] (a Pearson correlation over channels) spreads the similarity, while the searched
feature still weights the *uncentred* map: a * W F = a * W (F - mu) + a * W mu. The kernels run as they are on
(F - mu, q - mu) and the last term, one (B, C_out) vector per image scaled by the weights, is added back here in
torch, where autograd carries the gradients through mu to the map.
"""

from __future__ import annotations

import torch

from scfs.search.kernel_fn import memory_format


def centre_inputs(feats: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(feats - mu, queries - mu, mu): mu (B, C) accumulated in float32 (float64 stays float64), the centred map
    and queries rounded once to their own dtypes, the map kept in its memory format. Keeping feats' dtype keeps the
    backend key `scfs.search.api.resolve_backend` chose for the uncentred inputs."""
    acc = torch.float64 if feats.dtype == torch.float64 else torch.float32
    mu = feats.to(acc).mean(dim=(2, 3))
    centred = (feats.to(acc) - mu[:, :, None, None]).to(feats.dtype).contiguous(memory_format=memory_format(feats))
    q_centred = (queries.to(acc) - mu.unsqueeze(0)).to(queries.dtype)
    return centred, q_centred, mu


def add_mean_term(features: torch.Tensor, weights: torch.Tensor, mu: torch.Tensor,
                  weight: torch.Tensor | None) -> torch.Tensor:
    """features + a * (W mu): the searched map of the centred inputs made the searched map of the uncentred one.

    features (N*B, C_out, H, W) from the kernels on the centred inputs, weights a (N, B, H, W), mu (B, C); the sum
    is formed in mu's dtype and rounded once to the features' dtype and memory format."""
    n, b, h, w = weights.shape
    g_mu = mu if weight is None else mu @ weight.to(mu.dtype).t()  # (B, C_out)
    term = weights.to(mu.dtype).unsqueeze(2) * g_mu[None, :, :, None, None]  # (N, B, C_out, H, W)
    total = features.to(mu.dtype) + term.reshape(n * b, -1, h, w)
    return total.to(features.dtype).contiguous(memory_format=memory_format(features))

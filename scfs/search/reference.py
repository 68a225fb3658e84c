"""Pure-PyTorch search: the vectorised reference (the CPU path, and the ground truth of every kernel), published loop.

Autograd flows through plain torch ops here; the kernel backends implement their own backward and are checked
against this module (run in float64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64 (for checks), everything else accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def safe_normalize(x: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """x / max(||x||, eps) with finite gradients at ||x|| = 0 (clamp the squared norm, not the root)."""
    sq = (x * x).sum(dim=dim, keepdim=True)
    return x / sq.clamp_min(eps * eps).sqrt()


def topk_count(topk: float, positions: int) -> int:
    """Number of kept positions of the hard mode: ceil(topk * H * W), at least 1."""
    return max(1, min(positions, math.ceil(topk * positions - 1e-9)))


def hard_mask(sim: torch.Tensor, topk: float) -> torch.Tensor:
    """Boolean mask (N,B,H,W) of the top ceil(topk*H*W) positions of each (n, b) map."""
    n, b, h, w = sim.shape
    k = topk_count(topk, h * w)
    flat = sim.detach().reshape(n, b, h * w)
    idx = flat.topk(k, dim=-1).indices
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(-1, idx, True)
    return mask.view(n, b, h, w)


def apply_mode(sim: torch.Tensor, mode: str, topk: float, temperature: float,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Weights a from the similarity map (N,B,H,W): soft, hard (top-k masked) or H*W-scaled softmax.

    `mask` (hard mode) replaces the top-k selection: the harness scores a kernel's values and gradients given the
    positions it kept, since near-tied similarities may rank differently in float32 than in float64."""
    if mode == "soft":
        return sim
    if mode == "hard":
        return sim * (hard_mask(sim, topk) if mask is None else mask)
    n, b, h, w = sim.shape
    return (h * w) * torch.softmax(sim.reshape(n, b, h * w) / temperature, dim=-1).view_as(sim)


def reference_search(
    feats: torch.Tensor,
    queries: torch.Tensor,
    mode: str,
    weight: torch.Tensor | None,
    topk: float,
    temperature: float,
    eps: float,
    mask: torch.Tensor | None = None,
    centre: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Vectorised search, no loop over crops. Returns (features, similarity, weights); `mask`: see `apply_mode`.

    `centre`: the similarity is a Pearson correlation over channels: the image's mean feature over positions,
    mu[b] = mean_hw feats[b], is subtracted from the map and from the queries before normalising; the weights still
    multiply the uncentred map (or its projection)."""
    n, b = queries.shape[:2]
    _, c, h, w = feats.shape
    cd = compute_dtype(feats.dtype)
    f = as_dtype(feats, cd)
    q = as_dtype(queries, cd)
    if centre:
        mu = f.mean(dim=(2, 3))
        fn = safe_normalize(f - mu[:, :, None, None], 1, eps)
        qn = safe_normalize(q - mu.unsqueeze(0), -1, eps)
    else:
        fn = safe_normalize(f, 1, eps)
        qn = safe_normalize(q, -1, eps)
    # plain batched matmuls over the images, on (B, H*W, C) views of channels_last maps and (B, C, H*W) views of
    # contiguous ones: einsum would add its own permutes, reshapes and copies around the same products (the eager
    # step dispatches each op from the host). The similarity is made n-major (one small copy), so the weighted
    # maps come out in feats' memory format without a copy of their own.
    wt = None if weight is None else as_dtype(weight, cd)
    if _is_channels_last(feats):
        sim = torch.bmm(_pixels(fn), qn.permute(1, 2, 0)).permute(2, 0, 1).contiguous().view(n, b, h, w)
        a = apply_mode(sim, mode, topk, temperature, mask)
        g = _pixels(f) if wt is None else _pixels(f) @ wt.T  # (B, HW, C_out)
        out = (a.reshape(n, b, h * w, 1) * g).view(n * b, h, w, -1).permute(0, 3, 1, 2)  # channels_last
    else:
        sim = torch.bmm(qn.transpose(0, 1), fn.flatten(2)).transpose(0, 1).contiguous().view(n, b, h, w)
        a = apply_mode(sim, mode, topk, temperature, mask)
        g = f.flatten(2) if wt is None else torch.matmul(wt, f.flatten(2))  # (B, C_out, HW)
        out = (a.reshape(n, b, 1, h * w) * g).view(n * b, -1, h, w)
    return as_dtype(out, feats.dtype), sim, a


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)` without dispatching an op when it is already of that dtype (`to` would return `x` itself): the
    eager step dispatches every op from the host, and most of these casts are no-ops outside autocast."""
    return x if x.dtype == dtype else x.to(dtype)


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """(B, H*W, C) view of a channels_last (B, C, H, W) map."""
    b, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, h * w, c)


def _is_channels_last(x: torch.Tensor) -> bool:
    return (not x.is_contiguous()) and x.is_contiguous(memory_format=torch.channels_last)


def published_loop(feats: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The published SCFS search (soft mode, no projection): a Python loop over crops and a torch.cat."""
    outs = []
    fn = F.normalize(feats, dim=1)
    for i in range(queries.shape[0]):
        q = F.normalize(queries[i], dim=1)
        attn = torch.einsum("bc,bchw->bhw", q, fn)
        outs.append(attn.unsqueeze(1) * feats)
    return torch.cat(outs, dim=0)

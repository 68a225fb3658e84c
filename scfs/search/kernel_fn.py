"""The autograd Function shared by the kernel backends (triton, cuda).

Each backend provides three primitives over (B, C, P) strided views (P = H*W), all accumulating in float32:

* ``fwd``: similarity (+ norms) and/or weighting; the soft mode runs both in one launch.
* ``bwd_a``: da[n,b,p] = <dout[nB+b,:,p], g[b,:,p]> (per channel split) and dg[b,c,p] = sum_n a dout.
* ``bwd_f``: df = normalise-backward(sum_n ds q̂) + dg_add, and per-pixel-tile partials of dq̂.

Mode derivatives, the projection matmuls and the query-normalisation backward are small and run in torch.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from scfs.search.buffers import alloc
from scfs.search.reference import hard_mask


class KernelOps(Protocol):
    """Primitives a kernel backend implements (see module docstring)."""

    def fwd(
        self,
        f3: torch.Tensor,
        q: torch.Tensor,
        g3: torch.Tensor,
        out3: torch.Tensor | None,
        sim: torch.Tensor,
        a_out: torch.Tensor | None,
        fnorm: torch.Tensor,
        qnorm: torch.Tensor,
        a_in: torch.Tensor | None,
        eps: float,
    ) -> None: ...

    def bwd_a(self, dout3: torch.Tensor, g3: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def bwd_f(
        self,
        f3: torch.Tensor,
        fnorm: torch.Tensor,
        qhat: torch.Tensor,
        ds: torch.Tensor,
        sim: torch.Tensor,
        dg_add: torch.Tensor | None,
        df3: torch.Tensor,
        eps: float,
    ) -> torch.Tensor: ...


_OPS: dict[str, KernelOps] = {}


def _ops(backend: str) -> KernelOps:
    """The backend's primitives, looked up once per process."""
    got = _OPS.get(backend)
    if got is not None:
        return got
    if backend == "triton":
        from scfs.search import triton_backend

        got = triton_backend.OPS
    else:
        from scfs.search import cuda_backend

        got = cuda_backend.ops()
    _OPS[backend] = got
    return got


def memory_format(x: torch.Tensor) -> torch.memory_format:
    """channels_last when x is channels_last (and not also plain contiguous), else contiguous."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def fwd_soft_generic(ops: KernelOps, f3, queries, g3, h: int, w: int, channels_last: bool, eps: float):
    """Soft-mode forward over ``ops.fwd`` with outputs allocated here (backends without a fused entry)."""
    n, b = queries.shape[:2]
    p = h * w
    dev = f3.device
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = alloc((n * b, g3.shape[1], h, w), f3.dtype, dev, fmt)
    sim = alloc((n, b, p), torch.float32, dev)
    a = alloc((n, b, p), torch.float32, dev)
    fnorm = alloc((b, p), torch.float32, dev)
    qnorm = alloc((n, b), torch.float32, dev)
    ops.fwd(f3, queries, g3, out.flatten(2), sim, a, fnorm, qnorm, None, eps)
    return out, sim, a, fnorm, qnorm


def project(weight: torch.Tensor | None, f3: torch.Tensor) -> torch.Tensor:
    """G = W F in the dtype of F, the pair the kernels read together (the CUDA binding refuses two dtypes).

    Autocast is off here: under it the matmul would come out in the autocast dtype even when F does not, and a
    ViT's block maps (the residual stream) stay float32 under autocast while a CNN's come out of a conv in it.
    """
    if weight is None:
        return f3
    with torch.autocast(f3.device.type, enabled=False):
        return torch.matmul(weight.to(f3.dtype), f3)


def kernel_forward(feats, queries, weight, mode, topk, temperature, eps, backend):
    """The kernel forward: (feats as used, g3 or None, out, sim, a, fnorm, qnorm, mask), sim/a as (N, B, P)."""
    ops = _OPS.get(backend) or _ops(backend)
    if feats.is_contiguous():
        channels_last = False
    elif feats.is_contiguous(memory_format=torch.channels_last):
        channels_last = True
    else:
        channels_last = False
        feats = feats.contiguous()
    b, c, h, w = feats.shape
    f3 = feats.flatten(2)
    g3 = project(weight, f3)
    mask = None
    if mode == "soft":
        fused = getattr(ops, "fwd_soft", None)
        if fused is not None:
            out, sim, a, fnorm, qnorm = fused(f3, queries, g3, h, w, channels_last, eps)
        else:
            out, sim, a, fnorm, qnorm = fwd_soft_generic(ops, f3, queries, g3, h, w, channels_last, eps)
    else:
        n = queries.shape[0]
        p = h * w
        dev = feats.device
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        out = alloc((n * b, g3.shape[1], h, w), feats.dtype, dev, fmt)
        sim = alloc((n, b, p), torch.float32, dev)
        fnorm = alloc((b, p), torch.float32, dev)
        qnorm = alloc((n, b), torch.float32, dev)
        ops.fwd(f3, queries, g3, None, sim, None, fnorm, qnorm, None, eps)
        if mode == "hard":
            mask = hard_mask(sim.view(n, b, h, w), topk).view(n, b, p)
            a = sim * mask
        else:
            a = p * torch.softmax(sim / temperature, dim=-1)
        ops.fwd(f3, queries, g3, out.flatten(2), sim, None, fnorm, qnorm, a, eps)
    return feats, (g3 if weight is not None else None), out, sim, a, fnorm, qnorm, mask


class _KernelSearch(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        feats: torch.Tensor,
        queries: torch.Tensor,
        weight: torch.Tensor | None,
        mode: str,
        topk: float,
        temperature: float,
        eps: float,
        backend: str,
    ):
        feats, g3, out, sim, a, fnorm, qnorm, mask = kernel_forward(
            feats, queries, weight, mode, topk, temperature, eps, backend
        )
        ctx.save_for_backward(feats, queries, weight, g3, sim, a, fnorm, qnorm, mask)
        ctx.cfg = (mode, temperature, eps, backend)
        shape = (queries.shape[0], feats.shape[0], feats.shape[2], feats.shape[3])
        return out, sim.view(shape), a.view(shape)

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_sim: torch.Tensor | None, d_a: torch.Tensor | None):
        feats, queries, weight, g3, sim, a, fnorm, qnorm, mask = ctx.saved_tensors
        mode, temperature, eps, backend = ctx.cfg
        ops = _ops(backend)
        n, b = queries.shape[:2]
        _, c, h, w = feats.shape
        p = h * w
        f3 = feats.flatten(2)
        if g3 is None:
            g3 = f3
        if d_out is not None:
            da, dg = ops.bwd_a(d_out.flatten(2), g3, a)
        else:
            da = torch.zeros_like(sim)
            dg = torch.zeros(g3.shape, dtype=torch.float32, device=feats.device)
        if d_a is not None:
            da = da + d_a.reshape(n, b, p)
        if mode == "hard":
            ds = da * mask
        elif mode == "softmax":
            # row dot in float64: torch's row reduction may vectorise differently with B, and in float64 that
            # cannot show after rounding to float32, so d_feats stay batch-invariant
            dot = (da.double() * a.double()).sum(-1, keepdim=True).float()
            ds = a / temperature * (da - dot / p)
        else:
            ds = da
        if d_sim is not None:
            ds = ds + d_sim.reshape(n, b, p)
        ds = ds.contiguous()
        d_weight = None
        if weight is not None:
            f32 = f3.float()
            d_weight = torch.einsum("bop,bcp->oc", dg, f32).to(weight.dtype)
            dg = torch.matmul(weight.float().t(), dg)
        qf = queries.float()
        qinv = 1.0 / qnorm.clamp_min(eps)
        qhat = (qf * qinv[..., None]).contiguous()
        df = alloc((b, c, h, w), feats.dtype, feats.device, memory_format(feats))
        dq_hat = ops.bwd_f(f3, fnorm, qhat, ds, sim, dg, df.flatten(2), eps).sum(0)
        radial = (qhat * dq_hat).sum(-1, keepdim=True)
        clamped = (qnorm <= eps)[..., None]
        dq = torch.where(clamped, dq_hat / eps, (dq_hat - qhat * radial) * qinv[..., None]).to(queries.dtype)
        return df, dq, d_weight, None, None, None, None, None


def kernel_search(
    backend: str,
    feats: torch.Tensor,
    queries: torch.Tensor,
    mode: str,
    weight: torch.Tensor | None,
    topk: float,
    temperature: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run a kernel backend: through the autograd Function when a gradient is wanted, else directly."""
    if torch.is_grad_enabled() and (
        feats.requires_grad or queries.requires_grad or (weight is not None and weight.requires_grad)
    ):
        return _KernelSearch.apply(feats, queries, weight, mode, topk, temperature, eps, backend)
    feats, _, out, sim, a, _, _, _ = kernel_forward(feats, queries, weight, mode, topk, temperature, eps, backend)
    shape = (queries.shape[0], feats.shape[0], feats.shape[2], feats.shape[3])
    return out, sim.view(shape), a.view(shape)

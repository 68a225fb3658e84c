"""Triton backend: the readable GPU path (also runs under TRITON_INTERPRET=1 on the CPU for CI).

Programs tile one image's pixels (BLOCK_P) and loop over channels; a third grid axis splits the output
channels so that small maps (layer4: 7x7) still fill the GPU. Similarity/norm reductions use tl.dot in IEEE
fp32 against the queries of the image.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from scfs.search.buffers import alloc

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(feats: torch.Tensor) -> str | None:
    """None when this backend can run on feats' device, else why not."""
    if feats.device.type == "cuda":
        return None
    if _INTERPRET:
        return None
    return f"feats on {feats.device} (Triton needs a CUDA/ROCm device, or TRITON_INTERPRET=1 set before import)"


@triton.jit
def _tile(N, P, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr):
    """This program's tile (grid: pixel tiles, images, channel splits): pid_p, image b, split, its pixels p and
    their mask pm, the query lanes nn and their mask nm. Inlined into each kernel."""
    pid_p = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < P
    nn = tl.arange(0, BLOCK_N)
    nm = nn < N
    return pid_p, b, split, p, pm, nn, nm


@triton.jit
def _channel_split(split, C_PER_SPLIT, C):
    """[c_lo, c_hi): the channels of channel split `split`."""
    c_lo = split * C_PER_SPLIT
    c_hi = tl.minimum(c_lo + C_PER_SPLIT, C)
    return c_lo, c_hi


@triton.jit
def _fwd_kernel(
    f_ptr,
    sfb,
    sfc,
    sfp,
    q_ptr,
    sqn,
    sqb,
    sqc,
    g_ptr,
    sgb,
    sgc,
    sgp,
    o_ptr,
    sob,
    soc,
    sop,
    sim_ptr,
    aout_ptr,
    ain_ptr,
    fnorm_ptr,
    qnorm_ptr,
    N,
    B,
    C,
    CG,
    P,
    C_PER_SPLIT,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
    COMPUTE_SIM: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    WRITE_A: tl.constexpr,
):
    pid_p, b, split, p, pm, nn, nm = _tile(N, P, BLOCK_N, BLOCK_P)
    nbp = (nn[:, None] * B + b) * P + p[None, :]
    npm = nm[:, None] & pm[None, :]
    if COMPUTE_SIM:
        acc = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
        ss = tl.zeros([BLOCK_P], dtype=tl.float32)
        qss = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + tl.arange(0, BLOCK_C)
            cm = cc < C
            fb = tl.load(
                f_ptr + b * sfb + cc[:, None] * sfc + p[None, :] * sfp,
                mask=cm[:, None] & pm[None, :],
                other=0.0,
            ).to(tl.float32)
            qb = tl.load(
                q_ptr + nn[:, None] * sqn + b * sqb + cc[None, :] * sqc,
                mask=nm[:, None] & cm[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.dot(qb, fb, input_precision="ieee")
            ss += tl.sum(fb * fb, axis=0)
            qss += tl.sum(qb * qb, axis=1)
        fn = tl.sqrt(ss)
        qn = tl.sqrt(qss)
        a = acc / (tl.maximum(qn, eps)[:, None] * tl.maximum(fn, eps)[None, :])
        first = split == 0
        tl.store(sim_ptr + nbp, a, mask=npm & first)
        if WRITE_A:
            tl.store(aout_ptr + nbp, a, mask=npm & first)
        tl.store(fnorm_ptr + b * P + p, fn, mask=pm & first)
        tl.store(qnorm_ptr + nn * B + b, qn, mask=nm & first & (pid_p == 0))
    else:
        a = tl.load(ain_ptr + nbp, mask=npm, other=0.0)
    if WRITE_OUT:
        c_lo, c_hi = _channel_split(split, C_PER_SPLIT, CG)
        for c0 in range(c_lo, c_hi, BLOCK_C):
            cc = c0 + tl.arange(0, BLOCK_C)
            m = (cc < c_hi)[:, None] & pm[None, :]
            gb = tl.load(g_ptr + b * sgb + cc[:, None] * sgc + p[None, :] * sgp, mask=m, other=0.0)
            gb = gb.to(tl.float32)
            for n in range(N):
                arow = tl.sum(tl.where(nn[:, None] == n, a, 0.0), axis=0)
                val = (arow[None, :] * gb).to(o_ptr.dtype.element_ty)
                tl.store(o_ptr + (n * B + b) * sob + cc[:, None] * soc + p[None, :] * sop, val, mask=m)


@triton.jit
def _bwd_a_kernel(
    do_ptr,
    sdb,
    sdc,
    sdp,
    g_ptr,
    sgb,
    sgc,
    sgp,
    a_ptr,
    da_ptr,
    dg_ptr,
    N,
    B,
    CG,
    P,
    C_PER_SPLIT,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    _, b, split, p, pm, nn, _ = _tile(N, P, BLOCK_N, BLOCK_P)
    dacc = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
    c_lo, c_hi = _channel_split(split, C_PER_SPLIT, CG)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        m = (cc < c_hi)[:, None] & pm[None, :]
        gb = tl.load(g_ptr + b * sgb + cc[:, None] * sgc + p[None, :] * sgp, mask=m, other=0.0).to(tl.float32)
        dg = tl.zeros([BLOCK_C, BLOCK_P], dtype=tl.float32)
        for n in range(N):
            arow = tl.load(a_ptr + (n * B + b) * P + p, mask=pm, other=0.0)
            d = tl.load(do_ptr + (n * B + b) * sdb + cc[:, None] * sdc + p[None, :] * sdp, mask=m, other=0.0)
            d = d.to(tl.float32)
            dg += arow[None, :] * d
            part = tl.sum(d * gb, axis=0)
            dacc += tl.where(nn[:, None] == n, part[None, :], 0.0)
        tl.store(dg_ptr + (b * CG + cc[:, None]) * P + p[None, :], dg, mask=m)
    nm = nn < N
    tl.store(da_ptr + ((split * N + nn[:, None]) * B + b) * P + p[None, :], dacc, mask=nm[:, None] & pm[None, :])


@triton.jit
def _bwd_f_kernel(
    f_ptr,
    sfb,
    sfc,
    sfp,
    fnorm_ptr,
    qh_ptr,
    ds_ptr,
    sim_ptr,
    add_ptr,
    df_ptr,
    sdb,
    sdc,
    sdp,
    dq_ptr,
    N,
    B,
    C,
    P,
    C_PER_SPLIT,
    eps,
    HAS_ADD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pid_p, b, split, p, pm, nn, nm = _tile(N, P, BLOCK_N, BLOCK_P)
    npm = nm[:, None] & pm[None, :]
    nbp = (nn[:, None] * B + b) * P + p[None, :]
    ds = tl.load(ds_ptr + nbp, mask=npm, other=0.0)
    s = tl.load(sim_ptr + nbp, mask=npm, other=0.0)
    fn = tl.load(fnorm_ptr + b * P + p, mask=pm, other=1.0)
    clamped = fn <= eps
    inv = 1.0 / tl.maximum(fn, eps)
    t = tl.where(clamped, 0.0, tl.sum(ds * s, axis=0))
    dsi = ds * inv[None, :]
    c_lo, c_hi = _channel_split(split, C_PER_SPLIT, C)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        cc = c0 + tl.arange(0, BLOCK_C)
        cm = cc < c_hi
        m = cm[:, None] & pm[None, :]
        fb = tl.load(f_ptr + b * sfb + cc[:, None] * sfc + p[None, :] * sfp, mask=m, other=0.0).to(tl.float32)
        qh = tl.load(qh_ptr + (nn[:, None] * B + b) * C + cc[None, :], mask=nm[:, None] & cm[None, :], other=0.0)
        dfh = tl.dot(tl.trans(qh), ds, input_precision="ieee")
        df = (dfh - fb * (inv * t)[None, :]) * inv[None, :]
        if HAS_ADD:
            df += tl.load(add_ptr + (b * C + cc[:, None]) * P + p[None, :], mask=m, other=0.0)
        tl.store(df_ptr + b * sdb + cc[:, None] * sdc + p[None, :] * sdp, df.to(df_ptr.dtype.element_ty), mask=m)
        dq = tl.dot(dsi, tl.trans(fb), input_precision="ieee")
        tl.store(dq_ptr + ((pid_p * N + nn[:, None]) * B + b) * C + cc[None, :], dq, mask=nm[:, None] & cm[None, :])


def _tiling(n: int, b: int, c: int, p: int, dev: torch.device) -> tuple[int, int, int, int]:
    block_p = 64 if p > 32 else (32 if p > 16 else 16)
    block_c = 32
    tiles = triton.cdiv(p, block_p)
    # ~16 programs per image whatever B is: fills the GPU on small maps, keeps results independent of B
    splits = max(1, min(triton.cdiv(16, tiles), triton.cdiv(c, block_c)))
    c_per = triton.cdiv(triton.cdiv(c, splits), block_c) * block_c
    splits = triton.cdiv(c, c_per)
    return block_p, block_c, tiles, splits, c_per


def _blocks(n: int, block_c: int, block_p: int) -> dict[str, int]:
    """The block sizes every kernel is launched with: query lanes (a power of two, at least 16 as tl.dot needs),
    channels, pixels."""
    return {"BLOCK_N": max(16, triton.next_power_of_2(n)), "BLOCK_C": block_c, "BLOCK_P": block_p}


class _TritonOps:
    """The KernelOps primitives in Triton (see scfs.search.kernel_fn)."""

    two_pass = True  # False: the one-launch form (every channel split recomputes the similarity); for tests

    def fwd(self, f3, q, g3, out3, sim, a_out, fnorm, qnorm, a_in, eps):
        n, b, c = q.shape
        p = f3.shape[2]
        cg = g3.shape[1]
        block_p, block_c, tiles, splits, c_per = _tiling(n, b, cg, p, f3.device)
        if out3 is None:
            splits, c_per = 1, cg
        if a_in is None and out3 is not None and splits > 1 and self.two_pass:
            # One launch per split would read the whole feature map once per split to recompute the similarity
            # (16x on layer4's 7x7 maps): compute it once, then weight from the stored map (bitwise the same:
            # the fp32 similarity goes through memory unchanged).
            self.fwd(f3, q, g3, None, sim, a_out, fnorm, qnorm, None, eps)
            self.fwd(f3, q, g3, out3, sim, None, fnorm, qnorm, sim, eps)
            return
        o = out3 if out3 is not None else f3
        _fwd_kernel[(tiles, b, splits)](
            f3,
            *f3.stride(),
            q,
            *q.stride(),
            g3,
            *g3.stride(),
            o,
            *o.stride(),
            sim,
            a_out if a_out is not None else sim,
            a_in if a_in is not None else sim,
            fnorm,
            qnorm,
            n,
            b,
            c,
            cg,
            p,
            c_per,
            eps,
            **_blocks(n, block_c, block_p),
            COMPUTE_SIM=a_in is None,
            WRITE_OUT=out3 is not None,
            WRITE_A=a_out is not None,
        )

    def bwd_a(self, dout3, g3, a):
        n, b, p = a.shape
        cg = g3.shape[1]
        block_p, block_c, tiles, splits, c_per = _tiling(n, b, cg, p, g3.device)
        da = alloc((splits, n, b, p), torch.float32, g3.device)
        dg = alloc((b, cg, p), torch.float32, g3.device)
        _bwd_a_kernel[(tiles, b, splits)](
            dout3,
            *dout3.stride(),
            g3,
            *g3.stride(),
            a,
            da,
            dg,
            n,
            b,
            cg,
            p,
            c_per,
            **_blocks(n, block_c, block_p),
        )
        return da.sum(0), dg

    def bwd_f(self, f3, fnorm, qhat, ds, sim, dg_add, df3, eps):
        n, b, c = qhat.shape
        p = f3.shape[2]
        block_p, block_c, tiles, splits, c_per = _tiling(n, b, c, p, f3.device)
        dq = alloc((tiles, n, b, c), torch.float32, f3.device)
        add = dg_add.contiguous() if dg_add is not None else fnorm
        _bwd_f_kernel[(tiles, b, splits)](
            f3,
            *f3.stride(),
            fnorm,
            qhat,
            ds,
            sim,
            add,
            df3,
            *df3.stride(),
            dq,
            n,
            b,
            c,
            p,
            c_per,
            eps,
            HAS_ADD=dg_add is not None,
            **_blocks(n, block_c, block_p),
        )
        return dq


OPS = _TritonOps()

"""CUDA backend: the fused kernels of csrc/, JIT-built on first use with torch.utils.cpp_extension.load.

The build is cached by torch (TORCH_EXTENSIONS_DIR); set TORCH_CUDA_ARCH_LIST to pick the targets. Everything
that can be decided once is decided once per process (sources present, extension built or the reason why not);
the per-call path is a dictionary-free attribute lookup plus the C++ binding, which allocates the soft-mode
outputs itself.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from scfs.search import kernel_fn
from scfs.search.kernel_fn import alloc

log = logging.getLogger("scfs.search")
CSRC = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = [CSRC / "search_binding.cpp", CSRC / "search_kernels.cu", CSRC / "search_kernels_bwd.cu"]
_ext: ModuleType | None = None
_error: str | None = None


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    missing = [str(s) for s in SOURCES if not s.exists()]
    if missing:
        raise FileNotFoundError(f"kernel sources not found: {missing}")
    print(
        f"[scfs.search] compiling the fused CUDA search kernels in {CSRC} (first use, cached afterwards)...",
        file=sys.stderr,
        flush=True,
    )
    flags = ["-O3", "-lineinfo"] if torch.version.hip is None else ["-O3"]
    return load(
        name="scfs_search_ext2",
        sources=[str(s) for s in SOURCES],
        extra_cuda_cflags=flags,
        extra_cflags=["-O3"],
        verbose=os.environ.get("SCFS_VERBOSE_BUILD") == "1",
    )


def extension() -> ModuleType:
    """The built extension (builds once per process; raises RuntimeError with the reason if it cannot)."""
    global _ext, _error
    if _ext is not None:
        return _ext
    if _error is not None:
        raise RuntimeError(_error)
    try:
        _ext = _build()
    except Exception as exc:  # noqa: BLE001 - any build failure makes the backend unavailable, with its reason
        _error = f"building the CUDA extension failed: {type(exc).__name__}: {str(exc)[-2000:]}"
        raise RuntimeError(_error) from exc
    return _ext


def unavailable_reason(feats: torch.Tensor) -> str | None:
    """None when the fused kernels can run on feats, else why not (no filesystem access once built)."""
    if feats.device.type != "cuda":
        return f"feats on {feats.device}, the CUDA kernels need a CUDA/ROCm device"
    if _ext is not None:
        return None
    try:
        extension()
    except RuntimeError as exc:
        return str(exc)
    return None


def _split(c: int, p: int, tile: int, chunk: int = 8) -> tuple[int, int, int]:
    """(pixel tiles, channel splits, channels per split) of the backward kernels: about 16 blocks per image
    whatever B is, so that small maps fill the GPU while every image's reduction order stays B-independent."""
    tiles = -(-p // tile)
    splits = max(1, min(-(-16 // tiles), -(-c // chunk)))
    c_per = -(-c // splits)
    c_per = -(-c_per // chunk) * chunk
    return tiles, -(-c // c_per), c_per


class _CudaOps:
    """The KernelOps primitives over the fused CUDA kernels (see scfs.search.kernel_fn)."""

    def __init__(self, ext: ModuleType) -> None:
        self.ext = ext
        self.tile = ext.pixel_tile()
        self._fwd_soft = ext.fwd_soft
        self._split_cache: dict[tuple[int, int, int], tuple[int, int, int]] = {}

    def splits(self, c: int, p: int, chunk: int) -> tuple[int, int, int]:
        key = (c, p, chunk)
        got = self._split_cache.get(key)
        if got is None:
            got = self._split_cache[key] = _split(c, p, self.tile, chunk)
        return got

    def fwd_soft(self, f3, q, g3, h, w, channels_last, eps):
        """Soft mode in one binding call: (out (N*B, CG, H, W), sim, a, fnorm, qnorm), allocated in C++."""
        return self._fwd_soft(f3, q, g3, h, w, channels_last, kernel_fn.POISON, eps)

    def fwd(self, f3, q, g3, out3, sim, a_out, fnorm, qnorm, a_in, eps):
        if q.dtype != f3.dtype:
            q = q.to(f3.dtype)
        self.ext.fwd(f3, q, g3, out3, sim, a_out, fnorm, qnorm, a_in, eps)

    def bwd_a(self, dout3, g3, a):
        n, b, p = a.shape
        cg = g3.shape[1]
        _, splits, c_per = self.splits(cg, p, 8)
        da = alloc((splits, n, b, p), torch.float32, g3.device)
        dg = alloc((b, cg, p), torch.float32, g3.device)
        if dout3.dtype != g3.dtype:
            dout3 = dout3.to(g3.dtype)
        self.ext.bwd_a(dout3, g3, a, da, dg, splits, c_per)
        return (da[0] if splits == 1 else da.sum(0)), dg

    def bwd_f(self, f3, fnorm, qhat, ds, sim, dg_add, df3, eps):
        n, b, c = qhat.shape
        p = f3.shape[2]
        tiles, splits, c_per = self.splits(c, p, 64)
        dq = alloc((tiles, n, b, c), torch.float32, f3.device)
        add = dg_add.contiguous() if dg_add is not None else None
        self.ext.bwd_f(f3, fnorm, qhat, ds, sim, add, df3, dq, eps, splits, c_per)
        return dq


_ops: _CudaOps | None = None


def ops() -> _CudaOps:
    global _ops
    if _ops is None:
        _ops = _CudaOps(extension())
    return _ops

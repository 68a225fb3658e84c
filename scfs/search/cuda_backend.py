"""CUDA backend: the fused kernels of csrc/, JIT-built on first use with torch.utils.cpp_extension.load.

The build is cached by torch (TORCH_EXTENSIONS_DIR); set TORCH_CUDA_ARCH_LIST to pick the targets. Everything
that can be decided once is decided once per process (sources present, extension built or the reason why not);
the per-call path is a dictionary-free attribute lookup plus the C++ binding, which allocates the soft-mode
outputs itself.

The block order of the forward weighting pass is a process-wide option (``set_weighting``, or the environment
variables ``SCFS_SEARCH_WEIGHTING=tiled|chunked``, ``SCFS_SEARCH_WEIGHT_CHUNK_KIB``, ``SCFS_SEARCH_WEIGHT_BLOCK_KIB``
read when the extension is first used); ``tiled`` is the default; both orders pass the GPU harness (H200, 2026-11-30).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from scfs.search import buffers
from scfs.search.buffers import alloc

log = logging.getLogger("scfs.search")
CSRC = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = [CSRC / "search_binding.cpp", CSRC / "search_kernels.cu", CSRC / "search_kernels_bwd.cu"]
HEADERS = [CSRC / "search_kernels.h", CSRC / "search_common.cuh", CSRC / "search_order.h"]
# the name torch builds and caches the extension under (its folder in TORCH_EXTENSIONS_DIR)
EXTENSION_NAME = "scfs_search_ext2"
_ext: ModuleType | None = None
_error: str | None = None

WEIGHTING_ORDERS = ("tiled", "chunked")
DEFAULT_CHUNK_KIB = 4096
DEFAULT_BLOCK_KIB = 8


def add_weighting_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The ``--weighting tiled|chunked|both`` option (default both) shared by the harness and the benchmark."""
    parser.add_argument("--weighting", choices=(*WEIGHTING_ORDERS, "both"), default="both", help=help)


def _env_kib(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return float(default)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of KiB, got {raw!r}") from None


# The weighting-pass option (see set_weighting); the environment decides it until set_weighting is called.
WEIGHTING: str = os.environ.get("SCFS_SEARCH_WEIGHTING", "").strip().lower() or "tiled"
WEIGHT_CHUNK_KIB: float = _env_kib("SCFS_SEARCH_WEIGHT_CHUNK_KIB", DEFAULT_CHUNK_KIB)
WEIGHT_BLOCK_KIB: float = _env_kib("SCFS_SEARCH_WEIGHT_BLOCK_KIB", DEFAULT_BLOCK_KIB)


def _validate(order: str, chunk_kib: float, block_kib: float) -> None:
    if order not in WEIGHTING_ORDERS:
        raise ValueError(
            f"search weighting order (SCFS_SEARCH_WEIGHTING / set_weighting) must be one of {WEIGHTING_ORDERS}, "
            f"got {order!r}"
        )
    if not (chunk_kib * 1024 >= 1 and block_kib * 1024 >= 1):
        raise ValueError(f"weighting chunk and block sizes must be >= 1 byte, got {chunk_kib} KiB, {block_kib} KiB")


def set_weighting(order: str | None = None, *, chunk_kib: float | None = None, block_kib: float | None = None) -> None:
    """Pick the block order of the CUDA forward weighting pass, process-wide (all modes; backward unaffected).

    The weighting pass writes N weighted copies of the (B, C, H, W) map, ``out[n*B+b, c, p] = a[n,b,p] *
    g[b,c,p]``, and carries most of the forward's bytes. Two orders compute exactly the same products, so their
    outputs are bitwise identical:

    * ``"tiled"`` (default): a block reads its tile of g once and writes it to all N outputs. On an H200
      (benchmarks/results/search-h200-2026-11-30-v2.md) this runs at ~2.2 TB/s, half the 4.6 TB/s of pure
      writes, because every block writes N output slices that lie 49 MiB apart at the same time; "8 separate
      copies" of the map run faster while moving 1.8x the bytes.
    * ``"chunked"``: the map is processed in chunks of about ``chunk_kib`` KiB of g; for each chunk the N outputs
      are written one n at a time, one n per block, on a 1-d grid ordered chunk -> n -> unit (about
      ``block_kib`` KiB of g per block), so blocks in flight together write one output slice contiguously and
      the chunk of g is re-read from L2 rather than DRAM. 16-byte vector loads/stores where aligned, as tiled.

    The chunked order exists to test that hypothesis. MEASURED on an H200
    (benchmarks/results/search-h200-2026-11-30-v3-weighting.md): the harness passes under both orders and their
    outputs are bitwise equal, but chunked is no general win (faster on fp32 without projection: layer2 0.265 ->
    0.236 ms, layer3 0.212 -> 0.149 ms; slower on every bf16 row and on layer4), so tiled stays the default and
    chunked stays an opt-in for study.

    Arguments left as None keep their current value. The environment gives the initial values:
    ``SCFS_SEARCH_WEIGHTING=tiled|chunked``, ``SCFS_SEARCH_WEIGHT_CHUNK_KIB`` (default 4096),
    ``SCFS_SEARCH_WEIGHT_BLOCK_KIB`` (default 8).
    """
    global WEIGHTING, WEIGHT_CHUNK_KIB, WEIGHT_BLOCK_KIB
    new = (
        WEIGHTING if order is None else order,
        WEIGHT_CHUNK_KIB if chunk_kib is None else float(chunk_kib),
        WEIGHT_BLOCK_KIB if block_kib is None else float(block_kib),
    )
    _validate(*new)
    WEIGHTING, WEIGHT_CHUNK_KIB, WEIGHT_BLOCK_KIB = new
    if _ext is not None:
        _apply(_ext)


def weighting() -> dict:
    """The weighting-pass option in force: order, chunk_kib, block_kib (as the extension has it once built)."""
    if _ext is not None:
        order, chunk, block = _ext.get_weighting()
        return dict(order=WEIGHTING_ORDERS[order], chunk_kib=chunk / 1024, block_kib=block / 1024)
    return dict(order=WEIGHTING, chunk_kib=WEIGHT_CHUNK_KIB, block_kib=WEIGHT_BLOCK_KIB)


def _apply(ext: ModuleType) -> None:
    _validate(WEIGHTING, WEIGHT_CHUNK_KIB, WEIGHT_BLOCK_KIB)
    ext.set_weighting(
        WEIGHTING_ORDERS.index(WEIGHTING),
        max(1, round(WEIGHT_CHUNK_KIB * 1024)),
        max(1, round(WEIGHT_BLOCK_KIB * 1024)),
    )


def cached_build() -> Path | None:
    """torch's build of these kernels when loading it needs no compile: the library is newer than every source
    and header, and its build file names this tree's sources (ninja rebuilds for a build made from another copy
    of the tree, about 30 s). None when a compile is due, or when torch keeps its builds where this cannot look."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory(EXTENSION_NAME, verbose=False))
        built = (folder / f"{EXTENSION_NAME}.so").stat().st_mtime
        ninja = (folder / "build.ninja").read_text()
    except (ImportError, OSError, RuntimeError):
        return None
    fresh = all(src.stat().st_mtime <= built for src in (*SOURCES, *HEADERS) if src.exists())
    return folder if fresh and all(str(src) in ninja for src in SOURCES) else None


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    missing = [str(s) for s in (*SOURCES, *HEADERS) if not s.exists()]
    if missing:
        raise FileNotFoundError(f"kernel sources not found: {missing}")
    if cached_build() is None:
        print(
            f"[scfs.search] compiling the fused CUDA search kernels in {CSRC} (about 30 s on 16 cores; once per "
            "machine and copy of the tree, cached afterwards)...",
            file=sys.stderr,
            flush=True,
        )
    flags = ["-O3", "-lineinfo"] if torch.version.hip is None else ["-O3"]
    return load(
        name=EXTENSION_NAME,
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
        ext = _build()
    except Exception as exc:  # noqa: BLE001 - any build failure makes the backend unavailable, with its reason
        _error = f"building the CUDA extension failed: {type(exc).__name__}: {str(exc)[-2000:]}"
        raise RuntimeError(_error) from exc
    _apply(ext)  # a bad SCFS_SEARCH_WEIGHTING raises ValueError here, before any kernel runs
    _ext = ext
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
        return self._fwd_soft(f3, q, g3, h, w, channels_last, buffers.POISON, eps)

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

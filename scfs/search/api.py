"""The search-op contract: argument checks, backend selection and the `SearchOutput` result."""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from scfs.names import SEARCH_BACKENDS, WEIGHTINGS
from scfs.search.centre import add_mean_term, centre_inputs
from scfs.search.custom_op import search_forward
from scfs.search.kernel_fn import kernel_search
from scfs.search.reference import reference_search

log = logging.getLogger("scfs.search")

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
REFERENCE_DTYPES = (*KERNEL_DTYPES, torch.float64)
MAX_QUERIES = 32
_warned: set[str] = set()
# (backend, device type, dtype) -> resolved backend, for inputs within the kernels' limits. Availability depends on
# the device type only (extension built once per process), so the choice is made once, not per call.
_resolved: dict[tuple[str, str, torch.dtype], str] = {}


class SearchOutput(NamedTuple):
    """features (N*B, C_out, H, W) n-major; similarity and weights (N, B, H, W) float32."""

    features: torch.Tensor
    similarity: torch.Tensor
    weights: torch.Tensor


def _check(
    feats: torch.Tensor,
    queries: torch.Tensor,
    mode: str,
    weight: torch.Tensor | None,
    topk: float,
    temperature: float,
    eps: float,
    backend: str,
    centre: bool = False,
) -> None:
    if not isinstance(centre, bool):
        raise ValueError(f"centre must be True or False, got {centre!r}")
    if not isinstance(feats, torch.Tensor) or feats.dim() != 4:
        shape = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
        raise ValueError(f"feats must be a (B, C, H, W) tensor, got {shape}")
    if not isinstance(queries, torch.Tensor) or queries.dim() != 3:
        shape = tuple(queries.shape) if isinstance(queries, torch.Tensor) else type(queries).__name__
        raise ValueError(f"queries must be a (N, B, C) tensor, got {shape}")
    b, c, h, w = feats.shape
    if min(b, c, h, w) < 1:
        raise ValueError(f"feats must have B, C, H, W >= 1, got shape {tuple(feats.shape)}")
    if queries.shape[0] < 1 or queries.shape[1:] != (b, c):
        raise ValueError(
            f"queries must be (N, B={b}, C={c}) with N >= 1 for feats {tuple(feats.shape)}, got {tuple(queries.shape)}"
        )
    if feats.dtype not in REFERENCE_DTYPES:
        raise ValueError(f"feats dtype {feats.dtype} not supported; allowed: {REFERENCE_DTYPES}")
    if not queries.is_floating_point():
        raise ValueError(f"queries must be floating point, got dtype {queries.dtype}")
    if queries.device != feats.device:
        raise ValueError(f"queries on {queries.device} but feats on {feats.device}: put both on one device")
    if mode not in WEIGHTINGS:
        raise ValueError(f"mode must be one of {WEIGHTINGS}, got {mode!r}")
    if backend not in SEARCH_BACKENDS:
        raise ValueError(f"backend must be one of {SEARCH_BACKENDS}, got {backend!r}")
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != c or weight.shape[0] < 1:
            shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"weight must be a (C_out, C={c}) tensor, got {shape}")
        if not weight.is_floating_point():
            raise ValueError(f"weight must be floating point, got dtype {weight.dtype}")
        if weight.device != feats.device:
            raise ValueError(f"weight on {weight.device} but feats on {feats.device}")
    if not (0.0 < topk <= 1.0):
        raise ValueError(f"topk must be in (0, 1], got {topk}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not eps > 0.0:
        raise ValueError(f"eps must be > 0, got {eps}")


def kernel_unavailable_reason(backend: str, feats: torch.Tensor, queries: torch.Tensor) -> str | None:
    """Why a kernel backend cannot run these inputs (None when it can)."""
    if feats.dtype not in KERNEL_DTYPES:
        return f"{backend} backend supports dtypes {KERNEL_DTYPES}, got {feats.dtype}"
    if queries.shape[0] > MAX_QUERIES:
        return f"{backend} backend supports N <= {MAX_QUERIES} queries, got N={queries.shape[0]}"
    if backend == "triton":
        from scfs.search import triton_backend

        return triton_backend.unavailable_reason(feats)
    from scfs.search import cuda_backend

    return cuda_backend.unavailable_reason(feats)


def _resolve(backend: str, feats: torch.Tensor, queries: torch.Tensor) -> str:
    if backend == "reference":
        return backend
    if backend != "auto":
        why = kernel_unavailable_reason(backend, feats, queries)
        if why is not None:
            raise RuntimeError(f"search backend {backend!r} unavailable: {why}")
        return backend
    if feats.device.type != "cuda":
        return "reference"
    reasons = []
    for cand in ("cuda", "triton"):
        why = kernel_unavailable_reason(cand, feats, queries)
        if why is None:
            if reasons:
                _log_once(f"backend='auto' falls back to {cand!r}: " + "; ".join(reasons))
            return cand
        reasons.append(why)
    _log_once("backend='auto' falls back to 'reference': " + "; ".join(reasons))
    return "reference"


def resolve_backend(backend: str, feats: torch.Tensor, queries: torch.Tensor) -> str:
    """The backend that runs these inputs, chosen once per (backend, device type, dtype) for inputs within the
    kernels' limits. Call it eagerly before `torch.compile` traces a search: the choice may build the CUDA
    extension, which must not be traced; the traced call then finds it made."""
    if queries.shape[0] > MAX_QUERIES:
        return _resolve(backend, feats, queries)
    key = (backend, feats.device.type, feats.dtype)
    chosen = _resolved.get(key)
    if chosen is None:
        chosen = _resolved[key] = _resolve(backend, feats, queries)
    return chosen


def _log_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning(msg)


def _needs_grad(feats: torch.Tensor, queries: torch.Tensor, weight: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and (feats.requires_grad or queries.requires_grad
                                        or (weight is not None and weight.requires_grad))


def feature_search(
    feats: torch.Tensor,
    queries: torch.Tensor,
    *,
    mode: str = "soft",
    weight: torch.Tensor | None = None,
    topk: float = 0.25,
    temperature: float = 0.1,
    eps: float = 1e-6,
    backend: str = "auto",
    centre: bool = False,
) -> SearchOutput:
    """Weight a teacher map by each query's cosine-similarity map (SCFS).

    feats (B,C,H,W), queries (N,B,C) -> features (N*B, C_out, H, W) n-major in feats' dtype and memory format,
    similarity and weights (N,B,H,W) float32 (float64 for float64 feats). `centre=True`: the similarity is taken
    after subtracting the image's mean feature over positions from the map and the queries (a Pearson
    correlation), the weights still multiply the uncentred map. See docs/ARCHITECTURE.md.
    """
    _check(feats, queries, mode, weight, topk, temperature, eps, backend, centre)
    args = (mode, weight, topk, temperature, eps)
    if torch.compiler.is_compiling() and backend == "auto" and _needs_grad(feats, queries, weight):
        # inside torch.compile only the no-grad kernel forward is an op of the graph (scfs.search.custom_op);
        # with gradients the reference is traced instead and inductor fuses it
        return SearchOutput(*reference_search(feats, queries, *args, centre=centre))
    # chosen on the inputs as given (what a training step resolves eagerly before tracing), centred or not
    chosen = resolve_backend(backend, feats, queries)
    if chosen == "reference":
        return SearchOutput(*reference_search(feats, queries, *args, centre=centre))
    if not centre:
        return SearchOutput(*_kernel(chosen, feats, queries, *args))
    centred, q_centred, mu = centre_inputs(feats, queries)
    out, sim, a = _kernel(chosen, centred, q_centred, *args)
    return SearchOutput(add_mean_term(out, a, mu, weight), sim, a)


def _kernel(chosen: str, feats: torch.Tensor, queries: torch.Tensor, mode: str, weight: torch.Tensor | None,
            topk: float, temperature: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A kernel backend's (features, similarity, weights): the registered op when traced without gradients."""
    if torch.compiler.is_compiling() and not _needs_grad(feats, queries, weight):
        # traced by torch.compile: the kernel is one opaque op of the graph (its no-grad forward is registered)
        return search_forward(feats, queries, weight, mode, topk, temperature, eps, chosen)
    return kernel_search(chosen, feats, queries, mode, weight, topk, temperature, eps)

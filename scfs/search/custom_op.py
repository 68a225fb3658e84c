"""The kernel search's forward as a registered torch custom op (`torch.ops.scfs.search_forward`).

Why: `torch.compile` cannot trace into the CUDA extension or the Triton launcher of a kernel backend, so a step
that calls them breaks into several graphs (each a CUDA-graph launch and a host round trip under
`compile_mode=reduce-overhead`). As a custom op with a fake (shape-only) implementation the kernel is one opaque
node of the compiled graph: the teacher's searched targets, the stage heads and the losses compile into one graph
around it. Only the no-grad forward is registered, which is what a training step uses (the teacher side); a
search that needs gradients under `torch.compile` traces the reference instead (`feature_search`).
"""

from __future__ import annotations

import torch

from scfs.search.kernel_fn import kernel_forward


def _out_format(feats: torch.Tensor) -> torch.memory_format:
    """The kernels write `features` in feats' memory format (channels_last stays channels_last)."""
    if not feats.is_contiguous() and feats.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


@torch.library.custom_op("scfs::search_forward", mutates_args=())
def search_forward(feats: torch.Tensor, queries: torch.Tensor, weight: torch.Tensor | None, mode: str, topk: float,
                   temperature: float, eps: float, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features (N*B, C_out, H, W), similarity (N, B, H, W), weights (N, B, H, W)) of a kernel backend."""
    feats_used, _, out, sim, a, _, _, _ = kernel_forward(feats, queries, weight, mode, topk, temperature, eps, backend)
    shape = (queries.shape[0], feats_used.shape[0], feats_used.shape[2], feats_used.shape[3])
    # outputs of a custom op must not share storage with each other or the inputs; the CUDA binding carves sim, a
    # and the norms out of one fp32 allocation, so a gets its own (N*B*P floats: small next to the features)
    sim, a = sim.view(shape), a.view(shape)
    if a.untyped_storage().data_ptr() == sim.untyped_storage().data_ptr():
        a = a.clone()
    return out, sim, a


@search_forward.register_fake
def _(feats: torch.Tensor, queries: torch.Tensor, weight: torch.Tensor | None, mode: str, topk: float,
      temperature: float, eps: float, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, b = queries.shape[:2]
    _, c, h, w = feats.shape
    c_out = c if weight is None else weight.shape[0]
    out = feats.new_empty((n * b, c_out, h, w)).contiguous(memory_format=_out_format(feats))
    sim = feats.new_empty((n, b, h, w), dtype=torch.float32)
    return out, sim, feats.new_empty((n, b, h, w), dtype=torch.float32)

"""The kernel forward as a registered custom op: torch's op checks, the reference's values, one graph when traced.

Runs the Triton backend under TRITON_INTERPRET=1 on CPU-only machines (the CUDA backend needs a GPU; the GPU smoke
and `python -m scfs.search.check` cover it there). Fresh random inputs each run.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo

from scfs.search import feature_search
from scfs.search.api import resolve_backend
from scfs.search.custom_op import search_forward
from scfs.search.reference import reference_search

interp = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton interpreter tests run on CPU-only machines (TRITON_INTERPRET=1)",
)
TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


def _inputs(dtype: torch.dtype, channels_last: bool, projected: bool):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    feats = torch.randn(2, 8, 5, 6, generator=gen).to(dtype)
    if channels_last:
        feats = feats.contiguous(memory_format=torch.channels_last)
    queries = torch.randn(3, 2, 8, generator=gen).to(dtype)
    weight = torch.randn(4, 8, generator=gen).to(dtype) if projected else None
    return feats, queries, weight


@interp
@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("projected", [False, True])
def test_op_passes_torch_opcheck_and_matches_the_reference(mode, channels_last, projected):
    """`torch.library.opcheck`: the fake implementation's shapes, strides and dtypes are the kernel's (inductor
    asserts them at run time), no aliasing between outputs; and the values are the reference's."""
    feats, queries, weight = _inputs(torch.float32, channels_last, projected)
    args = (feats, queries, weight, mode, 0.25, 0.1, 1e-6, "triton")
    torch.library.opcheck(search_forward, args)
    got = search_forward(*args)
    want = reference_search(feats, queries, mode, weight, 0.25, 0.1, 1e-6)
    assert got[0].is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    for name, g, w in zip(("features", "similarity", "weights"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=name)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_traced_no_grad_search_is_one_graph_with_the_eager_values(dtype):
    """Under torch.compile a no-grad kernel search (what a step's teacher side runs) is one node of the graph: no
    graph break, and the compiled function returns the eager values."""
    feats, queries, weight = _inputs(dtype, True, True)
    resolve_backend("triton", feats, queries)

    def fn(f: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = feature_search(f, q, weight=w, backend="triton")
        return out.features.float().mean((2, 3)) + out.weights.sum((2, 3)).flatten()[:, None]

    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(fn)(feats, queries, weight)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        got = torch.compile(fn, backend="aot_eager", dynamic=False)(feats, queries, weight)
        want = fn(feats, queries, weight)
    torch._dynamo.reset()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def test_traced_search_with_gradients_traces_the_reference():
    """A search that needs gradients inside torch.compile (`backend=auto`) is traced through the reference (the
    custom op has no backward): one graph, and the eager reference's values and gradients."""
    feats, queries, weight = _inputs(torch.float32, False, False)
    feats.requires_grad_(True)

    def fn(f: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return feature_search(f, q, mode="soft").features.square().mean()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(feats, queries)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    got = torch.compile(fn, backend="aot_eager", dynamic=False)(feats, queries)
    (g_got,) = torch.autograd.grad(got, feats)
    want = reference_search(feats, queries, "soft", None, 0.25, 0.1, 1e-6)[0].square().mean()
    (g_want,) = torch.autograd.grad(want, feats)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-6)


def test_outputs_carved_from_one_allocation_do_not_alias(monkeypatch):
    """The CUDA binding returns sim and a as views of one fp32 buffer; the op must still hand back outputs that share
    no storage (torch checks this at run time and raised inside the compiled step before)."""
    import scfs.search.custom_op as custom_op

    def one_buffer_forward(feats, queries, weight, mode, topk, temperature, eps, backend):
        out, sim, a = reference_search(feats, queries, mode, weight, topk, temperature, eps)
        n, b, h, w = sim.shape
        stats = torch.cat([sim.flatten(), a.flatten()])
        flat_sim, flat_a = stats[: sim.numel()].view(n, b, h * w), stats[sim.numel():].view(n, b, h * w)
        return feats, None, out, flat_sim, flat_a, None, None, None

    monkeypatch.setattr(custom_op, "kernel_forward", one_buffer_forward)
    feats, queries, weight = _inputs(torch.float32, False, True)
    got = search_forward(feats, queries, weight, "soft", 0.25, 0.1, 1e-6, "cuda")
    storages = {t.untyped_storage().data_ptr() for t in got}
    assert len(storages) == 3
    want = reference_search(feats, queries, "soft", weight, 0.25, 0.1, 1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)

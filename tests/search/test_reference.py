"""Spine tests of the reference backend: published semantics, ordering, modes, gradients, errors."""

from __future__ import annotations

import pytest
import torch

from scfs.search import SearchOutput, feature_search
from scfs.search.reference import published_loop


def _inputs(gen, n=3, b=2, c=5, h=4, w=3, dtype=torch.float64):
    feats = torch.randn(b, c, h, w, generator=gen, dtype=torch.float64).to(dtype)
    queries = torch.randn(n, b, c, generator=gen, dtype=torch.float64).to(dtype)
    return feats, queries


@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
@pytest.mark.parametrize("proj", [False, True])
def test_reference_matches_loop(gen, loop_search, mode, proj):
    feats, queries = _inputs(gen)
    weight = torch.randn(4, 5, generator=gen, dtype=torch.float64) if proj else None
    out = feature_search(feats, queries, mode=mode, weight=weight, topk=0.3, temperature=0.5, backend="reference")
    assert isinstance(out, SearchOutput)
    ref = loop_search(feats, queries, mode=mode, weight=weight, topk=0.3, temperature=0.5)
    for got, want in zip(out, ref):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_ordering_is_n_major(gen):
    feats, queries = _inputs(gen, n=2, b=3)
    out = feature_search(feats, queries, backend="reference").features
    # crop n of image b lives at n*B + b: scaling query (1, 2) must change only that slice
    q2 = queries.clone()
    q2[1, 2] = -q2[1, 2]
    out2 = feature_search(feats, q2, backend="reference").features
    changed = [(i, not torch.equal(out[i], out2[i])) for i in range(6)]
    assert [i for i, c in changed if c] == [1 * 3 + 2]


def test_reference_matches_published_loop(gen):
    feats, queries = _inputs(gen, n=4, b=3, c=8, h=5, w=5, dtype=torch.float32)
    got = feature_search(feats, queries, backend="reference").features
    torch.testing.assert_close(got, published_loop(feats, queries), rtol=1e-5, atol=1e-6)


def test_hard_keeps_ceil_topk(gen):
    feats, queries = _inputs(gen, n=2, b=2, h=5, w=5)
    out = feature_search(feats, queries, mode="hard", topk=0.1, backend="reference")
    kept = (out.weights != 0).flatten(2).sum(-1)
    assert torch.all(kept == 3)  # ceil(0.1 * 25)


@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
@pytest.mark.parametrize("proj", [False, True])
def test_reference_gradcheck(gen, mode, proj):
    feats, queries = _inputs(gen, n=2, b=2, c=3, h=3, w=2)
    feats.requires_grad_(True)
    queries.requires_grad_(True)
    weight = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True) if proj else None

    def fn(f, q, *wt):
        o = feature_search(
            f, q, mode=mode, weight=wt[0] if wt else None, topk=0.5, temperature=0.7, backend="reference"
        )
        return o.features, o.similarity, o.weights

    args = (feats, queries, weight) if proj else (feats, queries)
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtype_and_memory_format(gen, loop_search, fmt, dtype):
    feats, queries = _inputs(gen, n=2, b=2, c=6, h=3, w=4, dtype=dtype)
    feats = feats.contiguous(memory_format=fmt)
    out = feature_search(feats, queries, backend="reference")
    assert out.features.dtype == dtype
    assert out.similarity.dtype == torch.float32 and out.weights.dtype == torch.float32
    assert out.features.is_contiguous(memory_format=fmt)
    ref = loop_search(feats, queries)[0]
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.features.double(), ref, rtol=tol, atol=tol)


def test_zero_norm_finite_and_nan_propagates(gen):
    feats, queries = _inputs(gen, dtype=torch.float32)
    feats[0, :, 1, 1] = 0
    queries[1, 0] = 0
    feats.requires_grad_(True)
    queries.requires_grad_(True)
    out = feature_search(feats, queries, backend="reference")
    assert all(torch.isfinite(t).all() for t in out)
    (out.features.sum() + out.similarity.sum()).backward()
    assert torch.isfinite(feats.grad).all() and torch.isfinite(queries.grad).all()
    f2 = feats.detach().clone()
    f2[1, 2, 0, 0] = float("nan")
    out2 = feature_search(f2, queries.detach(), backend="reference")
    assert torch.isnan(out2.features[1::2, :, 0, 0]).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="top"), "mode must be one of"),
        (dict(backend="gpu"), "backend must be one of"),
        (dict(topk=0.0), "topk must be in"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(weight=torch.zeros(3, 4)), "weight must be a"),
    ],
)
def test_errors(gen, kwargs, match):
    feats, queries = _inputs(gen)
    with pytest.raises(ValueError, match=match):
        feature_search(feats, queries, **kwargs)


def test_shape_and_dtype_errors(gen):
    feats, queries = _inputs(gen)
    with pytest.raises(ValueError, match="queries must be"):
        feature_search(feats, queries[:, :1])
    with pytest.raises(ValueError, match="feats must be a"):
        feature_search(feats[0], queries)
    with pytest.raises(ValueError, match="feats dtype"):
        feature_search(feats.to(torch.int32), queries)


def test_explicit_kernel_backend_on_cpu_errors(gen):
    feats, queries = _inputs(gen, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="'cuda' unavailable"):
        feature_search(feats, queries, backend="cuda")


def test_batch_invariance(gen):
    feats, queries = _inputs(gen, n=2, b=4, dtype=torch.float32)
    full = feature_search(feats, queries, backend="reference").features.view(2, 4, *feats.shape[1:])
    one = feature_search(feats[2:3], queries[:, 2:3], backend="reference").features
    torch.testing.assert_close(full[:, 2], one, rtol=0, atol=1e-6)


def _einsum_search(feats, queries, weight, centre, eps=1e-6):
    """The soft search as its formula, in einsum: a check written independently of the reference's matmul layouts."""
    from scfs.search.reference import safe_normalize

    f, q = feats.double(), queries.double()
    if centre:
        mu = f.mean(dim=(2, 3))
        fn, qn = safe_normalize(f - mu[:, :, None, None], 1, eps), safe_normalize(q - mu.unsqueeze(0), -1, eps)
    else:
        fn, qn = safe_normalize(f, 1, eps), safe_normalize(q, -1, eps)
    sim = torch.einsum("nbc,bchw->nbhw", qn, fn)
    g = f if weight is None else torch.einsum("oc,bchw->bohw", weight.double(), f)
    n, b = q.shape[:2]
    return (sim.unsqueeze(2) * g.unsqueeze(0)).reshape(n * b, g.shape[1], *f.shape[-2:]), sim


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("proj", [False, True])
@pytest.mark.parametrize("centre", [False, True])
def test_matmul_reference_equals_einsum_formula_values_and_gradients(gen, fmt, proj, centre):
    """The batched-matmul reference (both memory formats) against the einsum formula: values, layout and the
    gradients of the map, the queries and the projection."""
    from scfs.search.reference import reference_search

    feats, queries = _inputs(gen, n=3, b=2, c=6, h=4, w=5)
    feats = feats.contiguous(memory_format=fmt).requires_grad_()
    queries.requires_grad_()
    weight = torch.randn(7, 6, generator=gen, dtype=torch.float64, requires_grad=True) if proj else None
    out, sim, a = reference_search(feats, queries, "soft", weight, 0.25, 0.1, 1e-6, centre=centre)
    want, want_sim = _einsum_search(feats, queries, weight, centre)
    assert out.is_contiguous(memory_format=fmt) and sim.is_contiguous()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sim, want_sim, rtol=1e-12, atol=1e-12)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    leaves = [t for t in (feats, queries, weight) if t is not None]
    got = torch.autograd.grad((out * g).sum() + sim.square().sum(), leaves)
    exp = torch.autograd.grad((want * g).sum() + want_sim.square().sum(), leaves)
    for x, y in zip(got, exp, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)

"""The centred search (`feature_search(centre=True)`): a plain formula for values and gradients, the kernels
against the reference on fresh random inputs, known answers, the compiled step's dispatch, the argument check."""

from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo

from scfs.search import api as search_api
from scfs.search import check, feature_search
from scfs.search.reference import reference_search

interp = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton interpreter tests run on CPU-only machines (TRITON_INTERPRET=1)",
)
# value tolerances of the reference in a low-precision dtype against float64 (relative to the output's norm)
DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def pearson_search(feats: torch.Tensor, queries: torch.Tensor, weight: torch.Tensor | None = None,
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The soft centred search written out per (n, b, position) with Python loops: the Pearson correlation over
    channels of the query and each feature vector, both minus the image's mean feature; the searched feature is
    that correlation times the uncentred (projected) feature vector."""
    n_q, b_n = queries.shape[:2]
    _, c, h, w = feats.shape
    g = feats if weight is None else torch.einsum("oc,bchw->bohw", weight, feats)
    sims, outs = [], []
    for n in range(n_q):
        for b in range(b_n):
            mu = feats[b].reshape(c, -1).mean(dim=1)
            qc = queries[n, b] - mu
            qc = qc / qc.norm().clamp_min(eps)
            sim = torch.stack([torch.stack([
                torch.dot(qc, (feats[b, :, y, x] - mu) / (feats[b, :, y, x] - mu).norm().clamp_min(eps))
                for x in range(w)]) for y in range(h)])
            sims.append(sim)
            outs.append(sim.unsqueeze(0) * g[b])
    return torch.stack(outs), torch.stack(sims).view(n_q, b_n, h, w)


def _inputs(gen: torch.Generator, n=3, b=2, c=6, h=3, w=4, proj=0, dtype=torch.float64):
    """Post-ReLU-like maps: a large positive mean direction shared by every position, small variations."""
    feats = (torch.randn(b, c, h, w, generator=gen, dtype=torch.float64).relu() + 3.0).to(dtype)
    queries = (torch.randn(n, b, c, generator=gen, dtype=torch.float64).relu() + 3.0).to(dtype)
    weight = (torch.randn(proj, c, generator=gen, dtype=torch.float64) / c**0.5).to(dtype) if proj else None
    return feats, queries, weight


@pytest.mark.parametrize("proj", [0, 5])
def test_reference_is_the_pearson_formula_values_and_gradients(gen, proj):
    feats, queries, weight = _inputs(gen, proj=proj)
    out, sim, a = reference_search(feats, queries, "soft", weight, 0.25, 0.1, 1e-6, centre=True)
    want_out, want_sim = pearson_search(feats, queries, weight)
    torch.testing.assert_close(sim, want_sim, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a, want_sim, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    ins = [t.clone().requires_grad_(True) for t in (feats, queries) + ((weight,) if proj else ())]
    probes = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (out, sim)]

    def loss(fn):
        got = fn(*ins)
        return sum((o * p).sum() for o, p in zip(got, probes))

    got = torch.autograd.grad(loss(lambda f, q, *wt: reference_search(f, q, "soft", wt[0] if wt else None, 0.25, 0.1,
                                                                         1e-6, centre=True)[:2]), ins)
    want = torch.autograd.grad(loss(lambda f, q, *wt: pearson_search(f, q, wt[0] if wt else None)), ins)
    for g_got, g_want in zip(got, want):
        torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda f, q, *wt: reference_search(f, q, "soft", wt[0] if wt else None, 0.25, 0.1, 1e-6, centre=True)[0],
        tuple(ins))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
def test_reference_in_each_dtype_is_close_to_float64(gen, dtype, mode):
    feats, queries, weight = _inputs(gen, proj=4)
    f, q, w = (t.to(dtype) for t in (feats, queries, weight))
    got = reference_search(f, q, mode, w, 0.3, 0.5, 1e-6, centre=True)
    mask = (got[2] != 0) if mode == "hard" else None  # scored on the positions it kept
    want = reference_search(f.double(), q.double(), mode, w.double(), 0.3, 0.5, 1e-6, mask, centre=True)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    for g, wt in zip(got, want):
        assert ((g.double() - wt).norm() / wt.norm()).item() <= DTYPE_TOL[dtype]


def test_hard_and_softmax_weight_the_centred_similarity(gen):
    feats, queries, _ = _inputs(gen)
    _, sim, _ = reference_search(feats, queries, "soft", None, 0.25, 0.1, 1e-6, centre=True)
    for mode in ("hard", "softmax"):
        out = feature_search(feats, queries, mode=mode, topk=0.25, temperature=0.1, centre=True)
        torch.testing.assert_close(out.similarity, sim)
        if mode == "hard":
            k = 3  # ceil(0.25 * 12)
            kept = sim.flatten(2).topk(k, dim=-1).indices
            want = torch.zeros_like(sim.flatten(2)).scatter_(-1, kept, sim.flatten(2).gather(-1, kept)).view_as(sim)
        else:
            want = 12 * torch.softmax(sim.flatten(2) / 0.1, dim=-1).view_as(sim)
        torch.testing.assert_close(out.weights, want)
        # the searched feature weights the uncentred map
        torch.testing.assert_close(out.features, (out.weights.unsqueeze(2) * feats.unsqueeze(0)).flatten(0, 1))


def test_known_answer_positions_around_a_common_mean():
    """A map whose positions differ only by small deviations around one large mean feature: the raw cosine of a
    query is flat (every position ~1), the centred one is 1 exactly at the positions that deviate like the query."""
    c, h, w = 4, 2, 4
    mu = torch.full((c,), 10.0, dtype=torch.float64)
    e = torch.eye(c, dtype=torch.float64)
    deviations = [e[0], e[1], e[2], e[3], e[0], -e[0], e[1], -e[1]]  # positions 0 and 4 deviate along +e0
    feats = torch.stack([mu + 0.1 * d for d in deviations], dim=1).view(1, c, h, w)
    queries = (mu + 0.1 * e[0]).view(1, 1, c)  # a crop of the +e0 part
    raw = feature_search(feats, queries).similarity.flatten()
    centred = feature_search(feats, queries, centre=True).similarity.flatten()
    assert raw.max() - raw.min() < 1e-3 and raw.min() > 0.999  # flat: the mean direction dominates
    assert set(centred.topk(2).indices.tolist()) == {0, 4}
    torch.testing.assert_close(centred[[0, 4]], torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-6)
    assert centred[5] < -0.9 and (centred.max() - centred.min()) > 1.5


def test_known_answer_tiny_net_finds_the_query_region():
    """A tiny post-ReLU 'net' (a 1x1 conv + ReLU with a large positive bias): the left and right halves of an image
    differ in colour; a query pooled from a left crop gives a flat raw map and a centred one that is highest on
    the left half."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU()).double()
    with torch.no_grad():
        net[0].bias.fill_(5.0)
        net[0].weight.normal_(0, 0.3)
    img = torch.zeros(1, 3, 4, 6, dtype=torch.float64)
    img[:, 0, :, :3], img[:, 2, :, 3:] = 1.0, 1.0  # red left half, blue right half
    with torch.no_grad():
        feats = net(img)
        queries = net(img[..., 1:3, :2]).mean(dim=(2, 3)).view(1, 1, -1)
        raw = feature_search(feats, queries).similarity[0, 0]
        centred = feature_search(feats, queries, centre=True).similarity[0, 0]
    assert raw.max() - raw.min() < 0.05
    assert bool((centred[:, :3].min() > centred[:, 3:].max()).item())
    assert centred[:, :3].min() > 0.9 and centred[:, 3:].max() < -0.9


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["soft", "hard", "softmax"])
def test_triton_matches_the_reference_values_and_gradients(gen, dtype, mode):
    """The harness's check of one fresh random case: values, gradients (float64 reference), rerun bitwise, batch
    invariance, output dtype and memory format."""
    case = check.Case(3, 2, 24, 4, 5, dtype=dtype, mode=mode, proj=6 if mode == "hard" else 0,
                      channels_last=mode == "softmax", centre=True)
    assert check.check_case("triton", case, torch.device("cpu"), gen) == []


@interp
def test_centred_hard_selection_is_judged_on_the_map_the_kernel_ranks():
    """bfloat16 centring rounds the map about 1e-3 away from the float64 reference; with this seed the k-th and
    (k+1)-th similarities of one map sit 3e-4 apart, which a ranking on the reference would flag although the kernel
    ranks its own input right. The check passes on it, and still fails a selection that drops a clearly higher
    position."""
    case = check.Case(3, 2, 24, 4, 5, dtype=torch.bfloat16, mode="hard", proj=6, centre=True)
    assert check.check_case("triton", case, torch.device("cpu"), torch.Generator().manual_seed(1363008217)) == []
    feats, queries, weight = check.make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(1363008217))
    out = feature_search(feats, queries, mode="hard", weight=weight, topk=check.TOPK,
                         temperature=check.TEMPERATURE, backend="triton", centre=True)
    sim = check.rounded_centred_similarity(feats, queries)
    kept = out.weights != 0
    assert check.hard_selection_problems(sim, kept, check.TOPK) == []
    flat, bad = sim.reshape(-1, 20), kept.reshape(-1, 20).clone()
    best, worst = int(flat[0].argmax()), int(flat[0].argmin())
    bad[0, best], bad[0, worst] = False, True
    assert check.hard_selection_problems(sim, bad.reshape(kept.shape), check.TOPK) != []


@interp
def test_compiled_centred_search_dispatches_to_the_backend_chosen_before_tracing(monkeypatch, gen):
    """A training step resolves the backend on its real (uncentred) maps eagerly; the traced centred search must
    find that choice, not resolve a new key (e.g. of the float32 centred map of bfloat16 features) while tracing."""
    feats, queries, weight = (t.to(torch.bfloat16) for t in _inputs(gen, n=2, b=2, c=8, h=3, w=4, proj=4))
    monkeypatch.setattr(search_api, "_resolved", {})
    assert search_api.resolve_backend("triton", feats, queries) == "triton"  # what SCFS.prepare_loss does
    resolved_while_tracing = []
    real = search_api._resolve

    def resolve(backend, f, q):
        if torch.compiler.is_compiling():
            resolved_while_tracing.append((backend, f.dtype))
        return real(backend, f, q)

    monkeypatch.setattr(search_api, "_resolve", resolve)

    def fn(f: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = feature_search(f, q, weight=w, backend="triton", centre=True)
        return out.features.float().mean((2, 3)) + out.weights.sum((2, 3)).flatten()[:, None]

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(fn)(feats, queries, weight)
            got = torch.compile(fn, backend="aot_eager", dynamic=False)(feats, queries, weight)
            want = fn(feats, queries, weight)
    finally:
        torch._dynamo.reset()
    assert resolved_while_tracing == []
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    ref = reference_search(feats, queries, "soft", weight, 0.25, 0.1, 1e-6, centre=True)
    torch.testing.assert_close(got, ref[0].float().mean((2, 3)) + ref[2].sum((2, 3)).flatten()[:, None],
                               rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_centre_must_be_a_bool(bad):
    feats, queries = torch.randn(1, 4, 2, 2), torch.randn(1, 1, 4)
    with pytest.raises(ValueError, match="centre must be True or False") as err:
        feature_search(feats, queries, centre=bad)
    assert "\n" not in str(err.value)

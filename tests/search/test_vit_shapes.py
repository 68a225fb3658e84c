"""The search on ViT token maps (C = 192 / 384 / 768, patch grids 7x7 to 14x14): the reference in float32 and the
Triton kernel under the interpreter against the float64 reference, forward and every gradient (the CUDA backend
runs the GPU set of the same shapes in `python -m scfs.search.check --shapes vit`)."""

from __future__ import annotations

import os

import pytest
import torch

from scfs.search import check

interp = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton interpreter tests run on CPU-only machines (TRITON_INTERPRET=1)",
)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def test_the_vit_set_covers_the_token_widths_and_grids():
    for device in ("cpu", "cuda"):
        cases = check.vit_cases(device)
        assert {c.c for c in cases} == {192, 384, 768}
        assert min(c.h for c in cases) == 7 and max(c.h for c in cases) == 14
    assert {c.mode for c in check.vit_cases("cuda")} == {"soft", "hard", "softmax"}
    assert check.vit_cases("cpu") != check.cpu_cases()  # a set of its own, beside the CNN one


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=interp)])
def test_a_vits_own_token_maps_are_searched_as_they_come(backend):
    """The maps of a ViT-Ti-wide block (width 192, 8x8 grid) straight from `ViTBackbone` (no copy, no layout
    change) and its mean tokens as queries: every backend gives the float64 reference, gradients included."""
    from scfs.models.backbone import build_backbone
    from scfs.search import feature_search
    from scfs.search.reference import reference_search

    torch.manual_seed(0)
    vit = build_backbone({"arch": "vit", "name": "vit_tiny_patch16_224", "patch_size": 8, "img_size": 64,
                          "depth": 2}).eval()
    with torch.no_grad():
        feats = vit(torch.randn(2, 3, 64, 64))["last"]
        queries = vit(torch.randn(3 * 2, 3, 32, 32))["last"].mean(dim=(2, 3)).view(3, 2, -1)
    assert feats.shape == (2, 192, 8, 8)
    weight = torch.randn(24, 192) / 192**0.5
    ins = [t.clone().requires_grad_(True) for t in (feats, queries, weight)]
    out = feature_search(*ins[:2], mode="soft", weight=ins[2], backend=backend)
    ref_in = [t.detach().double().requires_grad_(True) for t in (feats, queries, weight)]
    ref = reference_search(ref_in[0], ref_in[1], "soft", ref_in[2], 0.25, 0.1, 1e-6)
    probe = [torch.randn(o.shape, dtype=torch.float64) for o in ref]
    got_g = torch.autograd.grad(sum((o.double() * g).sum() for o, g in zip(out, probe)), ins)
    ref_g = torch.autograd.grad(sum((o * g).sum() for o, g in zip(ref, probe)), ref_in)
    for got, want in [*zip(out, ref), *zip(got_g, ref_g)]:
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


@interp
@pytest.mark.parametrize("case", check.vit_cases("cpu"), ids=str)
def test_triton_interpreter_matches_float64_on_token_maps(case):
    assert check.check_case("triton", case, torch.device("cpu"), _gen()) == []

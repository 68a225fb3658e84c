"""GPU correctness of the kernel backends (pytest -m gpu): the check harness on a reduced sweep."""

from __future__ import annotations

import os

import pytest
import torch

from scfs.search import check, feature_search

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CASES = [c for c in check.gpu_cases() if c.b * c.c * c.h * c.w <= 4 * 512 * 28 * 28][::2]


@pytest.fixture
def cuda_gen() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_backend_matches_float64_reference(backend, case, cuda_gen):
    assert check.check_case(backend, case, torch.device("cuda"), cuda_gen) == []


@pytest.mark.parametrize("case", CASES, ids=str)
def test_chunked_weighting_is_bitwise_tiled(case, cuda_gen):
    """The chunked weighting order (off by default) gives the tiled order's outputs bit for bit."""
    assert check.check_weighting_orders(case, torch.device("cuda"), cuda_gen) == []


@pytest.mark.parametrize("case", CASES[::3], ids=str)
def test_chunked_weighting_matches_float64_reference(case, cuda_gen):
    with check.weighting("chunked", 40.0, 4.0):
        assert check.check_case("cuda", case, torch.device("cuda"), cuda_gen) == []


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_zero_norm_and_nan(backend, cuda_gen):
    assert check.check_special(backend, torch.device("cuda"), cuda_gen) == []


def test_auto_picks_cuda_kernel():
    feats = torch.randn(2, 32, 5, 5, device="cuda")
    queries = torch.randn(3, 2, 32, device="cuda")
    out = feature_search(feats, queries)
    ref = feature_search(feats, queries, backend="cuda")
    assert torch.equal(out.features, ref.features)

"""The harness's hard-mode rule: a kernel may break near-ties of the top-k either way, nothing else."""

from __future__ import annotations

import torch

from scfs.search.check import TIE_BAND, hard_selection_problems
from scfs.search.reference import hard_mask, reference_search, topk_count


def _sim_with_tie(gap: float) -> torch.Tensor:
    """One 4x4 map whose k-th and (k+1)-th largest values (k = ceil(0.25 * 16) = 4) are `gap` apart."""
    values = torch.tensor([0.9, 0.8, 0.7, 0.5, 0.5 - gap, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7],
                          dtype=torch.float64)
    return values.view(1, 1, 4, 4)


def _swap(mask: torch.Tensor, keep: int, drop: int) -> torch.Tensor:
    flat = mask.clone().view(-1)
    flat[keep], flat[drop] = True, False
    return flat.view_as(mask)


def test_exact_top_k_passes() -> None:
    sim = _sim_with_tie(0.2)
    assert hard_selection_problems(sim, hard_mask(sim, 0.25), 0.25) == []


def test_near_tie_taken_the_other_way_passes() -> None:
    sim = _sim_with_tie(TIE_BAND / 10)
    assert hard_selection_problems(sim, _swap(hard_mask(sim, 0.25), keep=4, drop=3), 0.25) == []


def test_clear_position_dropped_fails() -> None:
    sim = _sim_with_tie(0.2)
    assert hard_selection_problems(sim, _swap(hard_mask(sim, 0.25), keep=4, drop=3), 0.25) != []
    assert hard_selection_problems(sim, _swap(hard_mask(sim, 0.25), keep=15, drop=0), 0.25) != []


def test_wrong_count_fails() -> None:
    sim = _sim_with_tie(0.2)
    mask = hard_mask(sim, 0.25).clone()
    mask.view(-1)[10] = True
    assert any("positions per map" in f for f in hard_selection_problems(sim, mask, 0.25))
    assert topk_count(0.25, 16) == 4


def test_reference_takes_the_kernels_mask() -> None:
    """Given a mask, the reference weights are the similarity on exactly those positions."""
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 8, 3, 3, generator=gen, dtype=torch.float64)
    queries = torch.randn(3, 2, 8, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 2, 3, 3, generator=gen) < 0.5
    _, sim, a = reference_search(feats, queries, "hard", None, 0.3, 0.5, 1e-6, mask)
    assert torch.equal(a, sim * mask)
    _, sim0, a0 = reference_search(feats, queries, "hard", None, 0.3, 0.5, 1e-6)
    assert torch.equal(a0, sim0 * hard_mask(sim0, 0.3))

"""A metric pooled over training seeds: the mean over seeds, each seed's value and a 95 % Student-t interval.

Why: the within-seed interval (e.g. search precision's, from per-image means) says how precisely one checkpoint
was measured; whether a method's number holds for the method, not for one training run, needs the spread between
independently trained checkpoints, which only several seeds give. With n seeds the interval is
mean ± t_{0.975, n-1} · sd / sqrt(n) (sd with n - 1 degrees of freedom).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@functools.lru_cache(maxsize=64)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom: the cdf is torch's t density
    integrated (Simpson's rule on a grid fine enough for 1e-6), inverted by bisection."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    dist = torch.distributions.StudentT(torch.tensor(float(df), dtype=torch.float64))

    def cdf(x: float) -> float:
        n = 4_000  # even: Simpson's rule
        grid = torch.linspace(0.0, x, n + 1, dtype=torch.float64)
        dens = dist.log_prob(grid).exp()
        simpson = dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum()
        return 0.5 + float(simpson) * x / (3 * n)

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(48):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the finite `values` (one per seed): the Student-t interval over seeds; NaN bounds for
    fewer than two seeds."""
    v = np.asarray([x for x in values if x == x], dtype=np.float64)
    if len(v) == 0:
        return (float("nan"),) * 3
    mean = float(v.mean())
    if len(v) < 2:
        return mean, float("nan"), float("nan")
    half = t_quantile(0.5 + level / 2, len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class SeedPool:
    """One label's seeds for every mode x stage: `per_seed[mode][stage]` the seeds' values (members' order),
    `mean` / `ci` (t-interval over seeds, [low, high]) and `within` the members' own intervals."""

    label: str
    members: tuple[str, ...]
    per_seed: dict[str, dict[str, list[float]]]
    mean: dict[str, dict[str, float]]
    ci: dict[str, dict[str, list[float]]]
    within: dict[str, dict[str, list[list[float]]]]


def pool_over_seeds(values: Mapping[str, Mapping[str, Mapping[str, float]]],
                    within_ci: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]],
                    groups: Mapping[str, Sequence[str]], level: float = 0.95) -> dict[str, SeedPool]:
    """`values[member][mode][stage]` and their within-seed intervals pooled per group label (`groups[label]` = the
    members that are seeds of it)."""
    pools = {}
    for label, members in groups.items():
        missing = [m for m in members if m not in values]
        if missing:
            raise ValueError(f"seed group {label!r} names members with no values: {missing}")
        first = values[members[0]]
        per_seed = {mode: {s: [float(values[m][mode][s]) for m in members] for s in stages}
                    for mode, stages in first.items()}
        mean, ci, within = {}, {}, {}
        for mode, stages in per_seed.items():
            mean[mode], ci[mode], within[mode] = {}, {}, {}
            for s, vals in stages.items():
                mu, lo, hi = t_interval(vals, level)
                mean[mode][s], ci[mode][s] = mu, [lo, hi]
                within[mode][s] = [list(within_ci.get(m, {}).get(mode, {}).get(s, [float("nan")] * 2))
                                   for m in members]
        pools[label] = SeedPool(label, tuple(members), per_seed, mean, ci, within)
    return pools


def paired_gain(pools: Mapping[str, SeedPool], base: str, level: float = 0.95
                ) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Each label's gain over `base`, paired seed by seed: `out[label][mode][stage]` = {"per_seed": [x_k - b_k],
    "mean", "ci"} with the t-interval over the seeds' differences. Why paired: a run at seed k starts from the
    random init at seed k (the same network `random@k` builds), so x_k - b_k is what training did to that network,
    and the spread of inits (large for search precision) drops out of the comparison. Labels with another number of
    seeds than `base` are left out."""
    if base not in pools:
        return {}
    b = pools[base]
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for label, pool in pools.items():
        if label == base or len(pool.members) != len(b.members):
            continue
        out[label] = {}
        for mode, stages in pool.per_seed.items():
            out[label][mode] = {}
            for st, vals in stages.items():
                diffs = [x - y for x, y in zip(vals, b.per_seed[mode][st], strict=True)]
                mu, lo, hi = t_interval(diffs, level)
                out[label][mode][st] = {"per_seed": diffs, "mean": mu, "ci": [lo, hi]}
    return out

"""Closed-form schedules of the global step, so a resumed run continues exactly where it stopped."""

from __future__ import annotations

import math


def cosine(step: int, total_steps: int, base: float, final: float, warmup_steps: int = 0,
           warmup_start: float = 0.0) -> float:
    """Linear warm-up from `warmup_start` to `base` over `warmup_steps`, then cosine from `base` to `final`."""
    if step < warmup_steps:
        return warmup_start + (base - warmup_start) * step / max(warmup_steps, 1)
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return final + 0.5 * (base - final) * (1.0 + math.cos(math.pi * progress))


def linear_warmup(epoch: float, warmup_epochs: float, start: float, end: float) -> float:
    """DINO's teacher temperature: linear from `start` to `end` over `warmup_epochs`, then constant."""
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return end
    return start + (end - start) * epoch / warmup_epochs

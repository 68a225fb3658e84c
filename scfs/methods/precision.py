"""Mixed precision around the student's forward: each weight cast to the autocast dtype once per step.

Lightning's bf16/fp16 plugins enter `torch.autocast(..., cache_enabled=False)` (Lightning 2.6 turned the cache off
because a weight first cast under a nested `torch.no_grad()` was then reused, without its gradient, by the grad-
enabled calls after it). Without the cache, every use of a weight casts it again: the student runs each backbone
and head on two view batches (global and local), so an eager step casts every student weight twice in the
forward and casts both bf16 gradients back in the backward, about 300 extra kernels and 1,200 dispatched ops on
a ResNet-50 step whose eager speed is its host's. `cached_weight_casts` re-enables the cache for the student's
forward alone: that region never touches a student weight under `no_grad` (the teacher's weights need no
gradient, so autocast never caches them), and the cache is dropped when Lightning's outer autocast exits after
`training_step`, before the optimiser changes the weights. Autograd then sums a weight's two bf16 gradients
before the one cast back to float32: the same arithmetic as plain `torch.autocast`, whose cache is on by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def cached_weight_casts(device_type: str) -> Iterator[None]:
    """Inside an enabled autocast region whose weight cache is off, turn the cache on until the block ends;
    elsewhere (no autocast, or the cache already on) do nothing. Entries made here live until the outermost
    autocast region exits."""
    if not torch.is_autocast_enabled(device_type) or torch.is_autocast_cache_enabled():
        yield
        return
    with torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=True):
        yield

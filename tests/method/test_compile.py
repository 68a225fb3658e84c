"""Compiled SCFS step: every stage head's call stays compiled (dynamo's per-code-object graph limit)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.config as dynamo_config

from scfs.method.module import GRAPHS_PER_STAGE, RECOMPILE_SLACK, raise_recompile_limit
from scfs.models import StageHead


def _run_stage_heads(n_stages: int) -> None:
    """The calls a training step makes into `StageHead.forward`: per stage, the teacher's global maps without
    grad, the student's global and local maps with grad (own channels and map sizes per stage)."""
    for i in range(n_stages):
        student = StageHead(8 * (i + 1), out_dim=12, hidden_dim=16, bottleneck_dim=8)
        teacher = copy.deepcopy(student)
        for head in (student, teacher):
            head.compile(backend="eager", dynamic=False)
        size = 8 >> i
        with torch.no_grad():
            teacher(torch.randn(2, 8 * (i + 1), size, size))
        student(torch.randn(2, 8 * (i + 1), size, size)).sum().backward()
        student(torch.randn(4, 8 * (i + 1), max(size // 2, 1), max(size // 2, 1))).sum().backward()


def test_default_limit_drops_the_last_stage_head_to_eager():
    """Without raising the limit, three stages exceed dynamo's default of 8 graphs for `StageHead.forward` (the
    H200 run's 'hit config.recompile_limit (8)'): here made a hard failure so it cannot pass silently."""
    torch._dynamo.reset()
    with (dynamo_config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True),
          pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit)):
        _run_stage_heads(3)
    torch._dynamo.reset()


def test_raised_limit_keeps_every_stage_head_compiled():
    torch._dynamo.reset()
    with dynamo_config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        assert raise_recompile_limit(3) == GRAPHS_PER_STAGE * 3 + RECOMPILE_SLACK
        _run_stage_heads(3)
    torch._dynamo.reset()


def test_limit_is_never_lowered():
    with dynamo_config.patch(recompile_limit=100):
        assert raise_recompile_limit(3) == 100
        assert dynamo_config.recompile_limit == 100

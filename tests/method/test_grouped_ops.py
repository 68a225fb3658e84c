"""The eager step groups small ops (one head projection on several batches, the stage losses stacked over stages):
the grouped computations give the per-call ones."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import compose_cfg

from scfs.methods.losses import DINOLoss, sharpened_cross_entropy, stacked_dino_losses


def test_stacked_dino_losses_match_one_loss_per_stage():
    torch.manual_seed(0)
    losses = [DINOLoss(16, student_temp=0.1, center_momentum=0.9) for _ in range(3)]
    for lo in losses:
        lo.center.normal_()
    singles = copy.deepcopy(losses)
    student = [torch.randn(8, 16) for _ in losses]  # 2 global views x B=4
    teacher = [torch.randn(8, 16) for _ in losses]
    got = stacked_dino_losses(losses, torch.stack(student), torch.stack(teacher), 0.04)
    want = torch.stack([lo(s, t, 0.04) for lo, s, t in zip(singles, student, teacher, strict=True)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for lo, single in zip(losses, singles, strict=True):
        torch.testing.assert_close(lo.center, single.center, rtol=0, atol=0)


def test_stacked_sharpened_cross_entropy_matches_one_per_stage():
    torch.manual_seed(0)
    s, t = torch.randn(3, 12, 16), torch.randn(3, 12, 16)
    want = torch.stack([sharpened_cross_entropy(s[i], t[i], 0.04, 0.1) for i in range(3)])
    torch.testing.assert_close(sharpened_cross_entropy(s, t, 0.04, 0.1), want, rtol=0, atol=0)


def test_one_projection_on_global_and_local_rows_matches_separate_calls():
    """BatchNorm-free heads run once on the global and the local rows (student) and on the global views and the
    searched targets (teacher): the logits are those of one call per batch, to float32 rounding."""
    from scfs.methods.networks import student_forward, teacher_forward, teacher_stage_logits
    from scfs.train import build

    torch.manual_seed(0)
    _, method = build(compose_cfg(["search=soft", "method.head_bn=false", "method.bottleneck_bn=false"]))
    net = method.student
    assert net["head"].rows_independent and all(h.proj.rows_independent for h in net["stage_heads"].values())
    g, loc = torch.randn(8, 3, 32, 32), torch.randn(12, 3, 16, 16)
    with torch.no_grad():
        st = student_forward(copy.deepcopy(net), g, loc, method.stages, True)
        ref = copy.deepcopy(net)
        s_g, s_l = ref["backbone"](g), ref["backbone"](loc)
        pool = ref["backbone"].pool
        torch.testing.assert_close(st["logits"], torch.cat([ref["head"](pool(s_g)), ref["head"](pool(s_l))]))
        for s in method.stages:
            torch.testing.assert_close(st["stage_global"][s], ref["stage_heads"][s](s_g[s]))
            torch.testing.assert_close(st["stage_local"][s], ref["stage_heads"][s](s_l[s]))
        te = teacher_forward(method.teacher, g, method.stages)
        for s in method.stages:
            head = method.teacher["stage_heads"][s]
            target = torch.randn(12, te["stage_pooled"][s].shape[1])
            t_g, t_l = teacher_stage_logits(head, te["stage_pooled"][s], target)
            torch.testing.assert_close(t_g, head.proj(te["stage_pooled"][s]))
            torch.testing.assert_close(t_l, head.proj(target))


@pytest.mark.parametrize("with_targets", [True, False])
def test_stacked_teacher_stage_logits_match_per_stage_calls(with_targets):
    """The teacher's stage projections of every stage in one stacked call: the logits of the per-stage calls."""
    from scfs.methods.networks import stacked_teacher_stage_logits, teacher_forward, teacher_stage_logits
    from scfs.train import build

    torch.manual_seed(1)
    _, method = build(compose_cfg(["search=soft", "method.head_bn=false", "method.bottleneck_bn=false"]))
    heads = [method.teacher["stage_heads"][s] for s in method.stages]
    with torch.no_grad():
        te = teacher_forward(method.teacher, torch.randn(8, 3, 32, 32), method.stages)
        pooled = [te["stage_pooled"][s] for s in method.stages]
        targets = [torch.randn(12, p.shape[1]) if with_targets else None for p in pooled]
        t_g, t_l = stacked_teacher_stage_logits(heads, pooled, targets)
        for i, (h, p, t) in enumerate(zip(heads, pooled, targets, strict=True)):
            want_g, want_l = teacher_stage_logits(h, p, t)
            torch.testing.assert_close(t_g[i], want_g)
            if with_targets:
                torch.testing.assert_close(t_l[i], want_l)
    assert (t_l is None) == (not with_targets)

"""Self-distillation losses: DINO's centred cross-entropy and SCFS's sharpened-only local term."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class DINOLoss(nn.Module):
    """Cross-entropy between the centred, sharpened teacher and the student over all cross-view pairs.

    `teacher_out` holds the teacher's logits of the global views, `student_out` the student's logits of all
    views, both view-major (`(V*B, K)`, view v of image b at row v*B+b). Pairs with the same view index are
    skipped. The centre is an EMA of the teacher's batch mean, all-reduced across ranks as in DINO; it is a
    buffer, so checkpoints carry it and a resumed run continues exactly.
    """

    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(
        self, student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float, n_teacher: int = 2
    ) -> torch.Tensor:
        """Mean over pairs (teacher view iq, student view v != iq) of the batch-mean CE.

        Summed as sum_v <T, s_v> - sum_{v < n_teacher} <t_v, s_v> with T = sum_iq t_iq: one (B, K) product per
        teacher view plus one for the sum instead of one per pair (18 for 2 + 8 views), which matters for the
        65,536-way head. One log_softmax / softmax in float32 over all rows, no per-pair temporaries."""
        loss = _centred_cross_view_ce(student_out, teacher_out, self.center, teacher_temp, self.student_temp,
                                      n_teacher)
        self.update_center(teacher_out)
        return loss

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """centre <- momentum * centre + (1 - momentum) * the teacher's global batch mean (`_global_row_mean`)."""
        batch_center = _global_row_mean(teacher_out)
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)


def stacked_dino_losses(losses: Sequence[DINOLoss], student_out: torch.Tensor, teacher_out: torch.Tensor,
                        teacher_temp: float | torch.Tensor, n_teacher: int = 2) -> torch.Tensor:
    """`DINOLoss.forward` of several losses at once (SCFS's stage losses): `student_out` (S, V*B, K) and
    `teacher_out` (S, n_teacher*B, K) hold loss s's inputs at index s; returns the (S,) losses and updates every
    centre. One softmax, log-softmax and centre update for all S instead of one each: the eager step dispatches
    every small op from the host. The losses must share their temperature and centre momentum."""
    first = losses[0]
    if any(lo.student_temp != first.student_temp or lo.center_momentum != first.center_momentum for lo in losses):
        raise ValueError("stacked_dino_losses: the losses differ in student_temp or center_momentum")
    centres = [lo.center for lo in losses]
    loss = _centred_cross_view_ce(student_out, teacher_out, torch.stack(centres), teacher_temp, first.student_temp,
                                  n_teacher)
    _update_centres(centres, teacher_out, first.center_momentum)
    return loss


def _centred_cross_view_ce(student_out: torch.Tensor, teacher_out: torch.Tensor, center: torch.Tensor,
                           teacher_temp: float | torch.Tensor, student_temp: float, n_teacher: int) -> torch.Tensor:
    """DINO's loss (`DINOLoss.forward`) on (V*B, K) inputs, or on (S, V*B, K) stacks with centres (S, 1, K) (then
    one loss per s). The pair sums run over the view dimension, third from the end either way."""
    b = teacher_out.shape[-2] // n_teacher
    n_student = student_out.shape[-2] // b
    lead = student_out.shape[:-2]
    s = F.log_softmax(student_out.float() / student_temp, dim=-1).view(*lead, n_student, b, -1)
    t = F.softmax((teacher_out.float() - center) / teacher_temp, dim=-1).detach().view(*lead, n_teacher, b, -1)
    diag = min(n_teacher, n_student)
    cross = (t.sum(-3) * s.sum(-3)).sum(-1) - (t[..., :diag, :, :] * s[..., :diag, :, :]).sum(-1).sum(-2)  # (.., B)
    pairs = n_teacher * n_student - diag
    return -cross.mean(-1) / pairs


@torch.no_grad()
def _update_centres(centres: list[torch.Tensor], teacher_out: torch.Tensor, momentum: float) -> None:
    """centre_s <- momentum * centre_s + (1 - momentum) * (global mean of teacher_out[s]'s rows), for the (1, K)
    buffers `centres` and `teacher_out` (S, R, K); one reduction, one all-reduce and two foreach updates for all S."""
    batch_center = _global_row_mean(teacher_out)
    torch._foreach_mul_(centres, momentum)
    torch._foreach_add_(centres, list(batch_center.unbind(0)), alpha=1 - momentum)


def _global_row_mean(teacher_out: torch.Tensor) -> torch.Tensor:
    """The mean over the rows (dimension -2, kept) of `teacher_out` on all ranks, in float32. Every rank holds the
    same number of rows (drop_last sharding), so it is the all-reduced sum over rows x world size: one collective,
    no host-to-device copy of a count (a sync on CUDA)."""
    batch_center = teacher_out.float().sum(dim=-2, keepdim=True)
    world = 1
    if dist.is_available() and dist.is_initialized():
        if torch.compiler.is_compiling():  # the traceable (functional) form of the same all-reduce
            from torch.distributed import _functional_collectives as funcol

            batch_center = funcol.all_reduce(batch_center, "sum", dist.group.WORLD)
        else:
            dist.all_reduce(batch_center)
        world = dist.get_world_size()
    return batch_center / (teacher_out.shape[-2] * world)


def sharpened_cross_entropy(
    student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float | torch.Tensor,
    student_temp: float = 0.1
) -> torch.Tensor:
    """SCFS local term: row-wise CE between the sharpened (not centred) teacher and the student, averaged over the
    rows. On (S, M, K) stacks, one term per s (S,): SCFS's stages in one go."""
    t = F.softmax(teacher_out.float() / teacher_temp, dim=-1).detach()
    s = F.log_softmax(student_out.float() / student_temp, dim=-1)
    return torch.sum(-t * s, dim=-1).mean(-1)

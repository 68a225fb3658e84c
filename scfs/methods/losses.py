"""Self-distillation losses: DINO's centred cross-entropy and SCFS's sharpened-only local term."""

from __future__ import annotations

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
        b = teacher_out.shape[0] // n_teacher
        n_student = student_out.shape[0] // b
        s = F.log_softmax(student_out.float() / self.student_temp, dim=-1).view(n_student, b, -1)
        t = F.softmax((teacher_out.float() - self.center) / teacher_temp, dim=-1).detach().view(n_teacher, b, -1)
        diag = min(n_teacher, n_student)
        cross = (t.sum(0) * s.sum(0)).sum(-1) - (t[:diag] * s[:diag]).sum(-1).sum(0)  # (B,)
        pairs = n_teacher * n_student - diag
        self.update_center(teacher_out)
        return -cross.mean() / pairs

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        """Every rank holds the same number of rows (drop_last sharding), so the global mean is the all-reduced
        sum over rows x world size: one collective, no host-to-device copy of a count (a sync on CUDA)."""
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        world = 1
        if dist.is_available() and dist.is_initialized():
            if torch.compiler.is_compiling():  # the traceable (functional) form of the same all-reduce
                from torch.distributed import _functional_collectives as funcol

                batch_center = funcol.all_reduce(batch_center, "sum", dist.group.WORLD)
            else:
                dist.all_reduce(batch_center)
            world = dist.get_world_size()
        batch_center = batch_center / (teacher_out.shape[0] * world)
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)


def sharpened_cross_entropy(
    student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float, student_temp: float = 0.1
) -> torch.Tensor:
    """SCFS local term: row-wise CE between the sharpened (not centred) teacher and the student."""
    t = F.softmax(teacher_out.float() / teacher_temp, dim=-1).detach()
    s = F.log_softmax(student_out.float() / student_temp, dim=-1)
    return torch.sum(-t * s, dim=-1).mean()

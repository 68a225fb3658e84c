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
        b = teacher_out.shape[0] // n_teacher
        n_student = student_out.shape[0] // b
        s = F.log_softmax(student_out.float() / self.student_temp, dim=-1).chunk(n_student)
        t = F.softmax((teacher_out.float() - self.center) / teacher_temp, dim=-1).detach().chunk(n_teacher)
        total, pairs = student_out.new_zeros((), dtype=torch.float32), 0
        for iq, tq in enumerate(t):
            for v, sv in enumerate(s):
                if v == iq:
                    continue
                total = total + torch.sum(-tq * sv, dim=-1).mean()
                pairs += 1
        self.update_center(teacher_out)
        return total / pairs

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        count = torch.tensor(float(teacher_out.shape[0]), device=teacher_out.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            dist.all_reduce(count)
        batch_center = batch_center / count
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)


def sharpened_cross_entropy(
    student_out: torch.Tensor, teacher_out: torch.Tensor, teacher_temp: float, student_temp: float = 0.1
) -> torch.Tensor:
    """SCFS local term: row-wise CE between the sharpened (not centred) teacher and the student."""
    t = F.softmax(teacher_out.float() / teacher_temp, dim=-1).detach()
    s = F.log_softmax(student_out.float() / student_temp, dim=-1)
    return torch.sum(-t * s, dim=-1).mean()

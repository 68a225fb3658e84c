"""DINO (Caron et al., 2021): the student's head on every view matches the centred, sharpened teacher head on the
two global views. The baseline SCFS is compared with, on the same code path."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.profiler import record_function

from scfs.methods.base import SelfDistillation
from scfs.methods.losses import DINOLoss
from scfs.methods.registry import register


@register("dino")
class DINO(SelfDistillation):
    """L = L_dino: cross-entropy of the student's head (all views) against the teacher's (global views)."""

    def build_losses(self) -> None:
        super().build_losses()
        self.dino_loss = DINOLoss(self.method_cfg["out_dim"], self.method_cfg.get("student_temp", 0.1),
                                  self.method_cfg.get("center_momentum", 0.9))

    def loss_terms(self, st: dict[str, Any], te: dict[str, Any], b: int, n_local: int, temp: float | torch.Tensor,
                   logs: dict[str, Any], diagnostics: bool) -> torch.Tensor:
        with record_function("scfs/dino_loss"):
            loss = self.dino_loss(st["logits"], te["logits"], temp)
        logs["loss/dino"] = loss
        return loss

    def uniform_loss(self) -> float:
        return math.log(self.method_cfg["out_dim"])

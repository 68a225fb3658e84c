"""SCFS (Song et al., ICCV 2023): DINO plus, on backbone stages, per-stage heads matched across the global views and
a local term whose teacher target is the teacher's global-view map *searched* with the student's local query."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from scfs.methods.dino import DINO
from scfs.methods.losses import DINOLoss, sharpened_cross_entropy, stacked_dino_losses
from scfs.methods.networks import stacked_teacher_stage_logits
from scfs.methods.registry import register
from scfs.models.heads import as_dtype
from scfs.names import LOCAL_TARGETS, WEIGHTINGS, search_centred, search_settings


@register("scfs")
class SCFS(DINO):
    """Loss = L_dino + sum_s w_s (L_global_s + L_local_s), w_s = `method.stage_weight` (0.5 published):
    * L_global_s: per-stage heads matched across the two global views (centred teacher);
    * L_local_s: the student's per-stage head on local view n of image b is matched with the teacher's
      per-stage head on the teacher's global-view-1 map *searched* with the student's pooled local feature
      (teacher sharpened, not centred). `search.weighting` is how the similarity map weights the teacher map;
      `search.local_target=roi` replaces the search by random RoI crops of that map (the naive feature-level
      augmentation), `none` drops the local term.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.local_target != "none" and self.n_local < 1:
            raise ValueError(f"data.n_local={self.n_local}: search.local_target={self.local_target} needs at least "
                             "one local crop (>= 1)")

    @cached_property
    def weighting(self) -> str:
        """How the similarity map weights the teacher map (`search.weighting`)."""
        return search_settings(self.search_cfg)[0]

    @cached_property
    def local_target(self) -> str:
        """What the local term's teacher target is (`search.local_target`: search, roi or none)."""
        return search_settings(self.search_cfg)[1]

    def prepare_loss(self, st: dict[str, Any], te: dict[str, Any]) -> None:
        """Choose each stage's search backend on the first step's real maps and queries, eagerly: under
        `compile=true` the loss is traced and must find the choice made (`scfs.search.api.resolve_backend`)."""
        super().prepare_loss(st, te)
        if self.local_target != "search" or not st["queries"]:
            return
        from scfs.search.api import resolve_backend

        for s in self.stages:
            b = te["maps"][s].shape[0] // 2  # the teacher maps hold both global views; view 1 is searched
            maps, q = te["maps"][s][:b], st["queries"][s]
            resolve_backend(self.search_cfg.get("backend", "auto"), maps, q.view(-1, b, q.shape[-1]).to(maps.dtype))

    def stage_names(self) -> tuple[str, ...]:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"search.weighting={self.weighting!r} is not known: allowed are {', '.join(WEIGHTINGS)}")
        if self.local_target not in LOCAL_TARGETS:
            raise ValueError(f"search.local_target={self.local_target!r} is not known: allowed are "
                             f"{', '.join(LOCAL_TARGETS)}")
        return tuple(self.search_cfg.get("stages", ()))

    def uses_local_heads(self) -> bool:
        return self.local_target != "none"

    def build_losses(self) -> None:
        super().build_losses()
        st, cm = self.method_cfg.get("student_temp", 0.1), self.method_cfg.get("center_momentum", 0.9)
        self.stage_losses = nn.ModuleDict({s: DINOLoss(self.method_cfg["stage_out_dim"], st, cm) for s in self.stages})

    def loss_terms(self, st: dict[str, Any], te: dict[str, Any], b: int, n_local: int, temp: float | torch.Tensor,
                   logs: dict[str, Any], diagnostics: bool) -> torch.Tensor:
        """DINO's loss plus the stage terms. The eager step is host-bound, so the terms are grouped into few ops:
        the teacher's projections run once on every stage's global views' and local target's pooled features
        (`stacked_teacher_stage_logits`); the stages' heads share one output size, so their global terms are one
        stacked `DINOLoss` computation and their local terms one stacked cross-entropy (one softmax and one
        log-softmax per kind of term for all stages). The per-stage values and their sum are those of the per-stage
        terms."""
        loss = super().loss_terms(st, te, b, n_local, temp, logs, diagnostics)
        if not self.stages:
            return loss
        w = self.method_cfg.get("stage_weight", 0.5)
        targets = []
        for s in self.stages:
            with record_function(f"scfs/stage_{s}_local"):
                targets.append(self._local_target(s, st["stage_local"].get(s), st["queries"].get(s),
                                                  st["local_size"].get(s, 1), te["maps"][s][:b], b, n_local, logs,
                                                  diagnostics))
        with torch.no_grad():
            teacher_g, teacher_l = stacked_teacher_stage_logits(
                [self.teacher["stage_heads"][s] for s in self.stages], [te["stage_pooled"][s] for s in self.stages],
                targets)
        student_g = st.get("stage_global_stacked")
        if student_g is None:
            student_g = torch.stack([st["stage_global"][s] for s in self.stages])
        losses_g = stacked_dino_losses([self.stage_losses[s] for s in self.stages], student_g, teacher_g,
                                       temp).unbind(0)
        losses_l: tuple[torch.Tensor | None, ...] = (None,) * len(self.stages)
        if teacher_l is not None:
            student_l = st.get("stage_local_stacked")
            if student_l is None:
                student_l = torch.stack([st["stage_local"][s] for s in self.stages])
            losses_l = sharpened_cross_entropy(student_l, teacher_l, temp,
                                               self.method_cfg.get("student_temp", 0.1)).unbind(0)
        for s, loss_g, loss_l in zip(self.stages, losses_g, losses_l, strict=True):
            logs[f"loss/{s}_global"] = loss_g
            stage_loss = loss_g
            if loss_l is not None:
                logs[f"loss/{s}_local"] = loss_l
                stage_loss = stage_loss + loss_l
            loss = loss + w * stage_loss
        return loss

    def _local_target(self, stage: str, sl_out: torch.Tensor | None, queries: torch.Tensor | None, local_size: int,
                      t_global1: torch.Tensor, b: int, n_local: int, logs: dict, diagnostics: bool
                      ) -> torch.Tensor | None:
        """The teacher's target of the stage's local term before its projection (None without one): its stage
        head's pooled feature of its global-view-1 map searched by the student's pooled local features, whose logits
        are matched with the student's stage head logits on its local maps (`sl_out`)."""
        if self.local_target == "none" or sl_out is None or queries is None:
            return None
        head = self.teacher["stage_heads"][stage]
        with torch.no_grad():
            if self.local_target == "roi":
                from scfs.search import random_feature_crops

                size = max(local_size, 1)
                crops = random_feature_crops(t_global1, n_local, out_size=size,
                                             scale=tuple(self.search_cfg.get("roi_scale", (0.05, 0.25))))
                return head.pool(crops)
            tl_pooled, found = head.pool_searched(
                t_global1, as_dtype(queries.view(n_local, b, -1), t_global1.dtype), mode=self.weighting,
                topk=self.search_cfg.get("topk", 0.25),
                temperature=self.search_cfg.get("temperature", 0.1),
                backend=self.search_cfg.get("backend", "auto"),
                centre=search_centred(self.search_cfg),
            )
            if diagnostics:  # only on the steps whose logs are written
                sim = found.similarity
                p = found.weights.clamp_min(0).flatten(2)
                p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
                ent = -(p * p.clamp_min(1e-12).log()).sum(-1).mean() / math.log(max(p.shape[-1], 2))
                logs[f"search/{stage}_sim_mean"] = sim.mean()
                logs[f"search/{stage}_sim_max"] = sim.amax(dim=(2, 3)).mean()
                logs[f"search/{stage}_weight_entropy"] = ent
        return tl_pooled

    def uniform_loss(self) -> float:
        u = super().uniform_loss()
        if self.stages:
            n_terms = 1 + (self.local_target != "none")
            u += self.method_cfg.get("stage_weight", 0.5) * n_terms * len(self.stages) * math.log(
                self.method_cfg["stage_out_dim"])
        return u

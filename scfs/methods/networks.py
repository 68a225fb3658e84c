"""The networks of a self-distillation step and their two step-time calls (student side, teacher side).

Module-level functions that take the networks as arguments, so `torch.compile` can trace each side as one graph
and a copy of a module calls them with its own networks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from scfs.models import DINOHead, StageHead
from scfs.models.backbone import make_backbone
from scfs.models.heads import stacked_dino_heads
from scfs.names import VIT_LAST_STAGE, backbone_arch

# Graphs one code object may get per stage head: the stage heads of student and teacher share `StageHead.forward`,
# which can see the teacher's global maps (no grad) and the student's global and local maps. The compiled step
# traces those calls inside `student_forward` / `teacher_forward` (no graphs of their own); the per-module compiled
# calls that remain (RoI crops, the searched branch, calls outside the step) stay within this bound.
GRAPHS_PER_STAGE = 3
RECOMPILE_SLACK = 8  # dynamo's default limit: graphs of callers outside the step (the kNN passes run eager)


def raise_recompile_limit(n_stages: int) -> int:
    """Raise dynamo's per-code-object graph limit to what a compiled SCFS step needs, and return it.

    All instances of one module class share one `forward` code object, and dynamo keeps at most
    `recompile_limit` graphs for it (8 by default). Three stages need 9 graphs of `StageHead.forward`; past the
    limit dynamo runs the call eager without an error, and under CUDA graphs that stage's head is then
    launch-bound. The limit is global dynamo config, so it is only ever raised, never lowered."""
    import torch._dynamo.config as dynamo_config

    need = GRAPHS_PER_STAGE * n_stages + RECOMPILE_SLACK
    dynamo_config.recompile_limit = max(int(dynamo_config.recompile_limit), need)
    return dynamo_config.recompile_limit


def repeated_blocks(backbone: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a backbone, in order: a CNN's residual blocks (timm ResNet stages `layer1..4`) or a
    ViT's transformer blocks. `compile_scope=blocks` compiles each of them in place: blocks of one class and shape
    share one compiled graph (dynamo lifts the weights to inputs), so a cold compile lowers a few blocks instead of
    whole networks."""
    body = getattr(backbone, "body", backbone)
    if hasattr(body, "blocks"):
        return list(body.blocks)
    return [blk for name in ("layer1", "layer2", "layer3", "layer4") if hasattr(body, name)
            for blk in getattr(body, name)]


def block_kinds(blocks: Sequence[nn.Module]) -> int:
    """Distinct block structures (class and parameter shapes): each one is its own graph per view size and mode."""
    return len({(type(b), tuple((n, tuple(p.shape)) for n, p in b.named_parameters())) for b in blocks})


def raise_block_recompile_limit(blocks: Sequence[nn.Module]) -> int:
    """Raise dynamo's per-code-object graph limit for `compile_scope=blocks`, and return it.

    Every compiled block enters through the same code object, and each block structure needs a graph per step
    context (the student's global and local views with grad, the teacher's without) plus callers outside the
    step (the kNN passes run eager, `scfs.eval.features`). Past the limit dynamo would run the rest of the blocks
    eager, silently.
    Only ever raised, as `raise_recompile_limit`."""
    import torch._dynamo.config as dynamo_config

    need = block_kinds(blocks) * (GRAPHS_PER_STAGE + RECOMPILE_SLACK)
    dynamo_config.recompile_limit = max(int(dynamo_config.recompile_limit), need)
    dynamo_config.accumulated_recompile_limit = max(int(dynamo_config.accumulated_recompile_limit), 4 * need)
    return dynamo_config.recompile_limit


def build_network(
    backbone_cfg: Mapping[str, Any], method_cfg: Mapping[str, Any], stages: Sequence[str]
) -> nn.ModuleDict:
    """Backbone + DINO head + one stage head per searched stage (none for DINO): the student; the teacher is a copy."""
    bcfg = dict(backbone_cfg)
    name = bcfg.pop("name")
    bcfg.pop("channels_last", None)
    last = VIT_LAST_STAGE if backbone_arch(bcfg) == "vit" else "layer4"
    backbone = make_backbone(name, stages=stages or (last,), **bcfg)
    mlp = {"nlayers": method_cfg.get("head_layers", 3), "use_bn": method_cfg.get("head_bn", False),
           "norm_last_layer": method_cfg.get("norm_last_layer", True),
           "bottleneck_bn": method_cfg.get("bottleneck_bn", False)}  # the projection MLP settings both heads share
    net = nn.ModuleDict(
        {
            "backbone": backbone,
            "head": DINOHead(backbone.embed_dim, out_dim=method_cfg["out_dim"], hidden_dim=method_cfg["hidden_dim"],
                             bottleneck_dim=method_cfg["bottleneck_dim"], **mlp),
        }
    )
    net["stage_heads"] = nn.ModuleDict(
        {
            s: StageHead(
                backbone.channels[s],
                out_dim=method_cfg["stage_out_dim"],
                hidden_dim=method_cfg["stage_hidden_dim"],
                bottleneck_dim=method_cfg["stage_bottleneck_dim"],
                branch_channels=method_cfg.get("stage_branch_channels"),
                final_relu=method_cfg.get("stage_final_relu", False),
                norm=method_cfg.get("stage_norm", "batchnorm"),
                pooled_bn=method_cfg.get("stage_pooled_bn", True),
                **mlp,
            )
            for s in stages
        }
    )
    return net


def student_forward(student: nn.ModuleDict, g: torch.Tensor, loc: torch.Tensor | None, stages: Sequence[str],
                    local_heads: bool) -> dict[str, Any]:
    """Everything a step needs from the student, from its two view batches (global `g`, local `loc`), in one call.

    None of it depends on the teacher, so `compile=true` traces it as one graph: each weight used on both view
    sizes gets its two gradients summed inside the compiled backward, and the step launches one graph instead of
    one per module call (the H200 step is host-bound). Returns the pooled global feature, the DINO head's logits
    (global views, then local), the stage heads' logits on the global and local maps, and per stage the detached
    pooled local feature (the search queries) and the local map size.

    It is `student_view_features` per view batch, then `student_head_outputs` on both: with
    `compile_student_graphs=per_view_size` those are compiled as three graphs instead of one (smaller graphs whose
    first compiles can run in separate processes, `SelfDistillation.split_student_call`)."""
    f_g = student_view_features(student, g, stages, True)
    # whether there are local views, as a Python bool: the maps' dict is not tested for truth (`bool(dict)` is a
    # graph break for some torch releases' dynamo, splitting this call into two graphs)
    f_l = student_view_features(student, loc, stages, local_heads) if loc is not None else None
    return student_outputs(student_head_outputs(student, f_g, f_l, stages), f_l, stages)


def student_view_features(student: nn.ModuleDict, x: torch.Tensor, stages: Sequence[str],
                          head_pool: bool) -> dict[str, Any]:
    """One view batch through the student's backbone, up to what the heads take: the backbone's representation
    (`pooled`), each stage's GAP (`gaps`: the stage heads' pooled shortcut and, of local views, the search's
    queries), each stage head's pooled input (`stage_pooled`, only with `head_pool`; the pooling's residual
    branch keeps this batch's own BatchNorm statistics) and each stage's map size (`size`)."""
    backbone = student["backbone"]
    maps = backbone(x)
    pooled = backbone.pool(maps)  # the representation: GAP of layer4 (CNN), the CLS token (ViT)
    gaps = stage_gaps(backbone, maps, pooled, stages)
    heads = student["stage_heads"]
    return {"pooled": pooled, "gaps": gaps,
            "stage_pooled": {s: heads[s].pool(maps[s], gaps[s]) for s in stages} if head_pool else {},
            "size": {s: int(maps[s].shape[-1]) for s in stages}}


def student_head_outputs(student: nn.ModuleDict, f_g: dict[str, Any], f_l: dict[str, Any] | None,
                         stages: Sequence[str]) -> dict[str, Any]:
    """The student's heads on the features of both view batches (`student_view_features`; `f_l` None without
    local views): the DINO head's logits (global rows, then local) and the stage heads' logits, on all rows at
    once where a head's rows are independent (half the head's ops and its backward's)."""
    pooled_g, pooled_l = f_g["pooled"], None if f_l is None else f_l["pooled"]
    head = student["head"]
    if pooled_l is None:
        logits = head(pooled_g)
    elif head.rows_independent:
        logits = head(torch.cat([pooled_g, pooled_l]))
    else:  # BatchNorm in the head: each view batch keeps its own batch statistics
        logits = torch.cat([head(pooled_g), head(pooled_l)])
    heads = student["stage_heads"]
    stage_global, stage_local = {}, {}
    stacked_g = stacked_l = None
    local = f_l is not None and len(f_l["stage_pooled"]) > 0  # the stage heads run on the local views too
    if stages and all(heads[s].proj.rows_independent for s in stages):
        # every stage's projection on its global and local rows in one stacked call (`stacked_dino_heads`)
        xs = [f_g["stage_pooled"][s] for s in stages]
        if local:
            xs = [torch.cat([x, f_l["stage_pooled"][s]]) for s, x in zip(stages, xs, strict=True)]
        out = stacked_dino_heads([heads[s].proj for s in stages], xs)  # (S, rows, K)
        n_g = pooled_g.shape[0]
        stacked_g, stacked_l = (out[:, :n_g], out[:, n_g:]) if local else (out, None)
        stage_global = dict(zip(stages, stacked_g.unbind(0), strict=True))
        stage_local = dict(zip(stages, stacked_l.unbind(0), strict=True)) if local else {}
    else:
        for s in stages:
            if local:
                stage_global[s], stage_local[s] = _projection_pair(heads[s], f_g["stage_pooled"][s],
                                                                   f_l["stage_pooled"][s])
            else:
                stage_global[s] = heads[s].proj(f_g["stage_pooled"][s])
    return {
        "pooled_global": pooled_g,
        "logits": logits,
        "stage_global": stage_global,
        "stage_local": stage_local,
        # the same logits stacked over the stages (S, rows, K) when the stage heads ran as one, else None
        "stage_global_stacked": stacked_g,
        "stage_local_stacked": stacked_l,
    }


def student_outputs(heads_out: dict[str, Any], f_l: dict[str, Any] | None, stages: Sequence[str]) -> dict[str, Any]:
    """`student_forward`'s outputs: the heads' (`student_head_outputs`) and, of the local views, per stage the
    detached GAP (the search's queries) and the map size."""
    return {**heads_out,
            "queries": {s: f_l["gaps"][s].detach() for s in stages} if f_l is not None else {},
            "local_size": dict(f_l["size"]) if f_l is not None else {}}


def stage_gaps(backbone: nn.Module, maps: dict[str, torch.Tensor], pooled: torch.Tensor | None,
               stages: Sequence[str]) -> dict[str, torch.Tensor]:
    """Per stage, the GAP of its map, `maps[s].mean(dim=(2, 3))`: the stage heads' pooled shortcut and the
    search's queries. The backbone's own representation is reused where it is that GAP (`pool_stage`)."""
    same = getattr(backbone, "pool_stage", None)
    return {s: pooled if s == same and pooled is not None else maps[s].mean(dim=(2, 3)) for s in stages}


def _projection_pair(head: StageHead, p_g: torch.Tensor, p_l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stage head's projection of the pooled global and local maps: `(head.proj(p_g), head.proj(p_l))`, run once
    on both when its rows are independent, which halves its ops and its backward's."""
    if not head.proj.rows_independent:
        return head.proj(p_g), head.proj(p_l)
    out = head.proj(torch.cat([p_g, p_l]))
    n_g = p_g.shape[0]
    return out[:n_g], out[n_g:]


def teacher_forward(teacher: nn.ModuleDict, g: torch.Tensor, stages: Sequence[str]) -> dict[str, Any]:
    """The teacher's part of a step that does not depend on the student (call it under `torch.no_grad`): its
    global-view maps (searched later by the student's queries), DINO head logits and the stage heads' pooled
    (pre-projection) features, one graph under `compile=true` for the reason given in `student_forward`. The loss
    projects the pooled features together with the local targets' (`teacher_stage_logits`)."""
    backbone = teacher["backbone"]
    maps = backbone(g)
    pooled = backbone.pool(maps)
    heads = teacher["stage_heads"]
    gaps = stage_gaps(backbone, maps, pooled, stages)
    return {"maps": maps, "logits": teacher["head"](pooled),
            "stage_pooled": {s: heads[s].pool(maps[s], gaps[s]) for s in stages}}


def teacher_stage_logits(head: StageHead, pooled: torch.Tensor, target: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The teacher's stage head logits of its global views, from their pooled features (`teacher_forward`'s
    `stage_pooled`), and of the pooled features of a local term's target (None: no target): one projection call on
    both when its rows are independent, which halves the projection's ops (the eager step is host-bound)."""
    if target is None:
        return head.proj(pooled), None
    if not head.proj.rows_independent:  # BatchNorm in the projection: each batch keeps its own statistics
        return head.proj(pooled), head.proj(target)
    out = head.proj(torch.cat([pooled, target]))
    n = pooled.shape[0]
    return out[:n], out[n:]


def stacked_teacher_stage_logits(heads: Sequence[StageHead], pooled: Sequence[torch.Tensor],
                                 targets: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`teacher_stage_logits` of every stage, stacked over the stages: the global views' logits (S, n, K) and the
    local targets' (S, m, K), or None when a stage has no target. With row-independent projections all stages'
    projections run as one (`stacked_dino_heads`) on each stage's global and target rows."""
    projs = [h.proj for h in heads]
    if any(t is None for t in targets):
        return stacked_dino_heads(projs, pooled), None
    if not all(p.rows_independent for p in projs):
        pairs = [teacher_stage_logits(h, x, t) for h, x, t in zip(heads, pooled, targets, strict=True)]
        return torch.stack([g for g, _ in pairs]), torch.stack([t for _, t in pairs])
    out = stacked_dino_heads(projs, [torch.cat([x, t]) for x, t in zip(pooled, targets, strict=True)])
    n = pooled[0].shape[0]
    return out[:, :n], out[:, n:]

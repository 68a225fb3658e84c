"""The work of one training step in FLOPs, part by part, SCFS against DINO: the floor under the SCFS / DINO
step-time ratio.

Why: the speed target "SCFS step within 10 % of DINO's" only makes sense if SCFS's extra work allows it. SCFS adds
per-stage heads (a residual 1x1-3x3-1x1 bottleneck and a projection MLP) on the student's global and local maps
and on the teacher's global maps, and a teacher branch over the N·B *searched* maps of global-view size, whose 3x3
conv cannot be commuted in front of the search (a ReLU sits between). On a GPU-bound step the time ratio cannot
fall much below the ratio of the work, whatever the kernels; this benchmark counts that work exactly, with
`torch.utils.flop_counter.FlopCounterMode` (matmuls and convolutions, forward and backward; elementwise and
normalisation ops are not counted: they cost memory traffic, not FLOPs), on the recipe's real modules and view
sizes, in float32 on the CPU (FLOPs do not depend on the device or the dtype). The search runs its reference
backend, whose similarity and weighting are plain matmuls and so counted.

Parts (per image of the batch): the student's and the teacher's backbones (forward), their heads (DINO head, and
for SCFS the stage heads), the losses with the search and the teacher's searched branch, and the backward split
into the backbone's and the rest. Each part is counted on its own calls of the real step functions
(`student_forward`, `teacher_forward`, the method's loss, `backward`); the backbone parts by calling the backbones
alone on the same views, and the heads are the difference.

    python -m scfs.bench.flops [--recipe imagenet cifar10 imagenet_vit] [--out benchmarks/results]
    python -m scfs.bench.flops --recipe imagenet --override ++method.stage_branch_channels=256 --tag published-width
    python -m scfs.bench.flops --recipe imagenet --published-tree PATH   # and the published step's work beside it
    python -m scfs.bench.flops --tiny --out /tmp/x      # seconds, for the test

With `--published-tree` (a checkout of github.com/skyoux/scfs, as `scfs.bench.published` takes it) the record adds
the published step's work at the same batch, counted the same way on its own modules (ResNet-50 and its recipe's
views; `--tiny`: the published benchmark's tiny shapes): how much of a time ratio against it is less work.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from scfs.bench.records import provenance, save_record, source_commit

PARTS = ("student backbone", "student heads", "teacher backbone", "teacher heads", "losses, search, searched branch",
         "backward: backbone", "backward: heads and losses")
METHODS = ("scfs", "dino")


def _count(fn: Any) -> tuple[Any, int]:
    """`fn()` and the FLOPs it ran (matmuls and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = fn()
    return out, int(counter.get_total_flops())


def step_flops(cfg: Any) -> dict[str, Any]:
    """FLOPs per image of each part of one training step (`PARTS`) of the method `cfg` builds, and their total."""
    import torch

    from scfs.methods.networks import student_forward, teacher_forward
    from scfs.train import build
    from scfs.training.plain_step import random_views

    torch.manual_seed(int(cfg.seed))
    _, model = build(cfg)
    model = model.train()
    b, n_local = int(cfg.batch_size), int(cfg.crops.n_local)
    g, loc = random_views(cfg)
    stages, local_heads = model.stages, model._local_heads
    st, student_all = _count(lambda: student_forward(model.student, g, loc, stages, local_heads))
    with torch.no_grad():
        te, teacher_all = _count(lambda: teacher_forward(model.teacher, g, stages))
        model.prepare_loss(st, te)  # the search backend is chosen on real maps once, outside the counted calls

        def student_backbone() -> None:
            model.student["backbone"](g)
            if loc is not None:
                model.student["backbone"](loc)

        _, student_bb = _count(student_backbone)
        _, teacher_bb = _count(lambda: model.teacher["backbone"](g))  # the teacher sees the global views only
    temp = model._temp_arg(0.04, torch.device("cpu"))
    (loss, _), losses = _count(lambda: model._loss_fn(model, st, te, b, n_local, temp, False))
    _, backward_all = _count(loss.backward)

    def backbone_backward() -> None:  # every stage map the step reads gets a gradient, as in the step
        s_g = model.student["backbone"](g)
        maps = list(s_g.values()) + (list(model.student["backbone"](loc).values()) if loc is not None else [])
        sum(m.float().mean() for m in maps).backward()

    model.zero_grad(set_to_none=True)
    _, bb_fwd_bwd = _count(backbone_backward)
    bb_backward = bb_fwd_bwd - student_bb
    per = {"student backbone": student_bb, "student heads": student_all - student_bb, "teacher backbone": teacher_bb,
           "teacher heads": teacher_all - teacher_bb, "losses, search, searched branch": losses,
           "backward: backbone": bb_backward, "backward: heads and losses": backward_all - bb_backward}
    parts = {k: v / b for k, v in per.items()}
    return {"parts": parts, "total": sum(parts.values()), "batch": b, "n_local": n_local,
            "global_size": int(cfg.crops.global_size), "local_size": int(cfg.crops.local_size),
            "backbone": str(cfg.backbone.name), "stages": list(stages)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from scfs.bench.compile import compose
    from scfs.config import validate_config

    result: dict[str, Any] = {"date": dt.date.today().isoformat(), "commit": source_commit(),
                              "command": "python -m scfs.bench.flops " + " ".join(args.argv), "tiny": args.tiny,
                              "overrides": list(args.override or []), "recipes": {}}
    for recipe in args.recipe:
        rows = {}
        for method in METHODS:
            extra = [f"method={method}", f"batch_size={args.batch}", "search.backend=reference"]
            cfg = compose(recipe, "cpu", args.tiny, "model", False, extra + list(args.override or []))
            validate_config(cfg)
            rows[method] = step_flops(cfg)
            print(f"{recipe} {method}: {rows[method]['total'] / 1e9:.2f} GFLOP per image", flush=True)
        rows["ratio"] = rows["scfs"]["total"] / rows["dino"]["total"]
        result["recipes"][recipe] = rows
    if args.published_tree:
        from scfs.bench.published import flops_subprocess

        result["published"] = flops_subprocess(args.published_tree, args.batch, args.tiny)
        if "error" in result["published"]:
            raise SystemExit(f"scfs.bench.flops: {result['published']['error']}")
        print(f"published step: SCFS / DINO {result['published']['ratio']:.3f}", flush=True)
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Work of one training step in FLOPs, SCFS against DINO ({result['date']})", "",
             f"{provenance(result.get('commit'), result['command'])} Matmul and convolution FLOPs per image "
             "(`torch.utils.flop_counter.FlopCounterMode`, forward and backward, float32 on the CPU; elementwise and "
             "normalisation ops are not counted), on each recipe's modules and view sizes. The ratio is the floor "
             "under the SCFS / DINO step-time ratio of a compute-bound step."
             + (f" Overrides on every row: `{' '.join(result['overrides'])}`." if result.get("overrides") else ""),
             ""]
    for recipe, rows in result["recipes"].items():
        s, d = rows["scfs"], rows["dino"]
        title = "the CPU default" if recipe == "default" else f"`+experiment={recipe}`"
        lines += [f"## {title}: {s['backbone']}, 2 x {s['global_size']} + {s['n_local']} x "
                  f"{s['local_size']} views, B={s['batch']}, SCFS stages {', '.join(s['stages'])}", "",
                  "| part | SCFS GFLOP | DINO GFLOP | SCFS − DINO | share of SCFS's extra |", "|---|---|---|---|---|"]
        extra = s["total"] - d["total"]
        for part in PARTS:
            a, c = s["parts"][part] / 1e9, d["parts"][part] / 1e9
            share = f"{(a - c) * 1e9 / extra:.0%}" if extra > 0 else "-"
            lines.append(f"| {part} | {a:.2f} | {c:.2f} | {a - c:+.2f} | {share} |")
        lines += [f"| **step** | **{s['total'] / 1e9:.2f}** | **{d['total'] / 1e9:.2f}** | "
                  f"**{extra / 1e9:+.2f}** | |", "", f"SCFS / DINO work ratio: **{rows['ratio']:.3f}**.", ""]
    pub = result.get("published")
    if pub:
        s, d = pub["rows"]["scfs"], pub["rows"]["dino"]
        lines += [f"## The published step (checkout {pub['source']}), B={pub['batch']}"
                  + (", the tiny shapes" if pub.get("tiny") else ""), "",
                  "Its own modules and loop (`scfs.bench.published`), counted the same way; the forward is the "
                  "student's, the teacher's with its search, and the losses.", "",
                  "| part | SCFS GFLOP | DINO GFLOP | SCFS − DINO |", "|---|---|---|---|"]
        for part in ("forward", "backward"):
            lines.append(f"| {part} | {s[part] / 1e9:.2f} | {d[part] / 1e9:.2f} | {(s[part] - d[part]) / 1e9:+.2f} |")
        lines += [f"| **step** | **{s['total'] / 1e9:.2f}** | **{d['total'] / 1e9:.2f}** | "
                  f"**{(s['total'] - d['total']) / 1e9:+.2f}** |", "",
                  f"Published SCFS / DINO work ratio: **{pub['ratio']:.3f}**."]
        # the published step is the ResNet-50 recipe's: only that recipe's full-size step compares with it
        mine = result["recipes"].get("imagenet")
        if mine and not pub.get("tiny"):
            lines.append(f"This project's SCFS step (`imagenet` above) does **{mine['scfs']['total'] / s['total']:.3f}"
                         f"** times the published SCFS step's work per image, its DINO step "
                         f"{mine['dino']['total'] / d['total']:.3f} times the published DINO step's.")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", nargs="+", default=["imagenet", "cifar10", "imagenet_vit"],
                   help="experiments (+experiment=<name>), or 'default' for the CPU default")
    p.add_argument("--batch", type=int, default=32,
                   help="images per step (FLOPs are given per image; a few batch-independent products, the "
                        "closed-form BatchNorm's weight x moments, shrink per image as it grows)")
    p.add_argument("--tiny", action="store_true", help="the compile benchmark's tiny network (the CPU test)")
    p.add_argument("--override", action="append", metavar="KEY=VALUE",
                   help="Hydra override applied to both methods' configs (repeatable), e.g. "
                        "++method.stage_branch_channels=256 (++ for a key only SCFS's config has)")
    p.add_argument("--published-tree", type=Path, default=None,
                   help="a checkout of github.com/skyoux/scfs: count the published step's work beside ours")
    p.add_argument("--tag", default=None, help="appended to the record's name (a run with overrides)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    args.argv = argv
    if args.published_tree:
        from scfs.bench.published import tree_problem

        problem = tree_problem(args.published_tree)
        if problem:  # before the minutes of counting this project's steps
            print(f"scfs.bench.flops: --published-tree {problem}", file=sys.stderr)
            return 2
    result = run(args)
    name = (f"flops-{result['date']}" + (f"-{args.tag}" if args.tag else "")
            + (f"-{result['commit']}" if result["commit"] else ""))
    print(save_record(result, Path(args.out) / name, markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The published SCFS training step, timed from a checkout of its code in the same call as ours.

The speed targets compare our step with the published implementation's (github.com/skyoux/scfs). Timed on
another day or another machine of the same kind, that reference moves by 10 % and more (../shared/MEASUREMENTS.md)
and an eager step, bound by the host, follows the host; so the comparison is only honest side by side. This
module rebuilds the published step from a checkout the user supplies (`--tree`; nothing of it is part of this
project) and times it like our rows (`scfs.bench.timing.time_steps`: a CUDA event at every step start, median after
the warm-up).

What one step does is `main_scfs.py`'s `train_one_epoch` for one batch, without its data loader (the views are
random tensors already on the device, as in the published measurement): the learning rate and weight decay set
per parameter group from their cosine schedules, the student on the two global views and on the local views, the
teacher (`TeacherWrapper`, with its per-crop search loop) on the global views, `DINOLoss` on the final head and one
`DINOShallowLoss` per stage, the `loss.item()` finiteness check, backward, `clip_gradients` (3.0, the published
default), `cancel_gradients_last_layer`, the SGD step (momentum 0.9, the ResNet-50 script's optimizer), the
teacher's per-parameter EMA loop, the logged `.item()`s and the `torch.cuda.synchronize()` that end the loop body.
The networks are built as `train` builds them (torchvision ResNet-50, 65,536-way DINO head, 256-way stage heads of
width 2,048) and run unwrapped: over one process DistributedDataParallel and SyncBatchNorm change nothing in the
step's arithmetic, and on the GPU their one-process combination fails in the backward (an in-place update of a
BatchNorm buffer saved for it). The losses all-reduce the teacher's centre over a one-process group, as they do in a
run. Settings: `bf16_cl` (bf16 autocast, channels_last networks and views: the reference of our eager and default
rows) and `fp16` (the published code as it ships: fp16 autocast with its GradScaler, NCHW) and `fp32` (no autocast,
NCHW: the CPU test's rows). `dino` is the same step without SCFS: backbone and DINO head (the views of each
resolution in one batch, as the published wrappers do), `DINOLoss` alone. The step is timed at epoch 1, past the
epoch in which the last layer's gradients are cancelled (the steady state of a run).

The checkout needs `torchextractor` and `kornia` importable (`pip install torchextractor kornia`). Usage:
    python -m scfs.bench.published --tree PATH [--batch 32 --batch 64] [--setting bf16_cl] [--json OUT]
    python -m scfs.bench.step ... --published-tree PATH     # the same rows first, then ours, in one record
    python -m scfs.bench.published --tree PATH --no-syncs   # diagnostic: without the loop's host syncs
    python -m scfs.bench.published --tree PATH --flops --batch 32   # its work per image, on the CPU
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# name -> (precision, channels_last): bf16 / fp16 autocast, or fp32 without autocast
SETTINGS = {"bf16_cl": ("bf16", True), "fp16": ("fp16", False), "fp32": ("fp32", False)}
METHODS = ("scfs", "dino")
# main_scfs.py's defaults and the ResNet-50 pretraining script's arguments (scripts/run_pretrain.sh there)
RECIPE = {"arch": "resnet50", "stage_dims": (512, 1024, 2048), "out_dim": 65536, "stage_out_dim": 256,
          "stage_bottleneck_dim": 256, "stage_hidden_dim": 2048, "global_size": 224, "local_size": 96, "n_local": 8,
          "lr": 0.1, "min_lr": 0.0048, "weight_decay": 1e-4, "momentum_teacher": 0.996, "clip_grad": 3.0,
          "freeze_last_layer": 1, "epochs": 200, "warmup_epochs": 10, "warmup_teacher_temp": 0.04,
          "teacher_temp": 0.07, "warmup_teacher_temp_epochs": 50}
# --tiny: the CPU test's shapes (a ResNet-18, whose stages are a quarter of ResNet-50's widths)
TINY = {"arch": "resnet18", "stage_dims": (128, 256, 512), "out_dim": 256, "stage_out_dim": 32,
        "stage_bottleneck_dim": 32, "stage_hidden_dim": 64, "global_size": 64, "local_size": 32, "n_local": 2}
TREE_FILES = ("models/scfs.py", "utils/utils.py")  # what the step imports from the checkout


class PublishedTreeError(RuntimeError):
    """The checkout cannot be used: not there, not the published layout, or its imports are missing."""


def tree_problem(tree: Path) -> str | None:
    """Why `tree` is not a checkout of the published code (the files the step imports are missing), or None."""
    missing = [f for f in TREE_FILES if not (Path(tree) / f).is_file()]
    if not missing:
        return None
    return (f"{tree}: no {', '.join(missing)} there; pass a checkout of github.com/skyoux/scfs "
            "(git clone https://github.com/skyoux/scfs)")


def load_tree(tree: Path) -> tuple[ModuleType, ModuleType]:
    """The checkout's `models.scfs` and `utils.utils` modules (the checkout goes first on `sys.path`: its top-level
    packages are named `models` and `utils`)."""
    tree = Path(tree).resolve()
    problem = tree_problem(tree)
    if problem:
        raise PublishedTreeError(f"--tree {problem}")
    sys.path.insert(0, str(tree))
    try:
        return importlib.import_module("models.scfs"), importlib.import_module("utils.utils")
    except ModuleNotFoundError as err:
        raise PublishedTreeError(f"--tree {tree}: its code imports {err.name!r}, which is not installed; "
                                 "pip install torchextractor kornia") from err


def tree_identity(tree: Path) -> str:
    """The checkout's git commit, or (an exported tree without .git) a digest of the files the step runs."""
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip() and (Path(tree) / ".git").exists():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    h = hashlib.sha256()
    for f in TREE_FILES:
        h.update((Path(tree) / f).read_bytes())
    return "sha256:" + h.hexdigest()[:12]


def build(pm: ModuleType, pu: ModuleType, method: str, dev: Any, channels_last: bool,
          shapes: dict[str, Any]) -> dict[str, Any]:
    """Student, teacher, losses and optimizer as `main_scfs.train` builds them (`dino`: backbone + DINO head)."""
    import torch
    import torchvision
    from torch import nn

    class DinoOnly(nn.Module):
        """Backbone and DINO head: the views of one resolution in one batch, as the published wrappers run them."""

        def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
            super().__init__()
            backbone.fc = nn.Identity()
            self.backbone, self.head = backbone, head

        def forward(self, x: Sequence[torch.Tensor]) -> torch.Tensor:
            return self.head(self.backbone(torch.cat(x[:])))

    arch = getattr(torchvision.models, shapes["arch"])
    s_bb, t_bb = arch(), arch()
    embed = s_bb.fc.weight.shape[1]
    out_dim = shapes["out_dim"]

    def stage_heads() -> list[nn.Module]:
        return [pm.DINOShallowHead(in_dim=c, out_dim=shapes["stage_out_dim"],
                                   bottleneck_dim=shapes["stage_bottleneck_dim"],
                                   hidden_dim=shapes["stage_hidden_dim"]) for c in shapes["stage_dims"]]

    if method == "scfs":
        student = pm.StudentWrapper(s_bb, pm.DINOHead(embed, out_dim, use_bn=False, norm_last_layer=True),
                                    *stage_heads())
        teacher = pm.TeacherWrapper(t_bb, pm.DINOHead(embed, out_dim, False), *stage_heads(),
                                    num_crops=shapes["n_local"])
    else:
        student = DinoOnly(s_bb, pm.DINOHead(embed, out_dim, use_bn=False, norm_last_layer=True))
        teacher = DinoOnly(t_bb, pm.DINOHead(embed, out_dim, False))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    student, teacher = student.to(dev, memory_format=fmt), teacher.to(dev, memory_format=fmt)
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    n_crops = shapes["n_local"]
    schedule = (RECIPE["warmup_teacher_temp"], RECIPE["teacher_temp"], RECIPE["warmup_teacher_temp_epochs"],
                RECIPE["epochs"])
    losses = {"final": pm.DINOLoss(out_dim, n_crops + 2, *schedule).to(dev)}
    if method == "scfs":
        for s in ("l2", "l3", "l4"):
            losses[s] = pm.DINOShallowLoss(shapes["stage_out_dim"], n_crops, *schedule).to(dev)
    optimizer = torch.optim.SGD(pu.get_params_groups(student), lr=0, momentum=0.9)
    return {"student": student, "teacher": teacher, "losses": losses, "optimizer": optimizer}


def clip_without_sync(model: Any, clip: float) -> None:
    """`clip_gradients`' arithmetic (each parameter's gradient scaled to norm `clip` where it is larger) without
    reading each norm on the host: the factor min(1, clip / (norm + 1e-6)) multiplies on the device, and a factor
    of exactly 1 leaves a gradient bit-identical."""
    import torch

    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(torch.clamp(clip / (p.grad.norm(2) + 1e-6), max=1.0))


def make_step(parts: dict[str, Any], pu: ModuleType, method: str, views: list[Any], precision: str,
              niter: int, syncs: bool = True) -> Callable[[int], Any]:
    """One iteration of `train_one_epoch`'s loop body on `views`, at epoch 1 of `niter` iterations per epoch.
    `syncs=False` (a diagnostic, not the published step) leaves out the loop's host synchronisations: the
    finiteness check, the logged `.item()`s and the synchronize, and `clip_gradients`' `.item()` per parameter
    (`clip_without_sync`: the same arithmetic); what the syncs cost is the difference of the two."""
    import torch

    student, teacher = parts["student"], parts["teacher"]
    losses, optimizer = parts["losses"], parts["optimizer"]
    dev = views[0].device
    epoch = 1
    b = views[0].shape[0]
    lr = pu.cosine_scheduler(RECIPE["lr"] * b / 256.0, RECIPE["min_lr"], RECIPE["epochs"], niter,
                             warmup_epochs=RECIPE["warmup_epochs"])
    wd = pu.cosine_scheduler(RECIPE["weight_decay"], RECIPE["weight_decay"], RECIPE["epochs"], niter)
    mom = pu.cosine_scheduler(RECIPE["momentum_teacher"], 1, RECIPE["epochs"], niter)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(dev.type, dtype=dtype, enabled=precision != "fp32"):
            if method == "dino":
                s_all = torch.cat([student(views[:2]), student(views[2:])], dim=0)
                final = losses["final"](s_all, teacher(views[:2]), epoch)
                return final, final
            s_final_g, s_l2_g, s_l3_g, s_l4_g, _, _, _ = student(views[:2])
            s_final_l, s_l2_l, s_l3_l, s_l4_l, f_l2, f_l3, f_l4 = student(views[2:])
            t_final_g, t_l2_g, t_l3_g, t_l4_g, t_l2_l, t_l3_l, t_l4_l, _, _, _ = teacher(
                views[:2], f_l2.detach(), f_l3.detach(), f_l4.detach(), None)
            final = losses["final"](torch.cat([s_final_g, s_final_l], dim=0), t_final_g, epoch)
            total = final
            for key, (sg, tg, sl, tl) in {"l2": (s_l2_g, t_l2_g, s_l2_l, t_l2_l),
                                          "l3": (s_l3_g, t_l3_g, s_l3_l, t_l3_l),
                                          "l4": (s_l4_g, t_l4_g, s_l4_l, t_l4_l)}.items():
                loss_g, loss_l = losses[key](sg, tg, sl, tl, epoch)
                total = total + (loss_g + loss_l) * 0.5
            return final, total

    def step(i: int) -> torch.Tensor:
        it = niter * epoch + i
        for k, group in enumerate(optimizer.param_groups):
            group["lr"] = lr[it]
            if k == 0:
                group["weight_decay"] = wd[it]
        final, loss = forward()
        if syncs and not math.isfinite(loss.item()):
            raise FloatingPointError(f"published step {i}: the loss is {loss.item()}")
        clip = pu.clip_gradients if syncs else clip_without_sync
        optimizer.zero_grad()
        if scaler is None:
            loss.backward()
            clip(student, RECIPE["clip_grad"])
            pu.cancel_gradients_last_layer(epoch, student, RECIPE["freeze_last_layer"])
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            clip(student, RECIPE["clip_grad"])
            pu.cancel_gradients_last_layer(epoch, student, RECIPE["freeze_last_layer"])
            scaler.step(optimizer)
            scaler.update()
        with torch.no_grad():
            m = mom[it]
            for q, k in zip(student.parameters(), teacher.parameters(), strict=True):
                k.data.mul_(m).add_((1 - m) * q.detach().data)
        if syncs:
            final.item()  # the published loop logs these three each step
            if dev.type == "cuda":
                torch.cuda.synchronize()
            loss.item()
        optimizer.param_groups[0]["lr"]
        return loss.detach()

    step.forward = forward  # type: ignore[attr-defined]  # the forward alone, for counting its work (count_flops)
    return step


def measure(pm: ModuleType, pu: ModuleType, method: str, batch: int, setting: str, dev: Any, warmup: int,
            steps: int, shapes: dict[str, Any], syncs: bool = True) -> dict[str, Any]:
    """Median step of the published `method` at `batch` and `setting` (`scfs.bench.timing.time_steps`)."""
    import torch

    from scfs.bench.timing import p10_p90, time_steps

    precision, cl = SETTINGS[setting]
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    parts = build(pm, pu, method, dev, cl, shapes)
    fmt = torch.channels_last if cl else torch.contiguous_format
    views = [torch.randn(batch, 3, s, s, device=dev).contiguous(memory_format=fmt)
             for s in [shapes["global_size"]] * 2 + [shapes["local_size"]] * shapes["n_local"]]
    step = make_step(parts, pu, method, views, precision, warmup + steps, syncs)
    clock, last_loss = time_steps(step, warmup, steps, dev.type == "cuda")
    gaps = clock.step_ms(warmup)
    if not math.isfinite(last_loss.item()):  # checked once here too: the diagnostic variant skips it per step
        raise FloatingPointError(f"published step: the last loss is {last_loss.item()}")
    ms = statistics.median(gaps)
    row = {"method": method, "B": batch, "setting": setting, "step_ms": ms, "img_per_s": batch / (ms / 1e3),
           "step_ms_p10_p90": list(p10_p90(gaps)), "warmup_s": clock.warmup_s(warmup), "steps": len(gaps),
           "syncs": syncs}
    if dev.type == "cuda":
        row["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    del parts, views, step, last_loss
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def count_flops(pm: ModuleType, pu: ModuleType, method: str, batch: int, shapes: dict[str, Any]) -> dict[str, Any]:
    """The work of one published step per image, in float32 on the CPU: matmul and convolution FLOPs
    (`torch.utils.flop_counter.FlopCounterMode`, as `scfs.bench.flops` counts ours) of the forward (student,
    teacher with its search, losses) and of the whole step; the backward is their difference (clipping, the
    optimizer and the EMA are elementwise and add none)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    parts = build(pm, pu, method, torch.device("cpu"), False, shapes)
    views = [torch.randn(batch, 3, s, s)
             for s in [shapes["global_size"]] * 2 + [shapes["local_size"]] * shapes["n_local"]]
    step = make_step(parts, pu, method, views, "fp32", 1)
    counts = []
    for fn in (step.forward, lambda: step(0)):  # type: ignore[attr-defined]
        with FlopCounterMode(display=False) as counter:
            fn()
        counts.append(int(counter.get_total_flops()))
    fwd, whole = counts
    return {"method": method, "B": batch, "forward": fwd / batch, "backward": (whole - fwd) / batch,
            "total": whole / batch}


def run_flops(tree: Path, batch: int, tiny: bool = False) -> dict[str, Any]:
    """`count_flops` of both methods at `batch`, their ratio and the checkout's identity."""
    import torch

    pm, pu = load_tree(tree)
    init_process_group(torch.device("cpu"))
    shapes = dict(RECIPE, **(TINY if tiny else {}))
    rows = {m: count_flops(pm, pu, m, batch, shapes) for m in METHODS}
    return {"source": tree_identity(tree), "tiny": tiny, "batch": batch, "rows": rows,
            "ratio": rows["scfs"]["total"] / rows["dino"]["total"]}


def init_process_group(dev: Any) -> None:
    """The one-process group the published code runs in (its losses all-reduce the teacher's centre)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    fd, store = tempfile.mkstemp(prefix="scfs-published-")
    os.close(fd)
    os.unlink(store)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"file://{store}",
                            world_size=1, rank=0)


def run(tree: Path, batches: Sequence[int], settings: Sequence[str], methods: Sequence[str], device: str,
        warmup: int, steps: int, tiny: bool = False, syncs: bool = True) -> dict[str, Any]:
    """Every (method, batch, setting) row of the published step, in this process; a failing row records its
    error and the others go on. `syncs=False`: the diagnostic variant (`make_step`)."""
    import torch

    pm, pu = load_tree(tree)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    torch.backends.cudnn.benchmark = True  # as main_scfs.py sets it
    init_process_group(dev)
    shapes = dict(RECIPE, **(TINY if tiny else {}))
    rows = []
    for method in methods:
        for b in batches:
            for setting in settings:
                if device == "cpu" and SETTINGS[setting][0] == "fp16":
                    rows.append({"method": method, "B": b, "setting": setting,
                                 "error": "fp16 autocast with a GradScaler is a CUDA setting"})
                    continue
                try:
                    rows.append(measure(pm, pu, method, b, setting, dev, warmup, steps, shapes, syncs))
                except Exception as err:  # noqa: BLE001 - one failing row (say, OOM) must not lose the others
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    rows.append({"method": method, "B": b, "setting": setting,
                                 "error": f"{type(err).__name__}: {err}"})
                print(json.dumps(rows[-1]), flush=True)
    return {"tree": str(tree), "source": tree_identity(tree), "torch": torch.__version__, "warmup": warmup,
            "steps": steps, "tiny": tiny, "syncs": syncs, "rows": rows}


def _in_child(args: list[str], what: str) -> dict[str, Any]:
    """`python -m scfs.bench.published ARGS --json OUT` in a child process (the checkout's `models` and `utils`
    packages and its process group stay out of the caller's); its JSON, or {"error": ...} naming `what` failed,
    with the line the child printed that says why."""
    from scfs.bench.records import run_logged, why_it_failed

    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "published.json", Path(tmp) / "published.log"
        rc, _ = run_logged([sys.executable, "-m", "scfs.bench.published", *args, "--json", str(out)], log,
                           timeout=None)
        if rc != 0 or not out.is_file():
            return {"error": f"{what} (exit status {rc}): {why_it_failed(log)}"}
        return json.loads(out.read_text())


def run_subprocess(tree: Path, batches: Sequence[int], settings: Sequence[str], device: str, warmup: int,
                   steps: int, tiny: bool = False) -> dict[str, Any]:
    """`run` in a child process; its result, or {"error": ...} with the line it printed that says why."""
    return _in_child(["--tree", str(tree), "--device", device, "--warmup", str(warmup), "--steps", str(steps),
                      *[a for b in batches for a in ("--batch", str(b))],
                      *[a for s in settings for a in ("--setting", s)], *(["--tiny"] if tiny else [])],
                     "the published step did not run")


def flops_subprocess(tree: Path, batch: int, tiny: bool = False) -> dict[str, Any]:
    """`run_flops` in a child process, or {"error": ...} with the line that says why."""
    return _in_child(["--tree", str(tree), "--flops", "--device", "cpu", "--batch", str(batch),
                      *(["--tiny"] if tiny else [])], "the published step's work was not counted")


def table(result: dict[str, Any]) -> str:
    """Markdown table of the published rows."""
    lines = ["| method | B | setting | step ms | img/s | p10–p90 ms | peak GiB | warm-up s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result.get("rows", []):
        if "error" in r:
            lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | {r['error']} | | | | |")
            continue
        lo, hi = r["step_ms_p10_p90"]
        peak = f"{r['peak_GiB']:.1f}" if r.get("peak_GiB") is not None else "-"
        setting = r["setting"] + ("" if r.get("syncs", True) else ", no host syncs")
        lines.append(f"| {r['method']} | {r['B']} | {setting} | {r['step_ms']:.1f} | {r['img_per_s']:.0f} | "
                     f"{lo:.1f}–{hi:.1f} | {peak} | {r['warmup_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, required=True, help="a checkout of github.com/skyoux/scfs")
    ap.add_argument("--batch", type=int, action="append", help="per-GPU batch (repeatable); default 32 and 64")
    ap.add_argument("--setting", action="append", choices=tuple(SETTINGS), help="repeatable; default bf16_cl")
    ap.add_argument("--method", action="append", choices=METHODS, help="repeatable; default both")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true",
                    help="ResNet-18, 64/32 px views, 2 local, small heads (the CPU test)")
    ap.add_argument("--warmup", type=int, default=8, help="as the published measurement: 8 warm-up steps")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-syncs", dest="syncs", action="store_false",
                    help="diagnostic: leave out the loop's host synchronisations (clip_gradients' .item() per "
                         "parameter, the finiteness check, the logged .item()s, the synchronize); not the "
                         "published step")
    ap.add_argument("--flops", action="store_true",
                    help="count the step's work instead of timing it: FLOPs per image of both methods at the first "
                         "--batch, float32 on the CPU (what `python -m scfs.bench.flops --published-tree` runs)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows there")
    ap.add_argument("--out", type=Path, default=None,
                    help="write a record there: published-<gpu>-<date>-<commit>[-nosyncs].{json,md}")
    args = ap.parse_args(argv)
    if args.flops:
        try:
            result = run_flops(args.tree, (args.batch or [32])[0], args.tiny)
        except PublishedTreeError as err:
            print(f"scfs.bench.published: {err}", file=sys.stderr)
            return 2
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        print(f"published step, B={result['batch']}: " + ", ".join(
            f"{m} {r['total'] / 1e9:.2f} GFLOP per image" for m, r in result["rows"].items())
            + f"; SCFS / DINO {result['ratio']:.3f}")
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("scfs.bench.published: no CUDA GPU (use --device cpu --tiny)", file=sys.stderr)
            return 2
    try:
        result = run(args.tree, args.batch or [32, 64], args.setting or ["bf16_cl"], args.method or list(METHODS),
                     args.device, args.warmup, args.steps, args.tiny, args.syncs)
    except PublishedTreeError as err:
        print(f"scfs.bench.published: {err}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.out:
        save_published_record(result, args.out, args.device)
    print(table(result))
    return 0


def save_published_record(result: dict[str, Any], out: Path, device: str) -> Path:
    """The rows as a benchmark record (`scfs.bench.records`), with the command and the commit that made it."""
    import datetime as dt

    import torch

    from scfs.bench.records import provenance, record_stem, save_record, source_commit

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result["meta"] = {"gpu": gpu, "date": dt.date.today().isoformat(), "commit": source_commit(),
                      "command": "python -m scfs.bench.published " + " ".join(sys.argv[1:])}
    stem = record_stem(out, "published", gpu, result["meta"]["date"], result["meta"]["commit"],
                       "" if result.get("syncs", True) else "-nosyncs")

    def markdown(r: dict[str, Any]) -> str:
        m = r["meta"]
        return "\n".join([f"# The published step ({m['gpu']}, {m['date']})", "",
                          provenance(m["commit"], m["command"]), "",
                          f"Checkout {r['source']}; torch {r['torch']}; {r['warmup']} warm-up + {r['steps']} timed "
                          "steps, median (CUDA events on the GPU)"
                          + ("." if r.get("syncs", True) else "; **without the loop's host synchronisations** (a "
                             "diagnostic: the same arithmetic, not the published step)."), "", table(r), ""])

    out.mkdir(parents=True, exist_ok=True)
    save_record(result, stem, markdown)
    return stem


if __name__ == "__main__":
    sys.exit(main())

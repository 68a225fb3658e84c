"""Whole-training-step benchmark: the real method module trained by the real Lightning Trainer, timed per step.

The step is exactly the training one: `Trainer.fit` runs `on_after_batch_transfer` (views by `BatchMultiCrop` on
the device), `training_step`, backward, gradient clipping, the optimizer step and the EMA update (in
`SelfDistillation.optimizer_step`), plus the online linear monitor, with the configs of `+experiment=imagenet`
(ResNet-50, 2x224 + 8x96, 65,536-way head), `+experiment=cifar10` (`--suite cifar`: ResNet-18 CIFAR stem,
2x32 + 6x16, B=512, epochs/min for 50,000 images) or `+experiment=imagenet_vit` (`--suite vit`: ViT-S/16,
2x224 + 10x96, 65,536-way head, AdamW, B=64; its default path, compiled with CUDA graphs in bf16 as the recipe
ships it, beside the eager step).

Input (`--data synthetic`, default): random uint8 images already on the device (256x256 for ResNet-50, the
published measurement's input; 430x430 for the ViT, the side at which its smallest-scale crops keep full
resolution; 32x32 for CIFAR), served by the on-device loader (`data.on_device`); the views are made inside the step, so
the times include view generation (`aug ms` reports it alone). `--data real --data-root DIR` pulls batches
through the real datamodule instead (CIFAR tree: on-device path; any other ImageFolder: DataLoader workers
with per-sample multi-crop), to show whether the data path is the bottleneck.

Timing: a CUDA event at every `on_train_batch_start`; step time = median gap between consecutive events after
`--warmup` steps (one synchronize at the end), img/s = batch x processes / step. `warmup s` is the wall time
of the warm-up steps (includes torch.compile's compile time on compiled rows). Peak memory = max allocated.
`--devices 2` runs under DDP (re-launched through torchrun when needed); `--compare <1-GPU json>` adds the
scaling efficiency img/s(n) / (n x img/s(1)). The "published" columns are the published implementation's step:
timed first in the same call with `--published-tree PATH` (a checkout of github.com/skyoux/scfs, run by
`scfs.bench.published`; the speed targets are then judged against it), otherwise the reference numbers of
../shared/MEASUREMENTS.md, measured separately.
Each (batch, precision, memory format) also gets its backbone-bound limit (`backbone_ceiling`: the backbones'
work alone), the ceiling no step of that shape can beat; `--no-ceiling` skips it.
No published implementation exists for the ViT suite: its published columns read "-".
Writes benchmarks/results/step-<gpu>-<date>[-cifar|-vit].{json,md}. Usage:
    python -m scfs.bench.step [--suite resnet50|cifar|vit] [--quick] [--devices N] [--out DIR]
    python -m scfs.bench.step --device cpu --tiny --out /tmp/x      # seconds, for the test
    python -m scfs.bench.step --suite vit --device cpu --tiny --out /tmp/x   # a 2-block ViT, default + eager
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scfs.bench.host import host_info, host_phrase
from scfs.bench.records import device_slug, provenance, save_record, source_commit
from scfs.bench.timing import StepClock, p10_p90, time_steps
from scfs.names import CONF_DIR

# ../shared/MEASUREMENTS.md: the published SCFS implementation, one H200, synthetic input (measured separately):
# (step ms, img/s, setting, peak GiB). bf16_cl is the latest re-measurement (2026-12-02, torch 2.11; 8 % faster at
# B=32 than on 2026-12-01, another machine of the same kind: the stricter yardstick), the others 2026-11-30.
PUBLISHED = {
    ("resnet50", "scfs", 32, "bf16"): (118.2, 271, "fp16 autocast, NCHW", None),
    ("resnet50", "dino", 32, "bf16"): (73.8, 433, "fp16 autocast, NCHW", None),
    ("resnet50", "scfs", 64, "bf16"): (139.0, 461, "fp16 autocast, NCHW", 14.4),
    ("resnet50", "dino", 64, "bf16"): (113.4, 564, "fp16 autocast, NCHW", None),
    ("resnet50", "scfs", 32, "bf16_cl"): (91.0, 352, "bf16 + channels_last", 8.0),
    ("resnet50", "dino", 32, "bf16_cl"): (71.3, 449, "bf16 + channels_last", 6.1),
    ("resnet50", "scfs", 64, "bf16_cl"): (114.0, 561, "bf16 + channels_last", 14.7),
    ("resnet50", "dino", 64, "bf16_cl"): (83.2, 769, "bf16 + channels_last", 11.1),
    ("cifar", "scfs", 512, "bf16_cl"): (83.9, 6105, "bf16 + channels_last", None),
    ("cifar", "dino", 512, "bf16_cl"): (52.3, 9798, "bf16 + channels_last", None),
}
# the published rows' settings, as the reference columns name them
SETTING_NAMES = {"bf16_cl": "bf16 + channels_last", "fp16": "fp16 autocast, NCHW", "fp32": "fp32, NCHW"}
# The settings `+experiment=imagenet` / `cifar10` ship (the default path) and the eager path.
DEFAULT_SETTING, EAGER_SETTING = "bf16_cl_graphs", "bf16_cl"
SUITES = ("resnet50", "cifar", "vit")
EXPERIMENT = {"resnet50": "imagenet", "cifar": "cifar10", "vit": "imagenet_vit"}
# Per suite, the setting its experiment ships (default path) and that setting without compile (eager). The ViT
# recipe has no channels_last: a ViT's maps are tokens, NHWC would only reorder the patch embedding's input.
PATHS = {"resnet50": (DEFAULT_SETTING, EAGER_SETTING), "cifar": (DEFAULT_SETTING, EAGER_SETTING),
         "vit": ("bf16_graphs", "bf16")}
# Speed targets of the ResNet-50 step against the published one (bf16 + channels_last), per batch.
SPEEDUP_TARGET, RATIO_TARGET = 2.0, 1.10
SETTINGS = {  # name -> (trainer.precision, backbone.channels_last, compile)
    "fp32": ("32-true", False, False),
    "bf16": ("bf16-mixed", False, False),
    "bf16_cl": ("bf16-mixed", True, False),
    "bf16_cl_compile": ("bf16-mixed", True, True),
    "bf16_cl_graphs": ("bf16-mixed", True, "reduce-overhead"),  # torch.compile + CUDA graphs
    "bf16_cl_cudagraphs": ("bf16-mixed", True, "cudagraphs"),  # compile_backend=cudagraphs: no kernel generation
    "bf16_compile": ("bf16-mixed", False, True),
    "bf16_graphs": ("bf16-mixed", False, "reduce-overhead"),
}
TINY = ["backbone=tiny", "backbone.channels=[8,16,16,32]", "method.out_dim=64", "method.hidden_dim=32",
        "method.bottleneck_dim=16", "++method.stage_out_dim=32", "++method.stage_hidden_dim=16",
        "++method.stage_bottleneck_dim=8", "crops=shapes", "crops.global_size=32", "crops.local_size=16",
        "crops.n_local=2"]
# The ViT suite's tiny network: 2 blocks of width 64 (patch 8: a 4x4 grid at 32 px), both blocks searched.
TINY_VIT = ["backbone=vit_micro", "search.stages=[block1,last]", *TINY[2:]]


def suite_rows(suite: str, quick: bool, tiny: bool, batches: list[int] | None,
               settings: list[str] | None = None) -> list[tuple[str, int, str]]:
    """(method, batch, setting) rows of a suite; the default GPU suite fits in about 4 minutes. `settings`
    replaces the suite's per-batch choice (every batch gets exactly those settings). The ViT suite is its
    recipe's default path beside its eager step (`--quick`: eager only), tiny included: the tiny rows exist to
    run both paths' code."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}: one of {', '.join(SUITES)}")
    bs = batches or ([8] if tiny else [512] if suite == "cifar" else [64] if suite == "vit" else [32, 64])
    if settings:
        return [(m, b, s) for m in ("scfs", "dino") for b in bs for s in settings]
    if suite == "vit":
        sets = [PATHS["vit"][1]] if quick else list(PATHS["vit"])
        return [(m, b, s) for m in ("scfs", "dino") for b in bs for s in sets]
    if tiny:
        return [(m, b, s) for m in ("scfs", "dino") for b in bs for s in ("fp32",)]
    if suite == "cifar":
        sets = ["bf16_cl"] if quick else ["bf16", "bf16_cl", "bf16_cl_compile", "bf16_cl_graphs"]
        return [(m, b, s) for m in ("scfs", "dino") for b in bs for s in sets]
    rows = []
    for m in ("scfs", "dino"):
        for b in bs:
            sets = ["bf16", "bf16_cl"] if quick else (["fp32", "bf16", "bf16_cl"] if b == bs[0] else
                                                       ["bf16", "bf16_cl", "bf16_cl_compile", "bf16_cl_graphs"])
            rows += [(m, b, s) for s in sets]
    return rows


def variants(vary: list[str] | None) -> list[tuple[str, ...]]:
    """A variant is the overrides of one side-by-side run: `KEY=A,B` -> [("KEY=A",), ("KEY=B",)]; several keys,
    each with as many values, are zipped into one variant per position (`K1=A,B` and `K2=C,D` ->
    [("K1=A", "K2=C"), ("K1=B", "K2=D")]), so that a variant can change two keys at once; no `--vary` -> one
    variant without overrides."""
    if not vary:
        return [()]
    columns = []
    for item in vary:
        key, _, values = item.partition("=")
        if not key or not values:
            raise SystemExit(f"--vary {item!r}: expected KEY=A,B (e.g. optim.fused=true,false)")
        columns.append([f"{key}={v}" for v in values.split(",")])
    if len({len(c) for c in columns}) > 1:
        raise SystemExit(f"--vary {' '.join(vary)!r}: every key needs as many values (they are zipped: the n-th "
                         "values of all keys make the n-th variant)")
    return list(zip(*columns, strict=True))


def applicable(cfg: Any, variant: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides of `variant` that a method's config `cfg` (composed without them) has a key for, and those that
    add one (`+key=` / `++key=`): DINO has no stage heads, so a variant of `method.stage_*` keys runs DINO as it is,
    once, beside every SCFS variant (the SCFS / DINO ratio in the same call), instead of failing on a missing key."""
    from omegaconf import OmegaConf

    absent = object()
    return tuple(item for item in variant if item.startswith("+")
                 or OmegaConf.select(cfg, item.partition("=")[0], default=absent) is not absent)


def compose(suite: str, method: str, batch: int, setting: str, args: argparse.Namespace,
            variant: tuple[str, ...] = ()) -> Any:
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    precision, cl, comp = SETTINGS[setting]
    ov = [f"+experiment={EXPERIMENT[suite]}", f"method={method}", f"batch_size={batch}", "global_batch_size=null",
          f"trainer.precision={precision}", f"backbone.channels_last={str(cl).lower()}",
          f"compile={str(bool(comp)).lower()}",
          f"compile_mode={comp if isinstance(comp, str) and comp != 'cudagraphs' else 'default'}",
          f"compile_backend={'cudagraphs' if comp == 'cudagraphs' else 'inductor'}",
          *(["compile_views=false"] if comp == "cudagraphs" else []),  # inductor's fusion of the view ops
          f"trainer.devices={args.devices}", "logger=csv", "trainer.enable_progress_bar=false"]
    if args.data == "synthetic":  # the datamodule is replaced; shapes passes validation and keeps batch_aug on
        ov += ["data=shapes"]
    if args.device == "cpu":
        ov += ["trainer.accelerator=cpu"]
    if args.devices > 1:
        ov += ["+trainer.strategy=ddp"]
    if args.tiny:
        ov += TINY_VIT if suite == "vit" else TINY
    if args.data == "real":
        ov += [f"data.root={args.data_root}"]
    ov += list(args.override or []) + list(variant)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name="config", overrides=ov)


def synthetic_size(suite: str, crops: Any, tiny: bool) -> int:
    """Side of the synthetic (square) training images, which the step crops its views from. CIFAR and the tiny
    networks: the global view's size (the images are that size). ResNet-50: 256, the input of the published
    measurement it is compared with. ViT: nothing to match, so the smallest side at which every crop of the recipe
    keeps full resolution (`crop_min_side`: 430 for 224 px at scale 0.4 and 96 px at 0.05)."""
    from scfs.data.datamodule import crop_min_side

    if suite == "cifar" or tiny:
        return int(crops.global_size)
    if suite == "vit":
        return crop_min_side(crops)
    return 256


class SyntheticData:
    """LightningDataModule stand-in: random uint8 images on the training device, the on-device loader."""

    def __new__(cls, size: int, n: int, batch: int, seed: int = 0):
        import lightning as L
        import torch

        from scfs.data.datamodule import DeviceBatchLoader
        from scfs.data.samplers import EpochSeededRandomSampler

        class _DM(L.LightningDataModule):
            def train_dataloader(self) -> DeviceBatchLoader:
                dev = self.trainer.strategy.root_device
                g = torch.Generator(device="cpu").manual_seed(seed)
                imgs = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g).to(dev)
                labels = torch.arange(n, device=dev) % 10
                sampler = EpochSeededRandomSampler(n, seed, batch, self.trainer.world_size, self.trainer.global_rank)
                return DeviceBatchLoader(imgs, labels, sampler, batch)

        return _DM()


def measure(cfg: Any, args: argparse.Namespace, suite: str) -> dict[str, Any]:
    """Train warmup + steps steps of the configured module; median step time after warm-up."""
    import lightning as L
    import torch

    from scfs.train import build, trainer_kwargs
    from scfs.training.monitors import OnlineLinearMonitor

    cuda = args.device == "cuda"
    clock = StepClock(cuda)

    class Timer(L.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            clock.mark()

        def on_train_end(self, *a: Any) -> None:
            clock.mark()

    prof = StepProfile(args.warmup, args.profile, cuda) if args.profile else None
    L.seed_everything(0, verbose=False)
    dm, model = build(cfg)
    b = int(cfg.batch_size)
    size = synthetic_size(suite, cfg.crops, args.tiny)
    if args.data == "synthetic":
        dm = SyntheticData(size, b * max(args.devices, 1) * 4, b)
    kw = trainer_kwargs(cfg)
    kw.update(max_steps=args.warmup + args.steps, max_epochs=-1, enable_checkpointing=False, logger=False,
              enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    kw.pop("limit_train_batches", None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    callbacks = [Timer(), OnlineLinearMonitor(num_classes=10)] + ([prof] if prof else [])
    trainer = L.Trainer(**kw, callbacks=callbacks)
    trainer.fit(model, datamodule=dm)
    gaps = clock.step_ms(args.warmup)
    ms = statistics.median(gaps)
    world = trainer.world_size
    out = {"step_ms": ms, "img_per_s": b * world / (ms / 1e3), "warmup_s": clock.warmup_s(args.warmup),
           "steps": len(gaps), "world": world, "rank": trainer.global_rank,
           "step_ms_p10_p90": [float(v) for v in p10_p90(gaps)]}
    if cuda:
        out["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        out["aug_ms"] = _aug_ms(model, b, size)
    if prof is not None:
        out["profile"] = prof.summary()
    if suite == "cifar":
        out["epochs_per_min"] = 60.0 / (50_000 / out["img_per_s"])
    del trainer, model, dm
    if cuda:
        torch.cuda.empty_cache()
    return out


def backbone_ceiling(cfg: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The backbone-bound limit of the step at this batch: only the two backbones' work of one SCFS/DINO step,
    nothing else (no heads, losses, search, EMA or view making). The student runs forward and backward on the
    2 global + n local views (each size one batch, as the method's student does), the teacher forward on the 2
    global views, one SGD step, in the row's precision, memory format and compilation (compiled rows: the
    student's and the teacher's passes each one `torch.compile` graph in the row's mode, as the method compiles its
    student and teacher calls; an eager ceiling is itself host-bound and a compiled step beats it). No real step
    of that shape can beat it, so
    `step / ceiling` says how much of the step is left outside the backbones. Timed like `measure`: median of CUDA
    event gaps after the warm-up (`time_steps`). A ViT goes the same way, views of both sizes through its patch
    embedding and blocks to the CLS token (position embeddings interpolated per view size, drop path as
    configured); the maps of its searched blocks come out of that same pass (only their final norm is left out
    here)."""
    import torch
    from omegaconf import OmegaConf

    from scfs.models.backbone import build_backbone

    cuda = args.device == "cuda"
    dev = torch.device("cuda" if cuda else "cpu")
    bcfg = OmegaConf.to_container(cfg.backbone, resolve=True)
    fmt = torch.channels_last if bcfg.get("channels_last") else torch.contiguous_format
    student = build_backbone(bcfg).to(dev, memory_format=fmt)
    teacher = build_backbone(bcfg).to(dev, memory_format=fmt)
    teacher.requires_grad_(False)
    b, crops = int(cfg.batch_size), cfg.crops
    gen = torch.Generator(device=dev).manual_seed(0)

    def views(size: int, n: int) -> torch.Tensor:
        return torch.randn(n * b, 3, size, size, device=dev, generator=gen).contiguous(memory_format=fmt)

    glob, loc = views(int(crops.global_size), 2), views(int(crops.local_size), int(crops.n_local))
    opt = torch.optim.SGD(student.parameters(), lr=1e-3, momentum=0.9)
    mode = str(cfg.get("compile_mode", "default")) if cfg.get("compile") else None
    step = _backbones_step(student, teacher, opt, glob, loc, "bf16" in str(cfg.trainer.precision), mode)
    clock, _ = time_steps(step, args.warmup, args.steps, cuda)
    ms = statistics.median(clock.step_ms(args.warmup))
    del step, student, teacher, opt
    if cuda:
        torch.cuda.empty_cache()
    return {"ceiling_step_ms": ms, "ceiling_img_per_s": b / (ms / 1e3)}


def _backbones_step(student: Any, teacher: Any, opt: Any, glob: Any, loc: Any, bf16: bool,
                    compile_mode: str | None = None) -> Callable[[int], None]:
    """`backbone_ceiling`'s step: the teacher on the global views without grad, the student forward and backward on
    the global and local views, one optimizer step. `compile_mode` (None: eager) compiles the student's pass and
    the teacher's, one graph each ("default" or a `torch.compile` mode)."""
    import torch

    def student_pass(glob: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        loss = student.pooled(glob).float().mean()
        return loss + student.pooled(loc).float().mean() if loc.numel() else loss

    def teacher_pass(glob: torch.Tensor) -> torch.Tensor:
        return teacher.pooled(glob)

    graphs = compile_mode == "reduce-overhead" and glob.device.type == "cuda"
    if compile_mode is not None:
        kw: dict[str, Any] = {"dynamic": False} | ({"mode": compile_mode} if compile_mode != "default" else {})
        student_pass, teacher_pass = torch.compile(student_pass, **kw), torch.compile(teacher_pass, **kw)

    def step(i: int) -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(glob.device.type, dtype=torch.bfloat16, enabled=bf16):
            with torch.no_grad():
                teacher_pass(glob)
            loss = student_pass(glob, loc)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def StepProfile(start: int, n: int, cuda: bool) -> Any:  # noqa: N802 - a Callback factory (Lightning imported lazily)
    """Callback: `torch.profiler` over `n` steps after `start` warm-up steps. Where a step's time goes when it is
    not FLOPs: operator and kernel-launch counts per step (launch-bound small kernels show up as many launches
    and a low GPU busy share) and the top operators by self time (GPU time on CUDA, CPU time otherwise)."""
    import lightning as L
    import torch
    from torch.profiler import ProfilerActivity, profile

    class _Profile(L.Callback):
        def __init__(self) -> None:
            self.prof: Any = None
            self.steps = 0

        def on_train_batch_start(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step == start and self.prof is None:
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                self.prof = profile(activities=acts)
                self.prof.__enter__()

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if self.prof is not None and self.steps < n:
                self.steps += 1
                if self.steps == n:
                    if cuda:
                        torch.cuda.synchronize()
                    self.prof.__exit__(None, None, None)

        def summary(self) -> dict[str, Any]:
            if self.prof is None or self.steps < n:
                return {"error": "profiler did not cover the requested steps"}
            out = summarize_profile(self.prof.key_averages(), n, cuda)
            for part, ops in part_op_counts(self.prof.events(), n).items():
                out["parts"].setdefault(part, {})["aten_ops"] = ops
            return out

    return _Profile()


def part_op_counts(events: Any, n: int) -> dict[str, float]:
    """aten ops per step inside each named part of the step (the `scfs/` record_function ranges of the method
    module), nested ops included as in the step's total, an op inside nested parts counted in each of them; the
    ops outside every part (the backward on autograd's thread, the optimizer, Lightning's loop) under `rest`. On
    a host-bound step the op count is the part's cost in dispatches, which the host time of a profile inflates."""
    counts: dict[str, int] = {}
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        parts, p = [], e.cpu_parent
        while p is not None:
            if p.name.startswith("scfs/"):
                parts.append(p.name.removeprefix("scfs/"))
            p = p.cpu_parent
        for part in parts or ["rest"]:
            counts[part] = counts.get(part, 0) + 1
    return {k: v / n for k, v in counts.items()}


def summarize_profile(ev: Any, n: int, cuda: bool) -> dict[str, Any]:
    """Per-step numbers from `profile.key_averages()` (`ev`) over `n` steps.

    key_averages keeps a CPU entry and a GPU entry for each `record_function` range (same key, other device type):
    the CPU one carries the host time and the kernels launched inside it, the GPU one (a user annotation) only the
    span from its first kernel's start to its last kernel's end. GPU busy time is the sum over kernel, memcpy and
    memset entries alone: adding the CPU ops' or the annotations' device time counts kernels twice and idle gaps."""
    from torch.autograd import DeviceType

    def on_cpu(e: Any) -> bool:
        return e.device_type == DeviceType.CPU

    def annotation(e: Any) -> bool:
        return bool(getattr(e, "is_user_annotation", False)) or e.key.startswith(("scfs/", "Optimizer.", "## "))

    aten = sum(e.count for e in ev if on_cpu(e) and e.key.startswith("aten::"))
    launch_names = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    launches = sum(e.count for e in ev if e.key in launch_names)
    ops = [e for e in ev if on_cpu(e) and not annotation(e)]
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    top = sorted(ops, key=lambda e: getattr(e, key, 0.0), reverse=True)[:12]
    out: dict[str, Any] = {
        "steps": n, "aten_ops_per_step": aten / n, "kernel_launches_per_step": launches / n,
        # host ops by the time of their own kernels (GPU) or their own host time (CPU)
        "top": [{"op": e.key, "count_per_step": e.count / n, "self_ms_per_step": getattr(e, key, 0.0) / 1e3 / n}
                for e in top],
        # where the launches come from: the most frequent aten ops (each launches one kernel or more)
        "frequent": [{"op": e.key, "count_per_step": e.count / n} for e in sorted(
            (e for e in ops if e.key.startswith("aten::")), key=lambda e: e.count, reverse=True)[:15]]}
    # the named parts of the step (record_function ranges of the method module): host ms, GPU ms of the kernels launched
    # inside (same thread: the backward's kernels are launched by autograd's thread and count under "rest"), and
    # the GPU span of the range (first kernel start to last kernel end: kernel time plus the gaps between them)
    spans = {e.key: e.device_time_total for e in ev if not on_cpu(e) and e.key.startswith("scfs/")}
    out["parts"] = {e.key.removeprefix("scfs/"): {
        "cpu_ms": e.cpu_time_total / 1e3 / n, "gpu_ms": e.device_time_total / 1e3 / n,
        "gpu_span_ms": spans.get(e.key, 0.0) / 1e3 / n} for e in ev if on_cpu(e) and e.key.startswith("scfs/")}
    if cuda:
        kernels = [e for e in ev if not on_cpu(e) and not annotation(e)]
        busy = sum(e.device_time_total for e in kernels) / 1e3 / n
        out["gpu_busy_ms_per_step"] = busy
        out["parts"]["rest"] = {"cpu_ms": 0.0, "gpu_ms": busy - sum(p["gpu_ms"] for p in out["parts"].values()),
                                "gpu_span_ms": 0.0}
        # where the host time goes when the step is host-bound (busy / step well under 1): ops and runtime calls
        # (cudaLaunchKernel, graph replays, dynamo's cache lookups) by their own host time
        out["host_top"] = [{"op": e.key, "count_per_step": e.count / n, "self_cpu_ms_per_step":
                            e.self_cpu_time_total / 1e3 / n}
                           for e in sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]]
        out["top_kernels"] = [{"kernel": e.key, "count_per_step": e.count / n,
                               "ms_per_step": e.device_time_total / 1e3 / n}
                              for e in sorted(kernels, key=lambda e: e.device_time_total, reverse=True)[:10]]
    return out


def _aug_ms(model: Any, b: int, size: int) -> float | None:
    """Median ms of the module's BatchMultiCrop alone on a (b,3,size,size) uint8 batch (part of the step)."""
    import torch

    if model.batch_aug is None:
        return None
    x = torch.randint(0, 256, (b, 3, size, size), dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        model.batch_aug(x, generator=gen)
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        model.batch_aug(x, generator=gen)
        e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ts)


def published_setting(setting: str) -> str:
    """The eager setting a row's published reference was measured at: the row's precision and memory format with
    its compilation taken off (`bf16_cl_graphs`, `bf16_cl_compile` and `bf16_cl_cudagraphs` -> `bf16_cl`)."""
    base = setting.split(" ")[0]
    for suffix in ("_cudagraphs", "_graphs", "_compile"):
        base = base.removesuffix(suffix)
    return base


def published_reference(suite: str, method: str, b: int, setting: str,
                        same_call: dict | None = None) -> dict[str, Any] | None:
    """The published step a row of ours is compared with: the published row timed in the same call
    (`same_call`, the record's `published_same_call`) where there is one, else ../shared/MEASUREMENTS.md's
    (`PUBLISHED`); None where neither has one (the ViT suite, say)."""
    base = published_setting(setting)
    for r in (same_call or {}).get("rows", []):
        if (r.get("method"), r.get("B"), r.get("setting")) == (method, b, base) and "step_ms" in r and r.get(
                "syncs", True):
            return {"step_ms": r["step_ms"], "img_per_s": round(r["img_per_s"]), "peak_GiB": r.get("peak_GiB"),
                    "setting": SETTING_NAMES.get(base, base), "source": "same call"}
    pub = PUBLISHED.get((suite, method, b, base))
    if pub is None:
        return None
    return {"step_ms": pub[0], "img_per_s": pub[1], "setting": pub[2], "peak_GiB": pub[3],
            "source": "MEASUREMENTS.md"}


def dino_beside(rows: list[dict], row: dict) -> dict | None:
    """The DINO row a row's SCFS / DINO ratio is taken against: same batch and setting, and of the row's variant the
    keys DINO has (it runs once without the others, `applicable`), so every SCFS variant is set against it."""
    words = row["setting"].split()
    found = [d for d in rows if d["method"] == "dino" and d["B"] == row["B"] and "step_ms" in d
             and d["setting"].split()[:1] == words[:1] and set(d["setting"].split()) <= set(words)]
    return max(found, key=lambda d: len(d["setting"].split()), default=None)


def add_reference(rows: list[dict], suite: str, compare: dict | None, same_call: dict | None = None) -> None:
    """Published reference, SCFS/DINO ratio and (with a 1-process record) the scaling efficiency."""
    base = {(r["method"], r["B"], r["setting"]): r for r in (compare or {}).get("rows", []) if "img_per_s" in r}
    for r in rows:
        pub = published_reference(suite, r["method"], r["B"], r["setting"], same_call)
        if pub:
            r["published"] = pub
        dino = dino_beside(rows, r)
        if r["method"] == "scfs" and dino and "step_ms" in r:
            r["ratio_scfs_dino"] = r["step_ms"] / dino["step_ms"]
        one = base.get((r["method"], r["B"], r["setting"]))
        if one and "img_per_s" in r and r.get("world", 1) > 1:
            r["scaling_efficiency"] = r["img_per_s"] / (r["world"] * one["img_per_s"])


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"# Training-step benchmark ({m['suite']}): {m['gpu']}, {m['date']}", ""]
    if m.get("commit") or m.get("command"):
        lines += [provenance(m.get("commit"), m.get("command")), ""]
    lines += [
        f"torch {m['torch']}, lightning {m['lightning']}; {m['processes']} process(es); data {m['data']}; "
        f"{m['warmup']} warm-up + {m['steps']} timed steps; median step (CUDA events on GPU, wall clock on "
        "CPU). Published = the published implementation, "
        + ("timed first in this call (`--published-tree`: the table after this one) where its row ran, else "
           "measured separately (../shared/MEASUREMENTS.md); `same call` marks the former"
           if _timed(result.get("published_same_call")) else "measured separately (../shared/MEASUREMENTS.md)")
        + ("; it has no ViT, so there is none for this suite (\"-\"). " if m["suite"] == "vit" else ". ")
        + "Backbone-bound = the two backbones' work of the step alone (student forward + backward on every view, "
        "teacher forward on the global views, one SGD step; same batch, precision, memory format and "
        "compilation): the ceiling of the step, and `of it` our share of that ceiling."
        + (f" {host_phrase(m['host'])}" if m.get("host") else
           f" Host: {m['host_us_per_op']:.1f} us to dispatch one tiny op (the yardstick for host-bound steps)."
           if m.get("host_us_per_op") else "")
        + (f" Overrides on every row: `{' '.join(m['overrides'])}`." if m.get("overrides") else ""), "",
        "| method | B/GPU | setting | step ms | img/s | warm-up s | peak GiB | aug ms | SCFS/DINO | "
        "published ms (img/s) | scaling eff. | epochs/min | backbone-bound img/s | of it |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | error: {r['error'][:80]} |||||||||||")
            continue
        pub = r.get("published")

        def f(k: str, fmt: str = "{:.1f}", r: dict = r) -> str:
            return fmt.format(r[k]) if r.get(k) is not None else "-"

        ref = (f"{pub['step_ms']:.1f} ({pub['img_per_s']}, {pub['setting']}"
               + (", same call)" if pub.get("source") == "same call" else ")")) if pub else "-"
        ceiling = f("ceiling_img_per_s", "{:.0f}") if "ceiling_error" not in r else f"- ({r['ceiling_error'][:80]})"
        lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | {f('step_ms')} | {f('img_per_s', '{:.0f}')} | "
                     f"{f('warmup_s')} | {f('peak_GiB')} | {f('aug_ms', '{:.2f}')} | {f('ratio_scfs_dino', '{:.2f}')}"
                     f" | {ref} | {f('scaling_efficiency', '{:.2f}')} | {f('epochs_per_min')} | "
                     f"{ceiling} | {f('of_ceiling', '{:.0%}')} |")
    same_call = result.get("published_same_call")
    if same_call:
        from scfs.bench.published import table

        lines += ["", "The published step, timed in this call before the rows above (`scfs.bench.published`: "
                  "`main_scfs.py`'s loop body on views already on the device, the networks unwrapped (no DDP) "
                  f"in one process, {same_call.get('warmup', '?')} warm-up + {same_call.get('steps', '?')} timed "
                  f"steps; checkout {same_call.get('source', '?')}):", ""]
        lines += [table(same_call)] if same_call.get("rows") else [f"error: {same_call.get('error', '?')}"]
    prof_rows = [r for r in result["rows"] if "profile" in r and "error" not in r["profile"]]
    if prof_rows:
        lines += ["", "Profile (`--profile`): per step, op and kernel-launch counts, GPU busy ms (kernels, copies and "
                  "memsets only) and its share of the step, the top host ops by the time of their own kernels (GPU) "
                  "or their own host time (CPU).",
                  "", "| method | B/GPU | setting | aten ops | kernel launches | GPU busy ms | busy / step | "
                  "top ops (self ms) |", "|---|---|---|---|---|---|---|---|"]
        for r in prof_rows:
            p = r["profile"]
            top = ", ".join(f"{t['op']} {t['self_ms_per_step']:.2f}" for t in p["top"][:5])
            busy = f"{p['gpu_busy_ms_per_step']:.1f}" if "gpu_busy_ms_per_step" in p else "-"
            share = f"{p['gpu_busy_ms_per_step'] / r['step_ms']:.2f}" if "gpu_busy_ms_per_step" in p else "-"
            lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | {p['aten_ops_per_step']:.0f} | "
                         f"{p['kernel_launches_per_step']:.0f} | {busy} | {share} | {top} |")
        names = sorted({k for r in prof_rows for k in r["profile"].get("parts", {})})
        if names:
            lines += ["", "Parts of the step (record_function ranges of the module), per step: host ms / GPU ms of the "
                      "kernels launched inside / GPU span ms (first kernel start to last kernel end). The backward's "
                      "kernels come from autograd's thread, so they count under rest (GPU busy minus the parts: "
                      "backward, clipping, optimizer, monitor); views appear from the 2nd profiled step on. Last, "
                      "the aten ops dispatched inside the part (rest: outside every part, the backward's included).",
                      "",
                      "| method | B/GPU | setting | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
            for r in prof_rows:
                parts = r["profile"].get("parts", {})
                cells = [_part_cell(parts[k]) if k in parts else "-" for k in names]
                lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | " + " | ".join(cells) + " |")
        host_rows = [r for r in prof_rows if r["profile"].get("host_top")]
        if host_rows:
            lines += ["", "Where the host time goes (CUDA rows): ops by their own host time per step, with calls per "
                      "step; a step whose GPU is idle part of the time is bound by these.", ""]
            lines += [f"- {r['method']} B={r['B']} {r['setting']}: " + ", ".join(
                f"{t['op']} {t['self_cpu_ms_per_step']:.1f} ms ({t['count_per_step']:.0f}x)"
                for t in r["profile"]["host_top"][:8]) for r in host_rows]
    checks = targets(result)
    if checks:
        lines += ["", "Targets (ResNet-50 step against the published one, bf16 + channels_last: timed in this call "
                  "where the target says `same call`, else ../shared/MEASUREMENTS.md's; default "
                  f"path = `{DEFAULT_SETTING}`, what `+experiment=imagenet` ships; eager = `{EAGER_SETTING}`):", "",
                  "| B | target | measured | verdict |", "|---|---|---|---|"]
        lines += [f"| {c['B']} | {c['target']} | {c['measured']} | {c['verdict']} |" for c in checks]
    lines += [f"{label}: {m[key]}" for key, label in (("made_by", "\nMade by"), ("note", "\nNote")) if m.get(key)]
    return "\n".join(lines) + "\n"


def _timed(same_call: dict | None) -> bool:
    """Whether a record's published step (`published_same_call`) has a timed row."""
    return any("step_ms" in r for r in (same_call or {}).get("rows", []))


def _part_cell(part: dict[str, float]) -> str:
    """One part's cell of the parts table: host ms / GPU ms / GPU span ms, then its aten ops when counted."""
    times = (" / ".join(f"{part[k]:.1f}" for k in ("cpu_ms", "gpu_ms", "gpu_span_ms")) if "cpu_ms" in part
             else "-")
    return times + (f" / {part['aten_ops']:.0f} ops" if "aten_ops" in part else "")


def targets(result: dict) -> list[dict[str, Any]]:
    """The speed targets of the ResNet-50 step, each met or missed by how much, from the rows present: default path
    >= SPEEDUP_TARGET x the published img/s at no more peak memory, SCFS / DINO <= RATIO_TARGET on it, eager >=
    the published step."""
    if result["meta"].get("suite") != "resnet50":
        return []
    by = {(r["method"], r["B"], r["setting"]): r for r in result["rows"] if "step_ms" in r}
    same_call = result.get("published_same_call")
    out: list[dict[str, Any]] = []

    def check(b: int, target: str, measured: float, goal: float, higher: bool, unit: str, fmt: str = "{:.0f}") -> None:
        met = measured >= goal if higher else measured <= goal
        miss = (goal - measured) / goal if higher else (measured - goal) / goal
        out.append({"B": b, "target": target, "measured": fmt.format(measured) + unit, "met": met,
                    "verdict": "met" if met else f"missed by {100 * miss:.0f} %"})

    for b in sorted({r["B"] for r in result["rows"]}):
        ref = published_reference("resnet50", "scfs", b, EAGER_SETTING, same_call)
        pub = (ref["step_ms"], ref["img_per_s"], ref["setting"], ref["peak_GiB"]) if ref else None
        same = ", same call" if ref and ref["source"] == "same call" else ""
        scfs, dino = by.get(("scfs", b, DEFAULT_SETTING)), by.get(("dino", b, DEFAULT_SETTING))
        eager = by.get(("scfs", b, EAGER_SETTING))
        if pub and scfs:
            check(b, f"SCFS default >= {SPEEDUP_TARGET:.1f}x published ({SPEEDUP_TARGET * pub[1]:.0f} img/s{same})",
                  scfs["img_per_s"], SPEEDUP_TARGET * pub[1], True, " img/s")
            if pub[3] and scfs.get("peak_GiB") is not None:
                check(b, f"SCFS default peak memory <= published ({pub[3]:.1f} GiB{same})", scfs["peak_GiB"], pub[3],
                      False, " GiB", "{:.1f}")
        if scfs and dino:
            check(b, f"SCFS / DINO on the default path <= {RATIO_TARGET:.2f}", scfs["step_ms"] / dino["step_ms"],
                  RATIO_TARGET, False, "", "{:.2f}")
        if pub and eager:
            check(b, f"SCFS eager >= published ({pub[1]} img/s{same})", eager["img_per_s"], pub[1], True, " img/s")
            if eager.get("aug_ms"):  # the published timing had no data pipeline; ours makes the views in the step
                views_out = b * 1000 / (eager["step_ms"] - eager["aug_ms"])
                out[-1]["measured"] += f" ({views_out:.0f} without making the views)"
    return out


def save(result: dict, stem: Path) -> str:
    return save_record(result, stem, markdown)


def run(args: argparse.Namespace) -> dict:
    import lightning
    import torch

    rank = int(os.environ.get("RANK", "0"))
    gpu = "cpu" if args.device == "cpu" else device_slug(torch.cuda.get_device_name())
    stamp = dt.date.today().isoformat()
    suite = args.suite
    name = f"step-{gpu}-{stamp}" + ("" if suite == "resnet50" else f"-{suite}") + (
        f"-x{args.devices}" if args.devices > 1 else "") + ("-tiny" if args.tiny else "")
    meta = {"suite": suite, "gpu": gpu if args.device == "cpu" else torch.cuda.get_device_name(), "date": stamp,
            "torch": torch.__version__, "lightning": lightning.__version__, "python": platform.python_version(),
            "processes": args.devices, "data": args.data, "warmup": args.warmup, "steps": args.steps,
            "command": "python -m scfs.bench.step " + " ".join(sys.argv[1:]), "commit": source_commit(),
            "host": host_info(args.device), "overrides": list(args.override or [])}
    meta["host_us_per_op"] = meta["host"]["us_per_op"]
    compare = json.loads(Path(args.compare).read_text()) if args.compare else None
    rows: list[dict] = []
    result = {"meta": meta, "rows": rows}
    rows_todo = [r for r in suite_rows(suite, args.quick, args.tiny, args.batch, args.setting)
                 if not args.method or r[0] in args.method]
    if args.published_tree is not None and rank == 0:
        result["published_same_call"] = same_call_published(args, rows_todo)
    ceilings: dict[tuple, dict[str, Any]] = {}
    done: set[tuple] = set()
    plain: dict[tuple, Any] = {}  # each row's config without its variant, composed once for all its variants
    for (method, b, setting), variant in itertools.product(rows_todo, variants(args.vary)):
        if variant:
            with contextlib.suppress(Exception):  # a config that does not compose: the row's own compose records it
                if (method, b, setting) not in plain:
                    plain[method, b, setting] = compose(suite, method, b, setting, args)
                variant = applicable(plain[method, b, setting], variant)
        if (method, b, setting, variant) in done:  # the method has none of the variant's keys: it ran already
            continue
        done.add((method, b, setting, variant))
        row: dict[str, Any] = {"method": method, "B": b, "setting": " ".join((setting, *variant))}
        # each row compiles afresh: the rows share modules' forward code objects, so two batch sizes in one process
        # would fill dynamo's per-code-object graph limit and the later row's last stage head would run eager
        # (dynamo then logs 'hit config.recompile_limit' on the second batch size)
        torch._dynamo.reset()
        try:
            row.update(measure(compose(suite, method, b, setting, args, variant), args, suite))
        except Exception as err:  # one failing row (say, OOM) must not lose the others
            if args.device == "cuda":
                torch.cuda.empty_cache()
            row["error"] = f"{type(err).__name__}: {err}"
            if args.strict:
                raise
        if args.ceiling and "error" not in row:
            key = (b, SETTINGS[setting])  # precision, memory format and compilation, as the row's
            if key not in ceilings:
                try:
                    ceilings[key] = backbone_ceiling(compose(suite, method, b, setting, args, variant), args)
                except Exception as err:  # noqa: BLE001 - the row itself stands without its ceiling
                    ceilings[key] = {"ceiling_error": f"{type(err).__name__}: {err}"}
            row.update(ceilings[key])
            if row.get("ceiling_img_per_s"):
                row["of_ceiling"] = row["img_per_s"] / row["ceiling_img_per_s"]
        rows.append(row)
        add_reference(rows, suite, compare, result.get("published_same_call"))
        if rank == 0:
            print(json.dumps(row), flush=True)
            save(result, args.out / name)
    if rank == 0:
        print(markdown(result))
    return result


def same_call_published(args: argparse.Namespace, rows_todo: list[tuple[str, int, str]]) -> dict[str, Any]:
    """The published step at each batch of `rows_todo` and the eager setting their references were measured at
    (`published_setting`), timed before our rows by `scfs.bench.published` in a child process."""
    from scfs.bench import published

    settings = sorted({published_setting(s) for _, _, s in rows_todo} & set(published.SETTINGS))
    batches = sorted({b for _, b, _ in rows_todo})
    if not settings:
        return {"error": "none of the rows' settings has a published counterpart ("
                         + ", ".join(published.SETTINGS) + ")"}
    print(f"[step] the published step first: batches {batches}, settings {settings}", flush=True)
    return published.run_subprocess(args.published_tree, batches, settings, args.device, args.published_warmup,
                                     args.steps, tiny=args.tiny)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=SUITES, default="resnet50",
                    help="resnet50: +experiment=imagenet; cifar: +experiment=cifar10; vit: +experiment=imagenet_vit")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--devices", type=int, default=1, help="processes (GPUs) under DDP")
    ap.add_argument("--tiny", action="store_true", help="tiny network and crops (CPU test)")
    ap.add_argument("--quick", action="store_true", help="no fp32 and no compiled rows")
    ap.add_argument("--batch", type=int, action="append", help="per-GPU batch (repeatable); default per suite")
    ap.add_argument("--setting", action="append", choices=tuple(SETTINGS),
                    help="only these settings (repeatable), e.g. --setting bf16_cl --setting bf16_cl_graphs")
    ap.add_argument("--data", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--data-root", default=None, help="with --data real: the prepared data folder")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compare", default=None, help="1-process JSON record: adds the scaling efficiency")
    ap.add_argument("--strict", action="store_true", help="raise instead of recording a failing row")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile N steps after the warm-up: op / kernel-launch counts and top ops per row")
    ap.add_argument("--method", action="append", choices=("scfs", "dino"), help="only these methods (repeatable)")
    ap.add_argument("--vary", action="append", metavar="KEY=A,B",
                    help="run every row once per value of a config key, side by side (e.g. optim.fused=true,false); "
                         "repeated, the keys' values are zipped into variants; a method whose config lacks a key "
                         "runs without it, once (DINO beside SCFS variants of method.stage_*)")
    ap.add_argument("--override", action="append", metavar="KEY=VALUE",
                    help="Hydra override applied to every row, e.g. method.stage_pooled_bn=false (repeatable)")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="skip the backbone-bound limit (both backbones' work alone) measured per batch and setting")
    ap.add_argument("--published-tree", type=Path, default=None, metavar="PATH",
                    help="a checkout of github.com/skyoux/scfs: time the published step first, in this call, and "
                         "judge the targets against it (scfs.bench.published)")
    ap.add_argument("--published-warmup", type=int, default=8, help="the published step's warm-up steps")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    if args.suite == "vit" and any(SETTINGS[st][1] for st in args.setting or []):
        ap.error(f"--suite vit --setting {next(st for st in args.setting if SETTINGS[st][1])}: channels_last is a CNN "
                 "memory format the ViT recipe does not ship; use one of "
                 + ", ".join(st for st, v in SETTINGS.items() if not v[1]))
    if args.data == "real" and not args.data_root:
        ap.error("--data real needs --data-root")
    if args.published_tree is not None:
        if args.suite != "resnet50":
            ap.error(f"--published-tree with --suite {args.suite}: the published step is the ResNet-50 one "
                     "(its stage heads are ResNet-50's); use --suite resnet50")
        from scfs.bench.published import tree_problem

        problem = tree_problem(args.published_tree)
        if problem:
            ap.error(f"--published-tree {problem}")
    if args.data == "real" and not (Path(args.data_root) / "train").is_dir():  # else every row records an error
        ap.error(f"--data-root {args.data_root}: no train/ folder there; pass the prepared data folder, e.g. "
                 "the output of `python -m scfs.data.prepare cifar10 --archive ... --out data/cifar10`")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("scfs.bench.step: no CUDA GPU (use --device cpu --tiny)", file=sys.stderr)
            return 2
    if args.devices > 1 and "LOCAL_RANK" not in os.environ:  # one process per GPU through torchrun
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.devices}",
               "-m", "scfs.bench.step", *(argv if argv is not None else sys.argv[1:])]
        os.execv(sys.executable, cmd)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Multi-crop augmentation throughput: batched ``BatchMultiCrop`` vs per-sample ``MultiCrop`` + default_collate.

Why: per-sample torchvision v2 transforms cost ~9 ms/sample on our CPUs and cap GPU training at ~2,500 img/s.
Configs (DINO defaults otherwise): cifar-b128 (B=128, 32 px source, 2x32 + 6x16), cifar-b512 (B=512, same
views), imagenet-b64 (B=64, 224 px source, 2x224 + 8x96). Times are per batch, median of ``--reps`` after
``--warmup`` calls, on random uint8 images already on the device (the augmentation alone: no decode, no
host-to-device copy). Per-sample MultiCrop runs on the CPU only and is timed on ``--per-sample-n`` images, then
scaled to B (it is linear in B). CPU rows use ``--threads`` intra-op threads (default 1: one dataloader worker's
share; oversubscribed shared cores make multi-threaded elementwise ops erratic). kornia is timed only where it
is importable and an equivalent pipeline exists; none is written yet, so it is reported as skipped.
Usage: python -m scfs.bench.augment [--device cpu|cuda|all] [--reps N] [--warmup N] [--per-sample-n N]
       [--threads N] [--configs NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import default_collate

from scfs.data.batch_aug import BatchMultiCrop
from scfs.data.multicrop import MultiCrop


@dataclass(frozen=True)
class Config:
    name: str
    batch: int
    src: int
    global_size: int
    local_size: int
    n_local: int

    @property
    def views(self) -> str:
        return f"2x{self.global_size}+{self.n_local}x{self.local_size}"

    def kwargs(self) -> dict[str, int]:
        return dict(global_size=self.global_size, local_size=self.local_size, n_local=self.n_local)


CONFIGS = [
    Config("cifar-b128", 128, 32, 32, 16, 6),
    Config("cifar-b512", 512, 32, 32, 16, 6),
    Config("imagenet-b64", 64, 224, 224, 96, 8),
]


def median_time(fn: Callable[[], object], reps: int, warmup: int, device: torch.device) -> float:
    """Median seconds per call; synchronises around each call on CUDA (kernels run asynchronously)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_config(cfg: Config, devices: list[torch.device], reps: int, warmup: int, per_sample_n: int) -> list[dict]:
    rows = []
    imgs = torch.randint(
        0, 256, (cfg.batch, 3, cfg.src, cfg.src), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    if any(d.type == "cpu" for d in devices):
        mc = MultiCrop(**cfg.kwargs())
        sub = imgs[: min(per_sample_n, cfg.batch)]
        t = median_time(lambda: default_collate([mc(im) for im in sub]), reps, min(warmup, 1), torch.device("cpu"))
        rows.append(dict(cfg=cfg, device="cpu", method="MultiCrop per-sample", sec=t * cfg.batch / len(sub)))
    for dev in devices:
        aug = BatchMultiCrop(**cfg.kwargs())
        x = imgs.to(dev)
        gen = torch.Generator(device=dev).manual_seed(0)
        t = median_time(lambda x=x, aug=aug, gen=gen: aug(x, gen), reps, warmup, dev)
        rows.append(dict(cfg=cfg, device=dev.type, method="BatchMultiCrop", sec=t))
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table; speed-up is against per-sample MultiCrop on one CPU process of the same config."""
    base = {r["cfg"].name: r["sec"] for r in rows if r["method"].startswith("MultiCrop")}
    lines = [
        "| config | B | source | views | device | method | ms/batch | img/s | speed-up |",
        "|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        c = r["cfg"]
        sp = f"{base[c.name] / r['sec']:.1f}x" if c.name in base else "-"
        lines.append(
            f"| {c.name} | {c.batch} | {c.src} px | {c.views} | {r['device']} | {r['method']} | "
            f"{r['sec'] * 1e3:.1f} | {c.batch / r['sec']:,.0f} | {sp} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--device", choices=["cpu", "cuda", "all"], default="all", help="all = cpu, plus cuda when available"
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--per-sample-n", type=int, default=32, help="images timed for per-sample MultiCrop")
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    ap.add_argument("--configs", nargs="*", default=[c.name for c in CONFIGS], choices=[c.name for c in CONFIGS])
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    devices = [] if args.device == "cuda" else [torch.device("cpu")]
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    elif args.device == "cuda":
        print("no CUDA device available", file=sys.stderr)
        return 1
    gpu = f", GPU {torch.cuda.get_device_name()}" if any(d.type == "cuda" for d in devices) else ""
    print(
        f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}{gpu}; reps={args.reps} "
        f"warmup={args.warmup} per-sample-n={args.per_sample_n}",
        flush=True,
    )
    if importlib.util.find_spec("kornia") is None:
        print("kornia: not importable, skipped", flush=True)
    else:
        print("kornia: importable, but no equivalent pipeline is implemented here yet; skipped", flush=True)
    rows = []
    for cfg in CONFIGS:
        if cfg.name in args.configs:
            rows += bench_config(cfg, devices, args.reps, args.warmup, args.per_sample_n)
            print(f"{cfg.name}: done", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

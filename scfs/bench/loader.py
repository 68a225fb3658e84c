"""Throughput of the ImageFolder training data path: images per second delivered to the training step.

Why: images of different sizes (ImageNet, `data=folder`) cannot use the on-GPU batched views; their views are
made per sample on the host, so the host must feed the step rates the speed issue targets (ResNet-50 SCFS:
>= 542 img/s at B=32 and >= 922 img/s at B=64 on one H200). This measures img/s of the real loader
(`SSLDataModule.train_dataloader`, the `+experiment=imagenet` crops: 2x224 + 8x96 with DINO's photometric
augmentations, batches pinned when a GPU is present, as in training) for each worker count asked for, and the
workers one needs per target rate from the best per-worker rate.

Delivered = the views of a batch ready on the training device (`--device`, default cuda when present): the
batch is moved there and the module's on-device share of the data path runs (`data.colour_on_device`: the colour
ops; `data.decode=gpu`: decoding the JPEGs with `decode_jpeg` and all the views), synchronised per batch, so
`--decode cpu gpu` compares the two decode paths end to end. With `--device cpu` that share runs in the main
process, as it does when training on the CPU. `--device none` (the default without a GPU) times the loader
alone for decode=cpu rows (the host's side, for the workers-per-target table); decode=gpu rows then decode on
the CPU, the only device there is.

Input: `--root` an ImageFolder tree (`train/<class>/*.jpg`), or `--photos` a flat folder of photos (e.g. the
100 ImageNet sample photos from `python -m scfs.data.prepare imagenet-samples ...`): a temporary tree of links
to them, repeated `--repeat` times, so that a few batches exist. Warm-up: the first `--warmup` batches of each
worker count are not timed (worker start-up, first decodes). Writes benchmarks/results/loader-<host>-<date>.{json,md}.
Usage: python -m scfs.bench.loader --photos data/imagenet-samples [--workers 0 1 2] [--colour workers device]
       [--decode cpu gpu] [--decode-min-side auto 0] [--batch 32] [--batches 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scfs.bench.records import save_record
from scfs.data.prepare import PrepareError, repeat_photos
from scfs.names import DATA_DECODE

TARGETS = {"ResNet-50 SCFS B=32 (2x published)": 542, "ResNet-50 SCFS B=64 (2x published)": 922}


def crops_config() -> dict[str, Any]:
    """The `+experiment=imagenet` crops, from the Hydra configs (one source of truth)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=imagenet"])
    return OmegaConf.to_container(cfg.crops, resolve=True)  # type: ignore[return-value]


def deliver(batch: Any, aug: Any, device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
    """The views of one loader batch on `device`, as the training module gets them (`on_after_batch_transfer`):
    moved there, then colour ops (uint8 crops) or decoding and all views (`data.decode=gpu`) done there."""
    from scfs.data.encoded import EncodedImages, decode_images

    sample, labels = batch
    if isinstance(sample, EncodedImages):
        images, _ = decode_images(sample, labels.to(device, non_blocking=True), device)
        return aug(images, generator=generator)["views"]
    views = [v.to(device, non_blocking=True) for v in sample["views"]]
    if views[0].dtype == torch.uint8:
        views = aug.colour(views, generator=generator)["views"]
    return views


def measure(root: Path, workers: int, batch: int, batches: int, warmup: int, decode_min_side: Any,
            colour_on_device: bool = False, decode: str = "cpu", device: str = "none") -> dict[str, Any]:
    """img/s of `batches` timed batches after `warmup` untimed ones (the sampler cycles through epochs): time
    between consecutive batches whose views are ready on `device` (`none`: as the loader yields them; the CPU
    for decode=gpu)."""
    from scfs.data.batch_aug import BatchMultiCrop
    from scfs.data.datamodule import SSLDataModule

    data = {"name": "folder", "root": str(root), "decode_min_side": decode_min_side,
            "colour_on_device": colour_on_device, "decode": decode}
    crops = crops_config()
    dm = SSLDataModule(data, crops, batch_size=batch, num_workers=workers, seed=0)
    dm.setup("fit")
    loader = dm.train_dataloader()
    finish = device != "none" or decode == "gpu"
    dev = torch.device("cpu" if device == "none" else device)
    aug = BatchMultiCrop(**{k: tuple(v) if isinstance(v, list) else v for k, v in crops.items()})
    gen = torch.Generator(device=dev).manual_seed(0)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: list[float] = []
    it = iter(loader)
    t_last = time.perf_counter()
    while len(times) < warmup + batches:
        try:
            sample = next(it)
        except StopIteration:  # next epoch (the same order: irrelevant to throughput)
            it = iter(loader)
            continue
        if finish:
            views = deliver(sample, aug, dev, gen)
            sync()
            assert views[0].dtype == torch.float32
        else:
            views = sample[0]["views"]
        assert views[0].shape[0] == batch
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
    del it, loader
    timed = times[warmup:]
    per_batch = statistics.median(timed)
    return {"decode": decode, "device": str(dev) if finish else "none", "workers": workers, "batch": batch,
            "decode_min_side": str(decode_min_side) if decode == "cpu" else "-",
            "colour": "device" if colour_on_device or decode == "gpu" else "workers", "batches": len(timed),
            "batch_s_median": per_batch, "img_per_s": batch / per_batch,
            "img_per_s_mean": batch * len(timed) / sum(timed),
            "views": [list(v.shape[1:]) for v in views]}


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"# Training data path (ImageFolder, multi-crop): {m['host']}, {m['date']}", "",
             f"Command: `{m['command']}`. {m['cpus']} CPU cores, torch {m['torch']}; images: {m['images']}; crops "
             "2x224 + 8x96 with DINO's photometric augmentations (`+experiment=imagenet`). img/s = batch / median "
             f"time between batches whose views are ready on the device ({m.get('device', 'none')}; none: "
             "decode=cpu rows as the loader yields them, decode=gpu rows on the CPU), after the warm-up.", "",
             "decode = where the JPEGs are decoded: `cpu` in the DataLoader workers, `gpu` on the device "
             "(`data.decode=gpu`: workers read the bytes; decode_jpeg on the batch, then every view, on the device). "
             "colour = where flip, colour jitter, grayscale, blur, solarize and normalisation run: in the workers "
             "(`MultiCrop`) or on the training device (`data.colour_on_device=true`: workers only crop, uint8). "
             "The device's share is inside these times (synchronised per batch) unless the device is none.", "",
             "| decode | colour | workers | decode_min_side | img/s (median) | img/s (mean) |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r.get('decode', 'cpu')} | {r['colour']} | {r['workers']} | {r['decode_min_side']} | "
                     f"{r['img_per_s']:.1f} | {r['img_per_s_mean']:.1f} |")
    rates = result.get("per_worker") or {}
    if rates:
        cols = list(rates)
        lines += ["", "Workers (busy cores) needed per target, from the best img/s per busy core of each colour "
                  "path (" + "; ".join(f"{c}: {rates[c]['rate']:.1f} img/s, {rates[c]['from']}" for c in cols) + "):",
                  "", "| target | img/s | " + " | ".join(f"colour in {c}" for c in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        for name, rate in TARGETS.items():
            lines.append(f"| {name} | {rate} | " + " | ".join(str(math.ceil(rate / rates[c]["rate"])) for c in cols)
                         + " |")
    return "\n".join(lines) + "\n"


def per_worker_rate(rows: list[dict], cpus: int) -> dict[str, dict[str, Any]]:
    """Per colour path, the img/s one busy core delivers: the best of the main-process rows (1 core) and each
    worker row divided by min(workers, cores) (workers beyond the cores share them)."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("decode", "cpu") != "cpu":  # decoding on the device: the host's cores are not the limit
            continue
        cores = 1 if r["workers"] == 0 else min(r["workers"], cpus)
        rate = r["img_per_s"] / cores
        if rate > best.get(r["colour"], {}).get("rate", 0.0):
            best[r["colour"]] = {"rate": rate, "from": f"{r['workers']} worker(s), decode_min_side="
                                                      f"{r['decode_min_side']}"}
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--root", type=Path, help="ImageFolder tree with train/<class>/*")
    src.add_argument("--photos", type=Path, help="flat folder of photos (linked into a temporary tree)")
    ap.add_argument("--repeat", type=int, default=4, help="with --photos: link every photo this many times")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--decode-min-side", nargs="+", default=["auto"],
                    help="data.decode_min_side values to compare (auto, 0 = full size, N)")
    ap.add_argument("--colour", nargs="+", choices=("workers", "device"), default=["workers", "device"],
                    help="where the colour ops run: workers (MultiCrop) and/or device (data.colour_on_device)")
    ap.add_argument("--decode", nargs="+", choices=DATA_DECODE, default=["cpu"],
                    help="where JPEGs are decoded: cpu (DataLoader workers) and/or gpu (data.decode=gpu, on --device)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "none",
                    help="the training device the views are delivered to: cuda, cpu, or none = the loader alone for "
                         "decode=cpu (default: cuda when present, else none)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    if args.root is not None and not (args.root / "train").is_dir():
        ap.error(f"--root {args.root}: no train/<class>/ folders there; pass an ImageFolder tree, or --photos DIR")
    if args.photos is not None and not args.photos.is_dir():
        ap.error(f"--photos {args.photos}: not a folder; pass a folder of photos (e.g. data/imagenet-samples)")
    torch.set_num_threads(1)  # the main process is one core like a worker; no intra-op threads fighting workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    meta = {"host": platform.node() or "cpu", "date": time.strftime("%Y-%m-%d"), "cpus": cpus, "device": args.device,
            "torch": torch.__version__, "command": "python -m scfs.bench.loader " + " ".join(argv or sys.argv[1:])}
    with tempfile.TemporaryDirectory() as tmp:
        if args.photos is not None:
            try:
                root = Path(tmp) / "tree"
                repeat_photos(args.photos, root, args.repeat, val_per_class=0, log=lambda _: None)
            except PrepareError as err:
                ap.error(str(err))
            meta["images"] = f"{args.photos} (linked {args.repeat}x into a tree)"
        else:
            root = args.root
            meta["images"] = str(root)
        result: dict[str, Any] = {"meta": meta, "rows": []}
        stem = args.out / f"loader-{'cpu' if not torch.cuda.is_available() else 'gpuhost'}-{meta['date']}{args.tag}"
        # decode=gpu makes every view on the device: one colour path, decode_min_side does not apply
        runs = [("cpu", colour, dms) for colour in args.colour for dms in args.decode_min_side if "cpu" in args.decode]
        runs += [("gpu", "device", "-")] if "gpu" in args.decode else []
        for decode, colour, dms in runs:
            for w in args.workers:
                row = measure(root, w, args.batch, args.batches, args.warmup, dms if decode == "cpu" else 0,
                              colour == "device" and decode == "cpu", decode, args.device)
                result["rows"].append(row)
                result["per_worker"] = per_worker_rate(result["rows"], cpus)
                print(f"decode={decode} colour={colour} workers={w} decode_min_side={dms}: {row['img_per_s']:.1f} "
                      "img/s", flush=True)
                save_record(result, stem, markdown)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fast linear probe's training loop, per-minibatch Lightning steps (the loop `LinearProbe` runs on
`feature_loader`) against one Lightning step per epoch on features kept on the device (`FeatureProbe`, what
`train_linear_on_features` runs), at CIFAR-10 size: 50000 x 512 random features, 10 classes, batch 256.

    python -m scfs.bench.probe                      # both cases, 4 epochs a run (the first is warm-up), 3 runs
    python -m scfs.bench.probe --cases single --epochs 6 --repeats 5 --device cuda
    python -m scfs.bench.probe --device cuda --out benchmarks/results   # also a record: probe-<device>-<date>-<commit>

Cases: `single` is the final run (one head on the whole split), `grid` the sweep (the default 21 (lr, wd) heads on
90 % of it). Each run trains `--epochs` epochs through a Lightning Trainer; an epoch's time is the wall clock
between Lightning's epoch-start and epoch-end hooks, the first epoch of every run is left out as warm-up, and the
table gives the median over the rest of all runs, per epoch and per minibatch step (epoch / ceil(N / batch)).
Both paths run with the thread count `train_linear_on_features` picks. Random features train the same arithmetic
as real ones: the loop's cost does not depend on the values.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

from scfs.bench.records import provenance, record_stem, save_record, source_commit
from scfs.config import uses_cuda
from scfs.eval.linear import EpochOrder, FeatureProbe, GridSGD, LinearProbe, _trainer, feature_loader

LR_GRID = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]  # conf/eval/linear.yaml
WD_GRID = [0.0, 1e-4, 1e-3]
CASES = ("single", "grid")
PATHS = ("per-minibatch", "per-epoch", "arithmetic")


class EpochClock(L.Callback):
    """Wall clock of every training epoch (synchronised with the device, so queued work is counted)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t0 = 0.0

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._t0)


def case_grid(case: str) -> tuple[list[float], list[float], float]:
    """(lrs, wds, fraction of the split trained on) of a case."""
    if case == "single":
        return [0.1], [0.0], 1.0
    pairs = [(lr, wd) for lr in LR_GRID for wd in WD_GRID]
    return [a for a, _ in pairs], [b for _, b in pairs], 0.9


def arithmetic_run(probe: LinearProbe, features: torch.Tensor, labels: torch.Tensor, epochs: int,
                   batch_size: int, seed: int, dev: torch.device) -> list[float]:
    """Seconds of each epoch of the minibatches' own work (gather, forward, loss, backward, `GridSGD` step) in a
    bare loop with no Lightning and no logging: the floor under both paths; what they spend above it is their
    host work."""
    probe = probe.to(dev).train()
    f, y = features.float().to(dev), labels.long().to(dev)
    opt = GridSGD(probe.heads.parameters(), [lr * batch_size / 256 for lr in probe.lrs], probe.wds, 0.9)
    order = EpochOrder(f.shape[0], batch_size, seed)
    seconds = []
    for _ in range(epochs):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        (perm,) = list(order)
        for idx in perm.to(dev).split(batch_size):
            loss = probe.grid_loss(probe(f.index_select(0, idx)), y.index_select(0, idx))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds.append(time.perf_counter() - t0)
    return seconds


def one_run(path: str, features: torch.Tensor, labels: torch.Tensor, lrs: Sequence[float], wds: Sequence[float],
            epochs: int, batch_size: int, accelerator: str, seed: int = 0) -> list[float]:
    """Seconds of each epoch of one training run of `path` (one of `PATHS`)."""
    L.seed_everything(seed, verbose=False)
    args = (features.shape[1], int(labels.max()) + 1, None, list(lrs), batch_size, 0.9, list(wds), epochs)
    threads = torch.get_num_threads()
    if batch_size * features.shape[1] * args[1] < 1 << 24:  # the thread policy of train_linear_on_features
        torch.set_num_threads(1)
    try:
        if path == "arithmetic":
            return arithmetic_run(LinearProbe(*args, feature_norm="bn"), features, labels, epochs, batch_size, seed,
                                  torch.device("cuda" if uses_cuda(accelerator) else "cpu"))
        return _fit(path, args, features, labels, epochs, batch_size, accelerator, seed)
    finally:
        torch.set_num_threads(threads)


def _fit(path: str, args: tuple[Any, ...], features: torch.Tensor, labels: torch.Tensor, epochs: int,
         batch_size: int, accelerator: str, seed: int) -> list[float]:
    """Seconds of each epoch of a Lightning run of the per-minibatch or the per-epoch path."""
    clock = EpochClock()
    trainer = _trainer({"trainer": {"accelerator": accelerator}}, epochs, None, None, True, 0)
    trainer.callbacks.append(clock)
    if path == "per-minibatch":
        probe: LinearProbe = LinearProbe(*args, feature_norm="bn")
        loader: Any = feature_loader(features, labels, batch_size, True, seed)
    else:
        probe = FeatureProbe(*args, feature_norm="bn").attach(features, labels)
        loader = torch.utils.data.DataLoader(EpochOrder(features.shape[0], batch_size, seed), batch_size=None)
    trainer.fit(probe, loader)
    return clock.seconds


def measure(cases: Sequence[str], n: int, dim: int, classes: int, epochs: int, repeats: int, batch_size: int,
            accelerator: str) -> list[dict[str, Any]]:
    """One row per (case, path): median ms per epoch and per minibatch step, warm-up epochs left out."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(n, dim, generator=gen).relu()
    labels = torch.randint(0, classes, (n,), generator=gen)
    rows = []
    for case in cases:
        lrs, wds, frac = case_grid(case)
        m = round(frac * n)
        f, y = features[:m], labels[:m]
        steps = math.ceil(m / batch_size)
        kept: dict[str, list[float]] = {path: [] for path in PATHS}
        for _ in range(repeats):  # the paths take turns, so a change in the machine's load hits both
            for path in PATHS:
                kept[path] += one_run(path, f, y, lrs, wds, epochs, batch_size, accelerator)[1:]
        for path in PATHS:
            ms = 1000.0 * statistics.median(kept[path])
            rows.append({"case": case, "path": path, "heads": len(lrs), "samples": m, "steps_per_epoch": steps,
                         "epochs_timed": len(kept[path]), "ms_per_epoch": ms, "ms_per_step": ms / steps})
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of `measure`'s rows: each path's time a step, its host work (the time above the arithmetic
    row) and its speed-ups over the per-minibatch path, on the whole step and on the host work."""
    by = {(r["case"], r["path"]): r["ms_per_step"] for r in rows}
    lines = ["| case | heads | samples | steps / epoch | path | epochs timed | ms / epoch | ms / step | "
             "host ms / step | speed-up (step) | speed-up (host work) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        old, floor = by.get((r["case"], "per-minibatch"), math.nan), by.get((r["case"], "arithmetic"), math.nan)
        if r["path"] == "arithmetic":
            host, up, up_host = "-", "-", "-"
        else:
            h = r["ms_per_step"] - floor
            # at or under the floor: the host work hides behind the device's (or within the noise of the floor)
            host, up = (f"{h:.3f}" if h > 0 else "~0"), f"{old / r['ms_per_step']:.1f}x"
            up_host = f"{(old - floor) / h:.1f}x" if h > 0 else "-"
        lines.append(f"| {r['case']} | {r['heads']} | {r['samples']} | {r['steps_per_epoch']} | {r['path']} | "
                     f"{r['epochs_timed']} | {r['ms_per_epoch']:.1f} | {r['ms_per_step']:.3f} | {host} | {up} | "
                     f"{up_host} |")
    return "\n".join(lines)


def record_markdown(result: dict[str, Any]) -> str:
    """The record's markdown: what ran where (command, commit, device, sizes), then `table`."""
    m = result["meta"]
    return (f"# Linear-probe training loop: {m['device']}, {m['date']}\n\n"
            f"{provenance(m['commit'], m['command'])} torch {m['torch']}, lightning {m['lightning']}. "
            f"Random features, {m['n']} x {m['dim']}, {m['classes']} classes, batch {m['batch_size']}; "
            f"{m['epochs']} epochs a run (the first left out as warm-up), {m['repeats']} run(s), the paths taking "
            "turns; median over the timed epochs. `per-minibatch` = one Lightning step a minibatch on a feature "
            "loader; `per-epoch` = one Lightning step an epoch on features kept on the device (`FeatureProbe`, "
            "what `fast=true` runs); `arithmetic` = the minibatches' own work in a bare loop, the floor under "
            "both.\n\n" + table(result["rows"]) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=4, help="epochs a run; the first is warm-up")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="cpu", help="Lightning accelerator: cpu, cuda or auto")
    ap.add_argument("--out", type=Path, default=None, help="folder for a record (<stem>.json + .md); none if unset")
    a = ap.parse_args(argv)
    if a.epochs < 2 or a.repeats < 1:
        ap.error(f"--epochs {a.epochs} --repeats {a.repeats}: need at least 2 epochs (1 warm-up) and 1 run")
    warnings.filterwarnings("ignore", module="lightning")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    rows = measure(a.cases, a.n, a.dim, a.classes, a.epochs, a.repeats, a.batch_size, a.device)
    print(table(rows), flush=True)
    if a.out is not None:
        cuda, commit, date = uses_cuda(a.device), source_commit(), datetime.date.today().isoformat()
        stem = record_stem(a.out, "probe", torch.cuda.get_device_name() if cuda else "cpu", date, commit)
        meta = {"command": "python -m scfs.bench.probe " + " ".join(sys.argv[1:] if argv is None else argv),
                "commit": commit or "unknown", "date": date,
                "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.processor() or 'unknown'})",
                "torch": torch.__version__, "lightning": L.__version__, "n": a.n, "dim": a.dim,
                "classes": a.classes, "batch_size": a.batch_size, "epochs": a.epochs, "repeats": a.repeats}
        save_record({"meta": meta, "rows": rows}, stem, record_markdown)
        print(f"record: {stem}.json, .md", flush=True)


if __name__ == "__main__":
    main()

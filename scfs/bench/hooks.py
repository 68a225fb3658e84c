"""Host time of the per-step training hooks: `OnlineLinearMonitor.on_train_batch_end` against the eager autograd
step that computes the same update (nn.Linear, F.cross_entropy, backward, torch.optim.SGD with momentum, the
accuracy counts).

    python -m scfs.bench.hooks                      # CPU: feature dim 2048 / 1000 classes / B=64, 512 / 10 / 512
    python -m scfs.bench.hooks --device cuda        # host time per call with an empty launch queue

The median over `--calls` calls after `--warmup` calls (the reference's and the monitor's interleaved), in
microseconds of host time per call, plus the non-view ATen ops of one call (on CUDA, the kernel launches). On CUDA
the queue is drained before each timed call, so the number is the launch and Python cost the training step's host
thread pays, not the kernels' time. On CPU it includes the arithmetic, which dominates at the large size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

CASES: tuple[tuple[int, int, int], ...] = ((2048, 1000, 64), (512, 10, 512))  # (feature dim, classes, batch)


class AutogradLinearStep:
    """The plain eager update with autograd (nn.Linear, F.cross_entropy, backward, SGD): what the monitor's
    closed-form step computes, and the reference the benchmark compares it against."""

    def __init__(self, dim: int, num_classes: int, device: torch.device, lr: float = 0.1,
                 momentum: float = 0.9) -> None:
        self.linear = nn.Linear(dim, num_classes).to(device)
        self.optimizer = torch.optim.SGD(self.linear.parameters(), lr=lr, momentum=momentum)
        self.counts: torch.Tensor | None = None

    def __call__(self, feats: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.enable_grad(), torch.autocast(feats.device.type, enabled=False):
            logits = self.linear(feats.detach().float())
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            n = labels.shape[0]
            step = torch.stack(((logits.argmax(1) == labels).sum().float(), torch.full_like(loss, float(n)),
                                loss.detach().float() * n))
            self.counts = step if self.counts is None else self.counts + step


def _medians_us(fns: dict[str, Callable[[], None]], warmup: int, calls: int,
                device: torch.device) -> dict[str, float]:
    """Median host µs per call of each function, the calls interleaved round by round so that a drift of the
    machine's speed (other load, clocks) falls on all of them alike."""
    cuda = device.type == "cuda"
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}


class _KernelCount(TorchDispatchMode):
    """Counts the ATen ops that reach a backend and are not views: on CUDA each is a kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if not func.is_view and func.namespace == "aten":
            self.n += 1
        return func(*args, **(kwargs or {}))


def _kernels(fn: Callable[[], None]) -> int:
    with _KernelCount() as count:
        fn()
    return count.n


def _case(dim: int, classes: int, batch: int, dev: torch.device, warmup: int, calls: int) -> dict[str, Any]:
    from scfs.training.monitors import OnlineLinearMonitor

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(batch, dim, generator=g).to(dev)
    labels = torch.randint(0, classes, (batch,), generator=g).to(dev)
    ref = AutogradLinearStep(dim, classes, dev)
    monitor = OnlineLinearMonitor(num_classes=classes)
    module = SimpleNamespace(last_features=feats, last_labels=labels)
    trainer = SimpleNamespace(datamodule=None)
    calls_of = {"reference": lambda: ref(feats, labels),
                "monitor": lambda: monitor.on_train_batch_end(trainer, module, None, None, 0)}
    row: dict[str, Any] = {"dim": dim, "classes": classes, "batch": batch, "device": str(dev)}
    for name, us in _medians_us(calls_of, warmup, calls, dev).items():
        row[f"{name}_us"] = us
        row[f"{name}_kernels"] = _kernels(calls_of[name])
    return row


def online_linear(cases: Sequence[tuple[int, int, int]] = CASES, device: str = "cpu", warmup: int = 20,
                  calls: int = 200) -> list[dict[str, Any]]:
    """Per case, the median host µs per call of the autograd reference and of the monitor's hook, and the
    non-view ATen ops (kernels) of one call of each."""
    return [_case(dim, classes, batch, torch.device(device), warmup, calls) for dim, classes, batch in cases]


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| device | feature dim | classes | batch | autograd reference µs | OnlineLinearMonitor µs | speed-up | "
             "kernels (reference / monitor) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['device']} | {r['dim']} | {r['classes']} | {r['batch']} | {r['reference_us']:.0f} | "
                     f"{r['monitor_us']:.0f} | {r['reference_us'] / r['monitor_us']:.2f}x | "
                     f"{r['reference_kernels']} / {r['monitor_kernels']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m scfs.bench.hooks", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--case", type=int, nargs=3, action="append", metavar=("DIM", "CLASSES", "BATCH"),
                   help="instead of the default cases; repeatable")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    cases = [tuple(c) for c in args.case] if args.case else CASES
    rows = online_linear(cases, args.device, args.warmup, args.calls)
    threads = f", {torch.get_num_threads()} threads" if args.device == "cpu" else ""
    print(f"Host time per call, median of {args.calls} after {args.warmup} (torch {torch.__version__}{threads})\n")
    print(table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()

"""The host a benchmark ran on: its CPU's model, the cores it may use, and two yardsticks of its speed.

Why: a lent GPU of one kind comes on hosts whose CPUs differ. A first compile is mostly single-threaded Python
(dynamo, AOTAutograd, inductor's lowering and code generation), so the same compile row read 68 s on one H100
host and 73-101 s on another, where every row of the GPU smoke also ran 1.3-1.45x longer
(`compile-h100-2026-12-06-*.md`, `gpu-smoke-2026-12-06-*.md`).
A record that names its host's CPU and how fast that host ran a fixed piece of work lets a reader tell the
code's change from the machine's; the compile benchmark, the end-to-end benchmark, the step benchmark and the GPU
smoke write it.

    python -m scfs.bench.host            # one JSON line
    python -m scfs.bench.host --phrase   # the sentence the records print
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from scfs.training.host_load import usable_cpus

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model as /proc/cpuinfo names it (its first `model name`), else the platform's processor string,
    else "unknown"."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.processor() or "unknown"


def _python_work(n: int = 20_000) -> int:
    """A fixed piece of pure-Python work of the kind a compiler does: small objects, string keys, dict look-ups
    and a sort."""
    table: dict[str, tuple[int, str, list[int]]] = {}
    for i in range(n):
        key = f"node_{i % 997}_{i}"
        table[key] = (i, key.upper(), [i, i + 1])
    users = sum(len(v[2]) for v in table.values() if v[0] % 3)
    return users + len(sorted(table, key=lambda k: (len(k), k[-3:])))


def python_ms(repeats: int = 9) -> float:
    """Milliseconds this host takes for `_python_work`: the fastest of `repeats` runs after two warm-up runs (a
    busy neighbour or a clock still ramping up only adds time, so the fastest run is the host's own speed; how busy
    the host was is `scfs.training.host_load`'s to say). The yardstick of a compile's Python: lower is faster."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} is invalid: give at least 1")
    for _ in range(2):
        _python_work()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        _python_work()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def us_per_op(device: str, n: int = 5000) -> float:
    """Host cost of dispatching one tiny op (an in-place add on 16 elements), in microseconds: the yardstick of
    this machine's CPU for a host-bound step, whose time grows with (ops per step) x (this). Steps measured on
    different machines compare only with it: one commit ran the ResNet-50 SCFS step at 84.3 and 98.7 ms on two
    H200 machines (step-h200-2026-11-30-ab.md)."""
    import torch

    x = torch.zeros(16, device=device)
    for _ in range(200):
        x.add_(1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host_info(device: str = "cpu") -> dict[str, Any]:
    """`cpu` (the model), `cores` (those this process may use; None where the platform does not say),
    `python_ms` (`python_ms`), and `us_per_op` (`us_per_op`) on `op_device`: the benchmarks whose rows run in
    processes of their own take it on the CPU, so that they do not hold the GPU themselves."""
    cpus = usable_cpus()
    return {"cpu": cpu_model(), "cores": len(cpus) if cpus else None, "python_ms": round(python_ms(), 2),
            "us_per_op": round(us_per_op(device), 2), "op_device": device}


def host_phrase(host: dict[str, Any] | None) -> str:
    """The records' sentence on their host; empty for a record without one."""
    if not host:
        return ""
    cores = f", {host['cores']} usable cores" if host.get("cores") else ""
    parts = []
    if host.get("python_ms") is not None:
        parts.append(f"a fixed piece of Python in {host['python_ms']:.1f} ms")
    if host.get("us_per_op") is not None:
        parts.append(f"{host['us_per_op']:.1f} us to dispatch one tiny op on the {host.get('op_device', 'cpu')}")
    speed = f"; {' and '.join(parts)} (`scfs.bench.host`: lower is faster; compare records by it)" if parts else ""
    return f"Host: {host.get('cpu', 'unknown')}{cores}{speed}."


def host_tag(host: dict[str, Any] | None) -> str:
    """A short note of the host's Python yardstick for a table cell (`scfs.bench.targets`); empty without one."""
    if not host or host.get("python_ms") is None:
        return ""
    return f"host Python {host['python_ms']:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scfs.bench.host", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="where the dispatch yardstick runs (cpu, cuda)")
    ap.add_argument("--phrase", action="store_true", help="print the records' sentence instead of JSON")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"{ap.prog}: error: --device {args.device} needs a CUDA GPU and this machine has none; "
                  "drop --device or use --device cpu", file=sys.stderr)
            return 2
    host = host_info(args.device)
    print(host_phrase(host) if args.phrase else json.dumps(host))
    return 0


if __name__ == "__main__":
    sys.exit(main())

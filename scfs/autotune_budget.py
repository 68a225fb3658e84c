"""`compile_autotune_ms`: how long inductor times each candidate launch config of a kernel at its first run.

A compiled graph's first run benchmarks every Triton kernel that has more than one candidate launch config (block
sizes, warps) and keeps the fastest; the choice is cached on disk beside the kernel, so later runs skip it. Inductor's
benchmarker gives each candidate up to 25 ms of timed launches (`max_benchmark_duration`, after a warm-up and a
runtime estimate): a kernel that runs longer than a quarter of a millisecond uses all of it. On one H100 the ImageNet
recipe's first step spent 5 to 7 s in these benchmarks at the student's forward's first run and 4.6 to 4.8 s at its
backward's, on the first step's critical path (docs/RESULTS.md "Compile time"). `compile_autotune_ms=5` gives each
candidate 5 ms instead: fewer launches to tell candidates apart. The compile benchmark's `quick-tune` row measured
it at the recipe's batch (3.55 s off the first steps, no steady cost within run-to-run noise); the recipes keep
inductor's own, since over a long run a step even 0.1 % slower would cost more than that saves.

The budget is a keyword of the benchmarker, not an option of `torch._inductor.config`, so it is not part of any cache
key: a run and its compile helpers, with the budget or without, share the cache's graphs and launch-config choices.
It is set per process where the method is built (`scfs.training.build.build`), as `compile_inductor` is: the run,
its helpers (whose first runs benchmark the teacher's and the losses' kernels) and the compile benchmark alike.

`use` wraps `benchmark_gpu` of inductor's process-wide benchmarker object (`torch._inductor.runtime.benchmarking
.benchmarker`, the one `CachingAutotuner.bench` calls; its `benchmark` hands every GPU timing to `benchmark_gpu`) so
that every call gets `max_benchmark_duration=ms` (inductor's own benchmarker) and `rep=ms` (Triton's `do_bench`, the
fallback benchmarker: its timed repetitions); CPU timings go to `benchmark_cpu` and are left as they are. The next
`use` puts the original back first. A torch whose benchmarker has neither keyword is refused in one line.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

BENCHMARKING = "torch._inductor.runtime.benchmarking"
DEFAULT_MS = 25  # inductor's own budget per candidate (`InductorBenchmarker.benchmark_gpu`'s max_benchmark_duration)


class AutotuneBudgetError(ValueError):
    """`compile_autotune_ms` that this torch cannot honour or that is not a positive number, said in one line."""


def check(ms: Any) -> float | None:
    """`ms` as a budget in milliseconds (None: inductor's own); AutotuneBudgetError naming the fix otherwise."""
    if ms is None:
        return None
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0:
        raise AutotuneBudgetError(f"compile_autotune_ms={ms!r}: give a positive number of milliseconds (e.g. 5), or "
                                  f"null for inductor's own {DEFAULT_MS} ms per launch config")
    return float(ms)


def _benchmarker() -> Any:
    import importlib

    return importlib.import_module(BENCHMARKING).benchmarker


def supported(bench: Any | None = None) -> bool:
    """Whether this torch's benchmarker takes a per-config budget: `max_benchmark_duration` (inductor's) or
    Triton's `do_bench`'s `rep` (its fallback)."""
    bench = _benchmarker() if bench is None else bench
    params = inspect.signature(type(bench).benchmark_gpu).parameters
    if "max_benchmark_duration" in params:
        return True
    try:  # Triton's do_bench, imported on first use: a torch without Triton has none
        do_bench = getattr(bench, "triton_do_bench", None)
        return do_bench is not None and "rep" in inspect.signature(do_bench).parameters
    except (ImportError, NotImplementedError, TypeError, ValueError):
        return False


def current() -> float | None:
    """The budget the benchmarker has now (None: inductor's own)."""
    if BENCHMARKING not in sys.modules:
        return None
    return getattr(_benchmarker().__dict__.get("benchmark_gpu"), "scfs_autotune_ms", None)


def use(ms: Any) -> float | None:
    """Give each candidate launch config `ms` milliseconds of timed launches from now on in this process (None:
    inductor's own budget); what an earlier `use` set is put back first. Returns the budget set."""
    budget = check(ms)
    if budget is None and BENCHMARKING not in sys.modules:
        return None  # nothing set before, and no import of inductor for a run that may never compile
    bench = _benchmarker()
    bench.__dict__.pop("benchmark_gpu", None)
    if budget is None:
        return None
    if not supported(bench):
        raise AutotuneBudgetError("compile_autotune_ms: this torch's inductor benchmarker takes no per-config "
                                  "budget (no max_benchmark_duration); leave compile_autotune_ms=null")
    original = bench.benchmark_gpu

    @functools.wraps(original)
    def benchmark_gpu(*args: Any, **kwargs: Any) -> Any:
        kwargs["max_benchmark_duration"] = budget
        kwargs["rep"] = budget
        return original(*args, **kwargs)

    benchmark_gpu.scfs_autotune_ms = budget  # type: ignore[attr-defined]
    bench.benchmark_gpu = benchmark_gpu
    return budget

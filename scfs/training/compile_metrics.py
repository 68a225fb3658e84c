"""What torch's compiler did in this process, graph by graph: read by the compile benchmark (`scfs.bench.compile`)
and by a run whose first compile is shared with helper processes (`compile_parallel`), whose `summary.json` then
says which graph the first step spent its seconds on. No torch import at module level: the benchmark's child
imports this before it starts the helpers, which must not wait for this process's torch import."""

from __future__ import annotations

from typing import Any


def compile_phase_seconds() -> dict[str, float]:
    """torch's compile timers of this process so far: timer name -> seconds, summed over its calls (inclusive)."""
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return {str(n): float(v) for n, v in zip(names, values)}


def frame_compiles(wall0: float) -> list[dict[str, Any]]:
    """This process's compiles that began after `wall0` (`time.time()`), in order: one per dynamo frame and one
    per backward compiled at its first run (torch's per-frame compile metrics), and the work a compiled graph does
    at its first runs that torch counts with them (`first_run`: Triton's launch-config benchmarks, `autotune_s`, and
    the CUDA graphs' recording, `cudagraphs_s`). The phase table sums each timer over the graphs; this says which
    graph the run's own path spent its seconds on: `graph` (the frame's function, or `backward of` it), `at_s` (when
    it began, from `wall0`), `s` (how long), `ops` (the graph's op count where torch gives it), `inductor_cache` and
    `aot_cache` (hit, miss, or empty where that cache was not asked)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:  # a torch without per-frame metrics: the phase table alone
        return []

    def cache(m: Any, prefix: str) -> str:
        hit, miss = getattr(m, f"{prefix}_hit_count", None), getattr(m, f"{prefix}_miss_count", None)
        return "hit" if hit else "miss" if miss else ""

    names: dict[str, str] = {}
    out = []
    for m in get_compilation_metrics():
        start, forward = getattr(m, "start_time", None), bool(getattr(m, "is_forward", True))
        if forward and getattr(m, "co_name", None):
            names[str(m.compile_id)] = str(m.co_name)
        if start is None or start < wall0:
            continue
        took = getattr(m, "duration_us", None)
        entry = {"graph": names.get(str(m.compile_id), "?") if forward
                 else f"backward of {names.get(str(m.compile_id), '?')}",
                 "compile_id": str(m.compile_id), "at_s": round(start - wall0, 2),
                 "s": None if took is None else round(took / 1e6, 2), "ops": getattr(m, "graph_op_count", None),
                 "inductor_cache": cache(m, "inductor_fx_local_cache"),
                 "aot_cache": cache(m, "aotautograd_local_cache"), "first_run": bool(getattr(m, "is_runtime", False))}
        if entry["first_run"]:
            for key, field in (("autotune_s", "runtime_triton_autotune_time_us"),
                               ("cudagraphs_s", "runtime_cudagraphify_time_us")):
                us = getattr(m, field, None)
                entry[key] = None if us is None else round(us / 1e6, 2)
        out.append(entry)
    return out

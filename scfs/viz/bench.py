"""Search-kernel benchmark records (`python -m scfs.bench.search` JSON) as tables and figures, no GPU needed.

A record is `{"meta": {gpu, date, torch, copy_bw_TBps, n_crops, ...}, "rows": [{stage, shape, B, dtype, proj,
pass_, floor_bytes, floor_ms, impls: {impl: {ms, GBps, pct_copy, peak_MiB, correct, ...} | {error}}}],
"fast_p": {...}}` (see scfs/bench/search.py). Files that do not parse or lack rows are reported and skipped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("scfs.viz.bench")
IMPL_ORDER = ("published", "ref", "ref+conv", "compile", "triton", "cuda")
# one fixed colour per backend in every figure (tab10), so a backend reads the same across records
IMPL_COLOURS = {"published": "#7f7f7f", "ref": "#1f77b4", "ref+conv": "#17becf", "compile": "#ff7f0e",
                "triton": "#2ca02c", "cuda": "#d62728"}
_EXTRA_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22")


def impl_colour(impl: str) -> str:
    """The backend's fixed colour (others: a stable pick by name)."""
    if impl in IMPL_COLOURS:
        return IMPL_COLOURS[impl]
    return _EXTRA_COLOURS[sum(map(ord, impl)) % len(_EXTRA_COLOURS)]


def is_search_record(doc: Any) -> bool:
    """A `python -m scfs.bench.search` record: rows of cases with per-implementation results (`impls`). The step,
    loader and training records in the same folder have rows of another shape and are not plotted here."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    return (isinstance(rows, list) and bool(rows)
            and all(isinstance(r, dict) and isinstance(r.get("impls"), dict) and "stage" in r for r in rows))


def load_bench_results(folder: str | Path, pattern: str = "*.json") -> list[dict[str, Any]]:
    """Every search-op benchmark record under `folder` (sorted by file name), each with its `path`; [] when there
    is none. Other JSON files (step, loader, training records) are skipped quietly; unreadable ones with a warning."""
    folder = Path(folder)
    out = []
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            log.warning("skipping %s: not readable JSON (%s)", path, err)
            continue
        if not is_search_record(doc):
            log.debug("skipping %s: not a search-op record", path)
            continue
        doc["path"] = str(path)
        doc.setdefault("meta", {})
        out.append(doc)
    return out


def bench_table(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per (record, case, implementation): gpu, date, stage, B, dtype, proj, pass, impl, ms,
    pct_copy, GBps, peak_MiB, correct, error."""
    rows = []
    for doc in results:
        meta = doc.get("meta", {})
        for r in doc["rows"]:
            for impl, v in (r.get("impls") or {}).items():
                rows.append({"gpu": meta.get("gpu", "?"), "date": meta.get("date", "?"), "file": Path(doc["path"]).name,
                             "stage": r.get("stage"), "shape": r.get("shape"), "B": r.get("B"),
                             "dtype": r.get("dtype"), "proj": r.get("proj", 0), "pass": r.get("pass_", r.get("pass")),
                             "impl": impl, "ms": v.get("ms"), "pct_copy": v.get("pct_copy"), "GBps": v.get("GBps"),
                             "peak_MiB": v.get("peak_MiB"), "correct": v.get("correct"), "error": v.get("error"),
                             "floor_ms": r.get("floor_ms")})
    return rows


def markdown_table(rows: Sequence[dict[str, Any]], impls: Sequence[str] | None = None) -> str:
    """Cases as rows, implementations as columns: 'ms (% of copy bandwidth)'."""
    impls = [i for i in (impls or IMPL_ORDER) if any(r["impl"] == i for r in rows)]
    cases: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        cases.setdefault((r["gpu"], r["stage"], r["B"], r["dtype"], r["proj"], r["pass"]), {})[r["impl"]] = r
    lines = ["| gpu | stage | B | dtype | proj | pass | " + " | ".join(impls) + " |",
             "|---|---|---|---|---|---|" + "---:|" * len(impls)]
    for key, by_impl in cases.items():
        cells = []
        for i in impls:
            r = by_impl.get(i)
            cells.append("-" if r is None else ("err" if r["ms"] is None else f"{r['ms']:.3f} ({r['pct_copy']:.0f}%)"))
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_figure(doc: dict[str, Any], batch: int | None = None, proj: int = 0):
    """Time (ms, log scale) and % of copy bandwidth per stage x dtype, bars per implementation, for forward and
    forward+backward: one record, one batch size (the smallest unless given), projection `proj`."""
    from scfs.plotting import new_figure

    rows = [r for r in bench_table([doc]) if r["proj"] == proj]
    if batch is None and rows:
        batch = min(r["B"] for r in rows)
    rows = [r for r in rows if r["B"] == batch and r["ms"] is not None]
    passes = [p for p in ("fwd", "fwd+bwd") if any(r["pass"] == p for r in rows)] or ["fwd"]
    impls = [i for i in IMPL_ORDER if any(r["impl"] == i for r in rows)]
    impls += sorted({r["impl"] for r in rows} - set(impls))
    groups = list(dict.fromkeys((r["stage"], r["dtype"]) for r in rows))
    fig = new_figure(4.2 * len(passes) + 0.8, 6.4)
    axes = fig.subplots(2, len(passes), squeeze=False)
    x = np.arange(len(groups))
    width = 0.8 / max(len(impls), 1)
    for col, p in enumerate(passes):
        for j, impl in enumerate(impls):
            by = {(r["stage"], r["dtype"]): r for r in rows if r["pass"] == p and r["impl"] == impl}
            off = x + (j - (len(impls) - 1) / 2) * width
            for row, metric in enumerate(("ms", "pct_copy")):
                vals = [by[g][metric] if g in by else np.nan for g in groups]
                axes[row, col].bar(off, vals, width, label=impl, color=impl_colour(impl))
        for row, (metric, label) in enumerate((("ms", "median time (ms, log)"),
                                                ("pct_copy", "% of copy bandwidth (floor bytes)"))):
            ax = axes[row, col]
            ax.set_xticks(x, labels=[f"{s}\n{d}" for s, d in groups], fontsize=7)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if metric == "ms":
                from matplotlib.ticker import FuncFormatter

                ax.set_yscale("log")
                plain = FuncFormatter(lambda v, _: f"{v:g}")
                ax.yaxis.set_major_formatter(plain)
                ax.yaxis.set_minor_formatter(plain)
                ax.tick_params(axis="y", which="both", labelsize=7)
                ax.set_title(f"{p}", fontsize=10)
            else:
                ax.axhline(100, color="grey", ls="--", lw=1)
    axes[0, 0].legend(fontsize=7, ncol=2)
    meta = doc.get("meta", {})
    bw = meta.get("copy_bw_TBps")
    fig.suptitle(f"Search op on {meta.get('gpu', '?')} ({meta.get('date', '?')}): B={batch}, "
                 f"N={meta.get('n_crops', '?')} crops, projection {proj or 'none'}"
                 + (f", copy bandwidth {bw:.2f} TB/s" if bw else ""), fontsize=10)
    fig.tight_layout()
    return fig

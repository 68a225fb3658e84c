"""Search-op benchmark on a GPU: published loop, reference (eager, torch.compile), Triton, CUDA.

ResNet-50 stages x {B=32, 64} x {fp32, bf16} x {no projection, projection to 256} x {fwd, fwd+bwd}; N=8.
Median ms by triton.testing.do_bench (flushes L2 between calls), GB/s over the floor bytes (read feats
once, write N*B outputs; backward adds read dout + read feats + write dfeats), % of the device-to-device copy
bandwidth measured in the same run, speed-ups, peak memory, KernelBench fast_1/fast_2.
Writes benchmarks/results/search-<gpu>-<date>.{json,md} and prints the table.
Usage: python -m scfs.bench.search [--quick] [--no-compile] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from scfs.search import feature_search
from scfs.search.reference import published_loop, reference_search

STAGES = {"layer2": (512, 28, 28), "layer3": (1024, 14, 14), "layer4": (2048, 7, 7)}
N_CROPS = 8
PROJ = 256


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), 1 GiB buffers."""
    from triton.testing import do_bench

    x = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3)


def floor_bytes(b: int, c: int, p: int, cg: int, esize: int, backward: bool) -> int:
    fwd = (b * c * p + N_CROPS * b * cg * p) * esize
    return fwd + ((N_CROPS * b * cg * p + 2 * b * c * p) * esize if backward else 0)


def make_fns(feats, queries, weight, backward: bool, use_compile: bool) -> dict:
    """name -> zero-arg callable; forward returns features, fwd+bwd also runs the backward."""
    grad = torch.randn(
        (
            N_CROPS * feats.shape[0],
            weight.shape[0] if weight is not None else feats.shape[1],
            *feats.shape[2:],
        ),
        device=feats.device,
        dtype=feats.dtype,
    )
    ins = [t for t in (feats, queries, weight) if t is not None]

    def published():
        out = published_loop(feats, queries)
        return F.conv2d(out, weight[:, :, None, None]) if weight is not None else out

    def ref():
        return reference_search(feats, queries, "soft", weight, 0.25, 0.1, 1e-6)[0]

    def ref_conv():  # reference search on the raw map, then cuDNN 1x1 conv: the unfused baseline
        out = reference_search(feats, queries, "soft", None, 0.25, 0.1, 1e-6)[0]
        return F.conv2d(out, weight[:, :, None, None])

    fns = {"published": published, "ref": ref}
    if weight is not None:
        fns["ref+conv"] = ref_conv
    if use_compile:
        comp = torch.compile(lambda f, q, w: reference_search(f, q, "soft", w, 0.25, 0.1, 1e-6)[0])
        fns["compile"] = lambda: comp(feats, queries, weight)
    for be in ("triton", "cuda"):
        fns[be] = lambda be=be: feature_search(feats, queries, weight=weight, backend=be).features
    if not backward:
        return {k: (lambda fn=fn: fn()) for k, fn in fns.items()}
    return {k: (lambda fn=fn: torch.autograd.grad(fn(), ins, grad)) for k, fn in fns.items()}


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def run(quick: bool, use_compile: bool, out_dir: Path) -> dict:
    from triton.testing import do_bench

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    bw = copy_bandwidth()
    print(f"{name}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", name.replace("NVIDIA", "")).strip("-").lower()
    stamp = dt.date.today().isoformat()
    meta = dict(
        gpu=name,
        date=stamp,
        torch=torch.__version__,
        python=platform.python_version(),
        copy_bw_TBps=bw / 1e12,
        n_crops=N_CROPS,
        timer="triton.testing.do_bench median, L2 flushed",
    )
    rows = []
    batches = (32,) if quick else (32, 64)
    for stage, (c, h, w) in STAGES.items():
        for b in batches:
            for dtype in (torch.float32, torch.bfloat16):
                for proj in (0, PROJ):
                    for backward in (False, True):
                        gen = torch.Generator(device=dev).manual_seed(0)
                        feats = torch.randn(b, c, h, w, device=dev, generator=gen).to(dtype)
                        queries = torch.randn(N_CROPS, b, c, device=dev, generator=gen).to(dtype)
                        weight = (torch.randn(proj, c, device=dev, generator=gen) / c**0.5).to(dtype) if proj else None
                        if backward:
                            for t in (feats, queries, weight):
                                if t is not None:
                                    t.requires_grad_(True)
                        fns = make_fns(feats, queries, weight, backward, use_compile)
                        with torch.no_grad():
                            want = reference_search(
                                feats.detach().double(),
                                queries.detach().double(),
                                "soft",
                                None if weight is None else weight.detach().double(),
                                0.25,
                                0.1,
                                1e-6,
                            )[0]
                        cg = proj or c
                        nbytes = floor_bytes(b, c, h * w, cg, feats.element_size(), backward)
                        row = dict(
                            stage=stage,
                            shape=f"{c}x{h}x{w}",
                            B=b,
                            dtype=str(dtype).replace("torch.", ""),
                            proj=proj,
                            pass_="fwd+bwd" if backward else "fwd",
                            floor_bytes=nbytes,
                            floor_ms=nbytes / bw * 1e3,
                            impls={},
                        )
                        for impl, fn in fns.items():
                            try:
                                res = fn()
                                if not backward:
                                    err = ((res.double() - want).norm() / want.norm()).item()
                                    ok = err < (2e-5 if dtype == torch.float32 else 2e-2)
                                else:
                                    ok = all(torch.isfinite(g).all().item() for g in res)
                                ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                                mem = peak_mib(fn)
                                row["impls"][impl] = dict(
                                    ms=ms,
                                    GBps=nbytes / ms * 1e-6,
                                    pct_copy=100 * nbytes / ms * 1e3 / bw,
                                    peak_MiB=mem,
                                    correct=bool(ok),
                                )
                            except Exception as exc:  # noqa: BLE001 - a failing impl is recorded, the rest goes on
                                row["impls"][impl] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
                        base = row["impls"]["published"].get("ms")
                        comp = row["impls"].get("compile", {}).get("ms")
                        for r in row["impls"].values():
                            if "ms" in r:
                                r["x_published"] = base / r["ms"] if base else None
                                r["x_compile"] = comp / r["ms"] if comp else None
                        rows.append(row)
                        print(fmt_row(row), flush=True)
                        save(dict(meta=meta, rows=rows, fast_p=fast_p(rows)), out_dir / f"search-{gpu}-{stamp}")
                        del fns, feats, queries, weight
    result = dict(meta=meta, rows=rows, fast_p=fast_p(rows))
    print(save(result, out_dir / f"search-{gpu}-{stamp}"))
    return result


def save(result: dict, stem: Path) -> str:
    """Write <stem>.json and <stem>.md (after every row, so a run cut short still leaves its numbers)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    stem.with_suffix(".md").write_text(md)
    return md


def fast_p(rows: list[dict]) -> dict:
    """KernelBench fast_p: share of cases where the impl is correct and > p times faster than the baseline."""
    out = {}
    for impl in ("triton", "cuda", "compile"):
        for base in ("ref", "published"):
            for p in (1.0, 2.0):
                hits = [
                    r["impls"].get(impl, {}).get("correct", False)
                    and r["impls"][impl]["ms"] * p < r["impls"][base]["ms"]
                    for r in rows
                    if "ms" in r["impls"].get(base, {})
                ]
                out[f"{impl}_fast_{p:g}_vs_{base}"] = sum(hits) / max(1, len(hits))
    return out


ORDER = ("published", "ref", "ref+conv", "compile", "triton", "cuda")


def fmt_row(row: dict) -> str:
    parts = [f"{row['stage']} B{row['B']} {row['dtype']} proj{row['proj']} {row['pass_']} floor {row['floor_ms']:.3f}"]
    for k in ORDER:
        r = row["impls"].get(k)
        if r:
            parts.append(f"{k} {r['ms']:.3f}ms/{r['pct_copy']:.0f}%" if "ms" in r else f"{k} ERR")
    return " | ".join(parts)


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [
        f"# Search op benchmark: {m['gpu']}, {m['date']}",
        "",
        f"torch {m['torch']}; N={m['n_crops']}; copy bandwidth {m['copy_bw_TBps']:.2f} TB/s; {m['timer']}.",
        "Cells: median ms (% of copy bandwidth over the floor bytes). x = CUDA speed-up.",
        "",
        "| stage | B | dtype | proj | pass | floor ms | published | ref eager | ref+conv | compile | triton "
        "| cuda | cuda x pub | cuda x compile | cuda peak MiB | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = []
        for k in ORDER:
            x = r["impls"].get(k)
            cells.append("-" if x is None else ("err" if "ms" not in x else f"{x['ms']:.3f} ({x['pct_copy']:.0f}%)"))
        cu = r["impls"].get("cuda", {})
        ok = all(v.get("correct", False) for v in r["impls"].values())
        xp = f"{cu['x_published']:.1f}" if cu.get("x_published") else "-"
        xc = f"{cu['x_compile']:.2f}" if cu.get("x_compile") else "-"
        mem = f"{cu['peak_MiB']:.0f}" if "peak_MiB" in cu else "-"
        lines.append(
            f"| {r['stage']} | {r['B']} | {r['dtype']} | {r['proj']} | {r['pass_']} | {r['floor_ms']:.3f} | "
            + " | ".join(cells)
            + f" | {xp} | {xc} | {mem} | {'yes' if ok else 'NO'} |"
        )
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in result["fast_p"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="B=32 only")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("scfs.bench.search needs a CUDA GPU", file=sys.stderr)
        return 2
    run(args.quick, not args.no_compile, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

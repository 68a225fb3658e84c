"""`python -m scfs.sweep`: run several `scfs.train` configurations side by side and tabulate them.

Each run is a subprocess (`python -m scfs.train <common> <overrides>`) in its own run folder; runs go
`--parallel` at a time (one GPU can hold several small runs; `--gpus 0,1` spreads them over GPUs), and
`--resume` continues each from its previous folder's last.ckpt (long runs in chunks with `chunk_minutes`). The
summaries and kNN curves are gathered into one JSON record and a markdown table, so that tuning and
ablations are reproducible from one command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _table(rows: list[dict], ks: list[int]) -> str:
    """One row per run: kNN top-1 at random init and at the end for every k, loss against its uniform level."""
    knn_cols = " | ".join(f"kNN{k} init | kNN{k} final | gain{k}" for k in ks)
    lines = [f"| run | overrides | epochs | steps | time s | {knn_cols} | loss / uniform |",
             "|---|---|---|---|---|" + "---|" * (3 * len(ks)) + "---|"]
    for r in rows:
        s = r.get("summary") or {}
        if not s:
            lines.append(f"| {r['label']} | `{r['overrides']}` | failed (rc {r['rc']}) |" + " |" * (3 + 3 * len(ks)))
            continue
        cells = []
        for k in ks:
            init = s.get("knn_init", {}).get(f"top1_k{k}", float("nan"))
            fin = s.get("knn", {}).get(f"top1_k{k}", float("nan"))
            cells.append(f"{init:.1f} | {fin:.1f} | {fin - init:+.1f}")
        lines.append(f"| {r['label']} | `{r['overrides']}` | {s.get('epochs')} | {s.get('steps')} | "
                     f"{s.get('seconds')} | {' | '.join(cells)} | {s.get('loss', float('nan')):.3f} / "
                     f"{s.get('uniform_loss', float('nan')):.3f} |")
    return "\n".join(lines)


def _latest_checkpoint(root: Path, index: int, label: str) -> Path | None:
    """last.ckpt of the newest `<root>/<stamp>-<index>-<label>/` that has one (run folders sort by time stamp)."""
    for d in sorted(root.glob(f"*-{index:02d}-{label}"), reverse=True):
        ckpt = d / "checkpoints" / "last.ckpt"
        if ckpt.is_file():
            return ckpt
    return None


def _positive_int(text: str) -> int:
    """argparse type: --parallel 0 would start nothing and wait forever."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def _k_list(text: str) -> list[int]:
    """argparse type of --k: checked before any run starts, so a bad value costs no run."""
    try:
        ks = [int(k) for k in str(text).split(",") if k.strip()]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers >= 1 (e.g. 20,200)")
    return ks


def _last_line(log_file: Path) -> str:
    """The last non-empty line of a run's stdout.log: for a failed run, scfs.train's one-line error."""
    try:
        lines = [ln.strip() for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:500] if lines else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="one quoted override string per run, e.g. 'method=dino' (label=... optional "
                   "prefix 'LABEL:')")
    p.add_argument("--common", default="", help="overrides applied to every run")
    p.add_argument("--parallel", type=_positive_int, default=1, help="runs at a time (>= 1)")
    p.add_argument("--gpus", default="", help="comma-separated GPU ids to spread runs over (round robin)")
    p.add_argument("--out", required=True, help="output JSON path (a .md table is written beside it)")
    p.add_argument("--root", default="runs/sweep", help="folder for the run folders")
    p.add_argument("--resume", action="store_true",
                   help="continue each run from the last.ckpt of its latest run folder under --root (same position "
                        "and label): long runs in chunks, e.g. with chunk_minutes=8 in --common")
    p.add_argument("--k", type=_k_list, default="20", help="kNN k values to tabulate, comma-separated (e.g. 20,200)")
    args = p.parse_args(argv)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    gpus = [g for g in args.gpus.split(",") if g]
    pending = []
    for i, spec in enumerate(args.runs):
        label, _, ov = spec.partition(":") if ":" in spec.split("=")[0] else (f"run{i}", "", spec)
        run_dir = Path(args.root) / f"{stamp}-{i:02d}-{label}"
        cmd = [sys.executable, "-m", "scfs.train", *shlex.split(args.common), *shlex.split(ov),
               f"hydra.run.dir={run_dir}"]
        if args.resume:
            prev = _latest_checkpoint(Path(args.root), i, label)
            if prev is not None:
                cmd.append(f"resume={prev}")
                print(f"[sweep] {label}: continues {prev}", flush=True)
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        pending.append({"index": i, "label": label, "overrides": ov, "run_dir": str(run_dir), "cmd": cmd, "env": env})

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ks = args.k
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "scfs.sweep", *(argv or sys.argv[1:])])

    def write(done: list[dict], final: bool) -> str:
        """The record so far: rewritten after every finished run, so a sweep cut short keeps what it measured."""
        rows = sorted(done, key=lambda r: r["index"])
        record = {"command": command, "common": args.common, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "complete": final, "runs": rows}
        out.write_text(json.dumps(record, indent=2, default=str))
        table = _table(rows, ks)
        note = "" if final else f"\n\n(partial: {len(rows)} of {len(args.runs)} runs finished so far)"
        out.with_suffix(".md").write_text(f"Command: `{command}`\n\n{table}{note}\n")
        return table

    running: list[tuple[dict, subprocess.Popen, object]] = []
    done: list[dict] = []

    def stop(signum: int, frame: object) -> None:
        """SIGTERM/SIGINT (a `timeout`, a scheduler, Ctrl-C): stop the runs too (they write last.ckpt every
        `checkpoint.every_n_train_steps`), keep the record of the finished ones, exit."""
        for _, proc, _ in running:
            proc.terminate()
        for _, proc, _ in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        write(done, final=False)
        print(f"[sweep] stopped by signal {signum}: {len(done)} of {len(args.runs)} runs finished", flush=True)
        sys.exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _loop(pending, running, done, args.parallel, lambda: write(done, final=False))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(write(done, final=True))
    return 0 if all(r["rc"] == 0 for r in done) else 1


def _loop(pending: list[dict], running: list, done: list[dict], parallel: int, on_done: Callable[[], object]) -> None:
    """Start runs `parallel` at a time; collect each one's summary and kNN curve as it ends."""
    while pending or running:
        while pending and len(running) < parallel:
            r = pending.pop(0)
            Path(r["run_dir"]).mkdir(parents=True, exist_ok=True)
            logf = open(Path(r["run_dir"]) / "stdout.log", "w")  # noqa: SIM115
            running.append((r, subprocess.Popen(r["cmd"], env=r["env"], stdout=logf, stderr=subprocess.STDOUT), logf))
            print(f"[sweep] start {r['label']}: {r['overrides']}", flush=True)
        time.sleep(2)
        for item in list(running):
            r, proc, logf = item
            if proc.poll() is None:
                continue
            logf.close()
            running.remove(item)
            r["rc"] = proc.returncode
            sj = Path(r["run_dir"]) / "summary.json"
            r["summary"] = json.loads(sj.read_text()) if sj.exists() else None
            cj = Path(r["run_dir"]) / "knn_curve.json"
            r["knn_curve"] = json.loads(cj.read_text()) if cj.exists() else []
            if proc.returncode:  # say why, so a typo in one run's overrides is seen without opening its log
                r["error"] = _last_line(Path(r["run_dir"]) / "stdout.log")
                print(f"[sweep] FAILED {r['label']} rc={proc.returncode}: {r['error']} "
                      f"(log: {r['run_dir']}/stdout.log)", flush=True)
            else:
                print(f"[sweep] done {r['label']} rc=0", flush=True)
            done.append({k: v for k, v in r.items() if k not in ("env",)})
            on_done()


if __name__ == "__main__":
    sys.exit(main())

"""The CPU default, measured as a user runs it: `python -m scfs.train [method=dino] seed=S`, one process after the
other, wall clock from the shell's point of view (interpreter start, data generation, both kNN passes and the
figure included), the machine's load average next to each time. One JSON + markdown record.

    python -m scfs.bench.cpu_default --seeds 0 1 2 --out benchmarks/results/shapes-cpu-default
    python -m scfs.bench.cpu_default --methods scfs --seeds 0 -- trainer.max_epochs=2   # extra overrides after --

Run it on an otherwise idle machine: other processes on the same cores inflate the wall clock (the record keeps
the 1-minute load average before and after each run so a reader can tell).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGETS = {"wall_s": 180.0, "knn_top1": 50.0, "gain": 20.0}  # issue 18


def _load() -> float:
    return os.getloadavg()[0]


def one_run(method: str, seed: int, extra: list[str], runs_root: Path) -> dict[str, Any]:
    run_dir = runs_root / f"{method}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "scfs.train", f"method={method}", f"seed={seed}", f"hydra.run.dir={run_dir}",
           "trainer.enable_progress_bar=false", *extra]
    load0, t0 = _load(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    k = "top1_k20"
    env = "".join(f"{k}={os.environ[k]} " for k in ("SCFS_THREADS",) if k in os.environ)
    row = {"method": method, "seed": seed, "command": env + "python -m scfs.train"
           + (" method=dino" if method == "dino" else "") + f" seed={seed}",
           "wall_s": round(wall, 1), "train_s": s.get("seconds"), "load_before": round(load0, 2),
           "load_after": round(_load(), 2), "steps": s["steps"], "knn_top1": s["knn"][k],
           "knn_init_top1": s["knn_init"][k], "gain": round(s["knn"][k] - s["knn_init"][k], 2),
           "loss": s["loss"], "uniform_loss": s["uniform_loss"], "loss_dino": s.get("loss_dino"),
           "uniform_loss_dino": s.get("uniform_loss_dino"), "checkpoint": s["checkpoint"], "run_dir": str(run_dir)}
    row["met"] = {"wall": row["wall_s"] <= TARGETS["wall_s"], "knn": row["knn_top1"] >= TARGETS["knn_top1"],
                  "gain": row["gain"] >= TARGETS["gain"], "loss_under_uniform": row["loss"] < row["uniform_loss"]}
    print(json.dumps(row), flush=True)
    return row


def markdown(rec: dict[str, Any]) -> str:
    env = " ".join(f"{k}={v}" for k, v in rec.get("env", {}).items())
    lines = [f"# CPU default, per seed\n\n`{(env + ' ') if env else ''}{rec['command']}` ({rec['machine']})\n",
             "| run | seed | wall clock (load before/after) | steps | kNN top-1 trained | random init | gain | "
             "final loss (uniform) | DINO term (log out_dim) |",
             "|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rec["runs"]:
        lines.append(f"| `{r['command']}` | {r['seed']} | {r['wall_s']:.0f} s ({r['load_before']:.1f}/"
                     f"{r['load_after']:.1f}) | {r['steps']} | {r['knn_top1']:.1f} | {r['knn_init_top1']:.1f} | "
                     f"{r['gain']:+.1f} | {r['loss']:.2f} ({r['uniform_loss']:.2f}) | "
                     f"{r['loss_dino']:.2f} ({r['uniform_loss_dino']:.2f}) |")
    lines.append(f"\nTargets: wall <= {TARGETS['wall_s']:.0f} s, kNN >= {TARGETS['knn_top1']:.0f} %, gain >= "
                 f"{TARGETS['gain']:.0f} points, loss under its uniform level.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m scfs.bench.cpu_default", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["scfs", "dino"], choices=["scfs", "dino"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--runs-root", type=Path, default=Path("runs") / "cpu_default")
    p.add_argument("--out", type=Path, default=None, help="record stem: writes <out>.json and <out>.md")
    a = p.parse_args(argv)
    rec: dict[str, Any] = {
        "command": "python -m scfs.bench.cpu_default " + " ".join(sys.argv[1:] if argv is None else argv)
                   + (" -- " + " ".join(extra) if extra else ""),
        "machine": f"{os.cpu_count()} CPU cores", "targets": TARGETS, "runs": [],
        "env": {k: os.environ[k] for k in ("SCFS_THREADS", "OMP_NUM_THREADS") if k in os.environ}}
    for seed in a.seeds:  # seed-major: each method's seeds spread over the session's load
        for method in a.methods:
            rec["runs"].append(one_run(method, seed, extra, a.runs_root))
            if a.out:
                from scfs.bench.records import save_record

                save_record(rec, a.out, markdown)
    print(markdown(rec))
    return rec


if __name__ == "__main__":
    main()

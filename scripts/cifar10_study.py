"""The CIFAR-10 quality study on one GPU machine, window by window: SCFS vs DINO over seeds, the search ablation and
the training-length pair, each run pretrained with the shipped `+experiment=cifar10` recipe, then kNN (in the run)
and the swept fast linear probe (in the same window: checkpoints do not outlive a machine).

    python scripts/cifar10_study.py run --out /tmp/study --parallel 4 --deadline <unix time> [--ramp]
    python scripts/cifar10_study.py render benchmarks/results/cifar10-quality-*.json \
        --out benchmarks/results/cifar10-quality.md
    python scripts/cifar10_study.py figure benchmarks/results/cifar10-quality-*.json --out docs/cifar10_knn_curves.png \
        [--partial benchmarks/results/cifar10-partial-*.json]
    python scripts/cifar10_study.py partial <extracted study.tgz> --commit <c> --why '<why the runs stopped>'

The runs are the jobs of the Hydra study configs `conf/study/cifar10_{seeds,ablation,long}.yaml` (what
`python -m scfs.train -m +study=<name>` runs); this runner adds what a GPU window of ~25 minutes needs around them.
`run` skips every run already in a committed record (`benchmarks/results/cifar10-quality-*.json`), starts the
others in plan order, at most `--parallel` at a time, and only when they are predicted to finish (training, linear
probe) before `--deadline`; the prediction assumes one more run adds half of one run's rate to the aggregate epochs
per second measured now, scaled by the run's method (`method_pace`: DINO's epochs are shorter than SCFS's); a run
predicted to miss is not started; one cut by the deadline is not recorded.
`--ramp` adds the runs one at a time and measures the aggregate epochs per minute at 1, 2, ... runs side by side
(the record's `concurrency`; `<out>/ramp.done` marks its end, for work that should not disturb it). Each run's row
lands in `<out>/cifar10-quality-<date>-<commit>.json` (+ `.md`) the moment its linear probe ends. `--slim KEY ...`
keeps the teacher of those runs as a small weights-only checkpoint (`<out>/slim/`) for figures drawn after the window.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/cifar10_study.py` on a machine where scfs is not installed
    sys.path.insert(0, str(ROOT))

from scfs.bench.records import source_commit  # noqa: E402  (after the path: scfs may not be installed)

# every run is one job of its study's Hydra multirun (`python -m scfs.train -m +study=<name> <the job's overrides>`),
# with the data root and these settings for a run whose progress is read from its log
RECIPE = ["data.root=data/cifar10", "logger=csv", "eval.figure=false", "trainer.enable_progress_bar=true"]
STEPS_PER_EPOCH = 97  # 50,000 images, batch 512, the last partial batch dropped
PROGRESS = re.compile(r"Epoch (\d+):\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)")
TRAIN_MODULE, LINEAR_MODULE = "scfs.train", "scfs.eval.linear"  # module attributes: the tests put fakes here
POLL_S, MIN_RATE_S = 3.0, 5.0  # poll interval; shortest span a rate is measured over
WARM_EPOCHS = 1.0  # progress counted from here: epoch 0 holds the compile (minutes when the cache is cold)
COMPILE_S, LINEAR_S, SECONDS_PER_EPOCH_ALONE = 110.0, 220.0, 5.0  # priors before anything is measured
MARGINAL_GAIN = 0.5  # one more run side by side adds this fraction of one run's rate (measured by the ramp)


@dataclass
class Run:
    method: str
    variant: str
    seed: int
    epochs: int
    study: str = field(default="cifar10_seeds", compare=False)  # the conf/study/<name>.yaml whose job this is

    @property
    def key(self) -> str:
        return f"{self.method}-{self.variant}-s{self.seed}-e{self.epochs}"

    def overrides(self) -> list[str]:
        ov = [f"method={self.method}", f"seed={self.seed}", f"trainer.max_epochs={self.epochs}",
              f"name=quality-{self.key}"]
        if self.method == "scfs":
            ov.append(f"search={self.variant}")
        return ov


STUDIES = ("cifar10_seeds", "cifar10_ablation", "cifar10_long")  # conf/study/<name>.yaml, in the order they run
STUDY_DIR = Path(__file__).resolve().parents[1] / "conf" / "study"


def plan(conf_dir: Path = STUDY_DIR) -> list[Run]:
    """The study's runs in the order they are run, from its Hydra study configs (the same jobs that
    `python -m scfs.train -m +study=<name>` runs): the seed pairs first (the central claim), the ablation, then the
    long pair. A run named by two studies (soft search at seed 0) comes once."""
    import itertools

    from omegaconf import OmegaConf

    runs: list[Run] = []
    for name in STUDIES:
        cfg = OmegaConf.load(conf_dir / f"{name}.yaml")
        params = {k: [v.strip() for v in str(val).split(",")] for k, val in cfg.hydra.sweeper.params.items()}
        epochs = int(cfg.trainer.max_epochs)
        keys = list(params)
        for values in itertools.product(*(params[k] for k in keys)):
            job = dict(zip(keys, values))
            method = job.get("method", "scfs")
            variant = job.get("search", "soft") if method == "scfs" else "dino"
            run = Run(method, variant, int(job.get("seed", 0)), epochs, name)
            if run not in runs:
                runs.append(run)
    return sorted(runs, key=lambda r: (r.epochs, r.variant not in ("soft", "dino"), r.seed))


def row_key(row: dict) -> str:
    """A record row's run key, as `Run.key` names the run."""
    return Run(row["method"], row["variant"], row["seed"], row["epochs"]).key


def committed_records(pattern: str) -> list[dict]:
    """The committed window records matching `pattern`, in file-name order."""
    return [json.loads(Path(f).read_text()) for f in sorted(glob.glob(pattern))]


def committed(pattern: str) -> dict[str, dict]:
    """Rows already in committed records, by run key (a run there is not run again)."""
    return {row_key(r): r
            for rec in committed_records(pattern) for r in rec.get("runs", [])}


def linear_prior(rows: dict[str, dict]) -> float:
    """Seconds to plan for one linear probe: the slowest probe in committed rows that timed theirs (their probe is
    the current one: rows from before the timing carry none), else LINEAR_S."""
    timed = [float(r["linear_s"]) for r in rows.values() if r.get("linear_s")]
    return max(timed) if timed else LINEAR_S


def method_pace(rows: dict[str, dict]) -> dict[str, tuple[float, float]]:
    """Per method, from committed rows that timed their first epoch: its epoch time as a fraction of SCFS's at the
    same count of runs side by side (the median over its rows) and its slowest first epoch (the compile). The
    measured rates are SCFS's pace; a DINO epoch takes about 0.85 of it and its compile half, so a plan that timed
    every run as SCFS would leave a DINO run out of a window it fits."""
    def epoch_s(r: dict) -> float | None:
        ok = r.get("first_epoch_s") and r.get("wall_s") and int(r.get("epochs", 0)) > 1
        return (float(r["wall_s"]) - float(r["first_epoch_s"])) / (int(r["epochs"]) - 1) if ok else None

    timed = [(r, epoch_s(r)) for r in rows.values() if epoch_s(r)]
    ref: dict[int, list[float]] = {}
    for r, e in timed:
        if r["method"] == "scfs":
            ref.setdefault(int(r.get("side_by_side", 1)), []).append(e)
    pace: dict[str, tuple[float, float]] = {}
    for m in sorted({r["method"] for r, _ in timed}):
        ratios = [e / statistics.mean(ref[n]) for r, e in timed
                  if r["method"] == m and (n := int(r.get("side_by_side", 1))) in ref]
        if ratios:
            pace[m] = (statistics.median(ratios), max(float(r["first_epoch_s"]) for r, _ in timed if r["method"] == m))
    return pace


def committed_stages(pattern: str) -> dict[int, float]:
    """Aggregate epochs per minute by runs side by side, from the ramps of committed records (the lower figure for a
    count measured twice: a plan that assumes the slower pace is not cut by the deadline)."""
    got: dict[int, float] = {}
    for rec in committed_records(pattern):
        for st in (rec.get("concurrency") or {}).get("stages", []):
            n, agg = int(st["runs"]), float(st["aggregate_epochs_per_min"])
            got[n] = min(agg, got.get(n, agg))
    return got


@dataclass
class Job:
    run: Run
    dir: Path
    proc: subprocess.Popen
    t0: float
    phase: str = "train"   # train -> linear -> done
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, epochs done)
    linear: subprocess.Popen | None = None
    side_by_side: int = 1
    linear_t0: float | None = None
    linear_s: float | None = None  # wall seconds of its probe, once done

    def progress(self) -> float | None:
        """Epochs done so far, from the tail of the run's progress bar (None before the first training step)."""
        try:
            with open(self.dir / "stdout.log", "rb") as f:
                f.seek(0, 2)
                f.seek(max(f.tell() - 8192, 0))
                tail = f.read().decode(errors="replace")
        except OSError:
            return None
        hits = PROGRESS.findall(tail)
        if not hits:
            return None
        epoch, step, total = (int(x) for x in hits[-1])
        return epoch + step / max(total, 1)

    def remaining(self) -> float:
        done = self.samples[-1][1] if self.samples else 0.0
        return max(self.run.epochs - done, 0.0)


def rate(job: Job, since: float) -> float | None:
    """Epochs per second of a job over its samples after `since`."""
    pts = [(t, e) for t, e in job.samples if t >= since]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < MIN_RATE_S:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def row_of(job: Job, commit: str) -> dict | None:
    """The record row of a finished run (None when training or the probe did not finish)."""
    sj = job.dir / "summary.json"
    if not sj.is_file():
        return None
    s = json.loads(sj.read_text())
    if s.get("stopped_by_chunk_budget") or s.get("epochs", 0) < job.run.epochs:
        return None
    curve_file = job.dir / "knn_curve.json"
    curve = json.loads(curve_file.read_text()) if curve_file.is_file() else []
    lin_file = job.dir / "linear" / "metrics.json"
    lin = json.loads(lin_file.read_text()) if lin_file.is_file() else {}
    probe = lin.get("probe", {})
    metrics = lin.get("metrics", {})
    shown = [o for o in job.run.overrides() if not o.startswith("name=")]
    cmd = f"python -m scfs.train -m +study={job.run.study} " + " ".join(shown + RECIPE[:1])
    return {"method": job.run.method, "variant": job.run.variant, "seed": job.run.seed, "epochs": job.run.epochs,
            "knn_top1_k20": s["knn"].get("top1_k20"), "knn_top1_k200": s["knn"].get("top1_k200"),
            "knn_init_k20": (s.get("knn_init") or {}).get("top1_k20"),
            "linear_top1": metrics.get("top1"), "linear_top5": metrics.get("top5"),
            "linear_lr": probe.get("lr"), "linear_wd": probe.get("weight_decay"),
            "wall_s": s.get("seconds"), "loss": s.get("loss"), "uniform_loss": s.get("uniform_loss"),
            "first_epoch_s": s.get("first_epoch_s"), "img_per_s": s.get("img_per_s"),
            "epoch_s_median": (round(statistics.median(s["epoch_seconds"][1:]), 2)
                               if len(s.get("epoch_seconds") or []) > 1 else None),
            "curve": [{"epoch": p.get("epoch"), "top1_k20": (p.get("knn") or p).get("top1_k20"),
                       "top1_k200": (p.get("knn") or p).get("top1_k200")} for p in curve],
            "command": cmd,
            "linear_command": "python -m scfs.eval.linear ckpt=<its last.ckpt> +experiment=cifar10 "
                              "data.root=data/cifar10 fast=true",
            "linear_s": round(job.linear_s, 1) if job.linear_s is not None else None,
            "commit": commit, "side_by_side": job.side_by_side}


def slim_teacher(ckpt: Path, out: Path, part_mib: int = 15) -> list[str]:
    """The teacher of a Lightning checkpoint as a weights-only file (teacher tensors in fp16 + hyper_parameters),
    cut into parts of `part_mib` MiB so that it fits what a device call brings back."""
    import torch

    ck = torch.load(ckpt, map_location="cpu", weights_only=True)
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in ck["state_dict"].items()
             if k.startswith("teacher.backbone.")}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "hyper_parameters": ck.get("hyper_parameters", {})}, out)
    data, parts = out.read_bytes(), []
    step = part_mib << 20
    for i in range(0, len(data), step):
        p = out.with_name(f"{out.name}.part{i // step}")
        p.write_bytes(data[i:i + step])
        parts.append(str(p))
    out.unlink()
    return parts


def main_run(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    date = time.strftime("%Y-%m-%d")
    done_rows = committed(a.committed)
    runs = plan()
    if a.test_epochs:
        runs = [Run(r.method, r.variant, r.seed, a.test_epochs, r.study) for r in runs if r.epochs == 100]
    todo = [r for r in runs if r.key not in done_rows and (not a.only or r.key in a.only)]
    commit = source_commit() or "unknown"
    # one record per window, named by its commit too: two windows of one day do not share a file name
    record_path = out / f"cifar10-quality-{date}-{commit}.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"runs": [], "concurrency": {}}
    have = {row_key(r) for r in record["runs"]}
    todo = [r for r in todo if r.key not in have]
    print(f"[study] {len(done_rows)} runs in committed records, {len(todo)} to run: {[r.key for r in todo]}",
          flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled", OMP_NUM_THREADS="4")
    jobs: list[Job] = []
    stages: list[dict] = []
    stage_t0: float | None = None
    t_start = time.time()

    def save() -> None:
        record["commit"], record["date"] = commit, date
        record_path.write_text(json.dumps(record, indent=2))
        record_path.with_suffix(".md").write_text(render(record, done_rows))

    def start(run: Run) -> Job:
        d = Path(a.runs) / run.key
        d.mkdir(parents=True, exist_ok=True)
        left_min = max((a.deadline - time.time() - probe_s) / 60.0, 1.0)
        cmd = [sys.executable, "-m", TRAIN_MODULE, "-m", f"+study={run.study}", *RECIPE, *run.overrides(),
               f"hydra.sweep.dir={d}", "hydra.sweep.subdir=.", "hydra.sweeper.reuse=false",
               f"chunk_minutes={left_min:.1f}", *a.extra]
        log = open(d / "stdout.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        print(f"[study] +{time.time() - t_start:.0f}s start {run.key} (cap {left_min:.1f} min)", flush=True)
        return Job(run, d, proc, time.time())

    def training() -> list[Job]:
        return [j for j in jobs if j.phase == "train"]

    def aggregate(since: float) -> float | None:
        rates = [rate(j, since) for j in training()]
        return sum(rates) if rates and all(r is not None for r in rates) else None

    def fits(run: Run) -> bool:
        """Would one more run, and every running one, end before the deadline? One more run is assumed to add
        MARGINAL_GAIN of one run's current rate to the aggregate epochs per second measured now."""
        now, n = time.time(), len(training())
        agg = aggregate(stage_t0 or now) if n else None
        if n and agg is None:
            if n not in prior:
                return False  # wait for a measurement first
            agg = prior[n] / 60.0  # this count was measured in an earlier window: no need to wait for the compile
        alone = [st for st in stages if st["runs"] == 1]
        alone_s = (60.0 / alone[0]["aggregate_epochs_per_min"] if alone
                   else 60.0 / prior[1] if 1 in prior else SECONDS_PER_EPOCH_ALONE)
        per_run_s = (n + 1) / (agg * (1 + MARGINAL_GAIN / n)) if agg else alone_s
        factor, compile_run = pace.get(run.method, (1.0, compile_s))
        need_new = compile_run + run.epochs * per_run_s * factor + probe_s
        need_old = max((j.remaining() * per_run_s * pace.get(j.run.method, (1.0, 0.0))[0] + probe_s
                        for j in training()), default=0.0)
        return now + max(need_new, need_old) < a.deadline

    # counts measured in committed windows are not ramped again: their runs start together, compiles overlapping
    prior = committed_stages(a.committed)
    compile_s = max([COMPILE_S] + [r["first_epoch_s"] for r in done_rows.values() if r.get("first_epoch_s")])
    probe_s = linear_prior(done_rows)  # replaced by this window's slowest probe once one has ended
    pace = method_pace(done_rows)
    if pace:
        print("[study] pace by method (epoch time against SCFS's, compile s): "
              + ", ".join(f"{m} {f:.2f}, {c:.0f}" for m, (f, c) in pace.items()), flush=True)
    measured: set[int] = set(prior) if a.ramp else set()
    ramp_open = a.ramp and not all(k in prior for k in range(1, a.parallel + 1))
    if prior and a.ramp:
        print(f"[study] side by side, measured before: {prior} epochs/min; compile prior {compile_s:.0f} s",
              flush=True)
    if not ramp_open:
        (out / "ramp.done").touch()
    while todo or any(j.phase != "done" for j in jobs):
        now = time.time()
        for j in training():
            p = j.progress()
            if p is not None and p >= WARM_EPOCHS:  # past the compile and the first epoch's warm-up
                j.samples.append((now, p))
            j.side_by_side = max(j.side_by_side, len(training()))
        if training() and all(j.samples for j in training()) and stage_t0 is None:
            stage_t0 = now  # every run trains at full pace: the current count's measurement starts
        n = len(training())
        if ramp_open and stage_t0 is not None and n not in measured and now - stage_t0 >= a.ramp_s:
            per = {j.run.key: rate(j, stage_t0) for j in training()}
            if all(v for v in per.values()):
                agg = sum(per.values())
                measured.add(n)
                stages.append({"runs": n, "aggregate_epochs_per_min": round(agg * 60, 2),
                               "epoch_s_per_run": {k: round(1 / v, 2) for k, v in per.items()},
                               "measured_s": round(now - stage_t0, 1)})
                record["concurrency"] = {"method": "ramp: runs added one at a time; each count measured for "
                                         f"{a.ramp_s:.0f} s once every run trains (steps read from the progress "
                                         "bar)", "stages": stages}
                print(f"[study] {n} side by side: {agg * 60:.1f} epochs/min aggregate, s/epoch {stages[-1]}",
                      flush=True)
                save()
                if n >= a.parallel:
                    ramp_open = False
                    (out / "ramp.done").touch()
        gate = not ramp_open or not training() or n in measured
        # the first run in the study's order that would still end in time: a shorter one later in the list
        # uses minutes a longer one ahead of it cannot
        nxt = next((r for r in todo if fits(r)), None) if todo and n < a.parallel else None
        if nxt is not None and gate:
            todo.remove(nxt)
            jobs.append(start(nxt))
            stage_t0 = None
        elif todo and ramp_open and training() and n in measured and nxt is None:
            ramp_open = False  # one more would not finish in time: the count stays here
            (out / "ramp.done").touch()
        for j in jobs:
            if j.phase == "train" and j.proc.poll() is not None:
                s = j.dir / "summary.json"
                ok = j.proc.returncode == 0 and s.is_file()
                print(f"[study] +{time.time() - t_start:.0f}s {j.run.key} trained rc={j.proc.returncode} "
                      f"in {time.time() - j.t0:.0f}s", flush=True)
                ck = j.dir / "checkpoints" / "last.ckpt"
                stage_t0 = None  # one run fewer trains: measure the new count afresh
                if ok and ck.is_file() and row_of_train_ok(s, j.run):
                    lin = open(j.dir / "linear.log", "w")  # noqa: SIM115
                    j.linear_t0 = time.time()
                    j.linear = subprocess.Popen(
                        [sys.executable, "-m", LINEAR_MODULE, f"ckpt={ck}", "+experiment=cifar10",
                         "data.root=data/cifar10", "fast=true", "logger.wandb=false", f"hydra.run.dir={j.dir}/linear"],
                        stdout=lin, stderr=subprocess.STDOUT, env=env)
                    j.phase = "linear"
                    if j.run.key in a.slim:
                        try:
                            parts = slim_teacher(ck, out / "slim" / f"{j.run.key}.pt")
                            print(f"[study] slim teacher of {j.run.key}: {parts}", flush=True)
                        except Exception as err:  # noqa: BLE001
                            print(f"[study] slim teacher of {j.run.key} failed: {err}", flush=True)
                else:
                    j.phase = "done"
                    print(f"[study] {j.run.key} did not finish its epochs: not recorded", flush=True)
            elif j.phase == "linear" and j.linear is not None and j.linear.poll() is not None:
                j.phase = "done"
                j.linear_s = time.time() - (j.linear_t0 or time.time())
                probe_s = max(j.linear_s for j in jobs if j.linear_s is not None)
                row = row_of(j, commit)
                if row is not None and row["linear_top1"] is not None:
                    record["runs"].append(row)
                    save()
                    print(f"[study] +{time.time() - t_start:.0f}s recorded {j.run.key}: kNN20 {row['knn_top1_k20']:.2f}"
                          f" linear {row['linear_top1']:.2f}", flush=True)
                else:
                    print(f"[study] {j.run.key}: linear probe failed (rc {j.linear.returncode})", flush=True)
        if todo and not training() and not any(j.phase == "linear" for j in jobs) and not any(map(fits, todo)):
            print(f"[study] {', '.join(r.key for r in todo)} would not finish before the deadline: left for the next "
                  "window", flush=True)
            break
        time.sleep(POLL_S)
    save()
    print(render(record, done_rows), flush=True)
    return 0


def row_of_train_ok(summary_file: Path, run: Run) -> bool:
    s = json.loads(summary_file.read_text())
    return not s.get("stopped_by_chunk_budget") and s.get("epochs", 0) >= run.epochs


# ---- the tables --------------------------------------------------------------------------------------------------
def partial_record(run_dir: Path, run: Run, why: str, commit: str, date: str, rows: dict[str, dict]) -> dict:
    """An incomplete run as a record of its own: the kNN curve it wrote before its machine went (`knn_curve.json`,
    brought back by `watch`), beside its partner's (the other method, same seed and schedule) from the complete
    rows `rows`, at the epochs both have. `"complete": false`: the study's tables, figure rows and skip list never
    read it (the run is still to run); `figure --partial` draws its curve."""
    curve = [{"epoch": p["epoch"], "top1_k20": round(p["top1_k20"], 2), "top1_k200": round(p["top1_k200"], 2)}
             for p in json.loads((run_dir / "knn_curve.json").read_text())]
    if not curve:
        raise SystemExit(f"{run_dir}/knn_curve.json holds no checkpoint: nothing to keep of {run.key}")
    partner_key = (Run("dino", "dino", run.seed, run.epochs) if run.method == "scfs"
                   else Run("scfs", "soft", run.seed, run.epochs)).key
    partner = rows.get(partner_key)
    paired = []
    if partner is not None:
        theirs = {p["epoch"]: p for p in partner.get("curve") or []}
        for p in curve:
            q = theirs.get(p["epoch"])
            if q is not None:
                paired.append({"epoch": p["epoch"], "this_k20": p["top1_k20"], "partner_k20": round(q["top1_k20"], 2),
                               "gap_k20": round(p["top1_k20"] - q["top1_k20"], 2), "this_k200": p["top1_k200"],
                               "partner_k200": round(q["top1_k200"], 2),
                               "gap_k200": round(p["top1_k200"] - q["top1_k200"], 2)})
    overrides = [o for o in run.overrides() if not o.startswith("name=")]
    command = " ".join([f"python -m scfs.train -m +study={run.study}", *overrides, "data.root=data/cifar10"])
    return {"complete": False, "run": run.key, "method": run.method, "variant": run.variant, "seed": run.seed,
            "epochs_planned": run.epochs, "last_epoch_measured": curve[-1]["epoch"], "why_incomplete": why,
            "command": command, "commit": commit, "date": date, "partner": partner_key if partner else None,
            "partner_commit": partner.get("commit") if partner else None, "curve": curve, "paired_curve": paired}


def render_partial(rec: dict) -> str:
    """The markdown of an incomplete run's record: why it stopped, its curve beside its partner's."""
    name = {"scfs": "SCFS", "dino": "DINO"}
    this = name.get(rec["method"], rec["method"])
    out = [f"# CIFAR-10, {rec['run']}: an incomplete run (kNN curve to epoch {rec['last_epoch_measured']} of "
           f"{rec['epochs_planned']})", "",
           f"Commit `{rec['commit']}`, {rec['date']}. **Not a result of the study**: {rec['why_incomplete']}. "
           "No final kNN, no linear probe; the study's tables do not read this record and the run is still to run.",
           "", f"Run: `{rec['command']}`."]
    if rec["paired_curve"]:
        other = "DINO" if rec["method"] == "scfs" else "SCFS"
        out += ["", f"kNN top-1 (k = 20, 200) at the same epochs of the same schedule as its partner "
                f"`{rec['partner']}` (complete, commit `{rec['partner_commit']}`):", "",
                f"| epoch | {this} k20 | {other} k20 | difference | {this} k200 | {other} k200 | difference |",
                "|---|---|---|---|---|---|---|"]
        for r in rec["paired_curve"]:
            out.append(f"| {r['epoch']} | {r['this_k20']:.2f} | {r['partner_k20']:.2f} | {r['gap_k20']:+.2f} | "
                       f"{r['this_k200']:.2f} | {r['partner_k200']:.2f} | {r['gap_k200']:+.2f} |")
    else:
        out += ["", "| epoch | kNN20 | kNN200 |", "|---|---|---|"]
        out += [f"| {p['epoch']} | {p['top1_k20']:.2f} | {p['top1_k200']:.2f} |" for p in rec["curve"]]
    return "\n".join(out) + "\n"


def write_partials(study_dir: Path, out: Path, why: str, commit: str, date: str, pattern: str) -> list[Path]:
    """Incomplete records for every run of the plan that has a kNN curve under `<study_dir>/runs/<key>/` and no
    complete row, neither committed (`pattern`) nor in the window's own record (`<study_dir>/out/`)."""
    rows = committed(pattern)
    rows.update(committed(str(study_dir / "out" / "cifar10-quality-*.json")))
    written = []
    for run in plan():
        run_dir = study_dir / "runs" / run.key
        if run.key in rows or not (run_dir / "knn_curve.json").is_file():
            continue
        rec = partial_record(run_dir, run, why, commit, date, rows)
        stem = out / f"cifar10-partial-{date}-{commit}-{run.key}"
        out.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(rec, indent=1) + "\n")
        stem.with_suffix(".md").write_text(render_partial(rec))
        written.append(stem.with_suffix(".json"))
    return written


def mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f} (1 seed)"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f} ({len(xs)} seeds)"


def render(record: dict, committed_rows: dict[str, dict] | None = None) -> str:
    """The markdown tables of a record: every run; SCFS vs DINO over seeds with the paired differences; the
    ablation; the training-length pair; the concurrency measurement."""
    rows = list((committed_rows or {}).values()) + record.get("runs", [])
    seen, uniq = set(), []
    for r in rows:
        k = (r["method"], r["variant"], r["seed"], r["epochs"])
        if k not in seen:
            seen.add(k)
            uniq.append(r)
    rows = sorted(uniq, key=lambda r: (r["epochs"], r["method"] != "scfs", r["variant"], r["seed"]))

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    out = [f"# CIFAR-10 quality study (record `{record.get('date', '')}`, commit `{record.get('commit', '')}`)", "",
           "Recipe: `python -m scfs.train +experiment=cifar10 data.root=data/cifar10 method=<m> [search=<v>] "
           "seed=<s> trainer.max_epochs=<e>`, one H200, runs side by side; linear: the swept fast probe "
           "(`python -m scfs.eval.linear ckpt=<last.ckpt> +experiment=cifar10 fast=true`, lr and wd chosen on a "
           "held-out 10 % of the training split). Regenerate: `python scripts/cifar10_study.py render "
           "benchmarks/results/cifar10-quality-*.json --out benchmarks/results/cifar10-quality.md` (one record: its "
           "tables beside it).", "",
           "| method | variant | seed | epochs | kNN20 | kNN200 | linear | lr | wd | wall s | side by side | commit |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['method']} | {r['variant']} | {r['seed']} | {r['epochs']} | {f(r['knn_top1_k20'])} | "
                   f"{f(r['knn_top1_k200'])} | {f(r['linear_top1'])} | {r.get('linear_lr')} | {r.get('linear_wd')} | "
                   f"{r.get('wall_s')} | {r.get('side_by_side', '-')} | {r.get('commit')} |")
    for epochs in sorted({r["epochs"] for r in rows}):
        sc = {r["seed"]: r for r in rows if r["method"] == "scfs" and r["variant"] == "soft" and r["epochs"] == epochs}
        dn = {r["seed"]: r for r in rows if r["method"] == "dino" and r["epochs"] == epochs}
        if not sc and not dn:
            continue
        out += ["", f"## SCFS (soft) vs DINO, {epochs} epochs", "",
                "| metric | SCFS | DINO | per-seed SCFS − DINO | mean diff, paired 95 % CI |", "|---|---|---|---|---|"]
        for m in ("knn_top1_k20", "knn_top1_k200", "linear_top1"):
            diffs = _paired_diffs(sc, dn, m)
            ci = _interval(diffs, one_seed="(1 seed, no interval)", none="-")
            out.append(f"| {m} | {mean_std([r[m] for r in sc.values()])} | {mean_std([r[m] for r in dn.values()])} | "
                       f"{', '.join(f'{d:+.2f}' for d in diffs) or '-'} | {ci} |")
    pairs = _pairs_with_curves(rows)
    if pairs:
        out += ["", "## Faster or better: the epoch at which DINO reaches SCFS's kNN20", "",
                "Per SCFS checkpoint, the epoch of the same seed and schedule at which DINO's kNN20 curve first "
                "reaches SCFS's value (linear between DINO's checkpoints), and that epoch over SCFS's. A steady ratio "
                "is a lead in speed; `not reached` is a value DINO's schedule does not get to.", ""]
        for epochs, seed, sc_run, dn_run in pairs:
            match = epochs_to_match(_curve(sc_run), _curve(dn_run))
            out += [f"| {epochs} epochs, seed {seed}: SCFS epoch | " + " | ".join(str(e) for e, _ in match) + " |",
                    "|---" * (len(match) + 1) + "|",
                    "| DINO reaches it at | " + " | ".join(_match_cell(e, at) for e, at in match) + " |", ""]
        out.pop()
    abl = [r for r in rows if r["method"] == "scfs" and r["seed"] == 0 and r["epochs"] == 100]
    if len(abl) > 1:
        out += ["", "## Ablation, seed 0, 100 epochs (ranked by kNN20)", "", "| variant | kNN20 | kNN200 | linear |",
                "|---|---|---|---|"]
        for r in sorted(abl, key=lambda r: -(r["knn_top1_k20"] or 0)):
            out.append(f"| {r['variant']} | {f(r['knn_top1_k20'])} | {f(r['knn_top1_k200'])} | {f(r['linear_top1'])} |")
    recorded = {row_key(r) for r in rows}
    left = [r.key for r in plan() if r.key not in recorded]
    if left:
        out += ["", f"Still to run ({len(left)} of {len(plan())}): " + ", ".join(f"`{k}`" for k in left) + "."]
    conc = record.get("concurrency") or {}
    if conc.get("note"):
        out += ["", f"Runs side by side: {conc['note']}"]
    if conc.get("stages"):
        out += ["", "## Runs side by side on one H200", "", conc.get("method", ""), "",
                "| runs | aggregate epochs/min | s per epoch, each run |", "|---|---|---|"]
        for st in conc["stages"]:
            each = ", ".join(f"{k} {v}" for k, v in st["epoch_s_per_run"].items())
            out.append(f"| {st['runs']} | {st['aggregate_epochs_per_min']} | {each} |")
    return "\n".join(out) + "\n"


README_START = "<!-- cifar10-study: generated by `python scripts/cifar10_study.py readme` from the records -->"
README_END = "<!-- cifar10-study: end -->"


def _paired_diffs(sc: dict[int, dict], dn: dict[int, dict], metric: str) -> list[float]:
    """SCFS − DINO of `metric` per seed, over the seeds both have a value for, in seed order."""
    return [sc[s][metric] - dn[s][metric] for s in sorted(set(sc) & set(dn))
            if sc[s][metric] is not None and dn[s][metric] is not None]


def _interval(diffs: list[float], one_seed: str = "(1 seed)", none: str = "–") -> str:
    """The mean of paired differences with its 95 % t interval; one seed's difference marked `one_seed`."""
    if len(diffs) >= 2:
        from scfs.eval.seeds import t_interval

        md, lo, hi = t_interval(diffs)
        return f"{md:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return f"{diffs[0]:+.2f} {one_seed}" if diffs else none


def _paired(sc: dict[int, dict], dn: dict[int, dict], metric: str) -> str:
    """SCFS − DINO over the seeds both have: the mean difference with its paired interval, or one seed's."""
    return _interval(_paired_diffs(sc, dn, metric))


def readme_block(record: dict) -> str:
    """The README's CIFAR-10 results, written from the records alone (so the README cannot drift from them): SCFS
    vs DINO at 100 epochs over seeds (mean ± std, the paired interval), the longer pair, the ablation ranked, and
    what is still to run."""
    rows = record.get("runs", [])

    def pick(method: str, variant: str, epochs: int) -> dict[int, dict]:
        return {r["seed"]: r for r in rows if r["method"] == method and r["variant"] == variant
                and r["epochs"] == epochs}

    def ms(group: dict[int, dict], metric: str) -> str:
        xs = [r[metric] for r in group.values() if r[metric] is not None]
        if not xs:
            return "–"
        return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"

    out = ["| CIFAR-10, ResNet-18, `+experiment=cifar10`, one H200 | SCFS (soft search) | DINO | SCFS − DINO "
           "(paired 95 % interval) |", "|---|---|---|---|"]
    sc, dn = pick("scfs", "soft", 100), pick("dino", "dino", 100)
    seeds = ", ".join(str(s) for s in sorted(set(sc) | set(dn)))
    for metric, name in (("knn_top1_k20", "kNN20"), ("knn_top1_k200", "kNN200"),
                         ("linear_top1", "linear (swept probe)")):
        out.append(f"| {name}, 100 epochs, seeds {seeds}, mean ± std | {ms(sc, metric)} | {ms(dn, metric)} | "
                   f"{_paired(sc, dn, metric)} |")
    for epochs in sorted({r["epochs"] for r in rows if r["epochs"] > 100}):
        sl, dl = pick("scfs", "soft", epochs), pick("dino", "dino", epochs)
        seeds = ", ".join(str(s) for s in sorted(set(sl) | set(dl)))

        def both(group: dict[int, dict]) -> str:
            return f"{ms(group, 'knn_top1_k20')} / {ms(group, 'linear_top1')}" if group else "still to run"

        gap = (f"{_paired(sl, dl, 'knn_top1_k20')} / {_paired(sl, dl, 'linear_top1')}" if sl and dl else "–")
        out.append(f"| kNN20 / linear, {epochs} epochs, seed {seeds} | {both(sl)} | {both(dl)} | {gap} |")
    out += _match_lines(rows)
    abl = sorted((r for r in rows if r["method"] == "scfs" and r["seed"] == 0 and r["epochs"] == 100),
                 key=lambda r: -(r["knn_top1_k20"] or 0))
    d0 = dn.get(0)
    if len(abl) > 1:
        parts = [f"`{r['variant']}` {r['knn_top1_k20']:.2f} / {r['linear_top1']:.2f}" for r in abl]
        if d0:
            parts.append(f"DINO {d0['knn_top1_k20']:.2f} / {d0['linear_top1']:.2f}")
        out += ["", "Ablation, seed 0, 100 epochs, kNN20 / linear, best first: " + ", ".join(parts) + "."]
    recorded = {row_key(r) for r in rows}
    left = [r.key for r in plan() if r.key not in recorded]
    done = f"{len(plan()) - len(left)} of {len(plan())} runs"
    out += ["", f"{done}" + (f" (still to run: {', '.join(f'`{k}`' for k in left)})" if left else "") + "; "
            "per run and per seed: `benchmarks/results/cifar10-quality.md`."]
    return "\n".join(out)


def _match_lines(rows: list[dict]) -> list[str]:
    """The README's faster-or-better line: per schedule, the epoch at which DINO reaches SCFS's kNN20 of the
    schedule's middle and of its end, over the seeds with both curves."""
    pairs = _pairs_with_curves(rows)
    if not pairs:
        return []
    parts = []
    for epochs in sorted({p[0] for p in pairs}):
        mine = [p for p in pairs if p[0] == epochs]
        seeds = " / ".join(str(p[1]) for p in mine)
        matches = [dict(epochs_to_match(_curve(sc), _curve(dn))) for _, _, sc, dn in mine]
        cells = []
        for at_epoch in (epochs // 2, epochs):
            found = [m.get(at_epoch, "absent") for m in matches]
            if any(f == "absent" for f in found):
                continue
            if all(f is None for f in found):
                cells.append(f"SCFS's epoch-{at_epoch} value on no seed")
            else:
                shown = " / ".join("never" if f is None else f"{f:.0f}" for f in found)
                cells.append(f"SCFS's epoch-{at_epoch} value at epoch {shown}")
        if cells:
            parts.append(f"over {epochs} epochs (seed{'s' if len(mine) > 1 else ''} {seeds}) DINO reaches "
                         + " and ".join(cells))
    if not parts:
        return []
    return ["", "Faster or better, DINO's kNN20 curve against SCFS's of the same seed and schedule: "
            + "; ".join(parts) + " (`cifar10-quality.md` has every checkpoint)."]


def write_readme(record: dict, readme: Path, check: bool = False) -> bool:
    """Put `readme_block(record)` between the README's markers; with `check`, only say whether it is already
    there. Returns True when the README holds the block (after writing, or as found)."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{readme}: no CIFAR-10 block markers; put {README_START!r} and {README_END!r} on lines "
                         "of their own where the block belongs")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    new = f"{head}{README_START}\n{readme_block(record)}\n{README_END}{tail}"
    if check:
        return new == text
    readme.write_text(new)
    return True


ABLATION = (("soft", "tab:red", "soft search (SCFS)"), ("hard", "tab:orange", "hard search"),
            ("roi", "tab:purple", "random RoIs, no search"), ("none", "tab:green", "stage heads only, no local term"))


def _curve(run: dict) -> dict[int, float]:
    return {p["epoch"]: p["top1_k20"] for p in run.get("curve") or []}


def gaps_to_dino(record: dict, seed: int = 0, epochs: int = 100) -> dict[str, list[tuple[int, float]]]:
    """Each SCFS variant's kNN20 minus DINO's at the same epoch, same seed and schedule: {variant: [(epoch, gap)]}
    over the epochs both curves hold. A gap that closes by the end is speed; one that stays is a better result."""
    def run_of(method: str, variant: str) -> dict | None:
        return next((r for r in record["runs"] if r["method"] == method and r["variant"] == variant
                     and r["seed"] == seed and r["epochs"] == epochs and r.get("curve")), None)

    dino = run_of("dino", "dino")
    if dino is None:
        return {}
    base = _curve(dino)
    out = {}
    for variant, _, _ in ABLATION:
        run = run_of("scfs", variant)
        if run is not None:
            out[variant] = [(e, y - base[e]) for e, y in sorted(_curve(run).items()) if e in base]
    return out


def epochs_to_match(curve: dict[int, float], reference: dict[int, float]) -> list[tuple[int, float | None]]:
    """For each epoch e of `curve` (SCFS's kNN20 checkpoints), the epoch at which `reference` (DINO's curve, same
    seed and schedule) first reaches the value `curve` has at e, interpolated linearly between its checkpoints
    (from epoch 0 at minus infinity: a value reached at the first checkpoint reads as that epoch), or None when
    `reference` never reaches it. The ratio to e is how many times the epochs DINO needs: a constant ratio is
    faster training; None at the end means SCFS ends where DINO's schedule does not get."""
    ref = sorted(reference.items())
    out: list[tuple[int, float | None]] = []
    for e, y in sorted(curve.items()):
        at = None
        for i, (e1, v1) in enumerate(ref):
            if v1 >= y:
                if i == 0:
                    at = float(e1)
                else:
                    e0, v0 = ref[i - 1]
                    at = e0 + (y - v0) / (v1 - v0) * (e1 - e0)
                break
        out.append((e, at))
    return out


def _pairs_with_curves(rows: list[dict]) -> list[tuple[int, int, dict, dict]]:
    """(epochs, seed, SCFS soft run, DINO run) for every schedule and seed where both runs have a kNN curve."""
    out = []
    for r in rows:
        if r["method"] != "scfs" or r["variant"] != "soft" or not r.get("curve"):
            continue
        d = next((x for x in rows if x["method"] == "dino" and x["seed"] == r["seed"] and x["epochs"] == r["epochs"]
                  and x.get("curve")), None)
        if d is not None:
            out.append((r["epochs"], r["seed"], r, d))
    return sorted(out, key=lambda t: (t[0], t[1]))


def _match_cell(e: int, at: float | None) -> str:
    return "not reached" if at is None else f"{at:.0f} ({at / e:.2f}x)"


def partials_to_draw(record: dict, partial: list[dict]) -> list[dict]:
    """The incomplete runs' records whose run has no complete row in `record` (a complete run replaces its
    incomplete curve), one per run (the longest curve)."""
    done = {row_key(r) for r in record["runs"]}
    best: dict[str, dict] = {}
    for rec in partial:
        if rec.get("complete") is not False or rec["run"] in done:
            continue
        if rec["run"] not in best or rec["last_epoch_measured"] > best[rec["run"]]["last_epoch_measured"]:
            best[rec["run"]] = rec
    return list(best.values())


def curve_figure(record: dict, out: Path, epochs: int = 100, partial: list[dict] | None = None) -> Path:
    """kNN20 of the teacher against epochs. Left: SCFS (soft) vs DINO, each seed a thin line, the mean over seeds
    bold, a band of mean ± std where there are two seeds or more, and the longer pair (seed 0, its own cosine
    schedule) dashed. Right, once an ablation run exists: each variant's gap to DINO (seed 0), which tells a lead
    that closes (faster training) from one that stays (better features). `partial`: incomplete runs' records
    (`partial_record`), drawn dotted to where they stopped, unless a complete row of the same run exists."""
    import numpy as np

    from scfs.plotting import new_figure

    gaps = gaps_to_dino(record, 0, epochs)
    two = any(v != "soft" for v in gaps)
    fig = new_figure(11.0 if two else 6.0, 3.8, dpi=120)
    ax = fig.add_subplot(1, 2 if two else 1, 1)
    for method, variant, colour, label in (("scfs", "soft", "tab:red", "SCFS"), ("dino", "dino", "tab:blue", "DINO")):
        mine = [r for r in record["runs"] if r["method"] == method and r["variant"] == variant and r.get("curve")]
        runs = [r for r in mine if r["epochs"] == epochs]
        for r in (r for r in mine if r["epochs"] > epochs):
            c = sorted(_curve(r).items())
            ax.plot([e for e, _ in c], [y for _, y in c], color=colour, lw=1.4, ls="--",
                    label=f"{label}, {r['epochs']}-epoch schedule (seed {r['seed']})")
        for rec in partials_to_draw(record, partial or []):
            if rec["method"] == method and rec["variant"] == variant:
                c = [(p["epoch"], p["top1_k20"]) for p in rec["curve"]]
                ax.plot([e for e, _ in c], [y for _, y in c], color=colour, lw=1.4, ls=":",
                        label=f"{label}, {rec['epochs_planned']}-epoch schedule (seed {rec['seed']}), "
                              f"incomplete: to epoch {rec['last_epoch_measured']}")
        if not runs:
            continue
        xs = sorted({p["epoch"] for r in runs for p in r["curve"]})
        ys = np.array([[_curve(r).get(x, np.nan) for x in xs] for r in runs])
        for y in ys:
            ax.plot(xs, y, color=colour, lw=0.7, alpha=0.5)
        mean = np.nanmean(ys, axis=0)
        ax.plot(xs, mean, color=colour, lw=2.0, label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        if len(runs) > 1:
            sd = np.nanstd(ys, axis=0, ddof=1)
            ax.fill_between(xs, mean - sd, mean + sd, color=colour, alpha=0.2, lw=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel("kNN top-1, k=20 (%)")
    longer = any(r["epochs"] > epochs and r.get("curve") for r in record["runs"])
    schedules = f"{epochs} epochs, dashed: longer schedule" if longer else f"{epochs} epochs"
    if any(line.get_linestyle() == ":" for line in ax.get_lines()):
        schedules += ", dotted: incomplete"
    ax.set_title(f"CIFAR-10, ResNet-18, teacher kNN20 ({schedules})\nband: ± std over seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    if two:
        bx = fig.add_subplot(1, 2, 2)
        for variant, colour, label in ABLATION:
            if variant in gaps:
                bx.plot([e for e, _ in gaps[variant]], [g for _, g in gaps[variant]], color=colour, lw=1.6,
                        marker="o", ms=3, label=f"{variant}: {label}")
        bx.axhline(0.0, color="tab:blue", lw=1.0, label="DINO")
        bx.set_xlabel("epoch")
        bx.set_ylabel("kNN20 minus DINO's (points)")
        bx.set_title(f"What each part adds, seed 0, {epochs} epochs: gap to DINO", fontsize=9)
        bx.grid(alpha=0.3)
        bx.legend(loc="upper right", fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--runs", default="runs/study")
    r.add_argument("--parallel", type=int, default=4)
    r.add_argument("--deadline", type=float, required=True, help="unix time by which every probe has ended")
    r.add_argument("--ramp", action="store_true")
    r.add_argument("--ramp-s", type=float, default=30.0)
    r.add_argument("--slim", nargs="*", default=[])
    r.add_argument("--only", nargs="*", default=[])
    r.add_argument("--extra", nargs="*", default=[], help="overrides added to every training run (tests)")
    r.add_argument("--test-epochs", type=int, default=0, help="every run this many epochs (tests of the runner)")
    r.add_argument("--committed", default="benchmarks/results/cifar10-quality-*.json")
    g = sub.add_parser("render", help="the markdown tables of one record (beside it) or of several merged (--out)")
    g.add_argument("records", nargs="+")
    g.add_argument("--out", default=None, help="where the tables go (default: beside a single record)")
    c = sub.add_parser("figure", help="kNN20 against epochs, SCFS vs DINO, band over seeds (records merged)")
    c.add_argument("records", nargs="+")
    c.add_argument("--out", default="docs/cifar10_knn_curves.png")
    c.add_argument("--partial", nargs="*", default=[], help="incomplete runs' records (cifar10-partial-*.json), "
                   "drawn dotted to where they stopped")
    q = sub.add_parser("partial", help="incomplete records for the runs of a study folder (an extracted watch "
                       "archive) that have a kNN curve but no row: runs lost with their machine")
    q.add_argument("study_dir", help="the folder holding runs/<key>/knn_curve.json (and out/, if any)")
    q.add_argument("--why", required=True, help="why the run stopped, in a sentence")
    q.add_argument("--commit", required=True)
    q.add_argument("--date", default=None, help="the window's date (default: today)")
    q.add_argument("--out", default="benchmarks/results")
    q.add_argument("--committed", default="benchmarks/results/cifar10-quality-*.json")
    m = sub.add_parser("readme", help="the README's CIFAR-10 block, between its markers, from the records merged")
    m.add_argument("records", nargs="+")
    m.add_argument("--file", default="README.md")
    m.add_argument("--check", action="store_true", help="exit 1 when the README's block differs from the records")
    a = p.parse_args(argv)
    if a.what == "run":
        return main_run(a)
    if a.what == "partial":
        import datetime as dt

        written = write_partials(Path(a.study_dir), Path(a.out), a.why, a.commit,
                                 a.date or dt.date.today().isoformat(), a.committed)
        print("\n".join(str(p) for p in written) or f"{a.study_dir}: no run with a curve and no row")
        return 0
    record = merge([Path(r) for r in a.records])
    if a.what == "readme":
        ok = write_readme(record, Path(a.file), check=a.check)
        if not ok:
            print(f"{a.file}: the CIFAR-10 block differs from the records; run python scripts/cifar10_study.py "
                  "readme benchmarks/results/cifar10-quality-*.json")
        return 0 if ok else 1
    if a.what == "figure":
        partial = [json.loads(Path(f).read_text()) for f in a.partial]
        print(curve_figure(record, Path(a.out), partial=partial))
        return 0
    if a.out is None and len(a.records) > 1:
        p.error("render of several records needs --out (the merged tables have no single record to sit beside)")
    out = Path(a.out) if a.out else Path(a.records[0]).with_suffix(".md")
    out.write_text(render(record))
    print(out.read_text())
    return 0


def merge(paths: list[Path]) -> dict:
    """Several window records as one: their runs (a run in two records counts once, the first), and each window's
    side-by-side measurement under its own record; one record comes back as it is."""
    recs = [json.loads(p.read_text()) for p in paths]
    if len(recs) == 1:
        return recs[0]
    runs, seen = [], set()
    for r in (row for rec in recs for row in rec.get("runs", [])):
        k = (r["method"], r["variant"], r["seed"], r["epochs"])
        if k not in seen:
            seen.add(k)
            runs.append(r)
    stages = [dict(st, record=p.name) for p, rec in zip(paths, recs)
              for st in (rec.get("concurrency") or {}).get("stages", [])]
    notes = [f"`{p.name}`: {rec['concurrency']['note']}" for p, rec in zip(paths, recs)
             if (rec.get("concurrency") or {}).get("note")]
    conc = {"method": next((rec["concurrency"]["method"] for rec in recs
                            if (rec.get("concurrency") or {}).get("method")), ""), "stages": stages}
    if notes:
        conc["note"] = " ".join(notes)
    return {"runs": runs, "concurrency": conc, "records": [p.name for p in paths],
            "date": ", ".join(sorted({rec.get("date", "") for rec in recs})),
            "commit": ", ".join(dict.fromkeys(rec.get("commit", "") for rec in recs))}


if __name__ == "__main__":
    sys.exit(main())

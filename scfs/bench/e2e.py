"""End-to-end training speed: a real `python -m scfs.train +experiment=imagenet` run on real JPEGs (or
`+experiment=cifar10` on the CIFAR-10 training split, `--recipe cifar10`), beside the step benchmark at the same batch,
and where the difference goes.

Why: `scfs.bench.step` times the training step on synthetic images already on the GPU; a user sees the speed of
the whole run (DataLoader workers decoding and cropping JPEGs, host-to-device copies, the colour ops on the device,
the Lightning loop, callbacks, logging). The run's own `summary.json` figure (`img_per_s`: the median over the
epochs after the first of steps x batch / epoch wall seconds; epoch 0 holds the compile) is that speed. The target
is e2e >= 95 % of the step benchmark's img/s at the same batch.

What one call does:
0. on a GPU, a throwaway process primes the machine (`scfs.bench.compile --prime`: the imports, the model on the
   device, the fused search kernels' extension built once per machine and copy of the tree; `--no-prime` skips
   it), so the first record of a fresh machine does not charge that build to a run's helper.
1. data. imagenet: an ImageFolder tree of hard links to the sample photos (`scfs.data.prepare.repeat_photos`):
   each photo `--repeat` times in 10 class folders, so one epoch decodes ~10,000 real JPEGs (100 photos x 100), plus
   a small val/ for the kNN pass at the run's end (outside the timed epochs); `--root DIR` uses an existing tree
   instead. cifar10: the prepared folder `--root` (default data/cifar10), made from `--archive` by the project's
   preparer (`python -m scfs.data.prepare cifar10`) when given; the recipe decodes its training split once (cached
   under `<root>/.scfs_cache/`) and holds it on the GPU (`data.on_device`), its views made there
   (`data.batch_aug`).
2. the real run, as a user runs it. imagenet, once per `--decode` mode: `python -m scfs.train +experiment=imagenet
   data.root=<tree> batch_size=<B> global_batch_size=null trainer.max_epochs=<epochs> data.decode=<mode>
   eval.figure=false hydra.run.dir=<dir>` (the recipe's compile, precision, workers, logger and checkpoints as
   shipped; the recipe already has no kNN before or during training). cifar10, once: `python -m scfs.train
   +experiment=cifar10 data.root=<root> batch_size=<B> global_batch_size=null trainer.max_epochs=<epochs>
   eval.figure=false eval.knn_at_start=false eval.knn_every_n_epochs=0 hydra.run.dir=<dir>` (the recipe's compile,
   precision, data path and checkpoints as shipped; its kNN passes before and during training are evaluation, not
   training, so they are off, as the ImageNet recipe ships them). `--profile` adds Lightning's SimpleProfiler
   (`+trainer.profiler=simple`) and splits a step's host time into the loader's `next`, the batch transfer with
   the views made on the device, the training batch and the per-batch hooks, and an epoch's once-per-epoch time
   into its start and end hooks, the checkpoint saves and the rest of the epoch loop.
3. the step benchmark in a subprocess: `python -m scfs.bench.step [--suite cifar] --batch <B> --setting <setting>
   --method <method> --no-ceiling`, its `img_per_s` (`--step-record FILE`: the figure of an existing step record
   instead, e.g. one measured in an earlier call on the same machine when one call cannot hold both compiles).
4. the record `<recipe>-e2e-<gpu>-<date>[-<commit>].{json,md}`: both figures, their ratio against the target, the
   first epoch's seconds, the profile split, the settings each side ran (a mismatch between them is named), the
   exact commands, the commit, torch / lightning versions and the GPU, and whether the compile cache the runs
   started from was empty (`--fresh-cache`: an empty one for each run, so each first step is a cold one whatever
   the machine's cache holds); the subprocesses' logs beside it in `<record>-logs/`.

Profile times are the host's: with CUDA the step is queued asynchronously, so a part's time includes waiting for
the GPU wherever the host synchronises (a GPU-bound run shows it in the training batch; a loader-bound run in
`next`). SimpleProfiler sums the whole fit; epoch 0's excess over a steady epoch (the compile) is taken out of
the training batch. The run's epoch clock (`EpochTimer`, its first callback) starts before every other
epoch-start hook and stops before every epoch-end hook (Lightning runs the checkpoint callbacks last), so the
epoch-start hooks are inside `epoch_seconds` and the epoch-end hooks, checkpoint saves included, fall between the
timed epochs: in a run's wall time, not in its img/s. The same clock times each epoch's opening (its start to
its first batch: a whole batch's work where the workers start every epoch's sampling afresh,
`prefetch_across_epochs=false`; less where they run on across epochs, the default), and the record gives the
steady rate with the openings taken out, the rate a long epoch approaches: the benchmark's epochs of tens of
steps pay an opening that an ImageNet epoch of thousands spreads thin.

`--device cpu --tiny` runs the same flow on the CPU in seconds (tiny backbone and crops, fp32, eager, no workers).
Usage:
    python -m scfs.bench.e2e --archive .gpudata/imagenet-samples-100.tar.xz [--photos data/imagenet-samples]
        [--batch 64] [--epochs 3] [--decode cpu gpu] [--profile] [--out benchmarks/results]
    python -m scfs.bench.e2e --recipe cifar10 --archive .gpudata/cifar10-jpeg.tar.xz [--root data/cifar10]
        [--batch 512] [--epochs 6] [--profile] [--out benchmarks/results]
    python -m scfs.bench.e2e --archive .gpudata/imagenet-samples-100.tar.xz --batch 256 --epochs 2 --no-step \
        --fresh-cache    # the command's cold first step, whatever the machine's cache holds
    python -m scfs.bench.e2e --device cpu --tiny --photos DIR --repeat 4 --batch 8 --out /tmp/x
    python -m scfs.bench.e2e --recipe cifar10 --device cpu --tiny --root DIR --batch 8 --epochs 2 --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scfs.bench.host import host_info, host_phrase
from scfs.bench.records import (
    local_backward_phrase,
    provenance,
    record_stem,
    run_logged,
    save_record,
    source_commit,
    startup_phrase,
    why_it_failed,
)
from scfs.names import DATA_DECODE
from scfs.training.compile_helpers import HELPER_NAMES
from scfs.training.host_load import load_phrase

TARGET = 0.95  # e2e img/s over the step benchmark's at the same batch
DEFAULT_PHOTOS, DEFAULT_TREE = Path("data/imagenet-samples"), Path("data/imagenet-e2e")
DEFAULT_CIFAR_ROOT, CIFAR_ARCHIVE = Path("data/cifar10"), ".gpudata/cifar10-jpeg.tar.xz"
RECIPES = ("imagenet", "cifar10")
# Per recipe: the step benchmark's suite of the same experiment (step.EXPERIMENT), the default batch (ImageNet: 64,
# the batch of the step benchmark's yardstick row; CIFAR-10: the recipe's own) and epochs (epoch 0 is the compile,
# the later ones give the median).
SUITE = {"imagenet": "resnet50", "cifar10": "cifar"}
DEFAULT_BATCH = {"imagenet": 64, "cifar10": 512}
DEFAULT_EPOCHS = {"imagenet": 3, "cifar10": 6}
# The CIFAR-10 recipe's kNN passes before training and every 10 epochs: evaluation, not training (a run's epoch
# clock leaves them out, its wall time does not), so they are off, as the ImageNet recipe ships them.
NO_EVAL = ["eval.knn_at_start=false", "eval.knn_every_n_epochs=0"]
IMAGENET_ONLY = ("photos", "tree", "repeat", "decode")
# The tiny CPU flow: the step benchmark's tiny network and crops, fp32 and eager on both sides, no workers.
TINY_TRAIN = ["trainer.precision=32-true", "compile=false", "num_workers=0", "logger=csv"]
TINY_SETTING = "fp32"
TINY_STEP = ["--tiny", "--warmup", "2", "--steps", "5"]
# SimpleProfiler action names (strategy class names vary: SingleDeviceStrategy, DDPStrategy) -> parts of a step
NEXT, EPOCH, BATCH = "[_TrainingEpochLoop].train_dataloader_next", "run_training_epoch", "run_training_batch"
BATCH_HOOKS = (".on_train_batch_start", ".on_train_batch_end", ".on_before_batch_transfer")
# ... and of an epoch: its start and end hooks (`[Callback]<state_key>.<hook>`, `[LightningModule]<class>.<hook>`),
# every `Trainer.save_checkpoint`, and the datamodule's `train_dataloader` (once per fit: the on-device split's
# decode or cache load and copy)
EPOCH_START, EPOCH_END = ".on_train_epoch_start", ".on_train_epoch_end"
SAVE, LOADER_SETUP = "save_checkpoint", ".train_dataloader"
HOOK_OWNERS = ("[Callback]", "[LightningModule]")


class E2EError(RuntimeError):
    """Bad input (the data to train on, a flag of the other recipe), said in one line."""


# ---- commands ----------------------------------------------------------------------------------------------------
def train_command(root: Path, batch: int, epochs: int, decode: str | None, run_dir: Path, *, method: str = "scfs",
                  workers: int | None = None, profile: bool = False, tiny: bool = False, device: str = "cuda",
                  overrides: list[str] | None = None, recipe: str = "imagenet") -> list[str]:
    """`python -m scfs.train +experiment=<recipe> ...` as a user types it, plus only what makes it a measurement:
    the data, batch, epochs, decode mode (imagenet; the CIFAR-10 recipe's on-device split has none) and the run
    folder (and the figure off: it is drawn after training, on the wall clock of the slot but not of the epochs;
    for cifar10 the kNN passes before and during training too, `NO_EVAL`). `tiny`: the CPU flow's network and
    crops, fp32, eager."""
    from scfs.bench.step import TINY

    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r}: one of {', '.join(RECIPES)}")
    cmd = [sys.executable, "-m", "scfs.train", f"+experiment={recipe}", f"method={method}", f"data.root={root}",
           f"batch_size={batch}", "global_batch_size=null", f"trainer.max_epochs={epochs}"]
    cmd += [f"data.decode={decode}"] if decode is not None else []
    cmd += ["eval.figure=false", *(NO_EVAL if recipe == "cifar10" else []), f"hydra.run.dir={run_dir}"]
    if workers is not None:
        cmd.append(f"num_workers={workers}")
    if device == "cpu":
        cmd.append("trainer.accelerator=cpu")
    if profile:
        cmd.append("+trainer.profiler=simple")
    if tiny:
        cmd += [o for o in TINY_TRAIN if not (workers is not None and o.startswith("num_workers="))] + TINY
    return cmd + list(overrides or [])


def step_command(batch: int, setting: str, method: str, out: Path, *, tiny: bool = False, device: str = "cuda",
                 overrides: list[str] | None = None, recipe: str = "imagenet") -> list[str]:
    """`python -m scfs.bench.step` for the one row compared: same experiment (its suite), method and batch, the
    recipe's default path."""
    cmd = [sys.executable, "-m", "scfs.bench.step"]
    cmd += ["--suite", SUITE[recipe]] if recipe != "imagenet" else []
    cmd += ["--batch", str(batch), "--setting", setting, "--method", method, "--no-ceiling", "--strict", "--device",
            device, "--out", str(out)]
    cmd += TINY_STEP if tiny else []
    for o in overrides or []:
        cmd += ["--override", o]
    return cmd


def shown(cmd: list[str]) -> str:
    """A command as one pastes it: `python -m ...` (the interpreter's path says nothing on another machine)."""
    return shlex.join(["python", *cmd[1:]] if cmd and cmd[0] == sys.executable else cmd)


# ---- the profiler report -----------------------------------------------------------------------------------------
def parse_simple_profiler(text: str) -> dict[str, dict[str, float]]:
    """{action: {"mean_s", "calls", "total_s"}} of the last SimpleProfiler report (extended table) in `text`, a
    run's log; {} when there is none. Rows are `|  action\\t|  mean\\t|  calls\\t|  total\\t|  percent\\t|`."""
    start = text.rfind("Profiler Report")
    if start < 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    for line in text[start:].splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("Action", "Total"):
            if out and not line.strip():  # the blank line after the table ends it
                break
            continue
        try:
            mean, calls, total = float(cells[1]), int(cells[2]), float(cells[3])
        except ValueError:
            continue
        out[cells[0]] = {"mean_s": mean, "calls": calls, "total_s": total}
    return out


def _present(actions: dict[str, dict[str, float]], match: Callable[[str], bool]) -> dict[str, float]:
    """{action: total seconds} of the actions `match(name)` accepts."""
    return {k: v["total_s"] for k, v in actions.items() if match(k)}


def profile_split(actions: dict[str, dict[str, float]], epoch_seconds: list[float]) -> dict[str, Any]:
    """Host ms per training step by part, from a SimpleProfiler report over the whole fit:

    * `next`: the loader's `next` (waiting for the workers' batch, pinned; on the on-device path an index_select);
    * `to_device`: the batch transfer, and inside it `views`: `on_after_batch_transfer` (the views or the colour
      ops, the GPU decode), so that `to_device - views` is the copy itself;
    * `batch`: `run_training_batch` (forward, backward, optimizer, EMA), epoch 0's excess over a steady epoch (the
      compile) taken out;
    * `hooks`: every callback and module hook of a batch (on_train_batch_start / end, on_before_batch_transfer);
    * `loop`: the rest of the epochs' time (the loop itself, the epoch's iterator creation), per step.
    A part whose actions the report lacks is None (shown "–"), never 0. Also the five heaviest per-batch hooks by
    total seconds (`top_hooks`) and the once-per-epoch time (`per_epoch`, `epoch_overhead`)."""
    steps = int(actions.get(BATCH, {}).get("calls", 0))
    if not steps:
        return {"error": "no run_training_batch in the profiler report"}
    excess = 0.0
    if len(epoch_seconds) > 1:
        excess = max(epoch_seconds[0] - statistics.median(epoch_seconds[1:]), 0.0)
    to_device = _present(actions, lambda k: k.endswith(".batch_to_device"))
    views = _present(actions, lambda k: k.endswith(".on_after_batch_transfer"))
    hooks = _present(actions, lambda k: k.endswith(BATCH_HOOKS))
    parts_s: dict[str, float | None] = {
        "next": actions[NEXT]["total_s"] if NEXT in actions else None,
        "to_device": sum(to_device.values()) if to_device else None,
        "batch": max(actions[BATCH]["total_s"] - excess, 0.0),
        "hooks": sum(hooks.values()) if hooks else None}
    epochs_s = actions.get(EPOCH, {}).get("total_s", 0.0) - excess
    loop = max(epochs_s - sum(v for v in parts_s.values() if v is not None), 0.0)
    parts_s["loop"] = loop
    per_step = {k: None if v is None else 1e3 * v / steps for k, v in parts_s.items()}
    if views and to_device:  # a part of to_device, not added to the parts
        per_step["views"] = 1e3 * min(sum(views.values()), sum(to_device.values())) / steps
    else:
        per_step["views"] = None
    top = sorted(hooks.items(), key=lambda kv: -kv[1])[:5]
    return {"steps": steps, "compile_excess_s": round(excess, 2), "ms_per_step": per_step,
            "step_ms": 1e3 * epochs_s / steps,
            "share": {k: v / epochs_s for k, v in parts_s.items() if v is not None} if epochs_s > 0 else {},
            "top_hooks": [{"hook": k, "ms_per_step": 1e3 * v / steps} for k, v in top],
            "per_epoch": epoch_overhead(actions, epoch_seconds, loop)}


def epoch_overhead(actions: dict[str, dict[str, float]], epoch_seconds: list[float],
                   loop_s: float | None = None) -> dict[str, Any]:
    """Seconds per epoch of what runs once per epoch rather than once per batch, and each as a share of the steady
    epoch (the median of `epoch_seconds` after the first), from a SimpleProfiler report over the whole fit (means
    over all epochs, epoch 0 included):

    * `epoch_start`: every callback's and the module's `on_train_epoch_start` (inside the run's timed epoch);
    * `epoch_end`: every `on_train_epoch_end` (after the timed epoch: the epoch clock stops first), the epoch-end
      checkpoint saves included;
    * `checkpoint`: `save_checkpoint`, every save of the fit (last.ckpt at each epoch end, the numbered checkpoint
      every `checkpoint.every_n_epochs`, a step save every `checkpoint.every_n_train_steps`, which falls inside a
      batch's hooks), with `saves` and `per_save_s`;
    * `loop_rest`: the epoch loop's time outside every per-batch action (`loop_s`, from `profile_split`): the
      epoch's iterator creation, which Lightning does not profile on its own, and the loop's own code;
    * `loader_setup_s`: the datamodule's `train_dataloader`, once before epoch 0 (not per epoch).
    A part whose actions the report lacks is None (shown "–"). Also the three heaviest per-epoch hooks."""
    epochs = int(actions.get(EPOCH, {}).get("calls", 0))
    if not epochs:
        return {"error": "no run_training_epoch in the profiler report"}
    steady = (statistics.median(epoch_seconds[1:]) if len(epoch_seconds) > 1 else
              epoch_seconds[0] if epoch_seconds else None)
    start = _present(actions, lambda k: k.startswith(HOOK_OWNERS) and k.endswith(EPOCH_START))
    end = _present(actions, lambda k: k.startswith(HOOK_OWNERS) and k.endswith(EPOCH_END))
    setup = _present(actions, lambda k: k.startswith("[LightningDataModule]") and k.endswith(LOADER_SETUP))
    save = actions.get(SAVE)
    parts = {"epoch_start": sum(start.values()) / epochs if start else None,
             "epoch_end": sum(end.values()) / epochs if end else None,
             "checkpoint": save["total_s"] / epochs if save else None,
             "loop_rest": loop_s / epochs if loop_s is not None else None}
    top = sorted({**start, **end}.items(), key=lambda kv: -kv[1])[:3]
    return {"epochs": epochs, "steady_epoch_s": steady, "s_per_epoch": parts,
            "share": {k: (v / steady if v is not None and steady else None) for k, v in parts.items()},
            "saves": int(save["calls"]) if save else 0, "per_save_s": save["mean_s"] if save else None,
            "loader_setup_s": sum(setup.values()) if setup else None,
            "top_hooks": [{"hook": k, "s_per_epoch": v / epochs} for k, v in top]}


# ---- comparison --------------------------------------------------------------------------------------------------
def compare(e2e_img_s: float | None, step_img_s: float | None, batch: int, target: float = TARGET) -> dict[str, Any]:
    """e2e / step against the target: met, or missed by how many points; the missing time per step in ms
    (batch / e2e - batch / step) and the e2e img/s the target asks for."""
    if not e2e_img_s or not step_img_s:
        return {"verdict": "no ratio (a side has no img/s)"}
    ratio = e2e_img_s / step_img_s
    met = ratio >= target
    return {"ratio": ratio, "target": target, "met": met, "needed_img_per_s": target * step_img_s,
            "missing_ms_per_step": 1e3 * batch * (1 / e2e_img_s - 1 / step_img_s),
            "verdict": "met" if met else f"missed by {100 * (target - ratio):.1f} points "
                                         f"({target * step_img_s:.0f} img/s needed)"}


def run_settings(run_dir: Path) -> dict[str, Any]:
    """What the real run ran with, from its composed config (`<run_dir>/.hydra/config.yaml`)."""
    from omegaconf import OmegaConf

    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    cfg = OmegaConf.load(path)

    def get(key: str) -> Any:
        return OmegaConf.select(cfg, key, default=None)

    return {"precision": str(get("trainer.precision")), "channels_last": bool(get("backbone.channels_last")),
            "compile": bool(get("compile")), "compile_mode": str(get("compile_mode")),
            "num_workers": get("num_workers"), "decode": str(get("data.decode")),
            "colour_on_device": bool(get("data.colour_on_device")), "on_device": bool(get("data.on_device")),
            "batch_aug": bool(get("data.batch_aug")), "backbone": str(get("backbone.name")),
            "logger": str(get("logger.name") or "-"),
            "progress_bar": bool(get("trainer.enable_progress_bar")),
            "finite_check_every_n_steps": get("finite_check_every_n_steps"),
            "prefetch_across_epochs": get("prefetch_across_epochs"),
            "background_writes": get("checkpoint.background_writes"), "accelerator": str(get("trainer.accelerator"))}


def step_settings(setting: str) -> dict[str, Any]:
    """The step benchmark's precision, memory format and compile for a `--setting` (step.SETTINGS)."""
    from scfs.bench.step import SETTINGS

    precision, cl, comp = SETTINGS[setting]
    return {"precision": precision, "channels_last": cl, "compile": bool(comp),
            "compile_mode": comp if isinstance(comp, str) else "default"}


def mismatches(run: dict[str, Any], step: dict[str, Any]) -> list[str]:
    """The settings in which the real run and the step benchmark differ (each then measures another step)."""
    return [f"{k}: real run {run[k]}, step {step[k]}" for k in ("precision", "channels_last", "compile", "compile_mode")
            if k in run and run[k] != step[k] and not (k == "compile_mode" and not run.get("compile"))]


# ---- the record --------------------------------------------------------------------------------------------------
def cell(v: float | None, fmt: str = "{:.1f}") -> str:
    """A measured part as a table shows it; "–" for a part whose profiler actions the run's report lacks."""
    return "–" if v is None else fmt.format(v)


def hook_name(action: str) -> str:
    """A hook's profiler action as a table names it: a callback's state in its key (ModelCheckpoint's
    `{'monitor': None, ...}`) left out; the record keeps the full name."""
    return re.sub(r"\{[^}]*\}", "", action)


# the run's `summary.json` entries on its compile, kept in the row (`compile`): the helpers' timeline and statuses,
# the background child's switch, the cuDNN warm-up
COMPILE_KEYS = ("compile_parallel", "compile_background", "compile_cudnn_warmup")
# the run's own compiles the record names (shorter ones are cache loads and small graphs)
OWN_COMPILE_MIN_S = 0.5


def own_compile(c: dict) -> str:
    """One of the run's own compiles (`frame_compiles`), as the record names it."""
    if c.get("first_run"):
        return f"`{c['graph']}` first run {c['s']} s at {c['at_s']} s"
    cache = c.get("inductor_cache")
    return f"`{c['graph']}` {c['s']} s at {c['at_s']} s" + (f" (inductor cache {cache})" if cache else "")


def rest_of_first_run(compiles: list[dict]) -> float | None:
    """Seconds from the end of the student's forward's first-run benchmarks (`frame_compiles`' first-run entry: its
    launch-config benchmarks alone) to the start of the teacher's compile, the next thing the step does once the
    student's call returns; None where the record lacks either (the split student's graphs have other names)."""
    first = next((c for c in compiles if c.get("graph") == "student_forward" and c.get("first_run")), None)
    teacher = next((c for c in compiles if c.get("graph") == "teacher_forward" and not c.get("first_run")), None)
    if first is None or teacher is None or first.get("s") is None:
        return None
    return round(teacher["at_s"] - (first["at_s"] + first["s"]), 2)


def compile_lines(rows: list[dict]) -> list[str]:
    """What the first epoch spent on the compile, per row whose run reported it: the first step, its waits for the
    helpers' entries, when each helper wrote them, and the cuDNN warm-up (none for a record from before the rows
    kept it)."""
    out = []
    for r in rows:
        c = r.get("compile") or {}
        par, warm = c.get("compile_parallel") or {}, c.get("compile_cudnn_warmup") or {}
        parts = []
        if par.get("first_step_s") is not None:
            waited = ", ".join(f"{k} {v} s" for k, v in (par.get("waited_s") or {}).items())
            second_run = (r.get("compile_cache") or {}).get("empty_at_start") is False
            parts.append(f"the first step took {par['first_step_s']} s" + (f", waiting for the helpers' entries "
                                                                          f"({waited})" if waited else "")
                         + (" (its compile cache held an earlier run's graphs: a second run's first step)"
                            if second_run else ""))
            if par.get("early_s") is not None:
                ready, after = par.get("ready_at_go"), par.get("early_started_after_s")
                parts.append(f"the helpers started {par['early_s']} s before fit"
                             + ("" if after is None else f" and {after} s after the run's own start")
                             + ("" if ready is None else f" (ready for the go by then: {', '.join(ready) or 'none'})"))
            for key, name in HELPER_NAMES.items():
                early = (par.get(key) or {}).get("early") or {}
                if early.get("ready_s") is not None:
                    parts.append(f"{name} had built its model {early['ready_s']} s after its start"
                                 f"{startup_phrase(early)}")
            begun = par.get("started_s") or {}
            ready = ", ".join(f"{k} at {v} s" + (f" (begun at {begun[k]} s)" if k in begun else "")
                              for k, v in (par.get("ready_s") or {}).items())
            if ready:
                parts.append(f"they wrote their entries (seconds after the go) {ready}")
            built = par.get("built_here") or []
            if built:
                parts.append(f"built in the run without a helper's entry: {', '.join(built)}")
            local = par.get("local_helper") or {}
            if local:  # the student's call per view size
                parts.append("the local views' helper " + (
                    f"wrote its graphs{local_backward_phrase(local)}" if local.get("ok")
                    else f"wrote no entry ({local.get('error', 'it had not ended')})"))
            if par.get("local_brought_backward") is not None:
                parts.append("the run's local views' graph " + (
                    "came with its backward from AOTAutograd's cache" if par["local_brought_backward"]
                    else "did not bring its backward: it was built from inductor's entries or compiled here"))
            if par.get("host_load"):
                parts.append(f"the host during the first step: {load_phrase(par['host_load'])}")
            own = [g for g in par.get("compiles") or [] if (g.get("s") or 0) >= OWN_COMPILE_MIN_S]
            if own:
                parts.append(f"the run's own compiles and first runs of {OWN_COMPILE_MIN_S} s or more (seconds from "
                             "fit's start): " + ", ".join(own_compile(g) for g in own))
            rest = rest_of_first_run(par.get("compiles") or [])
            if rest is not None:
                parts.append(f"the student's call went on {rest} s past its first run's launch-config benchmarks, "
                             "until the teacher's compile began (the rest of that first run: its kernels' first "
                             "launches and, with `trainer.benchmark`, cuDNN's benchmarks of the forward's "
                             "convolutions, which only the run's own thread can make)")
        if warm.get("convs"):
            if warm.get("forward_s") is not None:
                parts.append(f"cuDNN's forward algorithms for {warm['convs']} convolutions chosen on the run's thread "
                             f"in {warm['forward_s']} s when training started (`compile_cudnn_warmup_forward`)")
            parts.append(f"cuDNN's backward algorithms for {warm['convs']} convolutions chosen "
                         f"{warm.get('done_s')} s into training (`compile_cudnn_warmup`)")
        elif warm.get("off"):
            parts.append(f"`compile_cudnn_warmup` off ({warm['off']})")
        if c.get("compile_background"):
            bg = c["compile_background"]
            parts.append(f"`compile_background`: the compiled step took over at step {bg.get('switch_step')}, "
                         f"{bg.get('switch_after_s')} s into training")
        if parts:
            out.append(f"- {row_label(r)}: " + "; ".join(parts) + ".")
    return ["", "The first epoch's compile (the run's `summary.json`; the helpers' logs beside the record):", "",
            *out] if out else []


def row_label(r: dict) -> str:
    """What a row ran on: its decode mode (imagenet, one row per mode); for the CIFAR-10 recipe its data path."""
    if r.get("decode"):
        return str(r["decode"])
    s = r.get("settings") or {}
    return "on-device" if s.get("on_device") else f"decode={s['decode']}" if s.get("decode") else "recipe"


def writes_where(row: dict[str, Any]) -> str | None:
    """Where the run wrote its checkpoints: the writer the run itself used (its summary's `checkpoint_writes`), else
    read from its config (`checkpoint.background_writes`; auto = in the background on a GPU), or None when neither
    says. A config that leaves the accelerator to Lightning ran on the GPU: this benchmark's CPU flow sets
    `trainer.accelerator=cpu` itself."""
    from scfs.models.checkpoint_io import writes_in_background

    used = (row.get("summary") or {}).get("checkpoint_writes")
    settings = row.get("settings") or {}
    if used is not None:
        background = used == "background"
    elif settings.get("background_writes") is not None:
        accelerator = str(settings.get("accelerator"))
        background = writes_in_background(settings["background_writes"],
                                          "gpu" if accelerator in ("auto", "None") else accelerator)
    else:
        return None
    return "written in the background" if background else "written on the training thread"


def epoch_cell(pe: dict[str, Any], part: str, row: dict[str, Any] | None = None) -> str:
    """`s (share of the steady epoch)` of one once-per-epoch part; checkpoint saves with their count and mean, the
    file's size and where it was written (the save's time is the training thread's share of it)."""
    v, share = pe["s_per_epoch"].get(part), pe["share"].get(part)
    if v is None:
        return "–"
    text = f"{v:.3f} s" + (f" ({100 * share:.1f} %)" if share is not None else "")
    if part == "checkpoint" and pe.get("saves"):
        text += f", {pe['saves']} saves of {pe['per_save_s']:.3f} s"
        extra = [f"last.ckpt {row['checkpoint_mb']:,.0f} MB"] if row and row.get("checkpoint_mb") else []
        where = writes_where(row or {})
        extra += [where] if where else []
        text += f" ({'; '.join(extra)})" if extra else ""
    return text


def epoch_table(rows: list[dict], col: str) -> list[str]:
    """The once-per-epoch part of the profile (`epoch_overhead`) as markdown lines, one row per profiled run."""
    rows = [r for r in rows if "error" not in r["profile"].get("per_epoch", {"error": "none"})]
    if not rows:
        return []
    lines = ["", "Once per epoch (`--profile`), seconds per epoch (the mean over all epochs, epoch 0 included) and "
             "their share of the steady epoch (the median epoch s after the first): epoch-start hooks = every "
             "callback's and the module's `on_train_epoch_start`, inside the timed epoch; epoch-end hooks = every "
             "`on_train_epoch_end`, the epoch-end checkpoint saves included: the run's epoch clock (`EpochTimer`, its "
             "first callback) stops before them, so they are in a run's wall time but not in its epoch s or e2e "
             "img/s; checkpoint saves = every `save_checkpoint` of the fit (last.ckpt at each epoch end, the numbered "
             "checkpoint every `checkpoint.every_n_epochs`, a step save every `checkpoint.every_n_train_steps`, which "
             "falls in a batch's hooks); loop rest = the epoch loop outside every per-batch action: the epoch's "
             "iterator creation (Lightning profiles it with no action of its own) and the loop's own code; loader "
             "setup = the datamodule's `train_dataloader`, once before epoch 0 (the on-device path's decode or cache "
             "load and copy). – = the run's report has no such action.", "",
             f"| {col} | steady epoch s | epoch-start hooks | epoch-end hooks | checkpoint saves | loop rest | loader "
             "setup s (once) | heaviest per-epoch hooks (s per epoch) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pe = r["profile"]["per_epoch"]
        hooks = ", ".join(f"{hook_name(h['hook'])} {h['s_per_epoch']:.3f}" for h in pe["top_hooks"])
        lines.append(f"| {row_label(r)} | {cell(pe['steady_epoch_s'], '{:.2f}')} | {epoch_cell(pe, 'epoch_start')} | "
                     f"{epoch_cell(pe, 'epoch_end')} | {epoch_cell(pe, 'checkpoint', r)} | "
                     f"{epoch_cell(pe, 'loop_rest')} | {cell(pe['loader_setup_s'], '{:.2f}')} | {hooks or '–'} |")
    return lines


def opening_lines(rows: list[dict], step_img_s: float | None) -> list[str]:
    """Each run's epoch openings (`EpochTimer`'s `epoch_openings_s`) as markdown lines, with the steady rate they
    leave (`img_per_s_after_openings`) against the step benchmark: on a short epoch the opening is a share of the
    e2e rate that an ImageNet epoch of thousands of steps does not pay."""
    lines = []
    for r in rows:
        e2e = r.get("summary") or {}
        openings = e2e.get("epoch_openings_s")
        if "error" in r or not openings:
            continue
        text = f"{row_label(r)}: " + ", ".join(f"{o:.2f}" for o in openings) + " s"
        after = e2e.get("img_per_s_after_openings")
        if after:
            text += f"; the steady epochs without them: {rate(after)} img/s"
            if step_img_s:
                text += f", {100 * after / step_img_s:.1f} % of the step benchmark"
        writes = e2e.get("epoch_background_writes_s")
        if writes:
            text += "; beside a background checkpoint write: " + ", ".join(f"{w:.2f}" for w in writes) + " s"
        lines.append(f"- {text}")
    if not lines:
        return []
    return ["", "Each epoch's opening (the run's epoch clock, `EpochTimer`: from the epoch's start to its first "
            "batch's start, i.e. the loader's first batch of the epoch on the device; epoch 0's includes the first "
            "views' compile where the recipe compiles them). Workers that start each epoch's sampling afresh "
            "(`prefetch_across_epochs=false`) make it a whole batch's work; workers that run on across epochs (the "
            "default) leave what they have not made of the first batch by then. Where checkpoints are written in the "
            "background, the seconds of each epoch that ran beside a write follow (a write handed over at an "
            "epoch's end runs into the next epoch):", "", *lines]


def run_cache_dir(recipe: str, overrides: list[str] | None) -> Path:
    """The compile cache folder a run of the training command uses (`choose_compile_cache`): TORCHINDUCTOR_CACHE_DIR
    where a user set it (`users_cache_dir`), else the recipe's `compile_cache` with the run's overrides (Hydra's
    compose, as the CLI composes it: `compose_train_cfg`); with `compile_cache=null` torch's own default folder."""
    from scfs.training.compile_helpers import torch_default_cache_dir, users_cache_dir
    from scfs.workbench import compose_train_cfg

    env = users_cache_dir()
    if env:
        return Path(env)
    chosen = compose_train_cfg([f"+experiment={recipe}", *(overrides or [])]).get("compile_cache")
    return Path(str(chosen)).expanduser() if chosen else Path(torch_default_cache_dir())


def cache_state(cache: Path) -> dict[str, Any]:
    """The compile cache the runs start from: its folder, and whether it held anything (a run on a cache an earlier
    run filled loads its graphs and launch configs, so its first step is a second run's, not a cold one)."""
    return {"dir": str(cache), "empty_at_start": not (cache.is_dir() and any(cache.iterdir()))}


def cache_sentence(meta: dict[str, Any]) -> str:
    """The record's sentence on the compile cache it started from ("" for a record from before it was kept)."""
    c = meta.get("compile_cache")
    if not c:
        return ""
    if c.get("fresh"):
        return " Compile cache: an empty folder of each run's own (`--fresh-cache`), so every first step is a cold one."
    return (f" Compile cache: `{c['dir']}`, empty at the start." if c.get("empty_at_start") else
            f" Compile cache: `{c['dir']}`, not empty at the start: the first step loaded what an earlier run "
            "compiled (a second run's first step).")


def prime_sentence(meta: dict[str, Any]) -> str:
    """The record's sentence on the machine's prime before the runs ("" where none ran)."""
    if meta.get("prime_s") is None:
        return ""
    return (f" Before the runs a throwaway process primed the machine in {meta['prime_s']} s (`scfs.bench.compile "
            "--prime`: the imports, the model on the device and the fused search kernels' extension built or found), "
            "so no run's helper pays that once-per-machine build.")


def markdown(result: dict) -> str:
    m = result["meta"]
    st = result.get("step") or {}
    recipe = m.get("recipe", "imagenet")
    what = "real JPEGs" if recipe == "imagenet" else "the CIFAR-10 training split"
    col = "decode" if recipe == "imagenet" else "data"
    lines = [f"# End-to-end training speed (`+experiment={recipe}`, {what}): {m['gpu']}, {m['date']}", "",
             f"{provenance(m.get('commit'), m['command'])} torch {m['torch']}, lightning "
             f"{m['lightning']}, {m['cpus']} CPU cores. Data: {m['data']}.{cache_sentence(m)}{prime_sentence(m)}"
             + (f" {host_phrase(m['host'])}" if m.get("host") else ""), "",
             "e2e img/s = the run's `summary.json` `img_per_s`: the median over the epochs after the first of steps x "
             "batch / epoch wall seconds (epoch 0 holds the compile). step img/s = `scfs.bench.step` (synthetic uint8 "
             f"images on the device, median step) at the same batch. Target: e2e >= {100 * TARGET:.0f} % of step."]
    if m.get("eval_off"):
        lines[-1] += (f" The recipe's kNN passes before and during training are off (`{' '.join(m['eval_off'])}`): "
                      "they are evaluation, not training; its kNN after training still runs, after the timed epochs.")
    lines += ["", f"| {col} | workers | precision | compile | B | epochs | e2e img/s | step img/s (setting) | "
              f"e2e / step | target {100 * TARGET:.0f} % | missing ms/step | first epoch s | epoch s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    step_cell = (f"{rate(st['img_per_s'])} ({st['setting']})" if st.get("img_per_s") else
                 f"- ({st.get('error', 'not run')[:80]})")
    for r in result["rows"]:
        s, c = r.get("settings", {}), r.get("compare", {})
        e2e = r.get("summary", {})
        if "error" in r:
            lines.append(f"| {row_label(r)} | {s.get('num_workers', '-')} | {s.get('precision', '-')} | "
                         f"{s.get('compile_mode', '-') if s.get('compile') else 'eager' if s else '-'} | {r['B']} | "
                         f"{r['epochs']} | error: {r['error'][:120]} | {step_cell} | - | - | - | - | - |")
            continue
        ratio = f"{100 * c['ratio']:.1f} %" if "ratio" in c else "-"
        missing = f"{c['missing_ms_per_step']:.1f}" if "missing_ms_per_step" in c else "-"
        img = rate(e2e["img_per_s"]) if e2e.get("img_per_s") else "-"
        lines.append(f"| {row_label(r)} | {s.get('num_workers', '-')} | {s.get('precision', '-')} | "
                     f"{s.get('compile_mode') if s.get('compile') else 'eager'} | {r['B']} | {r['epochs']} | {img} | "
                     f"{step_cell} | {ratio} | {c.get('verdict', '-')} | {missing} | {e2e.get('first_epoch_s', '-')} | "
                     f"{', '.join(str(x) for x in e2e.get('epoch_seconds', []))} |")
    prof = [r for r in result["rows"] if r.get("profile") and "error" not in r["profile"]]
    if prof:
        lines += ["", "Where a step's host time goes (`--profile`: Lightning's SimpleProfiler over the whole fit, "
                  "epoch 0's excess over a steady epoch taken out of the training batch), ms per step: `next` = the "
                  "loader's next batch (waiting for the workers), to device = the transfer and "
                  "`on_after_batch_transfer`, of which views = `on_after_batch_transfer` alone (views or colour ops; "
                  "the GPU decode), batch = forward, backward, "
                  "optimizer, EMA, hooks = the callbacks' and module's per-batch hooks, loop = the rest. With CUDA a "
                  "part includes the waits for the GPU at the host's syncs in it. step bench = the step "
                  "benchmark's step at this batch; missing = what the e2e step takes beyond it. "
                  "– = the run's report has no such action.", "",
                  f"| {col} | next | to device | of it views | batch | hooks | loop | e2e step (profiled) | "
                  "step bench | missing | heaviest hooks |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in prof:
            p = r["profile"]
            ms = p["ms_per_step"]
            bench = f"{st['step_ms']:.1f}" if st.get("step_ms") else "-"
            missing = f"{p['step_ms'] - st['step_ms']:.1f}" if st.get("step_ms") else "-"
            hooks = ", ".join(f"{hook_name(h['hook'])} {h['ms_per_step']:.2f}" for h in p["top_hooks"][:3])
            lines.append(f"| {row_label(r)} | {cell(ms['next'])} | {cell(ms['to_device'])} | {cell(ms.get('views'))} | "
                         f"{cell(ms['batch'])} | {cell(ms['hooks'])} | {cell(ms['loop'])} | {p['step_ms']:.1f} | "
                         f"{bench} | {missing} | {hooks} |")
        lines += epoch_table(prof, col)
    lines += opening_lines(result["rows"], st.get("img_per_s"))
    lines += compile_lines(result["rows"])
    diffs = sorted({d for r in result["rows"] for d in r.get("mismatch", [])})
    if diffs:
        lines += ["", "The two sides ran different settings (the step benchmark's `--setting` against the recipe as "
                  "shipped), so part of the gap is the step itself: " + "; ".join(diffs) + "."]
    lines += ["", "Commands:", ""]
    lines += [f"- real run, {'decode=' + r['decode'] if r.get('decode') else recipe}: `{r['command']}`"
              for r in result["rows"]]
    if st.get("command"):
        lines.append(f"- step benchmark: `{st['command']}`")
    return "\n".join(lines) + "\n"


def step_row(rows: list[dict], method: str, batch: int, setting: str) -> dict | None:
    """The step record's row of this method, batch and setting (a `--vary` suffix of the setting ignored)."""
    return next((r for r in rows if r.get("method") == method and r.get("B") == batch
                 and str(r.get("setting", "")).split(" ")[0] == setting), None)


def read_step_record(path: Path, method: str, batch: int, setting: str, recipe: str = "imagenet") -> dict[str, Any]:
    """The step figure from an existing record instead of a new measurement (a slot too short for both compiles,
    or the committed record a speed claim cites): the row of this method, batch and setting of a `scfs.bench.step`
    record of the recipe's suite, or the step of an e2e record of the recipe."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise E2EError(f"--step-record {path}: not a readable JSON step record ({err})") from None
    meta = rec.get("meta", {})
    rows = rec.get("rows", [])
    if isinstance(rec.get("step"), dict):  # an e2e record: the step it measured
        rows = [{"method": meta.get("method"), **rec["step"]}]
        suite = SUITE.get(meta.get("recipe", "imagenet"))
    else:
        suite = meta.get("suite", "resnet50")
    if suite != SUITE[recipe]:
        raise E2EError(f"--step-record {path}: measures the {suite} suite, not --recipe {recipe}'s {SUITE[recipe]} "
                       "(pass a record of the same experiment, or leave --step-record out to measure the step)")
    row = step_row(rows, method, batch, setting)
    if row is None or "img_per_s" not in row:
        raise E2EError(f"--step-record {path}: no {method} row at B={batch} with setting {setting} (pass --batch and "
                       "--setting of a row it has, or leave --step-record out to measure the step)")
    return {"command": f"{meta.get('command', 'python -m scfs.bench.step')} (record {path}, {meta.get('gpu', '?')}, "
                       f"{meta.get('date', '?')})", "setting": setting, "B": batch, "record": str(path),
            "settings": step_settings(setting),
            **{k: row.get(k) for k in ("img_per_s", "step_ms", "warmup_s", "peak_GiB", "aug_ms")}}


def rate(v: float) -> str:
    """img/s as a table shows it: whole numbers on a GPU, three significant digits for the CPU flow's few."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi, without creating a CUDA context in this process (the run and the
    step benchmark each get the whole GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return names[0].strip() if names else None


def build_data(args: argparse.Namespace) -> tuple[Path, str]:
    """The folder the run trains on, and its description for the record."""
    if args.recipe == "cifar10":
        return cifar_data(args.root, args.archive)
    from scfs.data.prepare import PrepareError, extract_archive, repeat_photos

    if args.root is not None:
        if not (args.root / "train").is_dir():
            raise E2EError(f"--root {args.root}: no train/<class>/ folders there; pass an ImageFolder tree, or "
                           "--photos DIR to build one")
        n = sum(1 for p in (args.root / "train").rglob("*") if p.is_file())
        return args.root, f"{args.root} ({n} train files)"
    if args.archive is not None and not args.photos.is_dir():
        try:
            extract_archive(args.archive, args.photos, log=lambda s: print(s, flush=True))
        except PrepareError as err:
            raise E2EError(str(err)) from None
    try:
        counts = repeat_photos(args.photos, args.tree, args.repeat, classes=10, log=lambda s: print(s, flush=True))
    except PrepareError as err:
        raise E2EError(str(err)) from None
    return args.tree, (f"{args.tree}: {counts['train']} train JPEG decodes per epoch ({counts['photos']} photos of "
                       f"{args.photos} x {args.repeat} hard links, {counts['classes']} classes), {counts['val']} val")


def cifar_data(root: Path, archive: Path | None) -> tuple[Path, str]:
    """The prepared CIFAR-10 folder: made from `archive` by the project's preparer when given (kept as is when it
    already exists), else checked for its train/ split."""
    from scfs.data.prepare import PrepareError, prepare_cifar10

    if archive is not None:
        try:
            prepare_cifar10(archive, root, log=lambda s: print(s, flush=True))
        except PrepareError as err:
            raise E2EError(str(err)) from None
    if not (root / "train").is_dir():
        raise E2EError(f"--root {root}: no train/ folder there; prepare it with `python -m scfs.data.prepare cifar10 "
                       f"--archive {CIFAR_ARCHIVE} --out {root}`, or pass --archive")
    n = sum(1 for p in (root / "train").rglob("*") if p.is_file())
    return root, (f"{root}: {n} train files, decoded once (cached under {root / '.scfs_cache'}), the split then held "
                  "on the training device as the recipe ships it")


def recipe_args(args: argparse.Namespace) -> None:
    """Check the flags against `--recipe` and fill the recipe's defaults in place; E2EError for a flag of the
    other recipe (imagenet's photo tree and decode modes mean nothing to the CIFAR-10 on-device split)."""
    if args.recipe == "cifar10":
        given = [f"--{k}" for k in IMAGENET_ONLY if getattr(args, k) is not None]
        if given:
            raise E2EError(f"{', '.join(given)}: imagenet-only (--recipe cifar10 trains on --root, default "
                           f"{DEFAULT_CIFAR_ROOT}, made from --archive {CIFAR_ARCHIVE})")
        args.root = args.root or DEFAULT_CIFAR_ROOT
    else:
        args.photos = args.photos or DEFAULT_PHOTOS
        args.tree = args.tree or DEFAULT_TREE
        args.repeat = 100 if args.repeat is None else args.repeat
        args.decode = args.decode or ["cpu"]
    args.batch = DEFAULT_BATCH[args.recipe] if args.batch is None else args.batch
    args.epochs = DEFAULT_EPOCHS[args.recipe] if args.epochs is None else args.epochs


def main(argv: list[str] | None = None) -> int:
    from scfs.bench.step import PATHS, SETTINGS

    ap = argparse.ArgumentParser(prog="python -m scfs.bench.e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=RECIPES, default="imagenet",
                    help="the experiment measured: imagenet (JPEG tree, --decode modes) or cifar10 (the training split "
                         "on the device, views made there)")
    ap.add_argument("--photos", type=Path, default=None,
                    help=f"imagenet: folder of photos (python -m scfs.data.prepare imagenet-samples ...), linked into "
                         f"--tree (default {DEFAULT_PHOTOS})")
    ap.add_argument("--archive", type=Path, default=None,
                    help="imagenet: the sample photos' archive (.gpudata/imagenet-samples-100.tar.xz), extracted into "
                         f"--photos first when that folder is missing; cifar10: the CIFAR-10 JPEG archive "
                         f"({CIFAR_ARCHIVE}), prepared into --root unless that folder already exists")
    ap.add_argument("--tree", type=Path, default=None,
                    help=f"imagenet: where the linked ImageFolder tree is made (default {DEFAULT_TREE})")
    ap.add_argument("--repeat", type=int, default=None,
                    help="imagenet: links per photo in train/ (default 100: 100 photos x 100 = 10,000)")
    ap.add_argument("--root", type=Path, default=None,
                    help="imagenet: train on this existing ImageFolder tree instead; cifar10: the prepared folder "
                         f"(default {DEFAULT_CIFAR_ROOT})")
    ap.add_argument("--batch", type=int, default=None,
                    help="per-GPU batch of both sides (default: imagenet 64, cifar10 512)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs of the real run (>= 2: epoch 0 is the compile; default: imagenet 3, cifar10 6)")
    ap.add_argument("--decode", nargs="+", choices=DATA_DECODE, default=None,
                    help="imagenet: data.decode of the real run, one run per mode (default cpu)")
    ap.add_argument("--workers", type=int, default=None, help="num_workers of the real run (default: the recipe's)")
    ap.add_argument("--method", choices=("scfs", "dino"), default="scfs")
    ap.add_argument("--setting", choices=tuple(SETTINGS), default=None,
                    help=f"the step benchmark's setting (default: the recipe's shipped path, "
                         f"{PATHS['resnet50'][0]} for imagenet, {PATHS['cifar'][0]} for cifar10: its compile and "
                         f"memory format in bf16; {TINY_SETTING} with --tiny)")
    ap.add_argument("--profile", action="store_true",
                    help="SimpleProfiler in the real run: where a step's time goes, and an epoch's once-per-epoch time")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override for the real run (repeatable), e.g. trainer.precision=bf16-mixed")
    ap.add_argument("--step-override", action="append", default=[], metavar="KEY=VALUE",
                    help="Hydra override for the step benchmark (repeatable)")
    ap.add_argument("--no-step", dest="step", action="store_false", help="skip the step benchmark (no ratio)")
    ap.add_argument("--step-record", type=Path, default=None,
                    help="take the step's img/s from this scfs.bench.step JSON record instead of measuring it")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny network and crops, fp32, eager on both sides (the CPU test; a flow check on a GPU)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs' folders and logs here (default: a tmp dir)")
    ap.add_argument("--tag", default="", help="suffix of the record's name")
    ap.add_argument("--no-prime", dest="prime", action="store_false",
                    help="on a GPU, skip the throwaway process that primes the machine before the runs (imports, the "
                         "model on the device, the fused search kernels' extension built once per machine and tree)")
    ap.add_argument("--fresh-cache", action="store_true",
                    help="each real run compiles into an empty compile cache of its own under the work folder "
                         "(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR): a cold first step on a machine whose cache "
                         "earlier runs filled")
    args = ap.parse_args(argv)
    prog = "scfs.bench.e2e"
    try:
        recipe_args(args)
    except E2EError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    if args.epochs < 2:
        ap.error(f"--epochs {args.epochs}: needs >= 2 (the run's img/s is the median over the epochs after the first)")
    if args.batch < 1 or (args.repeat is not None and args.repeat < 1):
        ap.error("--batch and --repeat must be >= 1")
    if args.device == "cpu" and not args.tiny:
        ap.error("--device cpu runs the tiny flow only: add --tiny (the recipes' networks on the CPU take hours)")
    setting = args.setting or (TINY_SETTING if args.tiny else PATHS[SUITE[args.recipe]][0])
    gpu = "cpu" if args.device == "cpu" else gpu_name()
    if gpu is None:
        print(f"{prog}: error: no CUDA GPU found by nvidia-smi (use --device cpu --tiny)", file=sys.stderr)
        return 2
    try:
        recorded = (read_step_record(args.step_record, args.method, args.batch, setting, args.recipe)
                    if args.step_record else None)
        root, data = build_data(args)
    except E2EError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2

    import lightning
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    date, sha = dt.date.today().isoformat(), source_commit()
    meta = {"recipe": args.recipe, "gpu": gpu, "date": date, "commit": sha, "torch": torch.__version__,
            "lightning": lightning.__version__, "python": platform.python_version(), "cpus": cpus, "data": data,
            "batch": args.batch, "epochs": args.epochs, "method": args.method, "target": TARGET,
            "host": host_info("cpu"),  # the runs' processes hold the GPU, not this one
            "command": "python -m scfs.bench.e2e " + shlex.join(argv if argv is not None else sys.argv[1:])}
    if args.recipe == "cifar10":
        meta["eval_off"] = NO_EVAL
    work = args.keep or Path(tempfile.mkdtemp(prefix="scfs-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    # one compile cache for both sides: the step benchmark reuses the kernels the runs compiled (warm-up only)
    cache = str(run_cache_dir(args.recipe, args.override))
    meta["compile_cache"] = ({"dir": str(work / "compile-cache-<run>"), "empty_at_start": True, "fresh": True}
                             if args.fresh_cache else cache_state(Path(cache)))
    if args.device == "cuda" and args.prime:
        from scfs.bench.compile import run_prime

        print("priming the machine (python -m scfs.bench.compile --prime)", flush=True)
        try:
            meta["prime_s"] = run_prime(args.recipe, "cuda", overrides=args.override)
        except RuntimeError as err:
            print(f"{prog}: error: {str(err).splitlines()[0]}; rerun with --no-prime to skip it", file=sys.stderr)
            return 2
    result: dict[str, Any] = {"meta": meta, "rows": [], "step": None}
    stem = record_stem(args.out, f"{args.recipe}-e2e", gpu, date, sha, args.tag + ("-tiny" if args.tiny else ""))
    # the CPU flow: one thread per process on both sides, so a busy shared host does not swamp either with spinning
    env = {"OMP_NUM_THREADS": "1", "SCFS_THREADS": "1"} if args.device == "cpu" else {}
    failed = False
    try:
        # imagenet: one run per decode mode; cifar10: one run, its data path the recipe's
        for decode in args.decode if args.recipe == "imagenet" else [None]:
            name = f"decode={decode}" if decode else args.recipe
            run_dir = work / f"run-{decode or args.recipe}"
            log = work / f"{run_dir.name}.log"
            shutil.rmtree(run_dir, ignore_errors=True)
            cmd = train_command(root, args.batch, args.epochs, decode, run_dir, method=args.method,
                                workers=args.workers, profile=args.profile, tiny=args.tiny, device=args.device,
                                overrides=args.override, recipe=args.recipe)
            print(f"real run, {name}: {shown(cmd)}", flush=True)
            run_env = env
            if args.fresh_cache:  # the step benchmark below then reuses the last run's kernels
                cache = str(work / f"compile-cache-{decode or args.recipe}")
                shutil.rmtree(cache, ignore_errors=True)
                run_env = {**env, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": str(Path(cache) / "triton")}
            # each run's own: a run after another on the shared cache starts from what that one compiled
            started_from = cache_state(Path(cache))
            rc, secs = run_logged(cmd, log, args.timeout, run_env)
            row: dict[str, Any] = {"decode": decode, "B": args.batch, "epochs": args.epochs, "command": shown(cmd),
                                   "returncode": rc, "wall_s": round(secs, 1), "settings": run_settings(run_dir),
                                   "compile_cache": started_from}
            last_ckpt = run_dir / "checkpoints" / "last.ckpt"
            if last_ckpt.is_file():
                row["checkpoint_mb"] = round(last_ckpt.stat().st_size / 2**20, 1)
            summary_file = run_dir / "summary.json"
            if rc != 0 or not summary_file.is_file():
                why = why_it_failed(log)
                row["error"] = ("timed out" if rc == 124 else f"exit {rc}") + f": {why}"
                failed = True
            else:
                s = json.loads(summary_file.read_text())
                row["summary"] = {k: s.get(k) for k in ("img_per_s", "first_epoch_s", "epoch_seconds", "steps",
                                                         "epochs", "seconds")}
                row["summary"].update({k: s[k] for k in ("epoch_openings_s", "img_per_s_after_openings",
                                                         "epoch_background_writes_s", "checkpoint_writes") if k in s})
                if any(k in s for k in COMPILE_KEYS):
                    row["compile"] = {k: s[k] for k in COMPILE_KEYS if k in s}
                if args.profile:
                    actions = parse_simple_profiler(log.read_text(errors="replace"))
                    row["profile"] = (profile_split(actions, list(s.get("epoch_seconds") or []))
                                      if actions else {"error": "no SimpleProfiler report in the run's log"})
            for helper_log in run_dir.glob("*background_compile*.log"):  # the compile helpers' own logs
                shutil.copy2(helper_log, work / f"{run_dir.name}-{helper_log.name}")
            result["rows"].append(row)
            print(f"{name}: " + (f"{row['summary']['img_per_s']} img/s" if "summary" in row else row["error"]),
                  flush=True)
            save_record(result, stem, markdown)
        if recorded is not None:
            result["step"] = recorded
        elif args.step:
            step_out = work / "step"
            cmd = step_command(args.batch, setting, args.method, step_out, tiny=args.tiny, device=args.device,
                               overrides=args.step_override, recipe=args.recipe)
            print(f"step benchmark: {shown(cmd)}", flush=True)
            rc, secs = run_logged(cmd, work / "step.log", args.timeout, {**env, "TORCHINDUCTOR_CACHE_DIR": cache})
            step: dict[str, Any] = {"command": shown(cmd), "setting": setting, "B": args.batch, "returncode": rc,
                                    "wall_s": round(secs, 1), "settings": step_settings(setting)}
            rows = [r for f in sorted(step_out.glob("step-*.json")) for r in json.loads(f.read_text())["rows"]]
            row = step_row(rows, args.method, args.batch, setting)
            if rc != 0 or row is None or "error" in row:
                step["error"] = (row or {}).get("error") or f"exit {rc}: {why_it_failed(work / 'step.log')}"
                failed = True
            else:
                step.update({k: row.get(k) for k in ("img_per_s", "step_ms", "warmup_s", "peak_GiB", "aug_ms")})
            result["step"] = step
        st = result["step"] or {}
        for r in result["rows"]:
            r["compare"] = compare((r.get("summary") or {}).get("img_per_s"), st.get("img_per_s"), args.batch)
            if st:
                r["mismatch"] = mismatches(r.get("settings", {}), st["settings"])
        md = save_record(result, stem, markdown)
    finally:
        logs = stem.parent / f"{stem.name}-logs"  # the subprocesses' output: a failed or odd row is read there
        logs.mkdir(parents=True, exist_ok=True)
        for f in work.glob("*.log"):
            shutil.copy2(f, logs / f.name)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(md)
    print(f"record: {stem}.json, {stem}.md; logs in {logs}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile time of the shipped recipes: cold, warm (same machine), carried cache file, and regional (per block).

Each row is a fresh Python process (dynamo's in-memory caches are per process) running the recipe's training step
(`student_forward`, `teacher_forward`, the losses on a logging and a non-logging step, backward, optimizer step,
EMA) on random views of the recipe's sizes, through the method module `scfs.train.build` makes, with
`compile=true` and the row's settings. It reports the wall seconds of the first `--first` steps (the compile: every
graph the step needs is built by then), the steady step (median of `--steady` steps after them), the graphs
dynamo built, inductor's and AOTAutograd's cache hits and misses, and the loss after the steps (rows of one recipe
share the seed, so a cache that changed the numbers would show). Where the recipe compiles its views
(`compile_views`, the `imagenet` recipe), each step of a compiled row first makes a batch's views as the run does
(`plain_step.with_views`), so their compile is in the first steps too. Rows:

* `cold`: an empty on-disk cache (`TORCHINDUCTOR_CACHE_DIR`), `compile_scope=model`; writes the artifacts file.
* `warm`: the same folder again: a second run on the same machine.
* `carried`: an empty folder plus the `cold` row's artifacts file (`compile_artifacts`): a fresh machine that
  carried the file. Needs `cold` in the same command (the files live in a temporary folder); `blocks-carried`
  needs `blocks`.
* `blocks`, `blocks-carried`: the same two with `compile_scope=blocks`.
* `cudagraphs`: an empty cache with `compile_backend=cudagraphs`: tracing without kernel generation, the step's
  own kernels replayed as CUDA graphs (on the CPU: the traced graphs run without them).
* `background`: an empty cache with `compile_background=true`: eager steps from the first one while a child
  process compiles the step into the cache, then the switch to the compiled step (a warm build); its own table
  says when the child was done, how many eager steps ran meanwhile, and how long the switch held the step.
* `parallel`: an empty cache with `compile_parallel=true`: the step compiled from the first step while a helper
  process compiles the teacher's call and the losses (the seconds the step waited for each are printed below the
  table).
* `parallel-warm`: `compile_parallel=true` again on the `parallel` row's cache folder (a second run): every entry
  is there, so the run should not wait for the helper (it waits only for a part the helper has begun), start as
  fast as the `warm` row, and stop the helper after its first steps (as a run does with a helper behind it).
* `parallel-backward`, `parallel-backward-warm`, `parallel-backward-lean`: the `parallel`, `parallel-warm` and
  `parallel-lean` rows with `compile_parallel_backward=true`: a second helper compiles the student's backward graph
  while the run compiles the student's forward (`scfs.training.backward_helper`).
* `parallel-backward-cudnn-warmup`, `cudnn-warmup`, `parallel-split-cudnn-warmup`: the `parallel-backward`, `cold`
  and `parallel-split` rows with cuDNN's backward convolution algorithms benchmarked on a side thread during the
  compile (`compile_cudnn_warmup=auto`, `scfs.training.cudnn_warmup`); every other row turns that off. The recipes
  ship it, so `parallel-backward-cudnn-warmup` is the recipe as shipped.
* `parallel-backward-cudnn-warmup-threads`: the recipe as shipped with a third of the host's cores for each
  process's compile workers (`THREADS`: inductor's `compile_threads`, one worker per core by default in each of the
  three processes), to tell whether the workers' kernel builds hold up the single-threaded compiles on the first
  step's path (each row's host load says how oversubscribed the host was).
* `parallel-backward-cudnn-warmup-compile-tune`: the recipe as shipped with Triton's launch configs benchmarked
  when each graph compiles, on random inputs, instead of at its first run (`COMPILE_TUNE`): the backward's helper
  then leaves its kernels' choices in the cache, so the run's first backward should benchmark none.
* `parallel-backward-cudnn-warmup-quick-tune`: the recipe as shipped with 5 ms of timed launches for each
  candidate launch config at a kernel's first run instead of inductor's 25 ms (`QUICK_TUNE`: `compile_autotune_ms`):
  what the shorter benchmarks take off the first runs on the first step's path, and, by its steady step beside the
  as-shipped row's, whether the choices they make cost the step.
* `parallel-split-cudnn-warmup-quick-tune`: both choices documented for short runs at once, the student's call per
  view size with four helpers (`SPLIT`) and 5 ms of launch-config benchmarks (`QUICK_TUNE`), with the warm-up as
  shipped: the shortest first compile that keeps inductor's options, and its steady step.
* `split`, `parallel-split`: the `cold` and `parallel-backward` rows with the student's call compiled per view size
  (`compile_student_graphs=per_view_size`: one graph per view batch and one for the heads); with the helpers, a
  third compiles the local views' graph and a fourth its backward while the run compiles the global views' graph
  and the backward's helper that graph's backward. `split` says what the split costs the step and the compile
  alone; `parallel-split-lean` adds `compile_inductor=lean` (`LEAN`), the shortest cold compile the options give.
* `lean`: an empty cache with inductor's options that spend compile time on step time turned off (`LEAN`: no
  launch-config benchmarks of pointwise kernels, no loop reordering after fusion; `compile_inductor`): what they
  cost the first compile, and what dropping them costs the step.
* `parallel-lean`: both (`compile_parallel=true` with `compile_inductor=lean`): the shortest cold compile the
  options give.
* `heuristics`: an empty cache with `trainer.benchmark=false`: cuDNN's heuristics choose each convolution's
  algorithms, where the other rows (as a run on `trainer=gpu`) benchmark them at the first call of each shape:
  what those benchmarks cost the first steps, and what they win on the step.
* `eager`: `compile=false`, the steady step to compare with.

Before the first row a throwaway process primes the machine (`--no-prime` skips it): it imports what a row imports,
builds the recipe's model on the device and, where the recipe uses them, the fused search kernels' extension
(`prebuild_search_kernels`), nothing compiled by torch. A freshly started machine's first process reads the
libraries from disk and sets the driver up, and the first to need the extension builds it; without the prime the
first row pays that (on an H100 a first row's helper was ready 68.9 s after its start, 37.8 s of it the extension's
build, against 20.9–30.7 s in the later rows), and a comparison of rows would charge it to whichever came first.
The extension is built once per machine and source folder (ninja's build file names the sources' paths), so a
benchmark run from another copy of the tree than the one that built it builds it again (28.6 s once; `kernels_s`
in the helper's status). Its seconds are in the record (`prime_s`).

Every compiled row's `compile cost` is the seconds its compile cost the run against a step compiled from the
start: the wall seconds of its steps minus that many steps at its steady pace.

Each compiled row also says where its compile went: torch's own compile timers (`torch._dynamo.utils.compile_times`,
inclusive seconds per phase: dynamo's tracing, AOTAutograd's joint graph and partition, inductor's lowering,
scheduling, code generation and kernel builds, the lazily compiled backward), all of them in the JSON, the main
ones as a second table. A phase that dominates the cold row is the one a shorter first compile has to cut. A third
table lists the run's own compiles in order (`frame_compiles`: each graph and each backward, when it began, how long
it took, its cache hits), which says which graph the run's longest path spent its seconds on. And the host's
load over each row's first steps (`scfs.training.host_load`: busy cores, runnable threads against the cores), so
a row whose compile shared the cores with more threads than there were says so.

Kernel searches, evaluation passes and the data path are not in the first-steps time (a training run adds them).
On the CPU inductor compiles C++ instead of Triton kernels: CPU times only indicate which way a setting moves.
Rows run in the order `--rows` names them, each in a fresh process; with `--repeats`, the odd repeats run them in
reverse (`--order alternate`): a pair run in one order only cannot tell its settings' difference from whatever a
row's place in the queue does to it (what the rows before it left warm on the machine). The record says the order.

Usage (GPU: the recipe's own precision and compile_mode; `--repeats` fresh processes per row, the median shown):

    python -m scfs.bench.compile --recipe cifar10 --out benchmarks/results/compile-h200-cifar10
    python -m scfs.bench.compile --recipe imagenet --rows cold warm carried --out benchmarks/results/compile-h200-r50
    python -m scfs.bench.compile --device cpu --tiny --out /tmp/compile-cpu     # seconds, for the test
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scfs.bench.host import host_info, host_phrase
from scfs.bench.records import local_backward_phrase, provenance, save_record, source_commit, startup_phrase
from scfs.names import CONF_DIR
from scfs.training.compile_helpers import HELPER_NAMES
from scfs.training.compile_metrics import compile_phase_seconds, frame_compiles
from scfs.training.host_load import HostLoad, load_phrase, usable_cpus

ROWS = ("eager", "cold", "warm", "carried", "blocks", "blocks-carried", "cudagraphs", "background", "parallel",
        "parallel-warm", "lean", "parallel-lean", "parallel-backward", "parallel-backward-warm",
        "parallel-backward-lean", "parallel-backward-cudnn-warmup", "cudnn-warmup", "heuristics", "split",
        "parallel-split", "parallel-split-lean", "parallel-split-cudnn-warmup",
        "parallel-backward-cudnn-warmup-compile-tune", "parallel-backward-cudnn-warmup-threads",
        "parallel-backward-cudnn-warmup-quick-tune", "parallel-split-cudnn-warmup-quick-tune")
# rows that reuse what an earlier row of the same repeat left (its cache folder, or the artifacts it wrote): a row
# here runs after the row it names, and only beside it
NEEDS = {"warm": "cold", "carried": "cold", "blocks-carried": "blocks", "parallel-warm": "parallel",
         "parallel-backward-warm": "parallel-backward"}
# the `lean` row's inductor options (`compile_inductor`): the defaults that spend compile time to win step time
LEAN = ("compile_inductor=lean",)
# the `parallel-backward*` rows: a second helper compiles the student's backward graph
BACKWARD = ("compile_parallel_backward=true",)
# the `split` rows: the student's call as one graph per view size and one for the heads
SPLIT = ("compile_student_graphs=per_view_size",)
# the rows that benchmark cuDNN's backward algorithms beside the compile (`compile_cudnn_warmup`; auto: off on the
# CPU): the `*cudnn-warmup` rows; every other row turns it off
WARMUP = ("compile_cudnn_warmup=auto",)
# the `*compile-tune` row: Triton's launch configs benchmarked at each graph's compile (in whichever process
# compiles it) instead of at its first run in the run
COMPILE_TUNE = ("+compile_inductor.triton.autotune_at_compile_time=true",)
# the `*quick-tune` row: each candidate launch config of a kernel's first-run benchmarks timed for 5 ms instead of
# inductor's 25 (`compile_autotune_ms`, `scfs.autotune_budget`), in the run and its helpers alike
QUICK_TUNE = ("compile_autotune_ms=5",)
# the `*threads` row: each of the three compiling processes (the run and its two helpers) with a third of the
# cores this process may use for its compile workers (`compile_threads`; inductor's default gives each
# process one per core, up to 32), so that the workers' kernel builds leave cores to the single-threaded
# compiles on the first step's path
THREADS = (f"+compile_inductor.compile_threads={max(len(usable_cpus() or range(os.cpu_count() or 3)) // 3, 1)}",)
# the `heuristics` row: cuDNN's heuristics pick the convolution algorithms instead of its benchmarks
HEURISTICS = ("trainer.benchmark=false",)
# torch's compile timers shown in the record's second table: (label, timer name). Inclusive and nested (a label's
# dots say which row it sits in); names as torch 2.14 reports them, a timer a version lacks shown as –.
PHASES = (
    ("dynamo: tracing and compiling the forward graphs", "_compile.compile_inner"),
    ("· second attempts (frames whose analysis restarted)", "compile_attempt_1"),
    ("· tracing the bytecode", "bytecode_tracing"),
    ("· backend: AOTAutograd and inductor", "OutputGraph.call_user_compiler"),
    ("· · AOTAutograd: joint graph", "aot_trace_joint_graph"),
    ("· · AOTAutograd: joint-graph passes", "_recursive_joint_graph_passes"),
    ("· · AOTAutograd: forward/backward partition", "min_cut_rematerialization_partition"),
    ("· · inductor: forward graphs", "compile_fx.<locals>.fw_compiler_base"),
    ("inductor: backward graphs, at the first backward", "backward._backward_impl"),
    ("inductor: backward graphs, compiling them (at the first backward, or with the forward in the backward's helper)",
     "compile_fx.<locals>.bw_compiler"),
    ("inductor, forward and backward: lowering", "GraphLowering.run"),
    ("inductor, forward and backward: scheduling and fusion", "Scheduler.__init__"),
    ("inductor, forward and backward: kernel code generation", "Scheduler.codegen"),
    ("inductor, forward and backward: building and loading the code", "compile_file"),
    ("inductor, forward and backward: waiting for the parallel kernel builds", "async_compile.wait"),
    ("first run of the kernels: benchmarking their launch configs", "CachingAutotuner.benchmark_all_configs"),
    ("dynamo: guards", "build_guards"),
)
# the tiny network of `--tiny` (the CPU test): the shapes default's ResNet-10, narrower, fewer views
TINY = ["backbone=tiny", "backbone.channels=[8,16,16,32]", "method.out_dim=64", "method.hidden_dim=32",
        "method.bottleneck_dim=16", "++method.stage_out_dim=32", "++method.stage_hidden_dim=16",
        "++method.stage_bottleneck_dim=8", "crops=shapes", "crops.global_size=32", "crops.local_size=16",
        "crops.n_local=2", "batch_size=8"]


def compose(recipe: str, device: str, tiny: bool, scope: str, compiled: bool, extra: list[str]) -> Any:
    """The recipe's config (`+experiment=<recipe>`, or the CPU default for `default`) for this row."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    ov = [] if recipe == "default" else [f"+experiment={recipe}"]
    ov += ["data=shapes", "logger=csv", "global_batch_size=null", f"compile={str(compiled).lower()}",
           f"compile_scope={scope}"]
    if device == "cpu":  # no CUDA graphs and no bf16 autocast on the CPU: inductor's default mode, float32
        ov += ["trainer=cpu", "compile_mode=default", "trainer.precision=32-true"]
    ov += (TINY if tiny else []) + extra
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name="config", overrides=ov)


def run_cudnn_benchmark(cfg: Any, device: str) -> bool:
    """Whether a run of `cfg` on `device` benchmarks cuDNN's convolution algorithms: its Trainer's `benchmark`
    (Lightning sets `torch.backends.cudnn.benchmark` from it), on CUDA only."""
    return device.startswith("cuda") and bool(cfg.trainer.get("benchmark", False))


def measure(cfg: Any, device: str, first: int, steady: int, artifacts_in: str | None,
            artifacts_out: str | None, early: Any = None) -> dict[str, Any]:
    """One row, in this process: build, load `artifacts_in`, time the first and the steady steps, save
    `artifacts_out`.

    Timed by the step benchmark's own clock (`scfs.bench.timing.time_steps`: the first steps' wall seconds, the
    steady step as the median gap between step marks, CUDA events on the GPU). The step itself is driven here
    rather than by that benchmark's Lightning `Trainer.fit`, for what a compile row must control: every graph
    built within the first steps (a logging and a non-logging loss graph; Lightning's cadence would build the
    logging one at the `log_every_n_steps`-th step or the run's last, inside the steady window), dynamo's graph
    count read right after them, and no data path or monitor in the compile time. cuDNN's algorithm benchmarks are
    on as the run's Trainer sets them (`trainer.benchmark`, on in `trainer=gpu`): a run pays them at the first
    call of each convolution shape, inside its first steps, and its steady step runs the algorithms they chose."""
    import torch

    from scfs.train import build
    from scfs.training.compile_helpers import parallel_helpers
    from scfs.training.cudnn_warmup import CudnnWarmup, cudnn_benchmarks, warmup_off_reason
    from scfs.training.plain_step import make_step, with_views

    loaded = None
    if artifacts_in:
        from scfs.training.compile_artifacts import load_compile_artifacts

        loaded = load_compile_artifacts(artifacts_in)
    torch.manual_seed(int(cfg.seed))
    torch.backends.cudnn.benchmark = cudnn_benchmark = run_cudnn_benchmark(cfg, device)
    _, model = build(cfg)
    model = model.to(device).train()
    step = make_step(model, cfg, device, model.configure_optimizers())
    views = model.batch_aug is not None and model.compile_views and bool(cfg.get("compile", False))
    if views:  # a compiled run compiles the views' graphs at its first batches too (the `imagenet` recipe)
        step = with_views(step, model, cfg, device)
    warmup = None
    if warmup_off_reason(cfg, device.startswith("cuda"), cudnn_benchmarks()) is None:
        warmup = CudnnWarmup(model, cfg, device)
        step = start_at_first_step(step, warmup)
    if cfg.get("compile_background", False):
        row = {**measure_background(model, cfg, device, step, first, steady), "loaded_artifacts": loaded}
    elif parallel_helpers(cfg, device.startswith("cuda"))[0]:
        with helper_process(model, cfg, device, early) as (gate, helper_status, stop_if_behind):
            stopped: list[bool] = []  # as the run's callback does after its first step
            row = measure_steps(model, device, step, first, steady, loaded,
                                after_first=lambda: stopped.append(stop_if_behind()))
            timeline = gate.timeline()  # while its files are there
        row["parallel"] = {**timeline, "helper": helper_status, "helper_stopped": any(stopped)}
    else:
        row = measure_steps(model, device, step, first, steady, loaded)
    row["cudnn_benchmark"] = cudnn_benchmark
    if views:  # with a helper, the first step's are made eagerly and the helper compiles their graphs
        row["views"] = "helper" if row.get("parallel") else "run"
    if warmup is not None:
        row["cudnn_warmup"] = warmup.report()
    if artifacts_out:
        from scfs.training.compile_artifacts import save_compile_artifacts

        size = save_compile_artifacts(artifacts_out)
        row["artifacts_mb"] = round(size / 1e6, 2) if size else None
    return row


def start_at_first_step(step: Callable[[int], Any], warmup: Any) -> Callable[[int], Any]:
    """`step` that starts `warmup` (`compile_cudnn_warmup`) at its first call, inside the first steps' time, as the
    run's callback starts it when training starts."""

    def first(i: int) -> Any:
        if warmup.t0 is None:
            warmup.start()
        return step(i)

    return first


def helper_process(model: Any, cfg: Any, device: str, early: Any = None) -> Any:
    """`compile_parallel`'s helper children for a row (with `compile_parallel_backward`, the backward's helper too):
    started (or, `early`, the ones `child` started at the process's start as `scfs.train` does, given the go),
    the method's `compile_gate` waiting for their parts, stopped after the row. Yields the gate (it keeps the first
    step's timeline: `HelperGates`), a dict that holds the helpers' statuses (their cache counts, their peak GPU
    memory; the backward's under `backward_helper`; `early_s`, the seconds from their start to the go) once the
    row ends ({} for one that had not ended), and `stop_if_behind()` for the end of the first steps
    (`stop_helper_if_behind`, as the run does)."""
    import contextlib

    from scfs.training import compile_child
    from scfs.training.background_compile import HelperGates
    from scfs.training.compile_helpers import (
        ROLES,
        helper_roles,
        parallel_helpers,
        read_status,
        splits_student,
        stop_child,
    )

    backward = parallel_helpers(cfg, device.startswith("cuda"))[1]
    roles = helper_roles(True, backward, splits_student(cfg))

    @contextlib.contextmanager
    def run() -> Any:
        with tempfile.TemporaryDirectory(prefix="scfs-helper-") as tmp:
            paths = {role: Path(tmp) / ROLES[role].status_file for role in roles}
            if early is not None:
                paths = {role: early.paths.get(role, path) for role, path in paths.items()}
            procs: dict[str, Any] = {}  # the gates' clocks start before the helpers do

            def ended(key: str) -> Callable[[], bool]:
                return lambda: key in procs and procs[key].poll() is not None

            gate = HelperGates.for_helpers(paths, {role: ended(role) for role in roles}, 900.0)
            early_s = None
            if early is not None:
                early_s = round(early.go(cfg, int(cfg.batch_size), compile_child.key_settings()), 2)
                procs.update(early.procs)
            else:
                for role in roles:
                    procs[role] = compile_child.start_child(cfg, int(cfg.batch_size), paths[role], device,
                                                            command=lambda role=role: compile_child.role_child_command(
                                                                role, paths[role], device))
            model.compile_gate = gate
            model.hand_views_to_helper()  # as the run's `ParallelCompile` does (nothing to hand without views)

            def stop_if_behind() -> bool:
                return any(gate.stop_behind(procs).values())

            status: dict[str, Any] = {}
            try:
                yield gate, status, stop_if_behind
            finally:
                model.compile_gate, model.views_handoff = None, None
                for proc in procs.values():
                    stop_child(proc)
                status.update(read_status(paths["parts"]) or {})
                for role in roles:
                    if role != "parts":
                        status[ROLES[role].summary_key] = read_status(paths[role]) or {}
                if early_s is not None:
                    status["early_s"] = early_s

    return run()


def measure_steps(model: Any, device: str, step: Any, first: int, steady: int, loaded: Any,
                  after_first: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The compiled rows' timing: the first steps (the compile), the steady step after them, what was built.
    `after_first()` runs after the first steps, outside the timed ones."""
    import torch
    from torch._dynamo.utils import counters

    from scfs.bench.timing import time_steps
    from scfs.training.plain_step import cache_counts

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    graphs: list[int] = []
    load = HostLoad()

    def after_warmup() -> None:
        graphs.append(int(counters["stats"]["unique_graphs"]))
        load.stop()
        if after_first is not None:
            after_first()

    counters.clear()
    phases0 = compile_phase_seconds()
    sync()
    wall0 = time.time()
    load.start()  # the host's load over the first steps: whether the compile on their path waited for a core
    clock, loss = time_steps(step, first, steady, device.startswith("cuda"),
                             after_warmup=after_warmup)
    load.stop()
    times = clock.step_ms(first)
    step_ms = statistics.median(times) if times else None
    row = {"first_s": round(clock.warmup_s(first), 2),
           "step_ms": round(step_ms, 2) if step_ms else None,
           "lost_s": round(clock.warmup_s(first) - first * step_ms / 1e3, 1) if step_ms else None,
           "graphs": graphs[0], "loss": float(loss), "loaded_artifacts": loaded, **cache_counts(),
           "host_load": load.summary(),
           **({"peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2)} if device.startswith("cuda") else {}),
           "phases": {k: round(v - phases0.get(k, 0.0), 3) for k, v in compile_phase_seconds().items()
                      if v - phases0.get(k, 0.0) >= 0.0005},
           "compiles": frame_compiles(wall0),
           # why a graph was split, and where the code went on after the break (dynamo's resume functions are
           # named after the function and line): each break is a graph more to compile
           "graph_breaks": {break_reason(k): int(v) for k, v in counters["graph_break"].items()},
           "resumes": {str(k): int(v) for k, v in counters["resumes"].items()}}
    return row


def measure_background(model: Any, cfg: Any, device: str, step: Any, first: int, steady: int) -> dict[str, Any]:
    """The `background` row, in this process: eager steps from the start while the child of
    `scfs.training.compile_child` compiles the step into this process's cache folder, the switch
    (`compile_now`) at the first step after the child is done, then `first` compiled steps (the warm build) and
    `steady` more. Each step is synchronised and timed by the wall clock (an eager step's host time is the step).

    `lost_s` is what the compile cost the run: the wall seconds to the end of the steady steps minus the steps
    done times the compiled steady step, as for the other rows (where it is the first steps' wall seconds minus
    their steps at the steady pace)."""

    import torch

    from scfs.training.compile_child import start_child
    from scfs.training.compile_helpers import read_status, stop_child
    from scfs.training.plain_step import cache_counters, cache_counts

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    marks: list[float] = []  # wall seconds since t0 at the end of each step
    with tempfile.TemporaryDirectory(prefix="scfs-background-") as tmp:
        status_path = Path(tmp) / "status.json"
        t0 = time.perf_counter()
        proc = start_child(cfg, int(cfg.batch_size), status_path, device)
        try:
            # eager steps until the child's status is there (as the run's callback sees it: not waiting for the
            # child's exit, which on a large model takes seconds of its own)
            while not (status_path.exists() or proc.poll() is not None):
                loss = step(len(marks))
                sync()
                marks.append(time.perf_counter() - t0)
            ready_s, eager_steps = time.perf_counter() - t0, len(marks)
            status = read_status(status_path) or {"ok": False}
            if not status.get("ok"):
                proc.wait()
                raise RuntimeError(f"the background compile failed: {status}\n"
                                   f"{status_path.with_suffix('.log').read_text(errors='replace')[-3000:]}")
            before, switch_t0 = cache_counters(), time.perf_counter() - t0
            model.compile_now()
            for _i in range(first + steady):
                loss = step(len(marks))
                sync()
                marks.append(time.perf_counter() - t0)
        finally:
            stop_child(proc, grace_s=120)  # after the timed steps: its exit, or it is ended
    k = eager_steps
    after = [b - a for a, b in zip(marks[k + first - 1:], marks[k + first:])]
    step_ms = statistics.median(after) * 1e3 if after else None
    eager = [b - a for a, b in zip(marks[:k - 1], marks[1:k])]
    return {"first_s": round(marks[0], 2), "step_ms": round(step_ms, 2) if step_ms else None,
            "lost_s": round(marks[-1] - len(marks) * step_ms / 1e3, 1) if step_ms else None,
            "graphs": None, "loss": float(loss), **cache_counts(before), "phases": {}, "graph_breaks": {},
            "resumes": {},
            "background": {"child_s": status.get("seconds"), "child_fx_cache": status.get("fx_cache"),
                           "ready_s": round(ready_s, 1), "eager_steps": eager_steps,
                           "eager_step_ms": round(statistics.median(eager) * 1e3, 2) if eager else None,
                           "switch_s": round(marks[k + first - 1] - switch_t0, 2)}}


def break_reason(reason: Any) -> str:
    """dynamo's graph-break message in one line: its title and explanation (the hints and links dropped)."""
    lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:300]


def child(args: argparse.Namespace) -> int:
    """`--child`: one row in this (fresh) process; its JSON as the last line of stdout."""
    cfg = compose(args.recipe[0], args.device, args.tiny, args.scope, not args.eager, list(args.override or []))
    with tempfile.TemporaryDirectory(prefix="scfs-early-") as tmp:
        from scfs.training.compile_helpers import start_early_helpers

        # a GPU row's helpers start here, before this process imports torch, as `scfs.train` starts a run's
        early = start_early_helpers(cfg, Path(tmp), int(cfg.batch_size)) if args.device.startswith("cuda") else None
        try:
            if args.device == "cpu":
                import torch

                torch.set_num_threads(int(os.environ.get("SCFS_THREADS", torch.get_num_threads())))
            row = measure(cfg, args.device, args.first, args.steady, args.artifacts_in, args.artifacts_out, early)
        finally:
            if early is not None:
                early.stop()
    print(json.dumps(row), flush=True)
    return 0


def prime(args: argparse.Namespace) -> int:
    """`--prime`: import what a row imports and build the first recipe's model on the device, then exit (module
    docstring); torch's compiler and, on CUDA, Triton are imported too, nothing is compiled."""
    cfg = compose(args.recipe[0], args.device, args.tiny, "model", False, list(args.override or []))
    import torch
    import torch._inductor.compile_fx  # noqa: F401 - the compiler's modules, read from disk as a row reads them

    from scfs.train import build
    from scfs.training import compile_helpers, plain_step  # noqa: F401

    if args.device.startswith("cuda"):
        import triton  # noqa: F401

    torch.manual_seed(int(cfg.seed))
    _, model = build(cfg)
    model.to(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    from scfs.training.compile_child import prebuild_search_kernels

    prebuild_search_kernels(model, args.device)  # None (nothing to build) on the CPU or without the fused search
    return 0


def run_prime(recipe: str, device: str, tiny: bool = False, overrides: Sequence[str] = ()) -> float:
    """Run `--prime` for `recipe` in a fresh process (as a row runs); its wall seconds."""
    cmd = [sys.executable, "-m", "scfs.bench.compile", "--prime", "--recipe", recipe, "--device", device,
           *(["--tiny"] if tiny else [])]
    for o in overrides:
        cmd += ["--override", o]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"priming the machine failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return round(time.perf_counter() - t0, 1)


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the finished child processes, the compiler's own processes included: on a
    shared machine a better gauge of the compile's work than wall seconds, which other jobs' load stretches."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_row(args: argparse.Namespace, recipe: str, row: str, cache_dir: Path, scope: str, eager: bool = False,
            artifacts_in: Path | None = None, artifacts_out: Path | None = None,
            backend: str = "inductor", background: bool = False, parallel: bool = False,
            extra: tuple[str, ...] = ()) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "scfs.bench.compile", "--child", "--recipe", recipe, "--device", args.device,
           "--scope", scope, "--first", str(args.first), "--steady", str(args.steady)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--eager"] if eager else []
    cmd += ["--artifacts-in", str(artifacts_in)] if artifacts_in else []
    cmd += ["--artifacts-out", str(artifacts_out)] if artifacts_out else []
    row_ov = [] if backend == "inductor" else [f"compile_backend={backend}", "compile_mode=default",
                                               "compile_views=false"]
    row_ov += ["compile_background=true"] if background else []
    row_ov += ["compile_parallel=true"] if parallel else []
    row_ov += list(extra)
    # each row says whether it starts the helpers and the cuDNN warm-up, where nothing else does: the recipes'
    # `auto` would start the helpers on a GPU machine
    given = [*(args.override or []), *row_ov]
    row_ov += [f"{key}=false" for key in ("compile_parallel", "compile_parallel_backward", "compile_cudnn_warmup")
               if not any(o.startswith(f"{key}=") for o in given)]
    for o in [*(args.override or []), *row_ov]:
        cmd += ["--override", o]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    t0 = time.perf_counter()
    cpu0 = _children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    cpu_s = _children_cpu_s() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{row} ({recipe}) failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    warned = [ln for ln in proc.stderr.splitlines() if "compile_artifacts=" in ln]
    return {"recipe": recipe, "setting": row, **out, "process_s": round(time.perf_counter() - t0, 1),
            "process_cpu_s": round(cpu_s, 1),
            **({"warning": warned[0]} if warned else {})}


# the timed columns a table row gives as the median over the repeats
MEDIAN_KEYS = ("first_s", "lost_s", "process_s", "process_cpu_s", "step_ms")


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from a setting's repeats: each timed column (`MEDIAN_KEYS`) the median over them (with an
    even count, the mean of the middle two, so every column is the same statistic), every repeat's first-steps
    time beside it; the rest (phases, cache counts, loss) from the repeat whose first steps were the (lower)
    median."""
    ordered = sorted(rows, key=lambda r: r["first_s"])
    out = dict(ordered[(len(ordered) - 1) // 2])
    out["first_s_all"] = [r["first_s"] for r in rows]
    for key in MEDIAN_KEYS:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if len(values) == len(rows):
            out[key] = round(statistics.median(values), 2)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    result: dict[str, Any] = {"machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else
                              f"cpu ({os.cpu_count()} cores)", "torch": torch.__version__,
                              "date": dt.date.today().isoformat(), "device": args.device, "tiny": args.tiny,
                              "first_steps": args.first, "steady_steps": args.steady,
                              "command": "python -m scfs.bench.compile " + " ".join(args.argv),
                              "commit": source_commit(), "host": host_info("cpu"), "rows": []}
    if args.prime:
        result["prime_s"] = run_prime(args.recipe[0], args.device, args.tiny, args.override or [])
        result["prime_builds_kernels"] = True
    stem = Path(args.out) / f"compile-{dt.date.today().isoformat()}" if not args.out.endswith("json") \
        else Path(args.out).with_suffix("")
    with tempfile.TemporaryDirectory(prefix="scfs-compile-bench-") as tmp:
        root = Path(tmp)
        for recipe in args.recipe:
            for rep in range(args.repeats):
                rows = run_order(args.rows, rep, args.order)
                d = root / f"{recipe}-{rep}"
                art, art_b = d / "model.bin", d / "blocks.bin"
                plan = {
                    "eager": dict(cache_dir=d / "eager", scope="model", eager=True),
                    "cold": dict(cache_dir=d / "cold", scope="model", artifacts_out=art),
                    "warm": dict(cache_dir=d / "cold", scope="model"),
                    "carried": dict(cache_dir=d / "carried", scope="model", artifacts_in=art),
                    "blocks": dict(cache_dir=d / "blocks", scope="blocks", artifacts_out=art_b),
                    "blocks-carried": dict(cache_dir=d / "blocks-carried", scope="blocks", artifacts_in=art_b),
                    "cudagraphs": dict(cache_dir=d / "cudagraphs", scope="model", backend="cudagraphs"),
                    "background": dict(cache_dir=d / "background", scope="model", background=True),
                    "parallel": dict(cache_dir=d / "parallel", scope="model", parallel=True),
                    "lean": dict(cache_dir=d / "lean", scope="model", extra=LEAN),
                    "parallel-lean": dict(cache_dir=d / "parallel-lean", scope="model", parallel=True, extra=LEAN),
                    "parallel-warm": dict(cache_dir=d / "parallel", scope="model", parallel=True),
                    "parallel-backward": dict(cache_dir=d / "parallel-backward", scope="model", parallel=True,
                                              extra=BACKWARD),
                    "parallel-backward-warm": dict(cache_dir=d / "parallel-backward", scope="model", parallel=True,
                                                   extra=BACKWARD),
                    "parallel-backward-lean": dict(cache_dir=d / "parallel-backward-lean", scope="model",
                                                   parallel=True, extra=(*BACKWARD, *LEAN)),
                    "parallel-backward-cudnn-warmup": dict(cache_dir=d / "parallel-backward-cudnn-warmup",
                                                           scope="model", parallel=True, extra=(*BACKWARD, *WARMUP)),
                    "cudnn-warmup": dict(cache_dir=d / "cudnn-warmup", scope="model", extra=WARMUP),
                    "heuristics": dict(cache_dir=d / "heuristics", scope="model", extra=HEURISTICS),
                    "split": dict(cache_dir=d / "split", scope="model", extra=SPLIT),
                    "parallel-split": dict(cache_dir=d / "parallel-split", scope="model", parallel=True,
                                           extra=(*BACKWARD, *SPLIT)),
                    "parallel-split-lean": dict(cache_dir=d / "parallel-split-lean", scope="model", parallel=True,
                                                extra=(*BACKWARD, *SPLIT, *LEAN)),
                    "parallel-split-cudnn-warmup": dict(cache_dir=d / "parallel-split-cudnn-warmup", scope="model",
                                                        parallel=True, extra=(*BACKWARD, *SPLIT, *WARMUP)),
                    "parallel-backward-cudnn-warmup-threads": dict(
                        cache_dir=d / "parallel-backward-cudnn-warmup-threads", scope="model", parallel=True,
                        extra=(*BACKWARD, *WARMUP, *THREADS)),
                    "parallel-backward-cudnn-warmup-compile-tune": dict(
                        cache_dir=d / "parallel-backward-cudnn-warmup-compile-tune", scope="model", parallel=True,
                        extra=(*BACKWARD, *WARMUP, *COMPILE_TUNE)),
                    "parallel-backward-cudnn-warmup-quick-tune": dict(
                        cache_dir=d / "parallel-backward-cudnn-warmup-quick-tune", scope="model", parallel=True,
                        extra=(*BACKWARD, *WARMUP, *QUICK_TUNE)),
                    "parallel-split-cudnn-warmup-quick-tune": dict(
                        cache_dir=d / "parallel-split-cudnn-warmup-quick-tune", scope="model", parallel=True,
                        extra=(*BACKWARD, *SPLIT, *WARMUP, *QUICK_TUNE)),
                }
                for position, name in enumerate(n for n in rows if not (n == "eager" and rep)):
                    r = run_row(args, recipe, name, **plan[name])
                    r["repeat"], r["position"] = rep, position + 1
                    result["rows"].append(r)
                    print(json.dumps(r), flush=True)
                    result["table"] = table_rows(result["rows"])
                    save_record(result, stem, markdown)  # after every row: a command cut short keeps its numbers
    return result


def row_units(rows: list[str]) -> list[list[str]]:
    """The rows in the order given (a name given twice runs once), each row that reuses another's cache or
    artifacts (`NEEDS`) kept right after it as one unit; ValueError, naming the fix, when such a row comes
    without the row it reuses or before it."""
    names = list(dict.fromkeys(rows))
    units: list[list[str]] = []
    for name in names:
        source = NEEDS.get(name)
        if source is None:
            units.append([name])
            continue
        if source not in names or names.index(source) > names.index(name):
            raise ValueError(f"row {name} reuses what row {source} leaves: name {source} before it in --rows")
        next(u for u in units if source in u).append(name)
    return units


def run_order(rows: list[str], repeat: int, order: str) -> list[str]:
    """The rows one repeat runs, in turn. A row's place in the queue can move its time (what the rows before it
    left warm on the machine), so `alternate` runs the odd repeats' units in reverse: with an even number of
    repeats every row runs first as often as last, and the median is not one order's. `given` keeps the order
    given in every repeat."""
    units = row_units(rows)
    if order == "alternate" and repeat % 2:
        units = units[::-1]
    return [name for unit in units for name in unit]


def order_line(rows: list[dict[str, Any]]) -> list[str]:
    """The order the rows ran in, per repeat and recipe (none for a record made before the rows said so)."""
    runs: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for r in rows:
        if isinstance(r.get("position"), int):
            runs.setdefault((r["recipe"], r.get("repeat", 0)), []).append((r["position"], r["setting"]))
    if not runs:
        return []
    parts = [f"{recipe}{f' repeat {rep + 1}' if any(k[1] for k in runs) else ''}: "
             + ", ".join(name for _, name in sorted(v)) for (recipe, rep), v in runs.items()]
    return ["", "The rows ran in this order, one fresh process each: " + "; ".join(parts) + "."]


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["recipe"], r["setting"]), []).append(r)
    return [median_row(v) for v in groups.values()]


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Compile time, {result['machine']} (torch {result['torch']}, {result['date']})\n",
             f"{provenance(result.get('commit'), result['command'])} First steps = wall seconds of the first "
             f"{result['first_steps']} training steps in a fresh process (the compile); process CPU = the whole "
             "process's CPU seconds, compiler processes included; steady = median step after them. Median over "
             "the repeats (each repeat's time in brackets)." + (f" {host_phrase(result['host'])}"
                                                                  if result.get("host") else "") + "\n",
             "| recipe | setting | first steps s | compile cost s | process CPU s | steady step ms | graphs | "
             "inductor cache | AOT cache | artifacts MB | loss |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in result.get("table", []):
        allv = r.get("first_s_all", [])
        reps = f" ({', '.join(str(v) for v in allv)})" if len(allv) > 1 else ""
        cost = r.get("lost_s") if r.get("graphs") != 0 else None
        lines.append(f"| {r['recipe']} | {r['setting']} | {r['first_s']}{reps} | {'' if cost is None else cost} | "
                     f"{r['process_cpu_s']} | {r['step_ms']} | {'' if r['graphs'] is None else r['graphs']} | "
                     f"{r['fx_cache']} | {r['aot_cache']} | {r.get('artifacts_mb') or ''} | {r['loss']:.5f} |")
    table = result.get("table", [])
    lines += order_line(result.get("rows", [])) + cudnn_lines(table) + views_lines(table)
    if result.get("prime_s") is not None:
        built = result.get("prime_builds_kernels")
        kernels = ", the fused search kernels' extension built or found where the recipe uses it" if built else ""
        lines.append(f"\nBefore the first row a throwaway process primed the machine in {result['prime_s']} s (the "
                     f"modules a row imports, the model built on the device{kernels}; nothing compiled by torch), so "
                     "that no row pays a freshly started machine's first reads of its libraries"
                     f"{' or that build' if built else ''}.")
    return "\n".join(lines + parallel_lines(table) + load_lines(result.get("rows", [])) + background_table(table)
                     + phase_table(table) + helper_phase_table(table) + compiles_table(table)) + "\n"


def load_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The host's load during each row's first steps (`HostLoad`), every repeat in the order they ran (none for a
    record made before the rows sampled it): whether a row's compile shared the cores with more threads than
    there were."""
    said = [r for r in rows if r.get("host_load")]
    if not said:
        return []
    lines = ["", "The host's load during the first steps (/proc/stat every "
             f"{said[0]['host_load']['interval_s']} s: busy cores, and runnable threads against the cores; the "
             "compile helpers, the compile workers and the cuDNN warm-up all count):", ""]
    for r in said:
        rep = f" (repeat {r['repeat'] + 1})" if any(x.get("repeat") for x in rows) else ""
        lines.append(f"- {r['recipe']} {r['setting']}{rep}: {load_phrase(r['host_load'])}")
    return lines


def cudnn_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Which rows benchmarked cuDNN's convolution algorithms at their first steps, as a run on `trainer=gpu`
    does (none for a record made before the rows said so)."""
    said = [r for r in rows if "cudnn_benchmark" in r]
    if not said:
        return []
    on = [f"{r['recipe']} {r['setting']}" for r in said if r["cudnn_benchmark"]]
    off = [f"{r['recipe']} {r['setting']}" for r in said if not r["cudnn_benchmark"]]
    out = ["", "cuDNN's algorithm benchmarks (`trainer.benchmark`, as the run's Trainer sets them): "
               f"on in {', '.join(on) or 'no row'}; off (cuDNN's heuristics) in {', '.join(off) or 'no row'}."]
    warmed = [r for r in said if r.get("cudnn_warmup")]
    if warmed:
        out[-1] += " The backward's benchmarked on a side thread during the compile (`compile_cudnn_warmup`) in " + \
            "; ".join(warmup_phrase(r) for r in warmed) + "; in no other row."
    return out


def views_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Which rows made each step's views on the device as the run does, their per-pixel ops compiled
    (`compile_views`), and who compiled those graphs (none for a record made before the rows made views)."""
    said = [r for r in rows if r.get("views")]
    if not said:
        return []
    run = [f"{r['recipe']} {r['setting']}" for r in said if r["views"] == "run"]
    helper = [f"{r['recipe']} {r['setting']}" for r in said if r["views"] == "helper"]
    return ["", "Each step made its batch's views on the device first, as the run does (`compile_views`: their "
                "per-pixel ops compiled), in " + ", ".join(run + helper) + ": "
                + "; ".join(p for p in (f"compiled by the run at its first step in {', '.join(run)}" if run else "",
                                        "made eagerly at the first step while the helper compiled their graphs, "
                                        f"which the second step loaded, in {', '.join(helper)}" if helper else "")
                            if p) + "."]


def warmup_phrase(row: dict[str, Any]) -> str:
    """What a row's cuDNN warm-up did: how many convolutions, how long the listing took, when the last was chosen
    (seconds from the first step's start), or why it failed."""
    w = row["cudnn_warmup"]
    what = f"{row['recipe']} {row['setting']} ({w.get('convs', 0)} convolutions, listed in {w.get('record_s')} s"
    if w.get("forward_s") is not None:  # `compile_cudnn_warmup_forward`
        what += f", their forwards benchmarked on the run's thread in {w['forward_s']} s"
    if w.get("error"):
        return what + f"; failed: {w['error']})"
    done = w.get("done_s")
    return what + (f", the last chosen {done} s into the first step)" if done is not None
                   else ", not finished by the row's end)")


def parallel_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The `parallel` rows' waits for their helper (the markdown lines; none without such a row)."""
    out = []
    for r in rows:
        if r.get("parallel"):
            par = r["parallel"]
            waits = ", ".join(f"{k} {v} s" for k, v in par["waited_s"].items()) or "none"
            out += ["", f"{r['recipe']} {r['setting']}: the first steps waited for the helper's "
                        f"entries: {waits}" + (" (the views at the second step)" if "views" in par["waited_s"]
                                               else "") + "."]
            if par.get("asked_s"):  # the timeline, from the gates' making: the helpers' start, or their go
                parts = [f"{k}: asked at {par['asked_s'][k]} s, " + (
                    f"begun by the helper at {par['started_s'][k]} s, " if k in par.get("started_s", {}) else "")
                    + f"written by the helper at {par.get('ready_s', {}).get(k, '–')} s" for k in par["asked_s"]]
                clock = "the helpers' go at the first step" if par.get("helper", {}).get("early_s") is not None \
                    else "the helper started"
                out[-1] += f" Seconds since {clock}: " + "; ".join(parts) + "."
                out[-1] += tail_sentence(r)
            if par.get("helper", {}).get("peak_GiB") is not None:
                out[-1] += (f" The helper's peak GPU memory: {par['helper']['peak_GiB']} GiB (the run's: "
                            f"{r.get('peak_GiB', '–')} GiB).")
            if par.get("helper", {}).get("early_s") is not None:
                out[-1] += " " + early_sentence(par["helper"])
            for key, seconds in (("backward_helper", "backward_s"), ("local_helper", "local_s"),
                                 ("local_backward_helper", "backward_s")):
                side = par.get("helper", {}).get(key)
                if side is not None:  # the helpers beside the first (compile_parallel_backward, per view size)
                    out[-1] += (f" {HELPER_NAMES[key].capitalize()}: " + (
                        f"its compile took {side.get(seconds, '–')} s, inductor cache {side.get('fx_cache', '–')}"
                        + (f", peak GPU memory {side['peak_GiB']} GiB" if side.get("peak_GiB") is not None else "")
                        + (local_backward_phrase(side) if key == "local_helper" else "")
                        if side.get("ok") else f"no entry ({side.get('error', 'it had not ended')})") + ".")
            if par.get("local_brought_backward"):
                out[-1] += " The run's local views' graph came with its backward from the cache: no wait for it."
            if par.get("student_compiled") is False:
                out[-1] += " The run's student forward came from the cache, so it did not wait for its backward."
            if par.get("built_here"):
                out[-1] += (f" Built by the run itself (the helper had not begun or written them when asked): "
                            f"{', '.join(par['built_here'])}.")
            if par.get("helper_stopped"):
                out[-1] += " The helper, behind the run, was stopped after the first steps."
    return out


def tail_sentence(row: dict[str, Any]) -> str:
    """How long the first steps went on after the first step's last wait for a helper ended: the part of the
    longest path that no helper shortens (the first backward's run and its benchmarks, the later steps). The gates'
    clock starts with the first step, give or take the helpers' start-up call."""
    par = row["parallel"]
    ends = [par["asked_s"][k] + par["waited_s"].get(k, 0.0) for k in par["asked_s"] if k != "views"]
    if not ends or row.get("first_s") is None:
        return ""
    last = round(max(ends), 2)
    return (f" The first step's last wait for a helper ended at {last} s, and the first steps about "
            f"{round(row['first_s'] - last, 1)} s after that.")


def early_sentence(helper: dict[str, Any]) -> str:
    """What the helpers started at the process's start did before the go (`helper_process` with `early`), and
    where their start-up went where the status says (`compile_in_child`'s `imported_s`, `built_s`,
    `on_device_s`)."""
    ready = [f"{h['early']['ready_s']} s ({name}{startup_phrase(h['early'])})"
             for name, h in (("the first helper", helper), ("the backward's", helper.get("backward_helper")))
             if h and (h.get("early") or {}).get("ready_s") is not None]
    return (f"The helpers were started at the process's start, {helper['early_s']} s before the first step (as "
            "`scfs.train` starts them, before its set-up)"
            + (f"; each had built its model {' and '.join(ready)} after its start" if ready else "") + ".")


def background_table(rows: list[dict[str, Any]]) -> list[str]:
    """The `background` rows' timeline (the markdown lines; none without such a row)."""
    bg = [r for r in rows if r.get("background")]
    if not bg:
        return []
    out = ["", "`compile_background=true`: eager steps from the first one while a child process compiled the step "
           "(child s: its own wall seconds; ready: seconds from the first step to the child's end), then the "
           "switch to the compiled step (switch s: the first compiled steps' wall seconds, a warm build):", "",
           "| recipe | first step s | eager step ms | eager steps | child s | child's inductor cache | ready s | "
           "switch s | compiled step ms | compile cost s |", "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in bg:
        b = r["background"]
        out.append(f"| {r['recipe']} | {r['first_s']} | {b['eager_step_ms']} | {b['eager_steps']} | {b['child_s']} | "
                   f"{b['child_fx_cache']} | {b['ready_s']} | {b['switch_s']} | {r['step_ms']} | {r['lost_s']} |")
    return out


def phase_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where each compiled row's first steps went, by torch's compile timers (the markdown lines; none without a
    compiled row). Seconds are inclusive: a row with dots is part of the nearest row above it with one dot fewer."""
    compiled = [r for r in rows if r.get("phases")]
    if not compiled:
        return []
    out = ["", "Where the first steps' compile went (torch's compile timers, seconds summed over the calls, "
           "inclusive: a row with dots is part of the nearest row above it with one dot fewer; all timers in the "
           "JSON's `phases`):", "",
           *phases_grid([(f"{r['recipe']} {r['setting']}", r["phases"]) for r in compiled])]
    for r in compiled:
        if r.get("graph_breaks"):
            why = "; ".join(f"{k} (x{v})" for k, v in r["graph_breaks"].items())
            where = ", ".join(r.get("resumes") or {}) or "not reported"
            out += ["", f"Graph breaks of {r['recipe']} {r['setting']}: {why}; resumed in {where}."]
    return out


def helper_statuses(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A `compile_parallel` row's helpers that ended with a status, named (`HELPER_NAMES`): the first helper's
    status holds the others' under their keys."""
    first = (row.get("parallel") or {}).get("helper") or {}
    found = [(name, first if key == "helper" else first.get(key)) for key, name in HELPER_NAMES.items()]
    return [(name, status) for name, status in found if status]


def helper_phase_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where each helper's compile went, by its own process's compile timers (`phases` in its status; the markdown
    lines, none where no helper said): the backward's helper is on the first step's path whenever the run asks for
    its graph before it is written, and its timers say which part of its compile to shorten."""
    cols = [(f"{r['recipe']} {r['setting']}: {name}", status["phases"])
            for r in rows for name, status in helper_statuses(r) if status.get("phases")]
    if not cols:
        return []
    return ["", "Where the helpers' compiles went (each helper process's own compile timers, from its start to its "
            "end, seconds as in the table above):", "", *phases_grid(cols)]


def phases_grid(cols: list[tuple[str, dict[str, float]]]) -> list[str]:
    """The markdown table of `PHASES`, one column per (heading, timers) pair, a dash for a timer it lacks."""
    out = ["| phase (timer) | " + " | ".join(head for head, _ in cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, name in PHASES:
        cells = " | ".join(f"{phases[name]:.1f}" if name in phases else "–" for _, phases in cols)
        out.append(f"| {label} (`{name}`) | {cells} |")
    return out


def compiles_table(rows: list[dict[str, Any]]) -> list[str]:
    """The run's own compiles in each compiled row's first steps, in order (`frame_compiles`; the markdown lines,
    none without them)."""
    listed = [r for r in rows if r.get("compiles")]
    if not listed:
        return []
    out = ["", "The run's own compiles in its first steps, in order (torch's per-frame compile metrics; seconds "
           "from the first step; a part built from a helper's entry is a short compile with cache hits; a graph's "
           "first run, where torch counts it, is Triton's launch-config benchmarks and the CUDA graphs' recording):",
           "", "| row | graph | what | began at s | took s | ops | inductor cache | AOT cache |",
           "|---|---|---|---:|---:|---:|---|---|"]
    for r in listed:
        for c in r["compiles"]:
            out.append(f"| {r['recipe']} {r['setting']} | `{c['graph']}` | {compile_kind(c)} | {c['at_s']} | "
                       f"{'' if c['s'] is None else c['s']} | {'' if c['ops'] is None else c['ops']} | "
                       f"{c['inductor_cache']} | {c['aot_cache']} |")
    return out


def compile_kind(c: dict[str, Any]) -> str:
    """What one `frame_compiles` entry was: a compile, or a first run and what it spent (an entry recorded before
    `first_run` was: empty)."""
    if "first_run" not in c:
        return ""
    if not c["first_run"]:
        return "compile"
    parts = [f"{label} {c[key]} s" for key, label in (("autotune_s", "launch configs"),
                                                      ("cudagraphs_s", "CUDA graphs")) if c.get(key)]
    return "first run" + (f": {', '.join(parts)}" if parts else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", nargs="+", default=["cifar10", "imagenet"],
                   help="experiments (+experiment=<name>), or 'default' for the CPU default")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS,
                   help="the rows, run in this order (a row that reuses another's cache runs right after it)")
    p.add_argument("--order", choices=("alternate", "given"), default="alternate",
                   help="alternate: odd repeats run the rows in reverse, so no row is always first (default)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny network and batch (the CPU test)")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per compiled row (median shown)")
    p.add_argument("--first", type=int, default=3, help="steps timed as the compile")
    p.add_argument("--steady", type=int, default=10, help="steps timed after them (median)")
    p.add_argument("--override", action="append", help="an extra config override (repeatable)")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--no-prime", dest="prime", action="store_false",
                   help="no throwaway process before the first row (module docstring)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prime", dest="prime_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--eager", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scope", default="model", help=argparse.SUPPRESS)
    p.add_argument("--artifacts-in", help=argparse.SUPPRESS)
    p.add_argument("--artifacts-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        row_units(args.rows)
    except ValueError as err:
        p.error(str(err))
    if args.child:
        return child(args)
    if args.prime_child:
        return prime(args)
    result = run(args)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

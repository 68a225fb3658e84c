"""Compiling the step in a child process: `compile_background=true` and `compile_parallel=true`.

`compile_background=true` trains eagerly from the first step while a child process compiles the step.

A cold inductor compile of the shipped recipes holds the first step for one to three minutes on an H200
(docs/RESULTS.md "Compile time"), most of it single-threaded Python on the host. The same graphs compiled by
another process land in the shared on-disk cache (`compile_cache`), from which this process then builds them in
14 to 30 s. So the run starts at once on the eager step, a child process runs the
recipe's step on random views of the run's sizes with the run's config (the same graphs, hence the same cache
keys), and the run switches to the compiled step at the first step boundary after the child finished: the only
wait left in the training process is the warm build.

The switch is decided at step boundaries every `check_every` steps and agreed by all ranks (one small collective
then, none in between), so every process of a DDP run changes at the same step; each node's local rank 0 starts
that node's child (the cache is per node). A child that fails is reported in one line with its log, and the run
compiles in-process at that step, as `compile_background=false` would have at the first: nothing is lost but the
head start.

`compile_parallel=true` keeps the compiled step from step 0 and splits its first compile: the same child, as a
helper (`--helper`), runs the student's call eager and compiles only the teacher's call and the losses, writing a
file for each once its cache entry exists, while the run compiles the student's call (the largest graph: both view
sizes, forward and backward); the run's first step waits for each file before that call (`compile_gate`), so it
builds those two from the cache. It waits only for a part the helper has begun (its `started_path`): one it has not
begun, this process builds itself at once, so a warm cache (a second run) is never held up by the helper's start.

The child's side (what it builds, compiles and reports) is `scfs.training.compile_child`; the files both sides
read and write, the helpers' command lines and their early start are `scfs.training.compile_helpers`. Every rank
reads the child's status file, written atomically when it ends (`ok`, seconds, cache hits and misses).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig

from scfs.training.compile_child import child_command, key_settings, role_child_command, start_child
from scfs.training.compile_helpers import (
    BACKWARD_PART,
    BACKWARD_STATUS_FILE,
    HEADS_PART,
    LOCAL_BACKWARD_PART,
    LOCAL_PART,
    PARTS,
    ROLES,
    STATUS_FILE,
    STUDENT,
    VIEWS_PART,
    EarlyHelpers,
    asked_path,
    helper_roles,
    part_path,
    read_status,
    splits_student,
    started_path,
    stop_child,
    wait_for_part,
    write_status,
)
from scfs.training.compile_metrics import frame_compiles
from scfs.training.host_load import HostLoad
from scfs.training.plain_step import cache_counters, cache_counts, cache_deltas

log = logging.getLogger("scfs.train")

CHECK_EVERY = 10  # steps between the checks for the child's end (each one small collective under DDP)


# ---- the run's gates: waiting for the helpers' parts -------------------------------------------------------------
class PartGate:
    """`compile_gate` of a run beside a `compile_parallel` helper: each call marks the part asked (`asked_path`,
    which a helper may read), waits for that part's cache entry (`wait_for_part`) and keeps the first step's
    timeline, in seconds since the gate was made (when the helper started): when the run asked for each part, how
    long it waited, when the helper began and wrote it (its files' times), and which parts this process built
    without the helper's entry (`built_here`: not begun by the helper when asked, or it ended or timed out
    first). A part written long before it was asked for says the helper could take more of the compile; a long
    wait says it has too much."""

    def __init__(self, status_path: Path, ended: Callable[[], Any], wait_s: float, log_path: Path,
                 parts: tuple[str, ...] = (*PARTS, VIEWS_PART)) -> None:
        self.status_path, self.ended, self.wait_s, self.log_path = status_path, ended, float(wait_s), log_path
        self.parts = parts  # the helper's parts, whose files the timeline reads
        self.t0, self.t0_wall = time.monotonic(), time.time()
        self.waited_s: dict[str, float] = {}
        self.asked_s: dict[str, float] = {}
        self.built_here: list[str] = []

    def __call__(self, part: str) -> None:
        if part in self.asked_s:
            return  # built at the first step: later steps pass (the timeline stays the first step's)
        self.asked_s[part] = round(time.monotonic() - self.t0, 2)
        with contextlib.suppress(OSError):  # a helper's hint only: the wait does not depend on it
            asked_path(self.status_path, part).touch()
        self.waited_s[part] = wait_for_part(self.status_path, part, self.ended, self.wait_s, self.log_path)
        if not part_path(self.status_path, part).exists():
            self.built_here.append(part)

    def pass_by(self, part: str) -> None:
        """Asked for `part` when this process needs none of the helper's: no wait, and the part counts as built
        here (so the helper is stopped after the first step)."""
        if part not in self.asked_s:
            self.asked_s[part], self.waited_s[part] = round(time.monotonic() - self.t0, 2), 0.0
            self.built_here.append(part)

    def _file_times(self, path_of: Callable[[Path, str], Path]) -> dict[str, float]:
        """Per part whose file exists, its time in seconds since the gate was made."""
        times = {}
        for part in self.parts:
            with contextlib.suppress(OSError):
                times[part] = round(path_of(self.status_path, part).stat().st_mtime - self.t0_wall, 2)
        return times

    def timeline(self) -> dict[str, Any]:
        """`waited_s`, `asked_s`, `started_s` and `ready_s` (when the helper began and wrote each part it has) per
        part, and `built_here`."""
        return {"waited_s": dict(self.waited_s), "asked_s": dict(self.asked_s),
                "started_s": self._file_times(started_path), "ready_s": self._file_times(part_path),
                "built_here": list(self.built_here)}


class HelperGates:
    """`compile_gate` of a run beside `compile_parallel`'s helpers: `parts`, the gate of the helper that compiles
    the teacher's call and the losses, and `backward` (`compile_parallel_backward`), that of the helper compiling
    the student's backward graph, or None. With the student's call per view size (`split_student_call`), `local`
    is the gate of the helper compiling the local views' graph and the heads' and `local_backward` that of the local
    views' backward's helper (`backward` then compiles the global views' graph's backward).

    The method asks for `STUDENT` before the student's call, then for the teacher's call and the losses, then for
    `BACKWARD_PART` before the backward; per view size also for `LOCAL_PART` before the local views' graph and for
    `HEADS_PART` before the heads'. The run waits for the student's backward only when it compiled the student's
    forward itself (an inductor cache miss during the student's call, or its global views' graph): a forward that
    came from the cache brought its backward along (AOTAutograd's entry holds both), and the helper, which has to
    lower the forward before its backward, would only hold the run up. Likewise it waits for the local views'
    backward only when that graph's forward brought none (no AOTAutograd hit during it: compiled here, or built from
    the local helper's forward entry)."""

    def __init__(self, parts: PartGate, backward: PartGate | None = None, local: PartGate | None = None,
                 local_backward: PartGate | None = None) -> None:
        self.parts, self.backward = parts, backward
        self.local, self.local_backward = local, local_backward
        self._before_student: tuple[int, ...] | None = None
        self._before_local: tuple[int, ...] | None = None
        self.student_compiled: bool | None = None  # None until known (after the student's call)
        self.local_brought_backward: bool | None = None  # None until known (after the local views' graph)

    @classmethod
    def for_helpers(cls, paths: dict[str, Path], ended: dict[str, Callable[[], Any]], wait_s: float) -> HelperGates:
        """The gates of the helpers writing `paths` (by role, `ROLES`; "parts" always there), each helper's log
        beside its status file; `ended[role]()` says whether that helper ended."""
        gates = {role: PartGate(path, ended[role], wait_s, path.with_suffix(".log"), parts=ROLES[role].parts)
                 for role, path in paths.items()}
        return cls(gates["parts"], gates.get("backward"), gates.get("local"), gates.get("local_backward"))

    def _student_asked_past(self) -> None:
        """Once the student's call (or its global views' graph) is past: whether it compiled here."""
        if self.student_compiled is None and self._before_student is not None:
            self.student_compiled = cache_deltas(self._before_student)[1] > 0

    def stop_behind(self, procs: dict[str, subprocess.Popen | None]) -> dict[str, bool]:
        """After the run's first step, `stop_helper_if_behind` for each helper (`procs` by role): whether each
        was stopped."""
        return {role: stop_helper_if_behind(procs.get(role), gate) for role, gate in self.gates().items()}

    def __call__(self, part: str) -> None:
        if part == STUDENT:
            if self._before_student is None:
                self._before_student = cache_counters()
            return
        self._student_asked_past()
        if part == LOCAL_PART:
            if self._before_local is None:
                self._before_local = cache_counters()
            if self.local is not None:
                self.local(part)
            return
        if part == HEADS_PART:
            if self.local_brought_backward is None and self._before_local is not None:
                self.local_brought_backward = cache_deltas(self._before_local)[2] > 0
            if self.local is not None:
                self.local(part)
            return
        if part != BACKWARD_PART:
            self.parts(part)
            return
        if self.backward is not None:
            if self.student_compiled is False:
                self.backward.pass_by(part)
            else:
                self.backward(part)
        if self.local_backward is not None:
            if self.local_brought_backward:
                self.local_backward.pass_by(LOCAL_BACKWARD_PART)
            else:
                self.local_backward(LOCAL_BACKWARD_PART)

    def gates(self) -> dict[str, PartGate]:
        """The gates there are, by role."""
        named = {"parts": self.parts, "backward": self.backward, "local": self.local,
                 "local_backward": self.local_backward}
        return {role: gate for role, gate in named.items() if gate is not None}

    def timeline(self) -> dict[str, Any]:
        """The gates' `PartGate.timeline`, merged (each part keyed by its name), `student_compiled` with a
        backward's helper and `local_brought_backward` with a local backward's."""
        out = self.parts.timeline()
        for role, gate in self.gates().items():
            if role == "parts":
                continue
            for key, value in gate.timeline().items():
                out[key] = [*out[key], *value] if isinstance(value, list) else {**out[key], **value}
        if self.backward is not None:
            out["student_compiled"] = self.student_compiled
        if self.local_backward is not None:
            out["local_brought_backward"] = self.local_brought_backward
        return out


def stop_helper_if_behind(proc: subprocess.Popen | None, gate: PartGate) -> bool:
    """After the run's first step: stop a helper that fell behind the run (a part built here without its entry).
    What it still compiles would not be used, and it would take the GPU and the host from the run's next steps
    (on a warm cache it has not begun when the run is done). A helper that wrote every part is left to end its
    step. Its status says so (the node's other ranks, which only see the file, learn that it ended). Returns
    whether it was stopped."""
    if gate.built_here and proc is not None and proc.poll() is None:
        stop_child(proc)
        if not gate.status_path.exists():
            write_status(gate.status_path, {"ok": False, "stopped": True, "error": "stopped after the run's first "
                                            f"step: the run built {', '.join(gate.built_here)} without it"})
        return True
    return False


# ---- the callbacks ----------------------------------------------------------------------------------------------
def poll_status(status_path: Path, proc: subprocess.Popen | None) -> dict[str, Any] | None:
    """A child's status once it ended, else None. On the rank that started it (`proc`), an exit without a status
    (killed, crashed) is written as a failed status, so that the other ranks, which only see the file, learn of it
    too."""
    status = read_status(status_path)
    if status is not None:
        return status
    if proc is not None and proc.poll() is not None:
        status = {"ok": False, "error": f"the process ended with status {proc.returncode} and no status file"}
        write_status(status_path, status)
        return status
    return None


def warn_cache_missed(option: str, whose: str, report: dict[str, Any]) -> None:
    """One line when the child's cache entries were not this run's: its compile then bought nothing."""
    log.warning("%s: %s cache entries were not this run's (inductor cache %s): this process compiled under other "
                "cache keys than the child, e.g. torch.set_float32_matmul_precision or inductor options changed after "
                "the run started, or another cache folder; the child's compile bought nothing", option, whose,
                report.get("fx_cache"))


class ChildCompile(L.Callback):
    """What both options' callbacks share: the child, started on each node's local rank 0 with the run's config,
    polled through its status file, stopped when the run ends first.

    `steps`: the child's steps. Subclasses set `helper` (the child's `--helper`) and `started_message`."""

    helper = False
    started_message = "process %d compiles into %s (log: %s)"

    def __init__(self, cfg: DictConfig, run_dir: Path, batch_size: int, steps: int = 2) -> None:
        self.cfg, self.run_dir, self.batch_size, self.steps = cfg, Path(run_dir), int(batch_size), int(steps)
        self.status_path = self.run_dir / STATUS_FILE  # per node (`_start_child`): a shared run folder
        self.proc: subprocess.Popen | None = None
        self.t0: float | None = None
        self.report: dict[str, Any] = {}
        self._counters: tuple[int, ...] | None = None  # the cache counters when the compiled step began

    @property
    def log_path(self) -> Path:
        """The child's output (per node, beside its status file)."""
        return self.status_path.with_suffix(".log")

    def command(self, device: str) -> list[str]:
        return child_command(self.status_path.with_suffix(".yaml"), self.status_path, device, self.steps,
                             self.helper)

    def _node_path(self, trainer: L.Trainer, name: str) -> Path:
        """A status file of this node: one per node in a shared run folder of a multi-node run."""
        return self.run_dir / (f"node{trainer.node_rank}-{name}" if trainer.num_nodes > 1 else name)

    @staticmethod
    def _device(trainer: L.Trainer) -> str:
        dev = trainer.strategy.root_device
        return f"cuda:{dev.index or 0}" if dev.type == "cuda" else str(dev.type)

    def _start_child(self, trainer: L.Trainer) -> None:
        """On each node's local rank 0: the child, with the run's config; then every rank past a barrier."""
        self.status_path = self._node_path(trainer, STATUS_FILE)
        if trainer.local_rank == 0:
            device = self._device(trainer)
            self.proc = start_child(self.cfg, self.batch_size, self.status_path, device,
                                    command=self.command(device))
            log.info(self.started_message, self.proc.pid,
                     os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch's default cache"), self.log_path)
        trainer.strategy.barrier("background_compile")  # the status file of an earlier run is gone on every rank

    def _poll_child(self) -> dict[str, Any] | None:
        """The child's status once it ended, else None (`poll_status`)."""
        return poll_status(self.status_path, self.proc)

    summary_key = "compile_background"  # the run's summary.json entry (`summary_entry`)

    def summary_entry(self) -> dict[str, Any]:
        """What `summary.json` records of the child and the compiled step (the option's key: `summary_key`)."""
        return self.report

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        stop_child(self.proc)  # still compiling: the run ended first

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        stop_child(self.proc)


class BackgroundCompile(ChildCompile):
    """`compile_background=true`: start the child at the start of fit, switch the method to its compiled step when
    the child is done.

    `check_every`: steps between the checks (`CHECK_EVERY` when None)."""

    started_message = ("compile_background: training eagerly while process %d compiles the step into %s (log: %s); "
                       "the compiled step takes over when it is done")

    def __init__(self, cfg: DictConfig, run_dir: Path, batch_size: int, check_every: int | None = None,
                 steps: int = 2) -> None:
        super().__init__(cfg, run_dir, batch_size, steps)
        self.check_every = max(int(check_every or CHECK_EVERY), 1)
        self.switched_at: int | None = None  # the global step the compiled step started at
        self._switch_t: float | None = None

    def summary_entry(self) -> dict[str, Any]:
        """When the compiled step took over and what it was built from (a run that never switched says so)."""
        return self.report or {"switch_step": None}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = time.monotonic()
        if getattr(pl_module, "compile_nets", True):
            return  # compiled already (a second fit of the same module): nothing to start
        self._start_child(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if getattr(pl_module, "compile_nets", True) or trainer.global_step % self.check_every:
            return
        status = self._poll_child()
        if not trainer.strategy.reduce_boolean_decision(status is not None, all=True):
            return
        status = status or {}
        elapsed = time.monotonic() - (self.t0 or time.monotonic())
        if status.get("ok"):
            log.info("compile_background: the child compiled the step in %.0f s (%s); the compiled step takes over "
                     "at step %d, %.0f s into training", status.get("seconds", 0.0), status.get("fx_cache", "?"),
                     trainer.global_step, elapsed)
        else:
            log.warning("compile_background: the child failed (%s; its log: %s); compiling the step in this "
                        "process now", status.get("error", "?"), self.log_path)
        self.switched_at = int(trainer.global_step)
        self.report = {"child": status, "switch_step": self.switched_at, "switch_after_s": round(elapsed, 1)}
        self._switch_t, self._counters = time.monotonic(), cache_counters()
        pl_module.compile_now()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._switch_t is None:
            return
        # the first compiled step: whether the child's cache held this run's graphs (all hits: it did), counted
        # from the switch (the process may have compiled other things before)
        deltas = cache_deltas(self._counters)  # inductor hits, misses, AOTAutograd hits, misses
        self.report.update(switch_s=round(time.monotonic() - self._switch_t, 1), **cache_counts(deltas=deltas))
        self._switch_t = None
        log.info("compile_background: the first compiled step took %.1f s (inductor cache %s, AOTAutograd %s)",
                 self.report["switch_s"], self.report["fx_cache"], self.report["aot_cache"])
        if deltas[1]:
            warn_cache_missed("compile_background", "the child's", self.report)


class ParallelCompile(ChildCompile):
    """`compile_parallel=true`: the run compiles its step from the first step, as `compile=true` does, but a helper
    child compiles the teacher's call and the losses meanwhile, while this process compiles the student's (the
    largest: both view sizes, forward and backward). Before the teacher's call and before the losses the method asks
    `compile_gate`, which waits for the helper's cache entry of that part (or its end), so this process builds them
    from the cache instead of compiling them after the student's; a part the helper has not begun yet is not
    waited for (`wait_for_part`). `wait_s` bounds each wait.

    `backward` (`compile_parallel_backward=true`): a second helper compiles the student's backward graph
    (`scfs.training.backward_helper`) while this process compiles the student's forward; the method asks the gate
    again before its first backward (`HelperGates`).

    With the student's call per view size (`compile_student_graphs=per_view_size`) a third helper compiles the
    local views' graph while this process compiles the global views', and with `backward` a fourth compiles the
    local views' backward while the second compiles the global views' (`ROLES`, `helper_roles`).

    Views made on the device with compiled per-pixel ops (`compile_views`) are handed over too
    (`SelfDistillation.hand_views_to_helper`): the helper compiles their graphs after its parts, the first batch's
    views are made eagerly, and the gate stays until the next batch has asked for "views"."""

    helper = True
    summary_key = "compile_parallel"  # the first step, its waits for the helpers and its cache hits
    started_message = ("compile_parallel: process %d compiles the teacher's call and the losses into %s (log: %s) "
                       "while this one compiles the student's")

    def __init__(self, cfg: DictConfig, run_dir: Path, batch_size: int, steps: int = 1,
                 wait_s: float = 900.0, backward: bool = False, early: EarlyHelpers | None = None) -> None:
        # one step writes both parts; a second would only take GPU time from the run
        super().__init__(cfg, run_dir, batch_size, steps)
        self.wait_s = float(wait_s)
        self.backward = bool(backward)
        self.roles = helper_roles(True, self.backward, splits_student(cfg))
        self.early = early  # helpers `scfs.train` started before its set-up, waiting for the go
        # the helpers other than the parts' one (`ChildCompile.status_path`, `proc`), by role
        self.side_paths = {role: self.run_dir / ROLES[role].status_file for role in self.roles if role != "parts"}
        self.side_procs: dict[str, subprocess.Popen | None] = {}
        self._first_t: float | None = None
        self._first_wall = 0.0
        self._load: HostLoad | None = None
        self._gate: HelperGates | None = None
        self._views_pending = False  # the views handed to the helper and not yet asked for by the run

    @property
    def backward_status_path(self) -> Path:
        """The backward helper's status file."""
        return self.side_paths.get("backward", self.run_dir / BACKWARD_STATUS_FILE)

    @property
    def backward_proc(self) -> subprocess.Popen | None:
        """The backward helper's process (None where this rank started none)."""
        return self.side_procs.get("backward")

    def backward_command(self, device: str) -> list[str]:
        """The backward helper's command line (`role_child_command`), as `command` is the first helper's."""
        return role_child_command("backward", self.backward_status_path, device)

    def side_command(self, role: str, device: str) -> list[str]:
        """The command line of the helper of `role` (other than the parts')."""
        if role == "backward":
            return self.backward_command(device)
        return role_child_command(role, self.side_paths[role], device)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = time.monotonic()
        self.status_path = self._node_path(trainer, STATUS_FILE)
        self.side_paths = {role: self._node_path(trainer, ROLES[role].status_file) for role in self.side_paths}
        # the gates' clocks first, then the helpers
        ended = {"parts": self._poll_child, **{role: self._poller(role) for role in self.side_paths}}
        self._gate = HelperGates.for_helpers({"parts": self.status_path, **self.side_paths}, ended, self.wait_s)
        self.report = {"waited_s": {}}
        if trainer.local_rank == 0 and self._give_early_helpers_the_go(trainer):
            trainer.strategy.barrier("background_compile")
        else:
            if trainer.local_rank == 0:
                device = self._device(trainer)
                for role, path in self.side_paths.items():
                    proc = start_child(self.cfg, self.batch_size, path, device,
                                       command=lambda role=role: self.side_command(role, device))
                    self.side_procs[role] = proc
                    log.info("compile_parallel: process %d compiles %s (log: %s)", proc.pid, ROLES[role].what,
                             path.with_suffix(".log"))
            self._start_child(trainer)
        self._first_t, self._first_wall, self._counters = time.monotonic(), time.time(), cache_counters()
        self._load = HostLoad().start()  # whether the first step's compile waited for a core (`summary.json`)
        pl_module.compile_gate = self.wait_for
        # a module that makes no views of its own (or another LightningModule) has none to hand over
        hand = getattr(pl_module, "hand_views_to_helper", None)
        self._views_pending = bool(hand is not None and hand())

    def _poller(self, role: str) -> Callable[[], dict[str, Any] | None]:
        """The status of the helper of `role` once it ended, else None (`poll_status`)."""
        return lambda: poll_status(self.side_paths[role], self.side_procs.get(role))

    def _give_early_helpers_the_go(self, trainer: L.Trainer) -> bool:
        """Take the helpers started early (`early`) as this run's and give them the go; False (they are stopped)
        where they are not the ones this run would start now (another device or status files, one ended)."""
        early, self.early = self.early, None
        if early is None:
            return False
        paths = {**self.side_paths, "parts": self.status_path}
        if not early.fits(self._device(trainer), paths):
            early.stop()
            log.info("compile_parallel: the helpers started before the set-up were not this run's (device %s, "
                     "files or an ended process); starting them now", early.device)
            return False
        self.proc = early.procs["parts"]
        self.side_procs = {role: early.procs.get(role) for role in self.side_paths}
        ready = early.ready_roles()
        ahead = early.go(self.cfg, self.batch_size, key_settings())
        self.report["early_s"] = round(ahead, 1)
        self.report["ready_at_go"] = list(ready)
        if early.started_after_s is not None:
            self.report["early_started_after_s"] = early.started_after_s
        starting = [role for role in early.paths if role not in ready]
        log.info("compile_parallel: the helpers started %.1f s before fit (processes %s) compile now (%s; logs: %s)",
                 ahead, ", ".join(str(p.pid) for p in early.procs.values()),
                 f"still starting: {', '.join(starting)}" if starting else "all ready",
                 ", ".join(str(p.with_suffix(".log")) for p in early.paths.values()))
        return True

    def summary_entry(self) -> dict[str, Any]:
        """The first step's report and each helper's status once it ended (its cache counts, seconds, peak GPU
        memory)."""
        out = dict(self.report)
        helpers = [("helper", self.status_path)] + [(ROLES[role].summary_key, path)
                                                     for role, path in self.side_paths.items()]
        for key, path in helpers:
            status = read_status(path)
            if status is not None:
                out[key] = status
        return out

    def wait_for(self, part: str) -> None:
        """Until the helper has compiled `part`, it has ended, or `wait_s` passed (then this process compiles it)."""
        self._gate(part)

    def _stop_side_helpers(self) -> None:
        for proc in self.side_procs.values():
            stop_child(proc)

    def _stop_load(self) -> dict[str, Any] | None:
        """Stop the host-load sampler (at the first step's end, or where the run ended before it) and return what
        it saw; None where it was stopped already."""
        load, self._load = self._load, None
        return load.stop() if load is not None else None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop_side_helpers()
        self._stop_load()
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop_side_helpers()
        self._stop_load()
        super().on_exception(trainer, pl_module, exception)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._first_t is None:
            if self._views_pending and getattr(pl_module, "views_handoff", None) is None:  # it asked for them
                self._views_pending = False
                pl_module.compile_gate = None
                if self._gate is not None:
                    self.report.update(self._gate.timeline())
                # the cache hits and misses of the first steps, up to the one that built the views
                self.report["through_views"] = cache_counts(deltas=cache_deltas(self._counters))
            return
        if getattr(pl_module, "views_handoff", None) is None:  # else the gate stays until the views are asked for
            self._views_pending = False
            pl_module.compile_gate = None
        deltas = cache_deltas(self._counters)
        self.report.update(first_step_s=round(time.monotonic() - self._first_t, 1), **cache_counts(deltas=deltas))
        if self._load is not None:
            self.report["host_load"] = self._stop_load()
        # this process's own compiles and first runs in the first step, by graph, seconds from fit's start
        self.report["compiles"] = frame_compiles(self._first_wall)
        if self._gate is not None:
            self.report.update(self._gate.timeline())
            stopped = self._gate.stop_behind({"parts": self.proc, **self.side_procs})
            for role, was_stopped in stopped.items():  # helper_stopped, backward_helper_stopped, ...
                self.report[f"{ROLES[role].summary_key}_stopped"] = was_stopped
        self._first_t = None
        log.info("compile_parallel: the first step took %.1f s, %s s of it waiting for the helpers (inductor cache "
                 "%s)%s",
                 self.report["first_step_s"], self.report["waited_s"], self.report["fx_cache"],
                 f"; built here without the helper's entry: {', '.join(self.report['built_here'])}"
                 if self.report.get("built_here") else "")
        from_helper = set(self.report.get("asked_s", {})) - set(self.report.get("built_here", []))
        if from_helper and not deltas[0]:  # parts the helper wrote, and still no hit
            warn_cache_missed("compile_parallel", "the helper's", self.report)


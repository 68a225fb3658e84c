"""The helper processes of `compile_parallel` from the run's side: their files, their command lines, where `auto`
starts them, and their early start.

Import-light on purpose (OmegaConf and the standard library only). A helper is a fresh interpreter that imports
torch, Lightning and inductor and builds the model on the GPU before it compiles anything: 17–21 s on an H200
host (docs/RESULTS.md "Compile time"). Started at the start of fit, that start-up lies on the first step's longest
path. `scfs.train` therefore starts the helpers before its own imports and set-up (`start_early_helpers`), each
helper builds the model and then waits, and the run gives the go at the start of fit (`EarlyHelpers.go`) with
what only it knows by then: its final config and its process-wide settings that are part of the compile cache's
keys. The child's side of the protocol is `scfs.training.compile_child`.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("scfs.train")

STATUS_FILE = "background_compile.json"
PARTS = ("teacher", "loss")  # what a `compile_parallel` helper compiles, in the order the step calls them
# and after them, where the run makes its views compiled (`SelfDistillation.hand_views_to_helper`), their graphs: the
# run asks for them at its second batch
VIEWS_PART = "views"
# `compile_parallel_backward`: the second helper's part, its status file, and the method's gate before the student's
# call (`HelperGates`: whether the run compiled the student's forward, and so will compile its backward)
BACKWARD_PART = "student_backward"
BACKWARD_STATUS_FILE = "background_compile_backward.json"
STUDENT = "student"
# `compile_student_graphs=per_view_size` (`SelfDistillation.split_student_call`): a third helper compiles the local
# views' graph of the student's call ("student_local", asked for before that graph) and a fourth its backward
# ("student_local_backward", asked for before the backward); the backward's helper then compiles the global views'
# graph's backward. The local views' helper then compiles the heads' graph, forward and backward ("student_heads",
# asked for before it).
LOCAL_PART = "student_local"
HEADS_PART = "student_heads"
LOCAL_BACKWARD_PART = "student_local_backward"
LOCAL_STATUS_FILE = "background_compile_local.json"
LOCAL_BACKWARD_STATUS_FILE = "background_compile_local_backward.json"


class HelperRole(NamedTuple):
    """What one helper does: its status file's name, the parts it writes, its command-line flags
    (`helper_command`), the steps it runs, the key of its status in the run's summary, what it compiles (for
    the log and the records) and what the records call it."""

    status_file: str
    parts: tuple[str, ...]
    flags: tuple[str, ...]
    steps: int
    summary_key: str
    what: str
    name: str

    def command_flags(self) -> dict[str, bool]:
        """`helper_command`'s keyword flags of this role."""
        return {"helper": "--helper" in self.flags, "backward": "--backward" in self.flags,
                "local": "--local" in self.flags}


ROLES: dict[str, HelperRole] = {
    "parts": HelperRole(STATUS_FILE, (*PARTS, VIEWS_PART), ("--helper",), 1, "helper",
                        "the teacher's call and the losses", "the first helper"),
    "backward": HelperRole(BACKWARD_STATUS_FILE, (BACKWARD_PART,), ("--backward",), 0, "backward_helper",
                           "the student's backward graph", "the backward's helper"),
    "local": HelperRole(LOCAL_STATUS_FILE, (LOCAL_PART, HEADS_PART), ("--local",), 0, "local_helper",
                        "the student's local views' graph and its heads'", "the local views' helper"),
    "local_backward": HelperRole(LOCAL_BACKWARD_STATUS_FILE, (LOCAL_BACKWARD_PART,), ("--backward", "--local"), 0,
                                 "local_backward_helper", "the student's local views' backward graph",
                                 "the local views' backward's helper"),
}
# each helper's status key in a run's summary (`compile_parallel`) and in the first helper's status -> its name
HELPER_NAMES: dict[str, str] = {role.summary_key: role.name for role in ROLES.values()}
AUTO_MIN_CORES = 8  # `auto` starts the helpers only with this many CPU cores: they compile beside the run
SPAWNED_AT_ENV = "SCFS_HELPER_SPAWNED_AT"  # the wall clock at the helper's start, for its start-up seconds
PARENT_PID_ENV = "SCFS_HELPER_PARENT_PID"  # the run that started the helper: gone, the helper must end too
# where this helper's start-up went (`scfs.training.helper_entry`): mark -> seconds since its spawn
STARTUP_MARKS: dict[str, float | None] = {}


# ---- where the helpers run --------------------------------------------------------------------------------------
def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_parallel_off_reason(cfg: DictConfig, cuda: bool, cores: int) -> str | None:
    """Why `compile_parallel=auto` leaves the helpers off for `cfg` (None: it turns them on). They pay off where
    the run compiles its step with inductor as one model-scope graph per call, on a CUDA GPU whose host has cores to
    spare for two more compiling processes; elsewhere `auto` keeps the single-process compile."""
    backend = cfg.get("compile_backend", "inductor")
    reasons = [(not cfg.get("compile", False), "compile=false"),
               (backend != "inductor", f"compile_backend={backend}"),
               (cfg.get("compile_scope", "model") != "model", f"compile_scope={cfg.get('compile_scope')}"),
               (bool(cfg.get("compile_background", False)), "compile_background=true"),
               (bool(cfg.get("sync_bn", False)), "sync_bn=true"),
               (not cuda, "no CUDA device"),
               (cores < AUTO_MIN_CORES, f"{cores} CPU cores (it needs {AUTO_MIN_CORES})")]
    return next((why for off, why in reasons if off), None)


def parallel_helpers(cfg: DictConfig, cuda: bool, cores: int | None = None) -> tuple[bool, bool]:
    """Whether a run of `cfg` starts `compile_parallel`'s helper and `compile_parallel_backward`'s, `auto`
    resolved: `compile_parallel=auto` is on where `auto_parallel_off_reason` finds nothing against it, and
    `compile_parallel_backward=auto` follows `compile_parallel`. `cores` defaults to this process's CPUs."""
    parallel = cfg.get("compile_parallel", False)
    if parallel == "auto":
        parallel = auto_parallel_off_reason(cfg, cuda, cpu_cores() if cores is None else cores) is None
    if parallel is not True or not cfg.get("compile", False):
        return False, False
    backward = cfg.get("compile_parallel_backward", False)
    return True, backward is True or backward == "auto"


def splits_student(cfg: DictConfig) -> bool:
    """Whether a run of `cfg` compiles the student's call per view size (`compile_student_graphs=per_view_size`
    with local views): then `compile_parallel` starts a helper for the local views' graph, and
    `compile_parallel_backward` one for its backward."""
    return (cfg.get("compile_student_graphs", "one") == "per_view_size"
            and int(cfg.get("crops", {}).get("n_local", 0) or 0) > 0)


def helper_roles(parallel: bool, backward: bool, split: bool) -> tuple[str, ...]:
    """The helpers' roles (`ROLES`) of a run, in the order they are started: the backward graphs' first (their
    compiles are the longest), the parts' last."""
    if not parallel:
        return ()
    return (*(("backward",) if backward else ()), *(("local_backward",) if backward and split else ()),
            *(("local",) if split else ()), "parts")


def gpu_run(cfg: DictConfig) -> bool:
    """Whether `cfg` trains on a GPU, judged without importing torch: its Trainer asks for one, or takes what
    there is (`auto`) on a host with an NVIDIA or AMD GPU driver."""
    accel = str(cfg.get("trainer", {}).get("accelerator", "cpu"))
    return accel in ("gpu", "cuda") or (accel == "auto" and any(Path(p).exists() for p in ("/dev/nvidiactl",
                                                                                           "/dev/kfd")))


# ---- the files of a helper --------------------------------------------------------------------------------------
def part_path(status_path: Path, part: str) -> Path:
    """The file that says a helper child has compiled `part` ("teacher", "loss")."""
    return status_path.with_suffix(f".{part}")


def started_path(status_path: Path, part: str) -> Path:
    """The file that says a helper child has begun `part` (its call is being compiled or built)."""
    return status_path.with_suffix(f".{part}-started")


def asked_path(status_path: Path, part: str) -> Path:
    """The file that says the run has asked for `part` (`PartGate`): a helper that could still add to that part's
    entries, at a cost to when it writes them, knows the run is waiting (`runs_local_backward`)."""
    return status_path.with_suffix(f".{part}-asked")


def go_path(status_path: Path) -> Path:
    """The file that tells an early-started helper to compile (`EarlyHelpers.go`)."""
    return status_path.with_suffix(".go")


def ready_path(status_path: Path) -> Path:
    """The file an early-started helper writes once its model is on the device and it waits for the go: the run
    says at its go which helpers were still starting (`EarlyHelpers.ready_roles`)."""
    return status_path.with_suffix(".ready")


def write_status(path: Path, status: dict[str, Any]) -> None:
    """The status file, whole or not at all (the ranks poll for it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any] | None:
    """A status file written by `write_status`; None while there is none."""
    with contextlib.suppress(FileNotFoundError):
        return json.loads(path.read_text())
    return None


# ---- starting and stopping one ----------------------------------------------------------------------------------
def since_spawn() -> float | None:
    """Seconds since the run started this process (`SPAWNED_AT_ENV`); None when it was started otherwise."""
    spawned = os.environ.get(SPAWNED_AT_ENV)
    return round(time.time() - float(spawned), 2) if spawned else None


def child_config(cfg: DictConfig, batch_size: int) -> DictConfig:
    """The run's config as the child builds it: resolved, this process's batch size, compiled from the start."""
    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    c.batch_size, c.global_batch_size = int(batch_size), None
    c.compile, c.compile_background, c.compile_parallel, c.compile_artifacts = True, False, False, None
    c.compile_parallel_backward = False
    return c


def helper_command(cfg_path: Path, status_path: Path, device: str, steps: int = 2, helper: bool = False,
                   backward: bool = False, wait_go: bool = False, local: bool = False) -> list[str]:
    """The child's command line (`scfs.training.compile_child`'s `main`, entered through
    `scfs.training.helper_entry`, which times its imports), without the run's settings."""
    return [sys.executable, "-m", "scfs.training.helper_entry", str(cfg_path), str(status_path), "--device",
            device, "--steps", str(steps), *(["--helper"] if helper else []), *(["--backward"] if backward else []),
            *(["--local"] if local else []), *(["--wait-go"] if wait_go else [])]


def role_command(role: str, status_path: Path, device: str, wait_go: bool = False) -> list[str]:
    """The command line of the helper of `role` (`ROLES`) writing `status_path`, its config beside it."""
    return helper_command(status_path.with_suffix(".yaml"), status_path, device, ROLES[role].steps,
                          wait_go=wait_go, **ROLES[role].command_flags())


def child_env() -> dict[str, str]:
    """The child's environment: this process's (the compile cache folder, the device settings), this package
    importable from wherever the run was started, output unbuffered into its log, its start time, and this
    process's id (the run's: a helper whose run is gone stops waiting for its go, `wait_for_go`)."""
    import scfs

    root = str(Path(scfs.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", SPAWNED_AT_ENV: repr(time.time()),
            PARENT_PID_ENV: str(os.getpid())}


def launch(cfg: DictConfig, batch_size: int, status_path: Path,
           command: list[str] | Callable[[], list[str]]) -> subprocess.Popen:
    """Start a child with `command` (or the command line `command()` makes, once the files are cleared), its files
    of an earlier run removed first: the run's config beside its status file (`.yaml`), its output there too
    (`.log`)."""
    parts = tuple(part for role in ROLES.values() for part in role.parts)
    stale = (f(status_path, part) for part in parts for f in (part_path, started_path, asked_path))
    for path in (status_path, go_path(status_path), ready_path(status_path), *stale):
        path.unlink(missing_ok=True)
    status_path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(child_config(cfg, batch_size), status_path.with_suffix(".yaml"))
    argv = command() if callable(command) else command
    with open(status_path.with_suffix(".log"), "w") as logf:  # the child keeps its own handle
        return subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=child_env())


def stop_child(proc: subprocess.Popen | None, grace_s: float = 0.0) -> None:
    """End a child still running: after `grace_s` seconds to end by itself, terminated, then killed."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- the early start --------------------------------------------------------------------------------------------
def process_age_s() -> float | None:
    """Seconds since this process started (from /proc on Linux), or None where that cannot be read."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # from the third field, the state
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 2)  # the 22nd field: the start, in ticks
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class EarlyHelpers:
    """Helpers started before the run's set-up, waiting for its go. `paths`: each helper's status file by role
    (`ROLES`: "parts", the teacher's call and the losses; "backward", the student's backward graph; "local" and
    "local_backward", the local views' graph and its backward)."""

    device: str
    paths: dict[str, Path]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    # seconds from the run's own start to theirs: what the run did before it started them
    started_after_s: float | None = field(default_factory=process_age_s)

    def fits(self, device: str, paths: dict[str, Path]) -> bool:
        """Whether these helpers are the ones the run would start now: the same device and files, all running."""
        return (device == self.device and paths == self.paths
                and all(p.poll() is None for p in self.procs.values()))

    def ready_roles(self) -> tuple[str, ...]:
        """The roles whose helper is ready for the go (`ready_path`): built, on the device and waiting."""
        return tuple(role for role, path in self.paths.items() if ready_path(path).exists())

    def go(self, cfg: DictConfig, batch_size: int, settings: dict[str, Any]) -> float:
        """Tell each helper to compile: the run's final config (a helper built from a config that differs
        rebuilds) and its `key_settings`. Returns the seconds since the helpers were started."""
        for path in self.paths.values():
            final = path.with_suffix(".go.yaml")
            OmegaConf.save(child_config(cfg, batch_size), final)
            write_status(go_path(path), {"config": str(final), "settings": settings})
        return time.monotonic() - self.started

    def stop(self) -> None:
        """End the helpers that are still running (a run that never reached fit, or one that started its own)."""
        for proc in self.procs.values():
            stop_child(proc)


def launch_local_rank() -> int:
    """This process's rank on its node as its launcher set it before any Trainer exists: torchrun's and
    Lightning's `LOCAL_RANK`, SLURM's `SLURM_LOCALID` (one task per GPU under srun), Open MPI's; 0 when none is set
    (a single process, or the first one, which starts the others)."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        value = os.environ.get(key)
        if value not in (None, ""):
            return int(value)
    return 0


def torch_default_cache_dir() -> str:
    """The folder torch.compile caches into when nothing names one: inductor's `default_cache_dir`
    (`<temp dir>/torchinductor_<user>`), worked out here as it does without importing torch, since the early
    helpers start before the run imports it (`tests/test_config.py` holds the two equal)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    folder = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.abspath(os.path.join(tempfile.gettempdir(), folder))


def users_cache_dir() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR where a user set it; None where it is unset or holds torch's own default folder.

    Importing Lightning has inductor write its default folder into the environment, so by the time a run reads
    the variable it is set whether or not anybody chose it, and a process started by one that imported Lightning
    (a notebook's, a benchmark's) inherits it; only another folder is a user's choice (a user who wants torch's
    folder says `compile_cache=null`)."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value or os.path.abspath(value) == torch_default_cache_dir():
        return None
    return value


def choose_compile_cache(cfg: DictConfig) -> str | None:
    """The compile cache folder of this process and its children: TORCHINDUCTOR_CACHE_DIR where a user set it
    (`users_cache_dir`: their own setting wins), else `compile_cache`, put into the environment; None for torch's
    default."""
    chosen = users_cache_dir()
    if not chosen and cfg.get("compile_cache"):
        chosen = os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(str(cfg.compile_cache)).expanduser())
    return chosen or None


def early_device() -> str:
    """The device of a single-node run's first process, as its Trainer will name it (`ParallelCompile._device`);
    a run on another (`trainer.devices=[1]`) finds out at fit, where the callback starts its helpers anew."""
    return "cuda:0"


def early_paths(run_dir: Path, backward: bool, split: bool = False) -> dict[str, Path]:
    """The helpers' status files in a single-node run folder by role, in their start order (`helper_roles`;
    `ParallelCompile` names the same ones)."""
    return {role: run_dir / ROLES[role].status_file for role in helper_roles(True, backward, split)}


def start_early_helpers(cfg: DictConfig, run_dir: Path, batch_size: int | None = None) -> EarlyHelpers | None:
    """`compile_parallel`'s helpers for `cfg`, started now and waiting for `EarlyHelpers.go`; None where the run
    would start none, or would start them elsewhere: not a GPU run (`gpu_run`), `auto` off, a multi-node run
    (each node's files are named at fit) or a process other than its node's first (`launch_local_rank`).

    The compile cache folder is chosen first (`choose_compile_cache`), since the helpers take it from this
    process's environment."""
    if not gpu_run(cfg) or launch_local_rank() != 0:
        return None
    if int(cfg.get("trainer", {}).get("num_nodes", 1) or 1) > 1:
        return None
    parallel, backward = parallel_helpers(cfg, cuda=True)
    if not parallel:
        return None
    choose_compile_cache(cfg)
    if batch_size is None:
        from scfs.training.build import per_device_batch_size

        batch_size = per_device_batch_size(cfg)
    early = EarlyHelpers(early_device(), early_paths(Path(run_dir), backward, splits_student(cfg)))
    for role, path in early.paths.items():  # the backward's first: its compile is the longest
        early.procs[role] = launch(cfg, batch_size, path, role_command(role, path, early.device, wait_go=True))
    return early


def wait_for_part(status_path: Path, part: str, ended: Callable[[], Any], wait_s: float, log_path: Path,
                  instead: str = "compiling it here") -> float:
    """Wait while a helper child compiles `part`: from its `started_path` until its `part_path`, until `ended()`
    says it ended, or until `wait_s` passed; returns the seconds waited. A part the helper has not begun is not
    waited for: the caller builds it at once (from a warm cache in seconds, else compiling it as it would without
    the helper), instead of waiting out the helper's start-up and everything it does before that part.
    `instead`: what the caller does when the wait times out, for the warning."""
    t0, path, begun = time.monotonic(), part_path(status_path, part), started_path(status_path, part)
    while not path.exists() and begun.exists() and not ended():
        if time.monotonic() - t0 > wait_s:
            log.warning("compile_parallel: no %s from the helper after %.0f s (its log: %s); %s",
                        part, wait_s, log_path, instead)
            break
        time.sleep(0.05)
    return round(time.monotonic() - t0, 2)

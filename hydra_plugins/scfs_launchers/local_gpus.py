"""`hydra/launcher=local_gpus`: the jobs of a multirun side by side on the GPUs of this machine.

Each job is a subprocess (`python -m <the app> <its overrides> hydra.run.dir=<its job folder>`), so each has its
own CUDA context and a crash or an out-of-memory stays in its job. `per_gpu` jobs share each GPU (small runs do not
fill an H200), each pinned to its GPU with `CUDA_VISIBLE_DEVICES`; `gpus` picks the GPUs (null: all visible). On a
machine without CUDA, `per_gpu` is the number of jobs at a time, and each job gets an equal share of the CPU cores
(`OMP_NUM_THREADS`, unless set). A job's output goes to `<job folder>/stdout.log`; its last line (the run's
one-line summary) is printed when it ends, or where it failed the line that says why (`scfs.errors.failure_line`).
SIGTERM or Ctrl-C stops the running jobs too (each has written `last.ckpt` every `checkpoint.every_n_train_steps`
steps: the next multirun resumes them).
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional  # noqa: UP035 - Hydra's structured configs need these

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

# hydra overrides of the sweep itself: meaningless (or harmful) in a job that runs as a single run
_SWEEP_ONLY = ("hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper", "hydra.sweep", "hydra.run",
               "hydra.mode")


@dataclass
class LocalGpusLauncherConf:
    _target_: str = "hydra_plugins.scfs_launchers.local_gpus.LocalGpusLauncher"
    per_gpu: int = 1              # jobs side by side on each GPU (jobs at a time on a machine without CUDA)
    gpus: Optional[List[int]] = None  # noqa: UP006, UP045  # GPU indices to use; null = every GPU this process sees
    poll_s: float = 0.5           # how often finished jobs are looked for


ConfigStore.instance().store(group="hydra/launcher", name="local_gpus", node=LocalGpusLauncherConf, provider="scfs")


def visible_gpus() -> list[int]:
    """The GPU indices this process sees, without creating a CUDA context here (the jobs make their own)."""
    try:
        import torch

        return list(range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001 - no usable torch/CUDA: a CPU machine
        return []


def app_command() -> list[str]:
    """How this app was started, to start its jobs the same way: `python -m <module>` or `python <script>`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return [sys.executable, "-m", spec.name.removesuffix(".__main__")]
    return [sys.executable, sys.argv[0]]


def log_line(path: Path, failed: bool) -> str:
    """A job's last line, or where it failed the line that says why."""
    from scfs.errors import failure_line

    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    if failed:
        return failure_line(text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


class LocalGpusLauncher(Launcher):
    def __init__(self, per_gpu: int = 1, gpus: list[int] | None = None, poll_s: float = 0.5) -> None:
        if int(per_gpu) < 1:
            from scfs.config import ConfigError

            raise ConfigError(f"hydra.launcher.per_gpu={per_gpu} is invalid: jobs per GPU must be >= 1")
        self.per_gpu, self.gpus, self.poll_s = int(per_gpu), (list(gpus) if gpus is not None else None), poll_s
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context

    def _slots(self) -> list[str | None]:
        """One entry per job that may run at once: its GPU (the CUDA_VISIBLE_DEVICES of its job), or None on a CPU.

        GPU indices count the GPUs this process sees: under `CUDA_VISIBLE_DEVICES=2,3`, GPU 0 is device 2.
        """
        gpus = self.gpus if self.gpus is not None else visible_gpus()
        seen = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if seen and any(int(g) >= len(seen) for g in gpus):
            from scfs.config import ConfigError

            raise ConfigError(f"hydra.launcher.gpus={list(gpus)} is invalid: this process sees {len(seen)} GPU(s) "
                              f"(CUDA_VISIBLE_DEVICES={','.join(seen)}); GPU indices count those from 0")
        devices = [seen[int(g)] if seen else str(g) for g in gpus]
        return [d for d in devices for _ in range(self.per_gpu)] if devices else [None] * self.per_gpu

    def _job(self, overrides: list[str], idx: int, sweep_dir: Path) -> dict[str, Any]:
        assert self.config is not None and self.hydra_context is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.num = idx
            cfg.hydra.job.id = f"local_gpus_{idx}"
        job_dir = (sweep_dir / str(cfg.hydra.sweep.subdir)).resolve()
        hydra_overrides = [o for o in OmegaConf.to_container(self.config.hydra.overrides.hydra)
                           if not str(o).lstrip("+~").startswith(_SWEEP_ONLY)]
        cmd = [*app_command(), *overrides, *hydra_overrides, f"hydra.run.dir={job_dir}", f"hydra.job.num={idx}"]
        return {"idx": idx, "overrides": list(overrides), "cfg": cfg, "dir": job_dir, "cmd": cmd}

    def launch(self, job_overrides: Any, initial_job_idx: int) -> list[JobReturn]:
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        from scfs.study import distinguishing

        pending = [self._job(list(o), initial_job_idx + i, sweep_dir) for i, o in enumerate(job_overrides)]
        for job, label in zip(pending, distinguishing([j["overrides"] for j in pending])):
            job["label"] = f"#{job['idx']}" + "".join(f" {o}" for o in label)
        slots = self._slots()
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // len(slots)))
        where = f"{len(slots) // self.per_gpu} GPU(s) x {self.per_gpu}" if slots[0] is not None else \
            f"{len(slots)} at a time on the CPU"
        print(f"[local_gpus] {len(pending)} jobs, {where}", flush=True)
        free, running, done = list(range(len(slots))), [], {}

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            while pending or running:
                while pending and free:
                    job, slot = pending.pop(0), free.pop(0)
                    job["dir"].mkdir(parents=True, exist_ok=True)
                    env = {**os.environ, "OMP_NUM_THREADS": threads}
                    if not os.environ.get("SCFS_TRACEBACK"):  # set by scfs.cli for this process only: the jobs'
                        env.pop("HYDRA_FULL_ERROR", None)     # errors stay one line unless a traceback was asked for
                    if slots[slot] is not None:
                        env["CUDA_VISIBLE_DEVICES"] = slots[slot]
                    log_file = open(job["dir"] / "stdout.log", "w")  # noqa: SIM115 - closed when the job ends
                    proc = subprocess.Popen(job["cmd"], env=env, stdout=log_file, stderr=subprocess.STDOUT)
                    running.append((job, slot, proc, log_file))
                    print(f"[local_gpus] {job['label']} start{'' if slots[slot] is None else ' on GPU ' + slots[slot]}",
                          flush=True)
                time.sleep(self.poll_s)
                for item in [r for r in running if r[2].poll() is not None]:
                    job, slot, proc, log_file = item
                    log_file.close()
                    running.remove(item)
                    free.append(slot)
                    done[job["idx"]] = self._result(job, proc.returncode)
        finally:
            signal.signal(signal.SIGTERM, previous)
            for _, _, proc, _ in running:
                proc.terminate()
            for _, _, proc, log_file in running:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                log_file.close()
        return [done[i] for i in sorted(done)]

    def _result(self, job: dict[str, Any], rc: int) -> JobReturn:
        ret = JobReturn(overrides=job["overrides"], cfg=job["cfg"], hydra_cfg=job["cfg"], working_dir=str(job["dir"]),
                        task_name=str(job["cfg"].hydra.job.name))
        line = log_line(job["dir"] / "stdout.log", failed=rc != 0)
        summary = job["dir"] / "summary.json"
        if rc == 0:
            ret.status = JobStatus.COMPLETED
            ret.return_value = json.loads(summary.read_text()) if summary.is_file() else None
        else:
            from scfs.errors import ReportedError

            ret.status = JobStatus.FAILED
            ret.return_value = ReportedError(f"exit status {rc}: {line} (log: {job['dir'] / 'stdout.log'})")
        print(f"[local_gpus] {job['label']} {'done' if rc == 0 else 'FAILED'}: {line}", flush=True)
        return ret

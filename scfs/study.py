"""What a study (a Hydra multirun of `scfs.train`) knows about the jobs it ran before: a job's config hash, which
earlier job folders hold a finished run of the same config, and which hold a run cut short that can be resumed.

The hash covers the job's whole composed config (the `hydra` node aside) except the keys that say how a run is
carried out, not what it computes (`resume`, `chunk_minutes`): the resumed job of a run cut short has the hash of
the run it continues. Job folders are found through the config Hydra saves in each (`<job>/.hydra/config.yaml`), so
folders written before this module existed are recognised too.

The study sweeper (`hydra_plugins.scfs_launchers.study_sweeper`) uses it to skip finished jobs and to resume cut
ones; `scfs.eval.compare` reads the same folders to tabulate a study.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# keys that change how a run is carried out but not its result: not part of a job's identity
RUN_ONLY_KEYS = ("resume", "chunk_minutes")
# overrides that do not make a different configuration of a study (the table groups jobs without them)
NOT_A_CONFIGURATION = ("seed", *RUN_ONLY_KEYS)


def config_hash(cfg: DictConfig | dict[str, Any]) -> str:
    """A short stable hash of a job's config (unresolved, `hydra` and `RUN_ONLY_KEYS` left out)."""
    doc = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else dict(cfg)
    doc = {k: v for k, v in doc.items() if k != "hydra" and k not in RUN_ONLY_KEYS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def job_overrides(job_dir: Path) -> list[str]:
    """The task overrides Hydra recorded for a job (`<job>/.hydra/overrides.yaml`), [] when there are none."""
    f = Path(job_dir) / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(f)] if f.is_file() else []


def configuration_key(overrides: list[str]) -> tuple[str, ...]:
    """The overrides that make a job's configuration: all but `seed`, `resume` and `chunk_minutes` (with or
    without Hydra's `+`/`++` prefix), sorted, so the jobs of different seeds of one configuration share a key."""
    def key(o: str) -> str:
        return o.lstrip("+~").split("=", 1)[0]

    return tuple(sorted(o for o in overrides if key(o) not in NOT_A_CONFIGURATION))


def is_finished(job_dir: Path) -> bool:
    """A job folder whose run ended with a summary (a run stopped by its `chunk_minutes` budget did not end)."""
    f = Path(job_dir) / "summary.json"
    if not f.is_file():
        return False
    try:
        return not json.loads(f.read_text()).get("stopped_by_chunk_budget", False)
    except (OSError, ValueError):
        return False


@dataclass
class PreviousJobs:
    """Earlier job folders under a runs root, by config hash: finished ones and resumable (cut short) ones."""

    finished: dict[str, Path]
    resumable: dict[str, Path]  # hash -> the newest last.ckpt of an unfinished job of that config

    @classmethod
    def scan(cls, root: str | os.PathLike) -> PreviousJobs:
        finished: dict[str, Path] = {}
        resumable: dict[str, tuple[float, Path]] = {}
        seen: set[Path] = set()
        root = Path(root)
        for cfg_file in sorted(root.glob("**/.hydra/config.yaml")) if root.is_dir() else []:
            job = cfg_file.parent.parent
            real = job.resolve()
            if real in seen:  # a reused job is linked into later sweep folders
                continue
            seen.add(real)
            try:
                h = config_hash(OmegaConf.load(cfg_file))
            except Exception:  # noqa: BLE001 - an unreadable config of an old job is not this sweep's problem
                continue
            if is_finished(job):
                finished.setdefault(h, job)
                continue
            ckpt = job / "checkpoints" / "last.ckpt"
            if ckpt.is_file():
                mtime = ckpt.stat().st_mtime
                if h not in resumable or mtime > resumable[h][0]:
                    resumable[h] = (mtime, ckpt)
        return cls(finished, {h: p for h, (_, p) in resumable.items()})


def resume_checkpoint_after_requeue(run_dir: Path) -> Path | None:
    """The newest resume point of this run folder when this process is a requeued SLURM job, else None.

    SLURM sets `SLURM_RESTART_COUNT` on a requeue (Lightning's SIGUSR1 handler and submitit both requeue with
    `scontrol requeue`, which keeps the job folder): the job continues from its `checkpoints/last.ckpt` or from the
    `hpc_ckpt_<n>.ckpt` Lightning saved when the signal came, whichever is newer, without anyone passing `resume=`.
    """
    if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) < 1:
        return None
    run_dir = Path(run_dir)
    candidates = [p for p in [run_dir / "checkpoints" / "last.ckpt", *run_dir.glob("hpc_ckpt_*.ckpt")] if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def distinguishing(jobs: list[list[str]]) -> list[list[str]]:
    """Each job's overrides without those every job has: what to print so a line tells the jobs apart."""
    if not jobs:
        return []
    common = set.intersection(*(set(j) for j in jobs))
    return [[o for o in j if o not in common] for j in jobs]

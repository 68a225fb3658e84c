"""`hydra/sweeper=study` (scfs's default): Hydra's basic sweeper (grid over the comma-separated overrides and
`hydra.sweeper.params`) with the checks and the bookkeeping a study needs.

* Every job's config is composed and value-checked before the first job starts (`scfs.config.validate_config`,
  secrets, and the accelerator when jobs run on this machine): a bad override fails once, in one line.
* `reuse=true`: a job whose config hash (`scfs.study.config_hash`) already has a finished run under `runs_root`
  is not run again; its folder is linked into the new sweep folder so the sweep folder holds the whole study. A job
  whose earlier run was cut short (a kill, a preemption, a `chunk_minutes` budget) is run with
  `resume=<its last.ckpt>` and continues where it stopped.
* All jobs go to the launcher at once (`local_gpus` runs them side by side, `submitit_*` as one array); the failed
  ones are named together in one line at the end, after the others have finished (exit status 1).
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional  # noqa: UP035 - Hydra's structured configs need these

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


@dataclass
class StudySweeperConf:
    _target_: str = "hydra_plugins.scfs_launchers.study_sweeper.StudySweeper"
    max_batch_size: Optional[int] = None  # noqa: UP045
    params: Optional[Dict[str, str]] = field(default_factory=dict)  # noqa: UP006, UP045
    reuse: bool = True                # skip finished jobs of the same config, resume cut ones
    runs_root: str = "runs/multirun"  # where earlier job folders are looked for


ConfigStore.instance().store(group="hydra/sweeper", name="study", node=StudySweeperConf, provider="scfs")


def _check_ranks_match_tasks(trainer: DictConfig, launcher: DictConfig) -> None:
    """Under submitit every task of a job is one DDP rank (Lightning's SLURMEnvironment reads them from SLURM): the
    run must ask for as many processes as the allocation starts, else Lightning fails on the cluster, after the
    queue wait."""
    from scfs.config import ConfigError

    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    per_node, alloc_nodes = int(launcher.get("tasks_per_node", 1) or 1), int(launcher.get("nodes", 1) or 1)
    if not isinstance(devices, int) or not isinstance(nodes, int):
        return  # "auto" or a device list: Lightning resolves it against SLURM itself
    if (devices, nodes) != (per_node, alloc_nodes):
        fix = f"trainer.devices={per_node} trainer.num_nodes={alloc_nodes}"
        if per_node * alloc_nodes > 1:
            fix += " trainer=ddp"
        raise ConfigError(f"trainer.devices={devices} trainer.num_nodes={nodes} is invalid with this launcher: each "
                          f"job runs {per_node} task(s) per node on {alloc_nodes} node(s), one DDP process per task; "
                          f"use {fix} (or change hydra.launcher.gpus_per_node / tasks_per_node / nodes)")


def _job_number(ret: Any) -> Any:
    """The number of a job from its JobReturn (its folder name with the default `hydra.sweep.subdir`)."""
    return "?" if ret.hydra_cfg is None else OmegaConf.select(ret.hydra_cfg, "hydra.job.num", default="?")


class StudySweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None, reuse: bool = True,
                 runs_root: str = "runs/multirun") -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.reuse, self.runs_root = reuse, runs_root

    def _job_config(self, overrides: list[str]) -> DictConfig:
        """The job's composed config (with its `hydra` node), value-checked like `scfs.train` checks a run."""
        from scfs.config import check_accelerator, validate_config
        from scfs.reliability import refuse_secrets

        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        validate_config(task)
        refuse_secrets(task)
        launcher = self.config.hydra.launcher
        if "submitit" in str(launcher.get("_target_", "")):
            _check_ranks_match_tasks(task.trainer, launcher)
        if "slurm" not in str(launcher.get("_target_", "")).lower():
            check_accelerator(task.trainer)  # a job for a cluster is checked on the cluster
        return cfg

    def _subdir(self, cfg: DictConfig, num: int) -> str:
        with open_dict(cfg):
            cfg.hydra.job.num = num
            cfg.hydra.job.id = num
        return str(cfg.hydra.sweep.subdir)

    @staticmethod
    def _print_summaries(results: list[Any]) -> None:
        from scfs.train import summary_line

        for r in results:
            value = r._return_value
            if r.status == JobStatus.COMPLETED and isinstance(value, dict) and "knn" in value:
                k = int(next(iter(value["knn"])).split("_k")[-1])
                print(f"[study] {value.get('run_dir')}: {summary_line(value, k)}", flush=True)

    def sweep(self, arguments: list[str]) -> Any:
        from scfs.errors import ReportedError
        from scfs.study import PreviousJobs, config_hash, distinguishing

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = self.split_arguments(parser.parse_overrides([*self._parse_config(), *arguments]), None)[0]
        configs = [self._job_config(j) for j in jobs]  # raises on the first bad job, before any job starts

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        previous = PreviousJobs.scan(self.runs_root) if self.reuse else PreviousJobs({}, {})
        to_run: list[list[str]] = []
        reused: list[tuple[DictConfig, Path]] = []
        for overrides, label, cfg in zip(jobs, distinguishing(jobs), configs):
            h = config_hash(cfg)
            if h in previous.finished:
                reused.append((cfg, previous.finished[h]))
                print(f"[study] done before: {' '.join(label) or 'the job'} -> {previous.finished[h]}", flush=True)
            elif h in previous.resumable:
                print(f"[study] resumes {' '.join(label) or 'the job'} from {previous.resumable[h]}", flush=True)
                to_run.append([*overrides, f"resume='{previous.resumable[h].resolve()}'"])
            else:
                to_run.append(list(overrides))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        for i, (cfg, job_dir) in enumerate(reused):  # numbered after the jobs that run
            link = sweep_dir / self._subdir(cfg, len(to_run) + i)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(job_dir.resolve(), target_is_directory=True)
        results = list(self.launcher.launch(to_run, initial_job_idx=0)) if to_run else []
        if "submitit" in str(self.config.hydra.launcher.get("_target_", "")):  # their output is in job logs
            self._print_summaries(results)
        failed = [r for r in results if r.status == JobStatus.FAILED]
        if failed:
            labels = dict(zip(map(tuple, to_run), distinguishing(to_run)))
            lines = "; ".join(f"job {_job_number(r)}"
                              + "".join(f" {o}" for o in labels.get(tuple(r.overrides or []), []))
                              + f": {r._return_value}" for r in failed)
            raise ReportedError(f"{len(failed)} of {len(jobs)} jobs failed ({lines}); all job folders are in "
                                f"{sweep_dir}; the same command again reruns only the jobs not finished")
        return [results]


"""Studies the Hydra way: `python -m scfs.train -m ...` with the study sweeper (every job checked first, finished
jobs reused, cut ones resumed), the `local_gpus` launcher (jobs as subprocesses pinned to GPUs), `submitit_local`,
the study configs, and a requeued SLURM job's resume point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CONF, TINY

REPO = Path(__file__).resolve().parent.parent
FAST = [*TINY, "eval.knn_at_start=false"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def _multirun(tmp_path: Path, sweep: str, *args: str, data_root: Path | None = None,
              timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m scfs.train -m <tiny jobs> args` with its sweep folder and earlier runs under tmp_path (the shapes
    data in `data_root`, the session's generated copy, when given)."""
    cmd = [sys.executable, "-m", "scfs.train", "-m", *FAST, f"data.root={data_root or tmp_path / 'shapes'}",
           f"hydra.sweep.dir={tmp_path / 'runs' / sweep}", f"hydra.sweeper.runs_root={tmp_path / 'runs'}", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)


def _summary_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if " done in " in ln and "kNN top-1" in ln]


def test_multirun_runs_each_job_in_its_own_folder(tmp_path, shapes_root):
    """Two tiny CPU jobs through Hydra's basic launcher: one run folder each with its summary and one-line summary."""
    res = _multirun(tmp_path, "first", "method=scfs,dino", data_root=shapes_root)
    assert res.returncode == 0, res.stderr[-2000:]
    first = tmp_path / "runs" / "first"
    summaries = [json.loads((first / str(i) / "summary.json").read_text()) for i in (0, 1)]
    assert [s["method"] for s in summaries] == ["scfs", "dino"] and all(s["steps"] == 2 for s in summaries)
    assert (first / "multirun.yaml").is_file() and (first / "0" / ".hydra" / "overrides.yaml").is_file()
    assert len(_summary_lines(res.stdout)) == 2


@pytest.mark.slow
def test_a_rerun_reuses_the_finished_jobs(tmp_path, shapes_root):
    """The same multirun again trains nothing and links the finished folders into the new sweep folder; a third
    run with reuse=false trains again."""
    assert _multirun(tmp_path, "first", "method=scfs,dino", data_root=shapes_root).returncode == 0
    first = tmp_path / "runs" / "first"
    again = _multirun(tmp_path, "second", "method=scfs,dino", data_root=shapes_root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _summary_lines(again.stdout) == [], "finished jobs must not train again"
    assert again.stdout.count("[study] done before") == 2
    second = tmp_path / "runs" / "second"
    linked = sorted(p.resolve() for p in second.iterdir() if p.is_dir())
    assert linked == [(first / "0").resolve(), (first / "1").resolve()]
    fresh = _multirun(tmp_path, "third", "method=dino", "hydra.sweeper.reuse=false", data_root=shapes_root)
    assert fresh.returncode == 0 and len(_summary_lines(fresh.stdout)) == 1


@pytest.mark.parametrize("bad, message", [
    ("search.weighting=soft,magic", "config key search.weighting='magic' is invalid"),
    ("method=dino,byol", "Could not find 'method/byol'"),
], ids=["bad-value", "unknown-option"])
def test_a_bad_override_in_a_sweep_fails_once_before_any_job(tmp_path, bad, message):
    res = _multirun(tmp_path, "bad", "seed=0,1", bad)
    assert res.returncode == 2
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("scfs.train: config error: ") and message in err[0], res.stderr
    assert not list((tmp_path / "runs").glob("bad/*/summary.json")) and _summary_lines(res.stdout) == []
    assert not list((tmp_path / "runs").glob("bad/*/.hydra")), "no job may start"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "local_gpus"])
def test_a_failed_job_is_named_in_one_line_and_the_others_still_run(tmp_path, shapes_root, launcher):
    """A job that fails at start (its resume file is missing) next to one that runs: the job's own one-line error,
    the other job's summary, then the sweep's one line naming the failed job; exit status 1, no traceback."""
    missing = tmp_path / "missing.ckpt"
    res = _multirun(tmp_path, "failing", f"resume={missing},null", "method=dino", f"hydra/launcher={launcher}",
                    data_root=shapes_root)
    assert res.returncode == 1
    assert f"scfs.train: error: resume={missing} does not exist" in res.stdout + res.stderr
    assert len(_summary_lines(res.stdout)) == 1, "the job after the failed one still runs"
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert err[-1].startswith(f"scfs.train: error: 1 of 2 jobs failed (job 0 resume={missing}: ")
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "failing").glob("*/stdout.log"))
    assert "Traceback" not in res.stderr + logs


def test_a_slurm_job_whose_ranks_do_not_match_its_tasks_is_refused_before_submission(tmp_path):
    """hydra/launcher=slurm starts 4 tasks per job (one per GPU): a run asking for one device is refused in one line
    that says which overrides match, before anything is submitted."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    res = _multirun(tmp_path, "slurm", "seed=0,1", "hydra/launcher=slurm")
    assert res.returncode == 2
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "trainer.devices=1 trainer.num_nodes=1 is invalid with this launcher" in err[0], err
    assert "use trainer.devices=4 trainer.num_nodes=1 trainer=ddp" in err[0]
    assert not (tmp_path / "runs" / "slurm" / ".submitit").exists()


# ---- the local_gpus launcher, on a stand-in app (no training: each job records what it was given) ----------------
APP = '''
import json, os, time
from pathlib import Path
import hydra
from hydra.core.hydra_config import HydraConfig

class AcceleratorError(RuntimeError):
    pass

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    out = Path(HydraConfig.get().runtime.output_dir)
    t0 = time.time()
    (out / "started").write_text(str(os.getpid()))
    time.sleep(float(cfg.sleep))
    if str(cfg.x) == "fail":
        raise SystemExit("stand-in: this job fails")
    if str(cfg.x) == "oom":  # as torch says a CUDA runtime call could not allocate: advice after the error
        print("Epoch 0:   0%|          | 0/4 [00:05<?, ?it/s]", flush=True)
        raise AcceleratorError("CUDA error: out of memory\\nCompile with `TORCH_USE_CUDA_DSA` to enable "
                               "device-side assertions.")
    record = {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": t0, "end": time.time(), "x": cfg.x,
              "threads": os.environ["OMP_NUM_THREADS"]}
    (out / "job.json").write_text(json.dumps(record))

main()
'''


def _app(tmp_path: Path, *args: str, wait: bool = True):
    (tmp_path / "app.py").write_text(APP)
    cmd = [sys.executable, str(tmp_path / "app.py"), "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           "hydra/launcher=local_gpus", *args]
    env = {k: v for k, v in _env().items() if k not in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    if not wait:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_local_gpus_runs_jobs_side_by_side_each_pinned_to_its_gpu(tmp_path):
    """4 jobs, 2 GPUs x per_gpu=2: all four at once, two per GPU index, each in its own process and folder."""
    res = _app(tmp_path, "+x=1,2,3,4", "+sleep=3", "hydra.launcher.gpus=[0,1]", "hydra.launcher.per_gpu=2")
    assert res.returncode == 0, res.stdout + res.stderr
    jobs = [json.loads((tmp_path / "sweep" / str(i) / "job.json").read_text()) for i in range(4)]
    assert [j["x"] for j in jobs] == [1, 2, 3, 4]
    assert sorted(j["cuda"] for j in jobs) == ["0", "0", "1", "1"]
    assert max(j["start"] for j in jobs) < min(j["end"] for j in jobs), "the four jobs must overlap in time"
    assert len({(tmp_path / "sweep" / str(i) / "started").read_text() for i in range(4)}) == 4
    assert res.stdout.count("done") >= 4 and "2 GPU(s) x 2" in res.stdout


def test_local_gpus_without_gpus_runs_per_gpu_jobs_at_a_time_and_names_failures(tmp_path):
    """No CUDA: per_gpu is jobs at a time on the machine, nothing pinned, the cores shared; a failed job is named
    in one line after the others finished."""
    res = _app(tmp_path, "+x=1,fail,3", "+sleep=1", "hydra.launcher.gpus=[]", "hydra.launcher.per_gpu=2")
    assert res.returncode == 1
    done = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/job.json"))]
    assert [j["x"] for j in done] == [1, 3] and all(j["cuda"] is None for j in done)
    assert all(j["threads"] == str(max(1, (os.cpu_count() or 1) // 2)) for j in done)
    assert "[local_gpus] #1 +x=fail FAILED: stand-in: this job fails" in res.stdout


def test_a_failed_jobs_line_is_its_error_not_what_it_printed_after(tmp_path):
    """A job whose error is followed by more output (CUDA's advice, Hydra's hint) is named by its error line."""
    res = _app(tmp_path, "+x=oom", "+sleep=0", "hydra.launcher.gpus=[]", "hydra.launcher.per_gpu=1")
    assert res.returncode == 1
    assert "[local_gpus] #0 FAILED: AcceleratorError: CUDA error: out of memory" in res.stdout, \
        res.stdout


def test_a_terminated_local_gpus_multirun_stops_its_jobs(tmp_path):
    """SIGTERM (a `timeout`, a scheduler) must not leave jobs behind on the GPUs."""
    proc = _app(tmp_path, "+x=1,2", "+sleep=600", "hydra.launcher.gpus=[]", "hydra.launcher.per_gpu=2", wait=False)
    started = [tmp_path / "sweep" / str(i) / "started" for i in (0, 1)]
    deadline = time.time() + 60
    while not all(f.is_file() and f.read_text() for f in started) and time.time() < deadline:
        time.sleep(0.2)
    pids = [int(f.read_text()) for f in started]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_a_missing_plugin_names_its_install_step():
    from hydra.errors import MissingConfigException

    from scfs.cli import _missing_plugin

    slurm = MissingConfigException("In 'hydra/launcher/slurm': Could not find 'hydra/launcher/submitit_slurm'")
    assert 'pip install "scfs[slurm]"' in _missing_plugin(slurm)
    assert "pip install -e ." in _missing_plugin(MissingConfigException("Could not find 'hydra/sweeper/study'"))
    assert _missing_plugin(MissingConfigException("Could not find 'method/byol'")) == ""


def test_launcher_slots(monkeypatch):
    from hydra_plugins.scfs_launchers.local_gpus import LocalGpusLauncher

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert LocalGpusLauncher(per_gpu=3, gpus=[0, 2])._slots() == ["0", "0", "0", "2", "2", "2"]
    assert LocalGpusLauncher(per_gpu=2, gpus=[])._slots() == [None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # this process sees two GPUs: its 0 and 1 are devices 4 and 6
    assert LocalGpusLauncher(per_gpu=1, gpus=[1, 0])._slots() == ["6", "4"]
    with pytest.raises(ValueError, match=r"hydra.launcher.gpus=\[2\] is invalid: this process sees 2 GPU"):
        LocalGpusLauncher(gpus=[2])._slots()
    with pytest.raises(ValueError, match=r"hydra.launcher.per_gpu=0 is invalid"):
        LocalGpusLauncher(per_gpu=0)


# ---- skip-if-done and resume ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_rerun_resumes_the_job_cut_short_through_local_gpus(tmp_path, shapes_root):
    """A job stopped by its chunk budget (summary with stopped_by_chunk_budget, last.ckpt at step 20) is continued
    by the same multirun without the budget: resume= its last.ckpt, ending at the full 30 steps."""
    common = ["trainer.max_epochs=15", "method=dino"]
    cut = _multirun(tmp_path, "cut", *common, "chunk_minutes=0.0001", data_root=shapes_root)
    assert cut.returncode == 0, cut.stderr[-2000:]
    first = json.loads((tmp_path / "runs" / "cut" / "0" / "summary.json").read_text())
    assert first["stopped_by_chunk_budget"] and first["steps"] == 20
    again = _multirun(tmp_path, "again", *common, "hydra/launcher=local_gpus", data_root=shapes_root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[study] resumes" in again.stdout
    job = tmp_path / "runs" / "again" / "0"
    assert json.loads((job / "summary.json").read_text())["steps"] == 30
    assert "resuming from" in (job / "stdout.log").read_text()


def _job_folder(root: Path, name: str, cfg: dict, summary: dict | None = None, ckpt: bool = False) -> Path:
    from omegaconf import OmegaConf

    job = root / name
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(cfg), job / ".hydra" / "config.yaml")
    if summary is not None:
        (job / "summary.json").write_text(json.dumps(summary))
    if ckpt:
        (job / "checkpoints").mkdir()
        (job / "checkpoints" / "last.ckpt").write_bytes(b"x")
    return job


def test_previous_jobs_are_found_by_config_hash(tmp_path):
    """Finished jobs count as done; chunk-stopped and killed ones (last.ckpt, no final summary) as resumable;
    `resume` and `chunk_minutes` are not part of a job's identity."""
    from scfs.study import PreviousJobs, config_hash

    a, b, c = {"seed": 0, "lr": 0.1}, {"seed": 1, "lr": 0.1}, {"seed": 2, "lr": 0.1}
    done = _job_folder(tmp_path, "d/0", {**a, "resume": None}, {"knn": {}})
    _job_folder(tmp_path, "d/1", {**b, "chunk_minutes": 5}, {"stopped_by_chunk_budget": True}, ckpt=True)
    killed = _job_folder(tmp_path, "d/2", c, None, ckpt=True)
    _job_folder(tmp_path, "d/3", {"seed": 3, "lr": 0.1}, None)  # failed before its first checkpoint
    found = PreviousJobs.scan(tmp_path)
    assert found.finished == {config_hash(a): done}
    assert set(found.resumable) == {config_hash(b), config_hash({**c, "resume": "x.ckpt"})}
    assert found.resumable[config_hash(c)] == killed / "checkpoints" / "last.ckpt"
    assert config_hash(a) != config_hash(b) and config_hash({**a, "chunk_minutes": 3}) == config_hash(a)


def test_a_requeued_slurm_job_resumes_from_its_newest_checkpoint(tmp_path, monkeypatch):
    from scfs.study import resume_checkpoint_after_requeue

    (tmp_path / "checkpoints").mkdir()
    last, hpc = tmp_path / "checkpoints" / "last.ckpt", tmp_path / "hpc_ckpt_1.ckpt"
    last.write_bytes(b"x")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert resume_checkpoint_after_requeue(tmp_path) is None, "a first start is a fresh run"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert resume_checkpoint_after_requeue(tmp_path) == last
    hpc.write_bytes(b"x")
    os.utime(last, (time.time() - 60, time.time() - 60))
    assert resume_checkpoint_after_requeue(tmp_path) == hpc
    assert resume_checkpoint_after_requeue(tmp_path / "elsewhere") is None


def test_submitit_local_runs_the_jobs(tmp_path, shapes_root):
    """`hydra/launcher=submitit_local`: the path of `hydra/launcher=slurm` without a cluster (submitit starts each job
    in its own process); the sweeper prints each job's summary line. In the default run (about 15 s) because it is
    the only check of the SLURM launcher's path that a CPU-only CI can make."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    res = _multirun(tmp_path, "sub", "method=scfs,dino", "hydra/launcher=submitit_local", "hydra.sweeper.reuse=false",
                    data_root=shapes_root)
    assert res.returncode == 0, res.stderr[-2000:]
    for i, method in enumerate(["scfs", "dino"]):
        assert json.loads((tmp_path / "runs" / "sub" / str(i) / "summary.json").read_text())["method"] == method
    assert len(_summary_lines(res.stdout)) == 2


@pytest.mark.slow
def test_the_readme_study_command_on_the_cpu_and_its_table(tmp_path, shapes_root):
    """The README's local-GPU study line as written (on the CPU: per_gpu jobs at a time), cut to seed 0 and tiny
    runs, then the README's table command on its folder."""
    from scfs.eval.compare import main as compare_main

    line = next(ln for ln in (REPO / "README.md").read_text().splitlines()
                if ln.startswith("python -m scfs.train -m +study=shapes_default_seeds hydra/launcher=local_gpus"))
    readme_args = line.split("#")[0].split()[4:]  # after `python -m scfs.train -m`
    res = _multirun(tmp_path, "readme", *readme_args, "seed=0", data_root=shapes_root)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "2 at a time on the CPU" in res.stdout and len(_summary_lines(res.stdout)) == 2
    table = compare_main([str(tmp_path / "runs" / "readme"), "--no-figure"])
    rows = [r for r in table.splitlines() if r.startswith("| method=")]
    assert [r.split(" | ")[0] for r in rows] == ["| method=scfs", "| method=dino"]
    assert all(" | 0 | " in r and "(one seed)" in r for r in rows)


# ---- the study configs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("study, params, data, epochs", [
    ("cifar10_seeds", {"method": "scfs,dino", "seed": "0,1,2"}, "cifar10", 100),
    ("cifar10_ablation", {"search": "none,roi,hard", "seed": "0"}, "cifar10", 100),
    ("cifar10_long", {"method": "scfs,dino", "seed": "0"}, "cifar10", 200),
    ("cifar10_vit", {"method": "scfs,dino", "seed": "0"}, "cifar10", 30),
    ("shapes_default_seeds", {"method": "scfs,dino", "seed": "0,1,2"}, "shapes", None),
    ("shapes_long", {"method": "scfs,dino", "seed": "0,1,2"}, "shapes", 40),
])
def test_study_configs(study, params, data, epochs):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=[f"+study={study}"], return_hydra_config=True)
        default = compose("config")
    assert dict(cfg.hydra.sweeper.params) == params
    assert cfg.data.name == data and cfg.method.name == "scfs"
    assert cfg.trainer.max_epochs == (epochs or default.trainer.max_epochs)
    assert cfg.hydra.sweeper._target_.endswith("StudySweeper")


def test_the_vit_and_shapes_long_studies_keep_their_experiments():
    """`+study=cifar10_vit` trains the experiment's ViT, not the CIFAR ResNet; `+study=shapes_long` lifts the
    experiment's one-call time guard (a study's jobs stop and resume by the chunk budget instead)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        vit = compose("config", overrides=["+study=cifar10_vit"])
        shapes = compose("config", overrides=["+study=shapes_long"])
        experiment = compose("config", overrides=["+experiment=shapes_long"])
    assert "vit" in vit.backbone.name and list(vit.search.stages) == ["block4", "block8", "block12"]
    assert experiment.trainer.max_time is not None and shapes.trainer.get("max_time") is None
    assert shapes.data.image_size == 64


def test_slurm_launcher_config():
    from hydra import compose, initialize_config_dir

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 8 and launcher.timeout_min > 0
    assert launcher.additional_parameters.signal == f"USR1@{launcher.signal_delay_s}"


def test_the_readme_slurm_command_composes_a_valid_ddp_run():
    """The README's SLURM line: the seeds study, one DDP process per GPU of the allocation."""
    from hydra import compose, initialize_config_dir

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    line = next(ln for ln in (REPO / "README.md").read_text().splitlines()
                if ln.startswith("python -m scfs.train -m") and "hydra/launcher=slurm" in ln)
    overrides = line.split("#")[0].split()[4:]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert cfg.trainer.strategy == "ddp" and cfg.trainer.devices == cfg.hydra.launcher.tasks_per_node
    assert cfg.hydra.sweeper.params.seed == "0,1,2" and cfg.data.name == "cifar10"

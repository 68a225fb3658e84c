"""`compile_parallel`'s helpers started before the run's set-up, waiting for its go at fit."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import compose_cfg
from omegaconf import OmegaConf

import scfs.bench.records as records
import scfs.training.background_compile as bgc
import scfs.training.compile_helpers as ch
import scfs.training.plain_step as plain_step
from scfs.train import run
from scfs.training import compile_child


class FakeProc:
    """A started helper, as `launch` returns it, that never ends by itself."""

    def __init__(self) -> None:
        self.pid, self.stopped = 4242, False

    def poll(self) -> int | None:
        return 0 if self.stopped else None

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        self.stopped = True

    kill = terminate


AGE_AT_IMPORT = ch.process_age_s()  # the test process's age at this module's import, before any run in it
GPU = ["compile=true", "compile_parallel=auto", "compile_parallel_backward=auto", "trainer=gpu"]


@pytest.mark.parametrize("overrides, env, roles", [
    (GPU, {}, ["backward", "parts"]),
    ([*GPU, "compile_parallel_backward=false"], {}, ["parts"]),
    ([*GPU, "compile_parallel=true", "compile_parallel_backward=false"], {}, ["parts"]),
    ([*GPU, "trainer=cpu"], {}, None),
    ([*GPU, "compile_parallel=false"], {}, None),
    ([*GPU, "compile=false"], {}, None),
    ([*GPU, "compile_scope=blocks"], {}, None),
    ([*GPU, "+trainer.num_nodes=2"], {}, None),
    (GPU, {"LOCAL_RANK": "1"}, None),
    (GPU, {"SLURM_LOCALID": "2"}, None),
    (GPU, {"SLURM_LOCALID": "0"}, ["backward", "parts"]),
    ([*GPU, "compile_student_graphs=per_view_size"], {}, ["backward", "local_backward", "local", "parts"]),
    ([*GPU, "compile_student_graphs=per_view_size", "compile_parallel_backward=false"], {}, ["local", "parts"]),
], ids=["gpu-auto", "no-backward", "true", "cpu-trainer", "false", "eager", "blocks", "multi-node", "second-rank",
        "second-slurm-task", "first-slurm-task", "per-view-size", "per-view-size-no-backward"])
def test_a_gpu_run_starts_its_helpers_before_its_set_up_only_where_it_would_start_them(
        tmp_path, monkeypatch, overrides, env, roles):
    launched: list[tuple[str, list[str], dict]] = []

    def fake_launch(cfg, batch_size, status_path, command):
        launched.append((status_path.name, command, OmegaConf.to_container(ch.child_config(cfg, batch_size))))
        return FakeProc()

    monkeypatch.setattr(ch, "launch", fake_launch)
    monkeypatch.setattr(ch, "cpu_cores", lambda: 16)
    for key in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    early = ch.start_early_helpers(compose_cfg([*overrides, "batch_size=8"]), tmp_path)
    if roles is None:
        assert early is None and not launched
        return
    assert list(early.paths) == roles and early.device == "cuda:0"  # the backward's first: the longest compile
    assert [name for name, _, _ in launched] == [early.paths[r].name for r in roles]
    for (_, command, child), role in zip(launched, roles):
        flags = {f for f in command if f in ("--helper", "--backward", "--local")}
        assert "--wait-go" in command and flags == set(ch.ROLES[role].flags), (role, command)
        assert "--settings" not in command  # the run's settings come with the go
        assert child["batch_size"] == 8 and child["compile_parallel"] is False
    assert early.fits("cuda:0", {r: early.paths[r] for r in roles}) and not early.fits("cuda:1", early.paths)
    early.stop()
    assert all(p.stopped for p in early.procs.values())


def test_the_helpers_take_the_runs_compile_cache_folder_from_the_start(tmp_path, monkeypatch):
    """The helpers inherit this process's environment at their start, before the set-up chooses the cache folder:
    the early start chooses it (`compile_cache`) first."""
    monkeypatch.setattr(ch, "launch", lambda *a: FakeProc())
    monkeypatch.setattr(ch, "cpu_cores", lambda: 16)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    ch.start_early_helpers(compose_cfg([*GPU, f"compile_cache={tmp_path / 'cache'}"]), tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")


def test_a_helper_waits_for_the_go_and_never_outlives_the_run(tmp_path, monkeypatch):
    status = tmp_path / "s.json"
    ch.write_status(ch.go_path(status), {"config": "c.yaml", "settings": {"deterministic": False}})
    assert compile_child.wait_for_go(status)["settings"] == {"deterministic": False}
    ch.go_path(status).unlink()
    assert compile_child.wait_for_go(status, timeout_s=0.1) is None  # no go: it gives up
    parents = iter([1000, 1000, 1])  # the run died: this process was handed to init
    monkeypatch.setattr(bgc.os, "getppid", lambda: next(parents, 1))
    t0 = time.monotonic()
    assert compile_child.wait_for_go(status, timeout_s=60) is None
    assert time.monotonic() - t0 < 5  # at the parent's end, not the timeout


@pytest.mark.parametrize("changed", [False, True], ids=["same-config", "config-changed"])
def test_an_early_helper_compiles_under_the_gos_settings_and_final_config(tmp_path, monkeypatch, eager_backend,
                                                                          changed):
    """In-process (dynamo's eager backend for inductor): the helper builds from the config it was started with,
    waits for the go, takes the run's settings, rebuilds only when the run's final config differs, then compiles
    its parts as a helper started at fit does."""
    torch._dynamo.reset()
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    OmegaConf.save(cfg, tmp_path / "c.yaml")
    final = cfg.copy()
    if changed:
        final.method.out_dim = int(cfg.method.out_dim) * 2
    OmegaConf.save(final, tmp_path / "final.yaml")
    ch.write_status(ch.go_path(tmp_path / "s.json"), {"config": str(tmp_path / "final.yaml"),
                                                      "settings": {"deterministic": False}})
    monkeypatch.setenv(ch.SPAWNED_AT_ENV, "0")
    status = compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "s.json", "cpu", steps=1, helper=True,
                                  wait_go=True)
    assert status["ok"], status
    assert status["early"]["rebuilt"] is changed and status["early"]["ready_s"] <= status["early"]["go_s"]
    # it said it was ready before it waited (the run's go names the helpers still starting)
    assert ch.read_status(ch.ready_path(tmp_path / "s.json")) == {"ready_s": status["early"]["ready_s"]}
    assert all(ch.part_path(tmp_path / "s.json", p).exists() for p in ch.PARTS)
    # where the start-up went, in order, seconds from the spawn (the clock's zero here)
    e = status["early"]
    assert 0 <= e["imported_s"] <= e["built_s"] <= e["on_device_s"] <= e["views_s"] <= e["ready_s"], e
    assert records.startup_phrase(e) == (f": imports done at {e['imported_s']} s, model built at {e['built_s']} s, "
                                    f"on the device at {e['on_device_s']} s, views made at {e['views_s']} s")
    assert not plain_step._AHEAD  # the views made before the go were the ones its step took
    # a status from before the helper said where its start-up went
    assert records.startup_phrase({"ready_s": 3.0}) == ""
    marks = {"entry_s": 0.4, "torch_s": 3.0, "lightning_s": 4.1, "imported_s": 6.1, "cuda_s": 7.5, "built_s": 9.0,
             "on_device_s": 14.2, "views_s": 15.1}  # a GPU helper's, each in the order the helper reaches it
    assert records.startup_phrase(marks) == (": the interpreter started at 0.4 s, torch imported at 3.0 s, Lightning "
                                        "imported at 4.1 s, imports done at 6.1 s, CUDA started at 7.5 s, model built "
                                        "at 9.0 s, on the device at 14.2 s, views made at 15.1 s")
    # where its compile went, by its own compile timers (dynamo traced the teacher's call and the losses here)
    assert status["phases"]["_compile.compile_inner"] > 0 and all(v >= 0.001 for v in status["phases"].values())


def test_views_made_ahead_are_handed_out_once_and_only_for_their_sizes():
    """A helper makes its random views while it waits for the go (`make_views_ahead`): the next `random_views` call
    of the same sizes, device and memory format gets exactly those tensors, which equal freshly made ones; a second
    call makes its own; views made ahead for other sizes are never handed out, and are dropped."""
    cfg = compose_cfg(["batch_size=4"])
    fresh_g, fresh_loc = plain_step.random_views(cfg, "cpu", True)
    plain_step.make_views_ahead(cfg, "cpu", True)
    ahead = plain_step._AHEAD[plain_step.views_key(cfg, "cpu", True)]
    g, loc = plain_step.random_views(cfg, "cpu", True)
    assert g is ahead[0] and loc is ahead[1] and not plain_step._AHEAD
    assert torch.equal(g, fresh_g) and torch.equal(loc, fresh_loc) and g.stride() == fresh_g.stride()
    again = plain_step.random_views(cfg, "cpu", True)
    assert again[0] is not g and torch.equal(again[0], g)
    plain_step.make_views_ahead(cfg, "cpu", True)
    other = compose_cfg(["batch_size=2"])
    g2, _ = plain_step.random_views(other, "cpu", True)
    assert g2.shape[0] == 4 and not plain_step._AHEAD  # two global views of 2 images; the stale pair dropped
    plain_step.make_views_ahead(cfg, "cpu", True)
    g3, _ = plain_step.random_views(cfg, "cpu", False)  # another memory format: made afresh
    assert g3.is_contiguous() and not plain_step._AHEAD


def test_an_early_helper_without_a_go_reports_it_and_compiles_nothing(tmp_path, monkeypatch, eager_backend):
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    OmegaConf.save(cfg, tmp_path / "c.yaml")
    monkeypatch.setattr(compile_child, "wait_for_go", lambda status_path: None)
    status = compile_child.compile_in_child(tmp_path / "c.yaml", tmp_path / "s.json", "cpu", steps=1, helper=True,
                                  wait_go=True)
    assert not status["ok"] and "the run ended before it gave the go" in status["error"]
    assert not any(ch.started_path(tmp_path / "s.json", p).exists() for p in ch.PARTS)


def test_a_helper_whose_run_died_during_its_start_up_ends_and_says_where_its_start_up_went(tmp_path):
    """The real command line (`helper_command`, entered through `scfs.training.helper_entry`), started early by a
    run that is gone before the helper is ready to wait for its go (killed during its set-up): the helper, adopted
    by another process, must not wait for a go that cannot come. It ends without compiling, and its status says
    where its start-up went, in order: the interpreter at the entry, torch and Lightning imported, the rest of its
    imports, the model built."""
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    status = tmp_path / "s.json"
    OmegaConf.save(cfg, status.with_suffix(".yaml"))
    command = ch.helper_command(status.with_suffix(".yaml"), status, "cpu", steps=1, helper=True, wait_go=True)
    run = ("import subprocess, sys\n"
           "from scfs.training.compile_helpers import child_env\n"
           "subprocess.Popen(sys.argv[1:], env=child_env())\n")  # the run: starts its helper, then is gone
    subprocess.run([sys.executable, "-c", run, *command], env=ch.child_env(), check=True, timeout=120)
    deadline = time.monotonic() + 300
    while ch.read_status(status) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    st = ch.read_status(status)
    assert st is not None, "the helper of a run that is gone waited on"
    assert not st["ok"] and "the run ended before it gave the go" in st["error"], st
    assert not any(ch.started_path(status, p).exists() for p in ch.PARTS)
    e = st["early"]
    assert 0 <= e["entry_s"] <= e["torch_s"] <= e["lightning_s"] <= e["imported_s"] <= e["built_s"], e
    assert records.startup_phrase(e).startswith(f": the interpreter started at {e['entry_s']} s, torch imported at "
                                           f"{e['torch_s']} s, Lightning imported at {e['lightning_s']} s, "
                                           f"imports done at {e['imported_s']} s")


# a stand-in helper: begins both parts at its start (so the run's first step waits for them, whatever its own
# pace); started early (argv[2] == "1"), says it is ready and writes them only after the run's go; says what the go
# gave it
STAND_IN = ("import sys, time; from pathlib import Path\n"
            "from scfs.training.compile_helpers import PARTS, go_path, part_path, read_status, ready_path, "
            "started_path, write_status\n"
            "p = Path(sys.argv[1])\n"
            "for part in PARTS:\n"
            "    write_status(started_path(p, part), {'ok': True})\n"
            "if sys.argv[2] == '1':\n"
            "    write_status(ready_path(p), {'ready_s': 0.0})\n"
            "while sys.argv[2] == '1' and read_status(go_path(p)) is None:\n"
            "    time.sleep(0.02)\n"
            "for part in PARTS:\n"
            "    time.sleep(0.2); write_status(part_path(p, part), {'ok': True})\n"
            "write_status(p, {'ok': True, 'go': read_status(go_path(p))})\n")


def recording(made: list) -> type:
    """`ParallelCompile` that appends each instance to `made`."""

    class Made(bgc.ParallelCompile):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    return Made


def _early_run(monkeypatch, tmp_path, shapes_root, device: str) -> tuple[list, list[bgc.ParallelCompile]]:
    """A CPU run of `compile_parallel=true` whose helpers `scfs.train` starts before its set-up (as on a GPU run),
    on `device`, each a stand-in (`STAND_IN`)."""
    launched: list[Path] = []
    made: list[bgc.ParallelCompile] = []
    real_launch = ch.launch

    def launch(cfg, batch_size, status_path, command):
        launched.append(status_path)
        return real_launch(cfg, batch_size, status_path, command)

    monkeypatch.setattr(ch, "launch", launch)
    monkeypatch.setattr(compile_child, "launch", launch)  # the callback's own start at fit
    monkeypatch.setattr(ch, "gpu_run", lambda cfg: True)
    monkeypatch.setattr(ch, "early_device", lambda: device)
    monkeypatch.setattr(ch, "helper_command", lambda cfg_path, status_path, device, steps=2, helper=False,
                        backward=False, wait_go=False, local=False: [sys.executable, "-c", STAND_IN, str(status_path),
                                                        "1" if wait_go else "0"])
    monkeypatch.setattr(compile_child, "helper_command", ch.helper_command)
    monkeypatch.setattr(bgc, "ParallelCompile", recording(made))
    cfg = compose_cfg(["compile=true", "compile_parallel=true", "trainer.limit_train_batches=2",
                       "eval.knn_at_start=false"], data_root=shapes_root)
    run(cfg, tmp_path)
    return launched, made


def test_the_run_gives_its_early_helpers_the_go_at_fit_and_builds_their_parts_from_them(
        tmp_path, shapes_root, monkeypatch, eager_backend):
    launched, (cb,) = _early_run(monkeypatch, tmp_path, shapes_root, "cpu")
    assert launched == [tmp_path / ch.STATUS_FILE]  # started once, before the set-up; not again at fit
    assert cb.report["early_s"] >= 0 and cb.report["waited_s"].keys() == {"teacher", "loss"}
    assert cb.report["built_here"] == []  # both parts came from the helper
    go = json.loads((tmp_path / ch.STATUS_FILE).read_text())["go"]
    assert go["settings"] == compile_child.key_settings()
    assert OmegaConf.load(go["config"]) == ch.child_config(cb.cfg, cb.batch_size)  # the run's final config
    assert cb.report["ready_at_go"] in ([], ["parts"])  # the stand-in says it is ready, maybe after the go
    assert AGE_AT_IMPORT <= cb.report["early_started_after_s"] <= ch.process_age_s()  # this process's age then
    entry = json.loads((tmp_path / "summary.json").read_text())["compile_parallel"]
    assert entry["early_s"] == cb.report["early_s"]


def test_the_go_names_the_early_helpers_still_starting_and_a_new_start_clears_an_old_ready_file(tmp_path):
    paths = ch.early_paths(tmp_path, backward=True, split=True)
    early = ch.EarlyHelpers("cpu", paths, {role: FakeProc() for role in paths})
    assert early.ready_roles() == ()
    for role in ("parts", "local"):
        ch.write_status(ch.ready_path(paths[role]), {"ready_s": 3.0})
    assert early.ready_roles() == ("local", "parts")  # in the start order
    cfg = ch.child_config(compose_cfg(["compile=true", "compile_parallel=true"]), batch_size=8)
    ch.launch(cfg, 8, paths["parts"], [sys.executable, "-c", "pass"]).wait(timeout=60)
    assert early.ready_roles() == ("local",)  # a helper started anew is not ready until it says so


def test_early_helpers_on_another_device_are_stopped_and_the_run_starts_its_own(
        tmp_path, shapes_root, monkeypatch, eager_backend, caplog):
    caplog.set_level(logging.INFO, logger="scfs.train")
    launched, (cb,) = _early_run(monkeypatch, tmp_path, shapes_root, "cuda:1")
    assert launched == [tmp_path / ch.STATUS_FILE] * 2  # the early one, then the run's own at fit
    assert "early_s" not in cb.report
    assert "the helpers started before the set-up were not this run's (device cuda:1" in caplog.text


def test_a_run_that_fails_before_fit_stops_its_early_helpers(tmp_path, shapes_root, monkeypatch):
    procs: list[FakeProc] = []

    def launch(cfg, batch_size, status_path, command):
        procs.append(FakeProc())
        return procs[-1]

    def broken(cfg, resume):
        raise RuntimeError("the data set-up failed")

    import scfs.train as train

    monkeypatch.setattr(ch, "launch", launch)
    monkeypatch.setattr(ch, "gpu_run", lambda cfg: True)
    monkeypatch.setattr(train, "build_for_training", broken)
    cfg = compose_cfg(["compile=true", "compile_parallel=true"], data_root=shapes_root)
    with pytest.raises(RuntimeError, match="the data set-up failed"):
        run(cfg, tmp_path)
    assert procs and all(p.stopped for p in procs)


def test_helpers_that_cannot_start_early_cost_the_run_only_its_head_start(tmp_path, shapes_root, monkeypatch, caplog,
                                                                          eager_backend):
    def fail(cfg, run_dir, batch_size=None):
        raise OSError("no space left on device")

    made: list[bgc.ParallelCompile] = []
    monkeypatch.setattr(ch, "start_early_helpers", fail)
    monkeypatch.setattr(bgc, "ParallelCompile", recording(made))
    monkeypatch.setattr(compile_child, "helper_command", lambda *a, **kw: [sys.executable, "-c", "pass"])
    caplog.set_level(logging.INFO, logger="scfs.train")
    cfg = compose_cfg(["compile=true", "compile_parallel=true", "trainer.limit_train_batches=2",
                       "eval.knn_at_start=false"], data_root=shapes_root)
    run(cfg, tmp_path)
    assert ("compile_parallel: the helpers could not start before the set-up (OSError: no space left on device); "
            "they start at fit") in caplog.text
    assert made[0].early is None and made[0].proc is not None  # started at fit instead


@pytest.mark.parametrize("overrides, device, builds", [
    ([], "cuda:0", True),
    (["method=dino"], "cuda:0", False),
    (["search.backend=reference"], "cuda:0", False),
    ([], "cpu", False),
], ids=["scfs-gpu", "dino", "reference-search", "cpu"])
def test_an_early_helper_builds_the_search_kernels_while_the_run_sets_up(monkeypatch, overrides, device, builds):
    """On a fresh machine the fused search kernels' extension is compiled at the first step's choice of backend,
    in the run and the helper alike: the early helper builds it before the go instead, where the run would."""
    from scfs.search import cuda_backend
    from scfs.train import build

    calls: list[int] = []
    monkeypatch.setattr(cuda_backend, "extension", lambda: calls.append(1))
    _, model = build(compose_cfg(overrides))
    assert (compile_child.prebuild_search_kernels(model, device) is not None) is builds
    assert len(calls) == int(builds)

    def boom():
        raise RuntimeError("building the CUDA extension failed: nvcc not found")

    monkeypatch.setattr(cuda_backend, "extension", boom)  # left to the run, which reports it as always
    assert compile_child.prebuild_search_kernels(model, device) is None


# a fresh interpreter runs `scfs.train.run` on a saved config whose helpers start early; at their start it prints
# which of the heavy modules it has imported by then, and ends
HEAVY_AT_START = ("import json, os, sys\n"
                  "from omegaconf import OmegaConf\n"
                  "import scfs.training.compile_helpers as ch\n"
                  "from scfs.train import run\n"
                  "def launch(*args, **kwargs):\n"
                  "    heavy = [m for m in ('torch', 'lightning', 'timm', 'torchvision') if m in sys.modules]\n"
                  "    print(json.dumps(heavy), flush=True)\n"
                  "    os._exit(0)\n"
                  "ch.gpu_run, ch.early_device, ch.launch = (lambda cfg: True), (lambda: 'cpu'), launch\n"
                  "import scfs.cuda_driver\n"
                  "scfs.cuda_driver.cuda_driver_devices = lambda: [(9, 0)]\n"
                  "run(OmegaConf.load(sys.argv[1]), sys.argv[2])\n"
                  "print('no helper started', flush=True)\n")


@pytest.mark.parametrize("resume", [[], ["resume=auto"]], ids=["fresh", "resume-auto-nothing-to-resume"])
@pytest.mark.parametrize("trainer", [[], ["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"]],
                         ids=["cpu", "gpu-the-driver-shows-it"])
def test_a_fresh_run_starts_its_helpers_before_it_imports_torch_lightning_or_the_models(tmp_path, shapes_root,
                                                                                       resume, trainer):
    """The run's own heavy imports (torch, Lightning, timm: 10-16 s on a GPU host) run beside the helpers' start-up,
    not before it: a GPU trainer's check takes the CUDA driver's word (a driver showing one bf16 GPU, here), so
    not even torch is imported first."""
    cfg = compose_cfg(["compile=true", "compile_parallel=true", *resume, *trainer], data_root=shapes_root)
    OmegaConf.save(cfg, tmp_path / "cfg.yaml")
    out = subprocess.run([sys.executable, "-c", HEAVY_AT_START, str(tmp_path / "cfg.yaml"), str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=ch.child_env())
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and lines, out.stderr[-2000:]
    assert json.loads(lines[-1]) == [], lines[-1]


def test_a_process_knows_its_own_age():
    """`process_age_s` (what a run's report says it did before it started its helpers): a child that sleeps 1 s
    before it asks is at least 1 s old, and not much older."""
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(1.0); "
                          "from scfs.training.compile_helpers import process_age_s; print(process_age_s())"],
                         capture_output=True, text=True, timeout=120, env=ch.child_env())
    age = float(out.stdout.strip())
    assert 1.0 <= age < 20.0, out


@pytest.mark.parametrize("experiment", ["cifar10", "cifar10_vit"])
def test_a_helper_makes_its_model_on_its_device_with_the_runs_shapes_dtypes_and_strides(experiment, tmp_path):
    """A helper's model (`helper_model`) is made and initialised on the helper's device, where the run's is made on
    the CPU (and moved): every parameter and buffer has the run's name, shape, dtype, strides and `requires_grad`,
    what the compile's cache keys take, so the helper's entries are the run's. On the `meta` device here, as no
    CPU test has a GPU; the ResNet-50 recipe's model is the ResNet-18's code at other sizes."""
    from scfs.training.build import build
    from scfs.workbench import compose_train_cfg

    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
    cfg = compose_train_cfg([f"+experiment={experiment}", f"data.root={tmp_path}"])

    def described(model: torch.nn.Module) -> dict[str, tuple]:
        tensors = {**dict(model.named_parameters()), **{f"buffer {k}": v for k, v in model.named_buffers()}}
        return {k: (tuple(v.shape), v.dtype, v.stride(), v.requires_grad) for k, v in tensors.items()}

    helper = compile_child.helper_model(cfg, "meta")
    assert {t.device.type for t in [*helper.parameters(), *helper.buffers()]} == {"meta"} and helper.training
    torch.manual_seed(int(cfg.seed))
    run_model = build(cfg)[1]
    assert {t.device.type for t in run_model.parameters()} == {"cpu"}
    assert described(helper) == described(run_model) and len(described(helper)) > 100

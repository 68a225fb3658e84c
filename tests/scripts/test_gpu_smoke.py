"""scripts/gpu_smoke.sh, the GPU gate, checked on the CPU with a stand-in interpreter: every README command it
names is still in the README, a failing command is a FAIL row with its last line, and the record is written."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_PY = """#!/bin/sh
case "$*" in *scfs.bench.host*) echo "Host: Stand-in CPU, 16 usable cores."; exit 0;; esac
case "$*" in *scfs.eval.detect*) echo "scfs.eval.detect: error: detect went wrong" >&2
  echo "Compile with TORCH_USE_CUDA_DSA to enable device-side assertions." >&2; exit 1;; esac
exit 0
"""


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in *index*) printf '0\\n1\\n';; *name*) printf 'Stand-in GPU\\nStand-in GPU\\n';; esac
"""


def smoke_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The smoke script's environment in a test: the stand-in interpreter (`fakepy`) and any stand-in tools in
    `tmp_path` first on PATH, its scratch, record and marks there."""
    return {**os.environ, "PY": str(tmp_path / "fakepy"), "OUT": str(tmp_path / "out"), "COMMIT": "test",
            "SMOKE_WORK": str(tmp_path / "work"), "REC_DIR": str(tmp_path / "rec"), "MARK": str(tmp_path / "mark"),
            "PATH": f"{tmp_path}:{os.environ['PATH']}", **extra}


def run_smoke(tmp_path: Path, gpus: int) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """The smoke script with the stand-in interpreter; with gpus=2 a stand-in nvidia-smi lists two GPUs."""
    for name, text in (("fakepy", FAKE_PY), ("nvidia-smi", FAKE_NVIDIA_SMI if gpus else "#!/bin/sh\nexit 1\n")):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    res = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=REPO, env=smoke_env(tmp_path), capture_output=True,
                         text=True, timeout=120)
    rows = [line.split("\t") for line in (tmp_path / "work" / "rows.tsv").read_text().splitlines()]
    return res, {r[0]: r for r in rows}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_smoke_runs_every_readme_command_and_reports_failures(tmp_path):
    res, by_id = run_smoke(tmp_path, gpus=0)
    assert res.returncode == 1, res.stdout + res.stderr  # one row fails on purpose
    rows = list(by_id.values())
    expected = {"cifar10", "cifar10-eager", "cifar10-cudagraphs", "cifar10-background", "pytest-gpu",
                "pytest-gpu-tuning", "pytest-gpu-background", "pytest-gpu-helper", "pytest-gpu-backward-helper",
                "pytest-gpu-split-student", "pytest-gpu-split-helpers", "cifar10-dino",
                "search-hard", "search-softmax", "search-roi", "search-none", "imagenet", "resume-stop", "resume-auto",
                "search-check", "bench-step", "knn", "linear-fast", "linear-full", "detect", "precision",
                "notebook-02", "search-centred", "precision-centred", "cifar10-vit", "cifar10-vit-dino",
                "imagenet-vit", "search-check-vit", "attention", "knn-vit", "study-local-gpus", "study-table",
                "bench-step-vit", "imagenet-gpu-decode", "bench-loader", "bench-e2e"}
    assert set(by_id) == expected
    # the row gives the line that says why, not what the command printed after it
    # (first side by side, then alone)
    assert by_id["detect"][1] == "FAIL"
    assert by_id["detect"][5] == "scfs.eval.detect: error: detect went wrong (failed alone too)"
    # PASS = the README still holds the command (else "not in README.md") and the stand-in ran it
    assert all(r[1] == "PASS" for i, r in by_id.items() if i != "detect"), [r for r in rows if r[1] != "PASS"]
    record = next((tmp_path / "rec").glob("gpu-smoke-*.md")).read_text()
    assert "40 of 41 PASS" in record and "Commit `test`" in record
    assert "\nHost: Stand-in CPU, 16 usable cores.\n" in record  # measured before the rows load the host
    # a device call returns at most 8 files: the rows' scratch stays out of $OUT, the work after the smoke needs room
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-smoke.md", "smoke-logs.tgz"]



@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_two_gpu_rows_name_readme_commands(tmp_path):
    """On a two-GPU machine the DDP rows run too: their README commands must be in the README as well."""
    _, by_id = run_smoke(tmp_path, gpus=2)
    ddp = {i: r for i, r in by_id.items() if i.startswith("ddp-")}
    assert set(ddp) == {"ddp-2gpu", "ddp-1gpu-same-batch"}
    assert all(r[1] == "PASS" for r in ddp.values()), list(ddp.values())


OOM_ONCE_PY = """#!/bin/sh
# side by side, the DINO run and the resume chain's first step run out of GPU memory once; alone they pass
oom() { [ -f "$MARK/$1" ] && return 1; touch "$MARK/$1"; echo "torch.OutOfMemoryError: CUDA out of memory." >&2; }
case "$*" in
  *name=smoke-dino*) oom dino && exit 1
    mkdir -p runs/smoke-dino/v0/checkpoints && touch runs/smoke-dino/v0/checkpoints/last.ckpt;;
  *"resume=auto"*) [ -f "$MARK/stopped" ] || { echo "nothing to resume" >&2; exit 1; };;
  *name=smoke-resume*) oom resume && exit 1; touch "$MARK/stopped";;
  *scfs.eval.precision*) case "$*" in *"DINO= "*) echo "checkpoint . is a folder" >&2; exit 1;; esac;;
  *data.decode=gpu*) echo "[scfs.viz][WARNING] - searched-regions figure skipped: ValueError: bad sample";;
  *"not childs_cache"*) ;;
  *"-k childs_cache"*) echo "${LIMIT:-unset}" >> "$MARK/background-limits"; oom background && exit 1;;
  *test_compile_backend.py*) [ -f "$MARK/slow" ] || { touch "$MARK/slow"; exit 124; };;
  *"backward_helper and not"*) [ -f "$MARK/cudnn" ] || { touch "$MARK/cudnn"
    echo "FAILED tests/method/test_cudnn_warmup.py::test_gpu_x - AssertionError: 7171 == 183" >&2
    echo "1 failed, 12 passed in 289.21s" >&2; exit 1; };;
  *"+study=cifar10_seeds"*) [ -f "$MARK/study" ] || { touch "$MARK/study"
    echo "scfs.train: error: 1 of 2 jobs failed (job 0 method=scfs: exit status 1:" \
      "torch.AcceleratorError: CUDA error: out of memory)" >&2
    echo "Compile with TORCH_USE_CUDA_DSA to enable device-side assertions." >&2; exit 1; };;
esac
exit 0
"""


def run_oom_once(tmp_path: Path, **env_extra: str) -> tuple[list[str], dict[str, list[str]], str]:
    """The smoke script with the stand-in interpreter that fails some rows side by side only (`OOM_ONCE_PY`), on
    a copy of the repository's scripts and README: its rows, by id, and its record."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(REPO / "scripts", repo / "scripts")
    shutil.copy(REPO / "README.md", repo / "README.md")
    (tmp_path / "mark").mkdir()
    (tmp_path / "fakepy").write_text(OOM_ONCE_PY)
    (tmp_path / "fakepy").chmod(0o755)
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    res = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=repo, env=smoke_env(tmp_path, **env_extra),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = (tmp_path / "work" / "rows.tsv").read_text().splitlines()
    record = next((tmp_path / "rec").glob("gpu-smoke-*.md")).read_text()
    return lines, {r[0]: r for r in (line.split("\t") for line in lines)}, record


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_rows_out_of_gpu_memory_side_by_side_run_again_alone(tmp_path):
    """A GPU shared with other work can run a row out of memory (a study's job too: the CUDA runtime's error), out
    of time, or fail it otherwise (cuDNN benchmarks again where it cannot allocate a chosen algorithm's workspace):
    that row runs again alone (under its own time limit), with the rows of wave 2 that failed for want of its
    checkpoint and the chain's step that never ran, in order; a command that exits 0 but logs a failure it
    swallowed fails its row, alone too, and its row keeps both failures."""
    lines, by_id, _ = run_oom_once(tmp_path)
    assert len(lines) == len(by_id) == 41
    again = "run again alone after: CUDA out of memory side by side"
    assert by_id["cifar10-dino"][1] == "PASS" and by_id["cifar10-dino"][5] == again
    assert by_id["resume-stop"][1] == "PASS" and by_id["resume-stop"][5] == again
    assert by_id["resume-auto"][1] == "PASS" and by_id["resume-auto"][5].startswith("run again alone after: did not")
    for row in ("precision", "precision-centred"):
        assert by_id[row][1] == "PASS" and "checkpoint . is a folder" in by_id[row][5], by_id[row]
    skipped = "searched-regions figure skipped: ValueError: bad sample"
    assert by_id["imagenet-gpu-decode"][1] == "FAIL"
    assert by_id["imagenet-gpu-decode"][5] == f"{skipped} (failed alone too)"
    assert by_id["pytest-gpu-backward-helper"][1] == "PASS"
    helper = by_id["pytest-gpu-backward-helper"][5]
    assert helper == "run again alone after: 1 failed, 12 passed in 289.21s side by side"
    assert by_id["knn"][5] == ""  # a wave-2 row that passed is not run again
    assert by_id["study-local-gpus"][1] == "PASS" and by_id["study-local-gpus"][5] == again
    assert by_id["pytest-gpu"][1] == "PASS"
    assert by_id["pytest-gpu"][5] == "run again alone after: timed out after 450 s side by side"
    # a row with a time limit of its own keeps it when it runs again alone
    assert by_id["pytest-gpu-background"][1] == "PASS" and by_id["pytest-gpu-background"][5] == again
    assert (tmp_path / "mark" / "background-limits").read_text().split() == ["450", "450"]
    assert "40 of 41 PASS" in next((tmp_path / "rec").glob("gpu-smoke-*.md")).read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_more_failures_side_by_side_than_the_cap_run_none_again(tmp_path):
    """More rows failed side by side than `SMOKE_RETRY_MAX` is a broken commit, not a crowded GPU: no row runs
    again alone, each keeps its first failure, and the record says why."""
    lines, by_id, record = run_oom_once(tmp_path, SMOKE_RETRY_MAX="2")
    assert len(lines) == len(by_id) == 41
    assert by_id["cifar10-dino"][1] == "FAIL" and "CUDA out of memory" in by_id["cifar10-dino"][5]
    assert by_id["pytest-gpu"][5] == "timed out after 450 s"
    assert not any(r[5].startswith("run again alone") or "alone too" in r[5] for r in by_id.values())
    assert "rows failed side by side, more than SMOKE_RETRY_MAX=2: none ran again alone." in record


COUNTING_PY = """#!/bin/sh
# each row notes itself as running for a moment and keeps the most rows it saw running at once
touch "$MARK/run.$$"; sleep 0.3
n=$(ls "$MARK" | grep -c '^run\\.')
[ "$n" -gt "$(cat "$MARK/most" 2>/dev/null || echo 0)" ] && echo "$n" > "$MARK/most"
rm -f "$MARK/run.$$"
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("memory_mib, parallel, most", [("81559", None, 15), ("143771", "3", 3)],
                         ids=["h100-memory", "set"])
def test_a_smaller_gpu_runs_fewer_rows_at_once(tmp_path, memory_mib, parallel, most):
    """On a GPU with less memory than an H200's, at most one row per 5 GiB runs at once (SMOKE_PARALLEL sets it):
    fewer rows then run out of memory side by side and have to run again alone."""
    (tmp_path / "mark").mkdir()
    smi = ("#!/bin/sh\ncase \"$*\" in *index*) echo 0;; *memory.total*) echo " + memory_mib
           + ";; *name*) echo Stand-in;; esac\n")
    for name, text in (("fakepy", COUNTING_PY), ("nvidia-smi", smi)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    env = smoke_env(tmp_path, **({"SMOKE_PARALLEL": parallel} if parallel else {}))
    res = subprocess.run(["bash", "scripts/gpu_smoke.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"at most {most} rows at once" in res.stdout
    assert 2 <= int((tmp_path / "mark" / "most").read_text()) <= most

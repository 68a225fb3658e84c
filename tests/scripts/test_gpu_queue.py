"""scripts/gpu_queue.sh, the GPU-window job queue, on the CPU with shell jobs: `start` returns while the queue runs
under setsid, jobs run one after the other with their own folders, a job that would overrun the deadline is left
for the next window and named, a malformed line is named, and `collect` brings back the jobs' folders and records."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
needs_setsid = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("setsid") is None,
                                  reason="needs bash and setsid")

QUEUE = """# a comment, then a blank line
done-before 1 echo "must not run" > "$JOB_OUT/ran.txt"

first 5 sleep 4; echo "# first at $COMMIT" > "$JOB_OUT/first.md"; echo made
too-long 99999 echo "must not run" > "$JOB_OUT/ran.txt"
broken notanumber echo never
second 5 cat "$Q/jobs/first/first.md" > "$JOB_OUT/seen.txt"; python -c "print('py')"; exit 7
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "OUT": str(tmp_path / "out"), "QUEUE_TREE": str(tmp_path / "queue-tree"),
            "QUEUE_DIR": str(tmp_path / "queue"), "MINUTES": "2", "COMMIT": "abc1234",
            "SKIP": "done-before"}


@needs_setsid
def test_queue_runs_in_order_skips_what_does_not_fit_and_collect_brings_it_back(tmp_path):
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("gpu_queue.sh", "python_shim.sh"):
        shutil.copy(REPO / "scripts" / name, tree / "scripts" / name)
    lines = QUEUE.splitlines(keepends=True)
    (tree / "a.queue").write_text("".join(lines[:4]))  # two files, run as one queue in the order given
    (tree / "b.queue").write_text("".join(lines[4:]))
    env, script = _env(tmp_path), ["bash", "scripts/gpu_queue.sh"]
    start = subprocess.run([*script, "start", "a.queue", "b.queue"], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    assert "deadline" in start.stdout and "start first" in start.stdout
    assert not (tmp_path / "queue" / "jobs" / "first" / "first.md").exists()  # still running after start returned
    res = subprocess.run([*script, "collect", "60"], cwd=tree, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    log = res.stdout
    assert "first ended, exit status 0" in log and "second ended, exit status 7" in log and "[queue] done" in log
    assert "left too-long for the next window" in log and "bad line for 'broken'" in log
    assert "skipped done-before (in SKIP)" in log
    assert log.index("first ended") < log.index("start second")
    out = tmp_path / "out"
    assert (out / "first--first.md").read_text() == "# first at abc1234\n"
    with tarfile.open(out / "queue.tgz") as tgz:
        names = tgz.getnames()
        assert "queue.log" in names and "logs/first.log" in names, names
        assert tgz.extractfile("jobs/second/seen.txt").read() == b"# first at abc1234\n"
        assert tgz.extractfile("logs/first.log").read() == b"made\n"
        assert tgz.extractfile("logs/second.log").read() == b"py\n"  # `python` is there, as the README says
        assert not any(n.startswith(("jobs/too-long/", "jobs/done-before/")) for n in names)


@needs_setsid
def test_start_without_a_queue_file_says_what_to_give(tmp_path):
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_queue.sh"), "start", "missing.queue"], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "no queue file 'missing.queue'" in res.stdout


@needs_setsid
def test_start_refuses_a_queue_whose_jobs_name_inputs_the_tree_lacks(tmp_path):
    """A job naming a carried input (`.gpudata/`, `.whl/`, `.pub/`) that the device's tree lacks would fail in
    its first second while the window's minutes go by: `start` names each such job and input and the fix, and
    starts nothing; a glob counts where it matches, and a job in SKIP is not asked."""
    tree = tmp_path / "tree"
    (tree / ".whl").mkdir(parents=True)
    (tree / ".whl" / "a-1.0-py3-none-any.whl").write_text("")
    (tree / "t.queue").write_text('wheels 5 ls .whl/*.whl\n'
                                  'e2e 5 python -m scfs.bench.e2e --archive ".gpudata/photos.tar.xz" --out "$JOB_OUT"\n'
                                  "published 5 python -m scfs.bench.published --root .pub/skyoux-scfs\n")
    script, env = ["bash", str(REPO / "scripts" / "gpu_queue.sh"), "start", "t.queue"], _env(tmp_path)
    res = subprocess.run(script, cwd=tree, env={**env, "SKIP": ""}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.splitlines()[:2] == ["missing input, job e2e: .gpudata/photos.tar.xz",
                                           "missing input, job published: .pub/skyoux-scfs"]
    assert "carry" in res.stdout and not (tmp_path / "queue").exists()
    res = subprocess.run(script, cwd=tree, env={**env, "SKIP": "e2e published"}, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0 and "missing input" not in res.stdout, res.stdout + res.stderr
    subprocess.run(["bash", str(REPO / "scripts" / "gpu_queue.sh"), "collect", "30"], cwd=tree, env=env,
                   capture_output=True, text=True, timeout=60)  # the started queue ends before tmp_path goes


@pytest.mark.parametrize("queue", ["speed", "compile", "vit", "smoke", "heads"])
def test_the_shipped_queues_parse_and_fit_two_windows(queue):
    """Every line of a shipped queue is `<name> <seconds> <command>`, the command one of the project's modules or
    scripts (a compile job's rows the benchmark's), and the whole queue asks for at most two windows of 25
    minutes."""
    lines = [ln for ln in (REPO / "scripts" / "queues" / f"{queue}.queue").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    names = [ln.split()[0] for ln in lines]
    secs = [int(ln.split()[1]) for ln in lines]
    assert len(set(names)) == len(names)
    runs = ("python -m scfs.", "python scripts/", "bash scripts/")
    assert all(any(run in ln.split(maxsplit=2)[2] for run in runs) for ln in lines)
    for ln in lines:  # a script a job names is in the tree
        for word in ln.replace(";", " ").split():
            assert not word.startswith("scripts/") or (REPO / word).is_file(), ln
    assert all(s <= 25 * 60 for s in secs) and sum(secs) <= 2 * 25 * 60
    from scfs.bench.compile import ROWS

    for ln in lines:  # a compile job names rows the benchmark has
        if "scfs.bench.compile" in ln:
            rows = ln.split("--rows", 1)[1].split("--")[0].split()
            assert rows and set(rows) <= set(ROWS), ln

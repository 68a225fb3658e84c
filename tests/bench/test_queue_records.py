"""`scfs.bench.queue_records`: a GPU queue's archive filed as records, named and rewritten the one way."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from scfs.bench import queue_records as qr

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMPILE = RESULTS / "compile-h100-2026-12-05-split-alone-r50-bf45094.json"
E2E = RESULTS / "imagenet-e2e-h100-2026-12-05-bf45094.json"
SMOKE = RESULTS / "gpu-smoke-2026-12-05-bf45094.md"
STEP = RESULTS / "step-h200-2026-12-03-same-call-eager-a181130.json"
QUEUE_LOG = """[queue] window: 1140 s
[queue] +0 s start smoke (480 s expected)
[queue] +411 s smoke ended, exit status 0, in 411 s
[queue] +411 s start split-alone-r50 (240 s expected)
[queue] +653 s split-alone-r50 ended, exit status 0, in 242 s
[queue] +653 s start e2e-r50 (360 s expected)
[queue] +850 s e2e-r50 ended, exit status 1, in 197 s
[queue] left cold-r50 for the next window: 360 s expected, 290 s left
[queue] done
"""


def make_queue(root: Path) -> Path:
    """A queue folder as `scripts/gpu_queue.sh` leaves it, from committed records put back where the device
    machine's jobs wrote them (`--out "$JOB_OUT"`)."""
    jobs = root / "jobs"
    for job in ("smoke", "split-alone-r50", "e2e-r50", "step-eager", "notes"):
        (jobs / job).mkdir(parents=True)
    d = json.loads(COMPILE.read_text())
    d["command"] = d["command"].replace(d["command"].split("--out ")[1], "/tmp/queue/jobs/split-alone-r50")
    (jobs / "split-alone-r50" / "compile-2026-12-05.json").write_text(json.dumps(d))
    # each benchmark writes its markdown beside its JSON; the filed record's is made again from the JSON
    (jobs / "split-alone-r50" / "compile-2026-12-05.md").write_text("# as the device machine wrote it\n")
    e = json.loads(E2E.read_text())
    e["meta"]["command"] = e["meta"]["command"].replace("--out benchmarks/results", '--out "/tmp/queue/jobs/e2e-r50"')
    (jobs / "e2e-r50" / E2E.name).write_text(json.dumps(e))
    (jobs / "e2e-r50" / E2E.with_suffix(".md").name).write_text("# as the device machine wrote it\n")
    st = json.loads(STEP.read_text())
    st["meta"]["command"] = st["meta"]["command"].replace("/root/out/e", '"/tmp/queue/jobs/step-eager"')
    (jobs / "step-eager" / "step-h200-2026-12-03.json").write_text(json.dumps(st))
    (jobs / "step-eager" / "step-h200-2026-12-03.md").write_text("# as the device machine wrote it\n")
    (jobs / "notes" / "step-x.md").write_text("# a markdown no importer knows, its JSON neither\n")
    shutil.copytree(E2E.with_name(E2E.stem + "-logs"), jobs / "e2e-r50" / (E2E.stem + "-logs"))
    shutil.copy(SMOKE, jobs / "smoke" / "gpu-smoke.md")
    (jobs / "notes" / "step-x.json").write_text("{}")
    (root / "queue.log").write_text(QUEUE_LOG)
    (root / "logs").mkdir()
    return root


def test_a_queue_archive_is_filed_as_named_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    queue = make_queue(tmp_path / "queue")
    tgz = tmp_path / "queue.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for part in ("jobs", "logs", "queue.log"):
            tar.add(queue / part, arcname=part)
    monkeypatch.chdir(tmp_path)
    assert qr.main([str(tgz)]) == 0
    out = Path("benchmarks/results")
    stem = out / "compile-h100-2026-12-05-split-alone-r50-bf45094"
    d = json.loads(stem.with_suffix(".json").read_text())
    assert d["command"] == json.loads(COMPILE.read_text())["command"]  # the command as the record was committed
    assert d["rows"] == json.loads(COMPILE.read_text())["rows"]
    assert f"--out {stem}`" in stem.with_suffix(".md").read_text()
    e2e = out / "imagenet-e2e-h100-2026-12-05-e2e-r50-bf45094"
    meta = json.loads(e2e.with_suffix(".json").read_text())["meta"]
    assert meta["command"].endswith("--no-step --out benchmarks/results") and "/tmp/queue" not in meta["command"]
    assert (out / f"{e2e.name}-logs" / "run-cpu.log").is_file()
    assert "/tmp/queue" not in e2e.with_suffix(".md").read_text()
    assert (out / "gpu-smoke-2026-12-05-bf45094.md").read_text() == SMOKE.read_text()
    step = out / "step-h200-2026-12-03-step-eager-a181130"
    st = json.loads(step.with_suffix(".json").read_text())
    assert st["rows"] == json.loads(STEP.read_text())["rows"]
    assert st["meta"]["command"].endswith("--no-ceiling --out benchmarks/results")
    assert "/tmp/queue" not in step.with_suffix(".md").read_text()
    assert "| scfs | 64 | bf16_cl |" in step.with_suffix(".md").read_text()
    printed = capsys.readouterr().out
    assert "wrote 8 file(s):" in printed
    assert "jobs that did not end cleanly: e2e-r50 (exit 1), cold-r50 (left)" in printed
    assert "left (no importer; file by hand if it is a record): notes/step-x.json, notes/step-x.md\n" in printed
    # filed again: nothing is replaced without --force, and the error is one line
    assert qr.main([str(queue)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists already; pass --force" in err
    assert qr.main([str(queue), "--force"]) == 0


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    queue = make_queue(tmp_path / "queue")
    assert qr.main([str(queue), "--out", str(tmp_path / "records"), "--dry-run"]) == 0
    assert not (tmp_path / "records").exists()
    assert "would write 8 file(s):" in capsys.readouterr().out


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "has no jobs/ folder"),
    (lambda p: (p.write_text("not a tar"), p)[1], "is not a readable tar archive"),
])
def test_bad_queue_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, make, message: str) -> None:
    path = make(tmp_path / "queue.tgz")
    assert qr.main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("scfs.bench.queue_records: error:") and message in err


def test_a_record_that_is_not_what_its_name_says_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "q" / "jobs" / "j").mkdir(parents=True)
    (tmp_path / "q" / "jobs" / "j" / "compile-2026-12-05.json").write_text(json.dumps({"rows": []}))
    assert qr.main([str(tmp_path / "q"), "--out", str(tmp_path / "r")]) == 2
    assert "not a compile benchmark record" in capsys.readouterr().err


def test_out_flag_is_rewritten_in_every_spelling() -> None:
    assert qr.with_out('python -m x --out "$JOB_OUT" --y', "r/s") == "python -m x --out r/s --y"
    assert qr.with_out("python -m x --out=/tmp/q/j", "r") == "python -m x --out r"
    assert qr.with_out("python -m x", "r") == "python -m x --out r"
    assert qr.job_states(QUEUE_LOG) == {"smoke": "exit 0", "split-alone-r50": "exit 0", "e2e-r50": "exit 1",
                                        "cold-r50": "left"}


def test_a_checkpoint_write_record_is_filed_under_its_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scfs.bench import checkpoint_writes

    job = tmp_path / "q" / "jobs" / "ckpt-writes"
    monkeypatch.setenv("COMMIT", "abc1234")
    assert checkpoint_writes.main(["--device", "cpu", "--mb", "0.1", "--tensors", "2", "--steps", "3", "--at", "1",
                                   "--matmuls", "1", "--size", "8", "--repeats", "1", "--out", str(job)]) == 0
    (made,) = job.glob("checkpoint-writes-cpu-*-abc1234.json")
    filed = qr.file_queue(tmp_path / "q", tmp_path / "r")
    stem = tmp_path / "r" / made.name.replace("-abc1234.json", "-ckpt-writes-abc1234")
    assert filed.written == [stem.with_suffix(".json"), stem.with_suffix(".md")] and not filed.left
    meta = json.loads(stem.with_suffix(".json").read_text())["meta"]
    assert meta["command"].endswith(f"--out {tmp_path / 'r'}") and str(job) not in stem.with_suffix(".md").read_text()

"""The sweep's table: one row per run, every requested k, failed runs shown as failed."""

import pytest

from scfs.sweep import _table


def test_table_lists_every_k_and_failed_runs():
    ok = {"label": "scfs", "overrides": "method=scfs", "rc": 0,
          "summary": {"epochs": 3, "steps": 30, "seconds": 12.5, "loss": 5.0, "uniform_loss": 8.3,
                      "knn_init": {"top1_k20": 30.0, "top1_k200": 28.0},
                      "knn": {"top1_k20": 41.5, "top1_k200": 39.0}}}
    bad = {"label": "dino", "overrides": "method=dino", "rc": 1, "summary": None}
    lines = _table([ok, bad], [20, 200]).splitlines()
    assert "kNN20 final" in lines[0] and "kNN200 final" in lines[0]
    assert len({line.count("|") for line in lines}) == 1, "rows and header must have the same number of cells"
    assert "41.5 | +11.5" in lines[2] and "39.0 | +11.0" in lines[2]
    assert "failed (rc 1)" in lines[3]


def test_sweep_records_every_run_even_failed_ones(tmp_path):
    """Two runs whose config is refused at start-up (exit 2, seconds): the record and table still list both,
    in the order given, and say the sweep completed."""
    import json

    from scfs.sweep import main

    out = tmp_path / "rec.json"
    rc = main(["bad1:method=byol", "bad2:search.weighting=magic", "--parallel", "2", "--out", str(out),
               "--root", str(tmp_path / "runs"), "--k", "20,200"])
    assert rc == 1
    rec = json.loads(out.read_text())
    assert rec["complete"] is True and [r["label"] for r in rec["runs"]] == ["bad1", "bad2"]
    assert all(r["rc"] == 2 and r["summary"] is None for r in rec["runs"])
    # why each failed is in the record (and was printed), not only in its stdout.log
    assert "Could not find 'method/byol'" in rec["runs"][0]["error"]
    assert "search.weighting='magic' is invalid" in rec["runs"][1]["error"]
    md = out.with_suffix(".md").read_text()
    assert md.count("failed (rc 2)") == 2 and "kNN200 final" in md


@pytest.mark.parametrize("args", [["--parallel", "0"], ["--k", "abc"], ["--k", "20,x"]],
                         ids=["parallel-0-would-hang", "k-not-a-number", "k-partly-bad"])
def test_bad_options_are_refused_before_any_run(tmp_path, capsys, args):
    """--parallel 0 used to wait forever; --k abc failed with a traceback after the runs were set up."""
    from scfs.sweep import main

    with pytest.raises(SystemExit) as exc:
        main(["a:method=dino", "--out", str(tmp_path / "rec.json"), "--root", str(tmp_path / "runs"), *args])
    assert exc.value.code == 2
    assert "error: argument" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "rec.json").exists()


def test_resume_finds_the_newest_checkpoint_of_the_same_run(tmp_path):
    """--resume: run i with label L continues from the newest <root>/<stamp>-<i>-<L>/checkpoints/last.ckpt."""
    from scfs.sweep import _latest_checkpoint

    for stamp, idx, label, ckpt in [("20261130-100000", 0, "scfs", True), ("20261130-110000", 0, "scfs", True),
                                    ("20261130-120000", 0, "scfs", False), ("20261130-130000", 1, "scfs", True),
                                    ("20261130-140000", 0, "dino", True)]:
        d = tmp_path / f"{stamp}-{idx:02d}-{label}" / "checkpoints"
        d.mkdir(parents=True)
        if ckpt:
            (d / "last.ckpt").write_bytes(b"x")
    found = _latest_checkpoint(tmp_path, 0, "scfs")
    assert found == tmp_path / "20261130-110000-00-scfs" / "checkpoints" / "last.ckpt"
    assert _latest_checkpoint(tmp_path, 2, "scfs") is None


def test_a_terminated_sweep_stops_its_runs_and_keeps_its_record(tmp_path, shapes_root):
    """SIGTERM (e.g. `timeout` around a device call) must not leave training processes behind on the GPUs."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from helpers import TINY

    root, out = tmp_path / "runs", tmp_path / "rec.json"
    common = " ".join([*TINY, f"data.root={shapes_root}", "trainer.max_epochs=100000", "eval.knn_at_start=false"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sweep = subprocess.Popen([sys.executable, "-m", "scfs.sweep", "long:method=dino", "--common", common,
                              "--out", str(out), "--root", str(root)], env=env, stdout=subprocess.PIPE, text=True)

    def runs_alive() -> list[str]:
        alive = []
        for p in Path("/proc").iterdir():
            try:
                cmdline = (p / "cmdline").read_bytes().decode(errors="ignore") if p.name.isdigit() else ""
                if f"hydra.run.dir={root}" in cmdline:  # the training runs, not the sweep itself
                    alive.append(p.name)
            except OSError:
                continue
        return alive

    deadline = time.time() + 60
    while not runs_alive() and time.time() < deadline:
        time.sleep(0.5)
    assert runs_alive(), "the training run never started"
    time.sleep(2)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) == 128 + signal.SIGTERM
    assert "stopped by signal" in sweep.stdout.read()
    assert not runs_alive()
    rec = json.loads(out.read_text())
    assert rec["complete"] is False and rec["runs"] == []

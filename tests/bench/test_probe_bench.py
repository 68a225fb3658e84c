"""The probe benchmark runs end to end on a small size and reports every path of every case."""

import json

from scfs.bench.probe import PATHS, main, measure, table


def test_probe_bench_rows_and_table():
    rows = measure(["single", "grid"], n=600, dim=8, classes=3, epochs=2, repeats=1, batch_size=128,
                   accelerator="cpu")
    assert [(r["case"], r["path"]) for r in rows] == [(c, p) for c in ("single", "grid") for p in PATHS]
    assert all(r["ms_per_step"] > 0 and r["epochs_timed"] == 1 for r in rows)
    assert rows[3]["heads"] == 21 and rows[3]["samples"] == 540 and rows[3]["steps_per_epoch"] == 5
    text = table(rows)
    assert text.count("\n") == 1 + len(rows) and "| single | 1 | 600 | 5 | per-epoch |" in text


def test_host_work_under_the_floor_reads_as_none():
    """A path at or under the arithmetic floor (its host work hidden behind the device's) shows ~0, never a
    negative time or a speed-up divided by it."""
    rows = [{"case": "single", "path": p, "heads": 1, "samples": 10, "steps_per_epoch": 1, "epochs_timed": 1,
             "ms_per_epoch": ms, "ms_per_step": ms} for p, ms in zip(PATHS, (4.0, 1.1, 1.2))]
    line = table(rows).splitlines()[3]
    assert "| 1.100 | ~0 | 3.6x | - |" in line, line


def test_out_writes_a_record_naming_command_commit_and_device(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMIT", "abc1234")
    main(["--cases", "single", "--n", "300", "--dim", "4", "--classes", "3", "--epochs", "2", "--repeats", "1",
          "--batch-size", "100", "--out", str(tmp_path)])
    (js,) = tmp_path.glob("probe-cpu-*-abc1234.json")
    rec = json.loads(js.read_text())
    assert rec["meta"]["commit"] == "abc1234"
    assert rec["meta"]["command"].startswith("python -m scfs.bench.probe --cases")
    assert [r["path"] for r in rec["rows"]] == list(PATHS)
    md = js.with_suffix(".md").read_text()
    assert "Commit `abc1234`" in md and "| single | 1 | 300 | 3 | per-epoch |" in md

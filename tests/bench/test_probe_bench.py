"""The probe benchmark runs end to end on a small size and reports every path of every case."""

from scfs.bench.probe import PATHS, measure, table


def test_probe_bench_rows_and_table():
    rows = measure(["single", "grid"], n=600, dim=8, classes=3, epochs=2, repeats=1, batch_size=128,
                   accelerator="cpu")
    assert [(r["case"], r["path"]) for r in rows] == [(c, p) for c in ("single", "grid") for p in PATHS]
    assert all(r["ms_per_step"] > 0 and r["epochs_timed"] == 1 for r in rows)
    assert rows[3]["heads"] == 21 and rows[3]["samples"] == 540 and rows[3]["steps_per_epoch"] == 5
    text = table(rows)
    assert text.count("\n") == 1 + len(rows) and "| single | 1 | 600 | 5 | per-epoch |" in text

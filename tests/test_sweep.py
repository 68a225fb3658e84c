"""The sweep's table: one row per run, every requested k, failed runs shown as failed."""

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

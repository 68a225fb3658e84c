"""docs/ figures from records: the kNN-per-seed plot pools records, and a missing input is a one-line error."""

import json

import pytest

from scfs.viz.docs_figures import main


def _record(path, method, values):
    runs = [{"method": method, "seed": s, "knn_top1": v, "knn_init_top1": 60.0 + s} for s, v in enumerate(values)]
    path.write_text(json.dumps({"runs": runs}))


def test_knn_figure_pools_records_and_shares_one_axis(tmp_path):
    _record(tmp_path / "a.json", "scfs", [80.0, 70.0, 75.0])
    _record(tmp_path / "b.json", "dino", [60.0, 50.0, 55.0])
    out = main(["knn", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "k.png")])
    assert out.stat().st_size > 5_000


def test_missing_inputs_are_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["knn", str(tmp_path / "nope.json")])
    assert "record not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["regions", f"SCFS={tmp_path / 'x.ckpt'}"])
    assert "checkpoint file not found" in capsys.readouterr().err

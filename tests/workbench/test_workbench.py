"""Notebook plumbing: run folders keyed by the training settings, reuse of finished runs, output locations."""

import json

from scfs import workbench as wb


def test_run_key_ignores_logging_but_not_training(monkeypatch, tmp_path):
    monkeypatch.setenv("SCFS_NB_RUNS", str(tmp_path))
    a = wb.compose_train_cfg([], small=True)
    assert wb.run_key(a) == wb.run_key(wb.compose_train_cfg(["logger=csv", "eval.figure=false"], small=True))
    assert wb.run_key(a) != wb.run_key(wb.compose_train_cfg(["search=hard"], small=True))
    assert wb.run_key(a) == wb.run_key(wb.compose_train_cfg(["search=soft"], small=True))  # the default, explicit
    d = wb.pretrain_dir(a)
    assert d.parent == tmp_path / "pretrain" and d.name.startswith("scfs-shapes-soft-")
    assert str(a.data.root) == str(wb.DATA_ROOT)  # absolute: independent of the notebook's cwd


def test_pretrain_reuses_a_finished_run(monkeypatch, tmp_path):
    monkeypatch.setenv("SCFS_NB_RUNS", str(tmp_path))
    cfg = wb.compose_train_cfg(["method=dino"], small=True)
    assert wb.find_run(cfg) is None
    d = wb.pretrain_dir(cfg)
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (d / "summary.json").write_text(json.dumps({"method": "dino", "search": "soft", "checkpoint": "c"}))
    assert wb.pretrain(cfg)["checkpoint"] == "c"
    assert wb.fresh_run_dir(cfg) == d and not d.exists()


def test_notebook_dir_and_summaries(monkeypatch, tmp_path):
    monkeypatch.setenv("SCFS_NB_RUNS", str(tmp_path / "r"))
    assert wb.notebook_dir("x") == tmp_path / "r" / "x" and (tmp_path / "r" / "x").is_dir()
    s = {"knn": {"top1_k20": 30.0}, "knn_init": {"top1_k20": 10.0}, "loss": 5.0, "uniform_loss": 10.0, "steps": 3,
         "seconds": 2.0}
    table = wb.summaries_table({"SCFS": s, "DINO": s})
    assert "| SCFS | 30.0 | 10.0 | +20.0 |" in table
    assert len(wb.summaries_figure({"SCFS": s}).axes) == 2
    monkeypatch.setenv("SCFS_NB_SMALL", "yes")
    assert wb.small_mode()


def test_shapes_split_reads_a_relative_root_from_the_repository(tmp_path, monkeypatch):
    """A run's saved config holds `data.root: data/shapes`; a notebook's cwd is notebooks/: the split must come
    from the repository's data folder, not a new copy under the cwd."""
    from omegaconf import OmegaConf

    from scfs import workbench as wb

    monkeypatch.setattr(wb, "REPO", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    data = OmegaConf.create({"root": "data/shapes", "image_size": 16, "n_train": 4, "n_val": 2})
    val = wb.shapes_split(data, "val")
    assert len(val) == 2 and (tmp_path / "repo" / "data" / "shapes").is_dir()
    assert not (tmp_path / "data").exists()

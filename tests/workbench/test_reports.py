"""Notebook 3's report: the eval CLIs' path, the fallback when they fail, the figures and the offline W&B run."""

import pytest
from helpers import compose_cfg

from scfs.viz import eval_report
from scfs.workbench import reports


@pytest.fixture
def train_cfg(shapes_root):
    return compose_cfg([], data_root=shapes_root)


def _check_docs(docs):
    assert [d["kind"] for d in docs] == ["knn", "linear"]
    assert docs[0]["knn_curve"] and [r["k"] for r in docs[0]["knn_curve"]] == [1, 5, 20]
    for d in docs:
        assert 0 <= d["metrics"]["top1"] <= 100 and len(d["per_class"]) == 10


def test_eval_overrides_point_at_the_training_data(train_cfg):
    ov = reports.eval_overrides(train_cfg)
    assert f"++data.root={train_cfg.data.root}" in ov and "++data.n_train=48" in ov
    assert "++backbone.channels=[8, 16, 16, 32]" in ov and "++data.eval_size=null" in ov


def test_cli_path_figures_table(train_cfg, tmp_path):
    docs = reports.evaluate_checkpoints({"random init": "random"}, train_cfg, tmp_path, ks=(1, 5, 20), linear_epochs=2)
    _check_docs(docs)
    assert (tmp_path / "knn-random-init" / "metrics.json").is_file()
    assert len(eval_report.accuracy_vs_k_figure(docs).axes) == 1
    assert eval_report.per_class_figure(docs, "linear") is not None
    assert eval_report.per_class_figure([], "knn") is None
    assert "random init" in eval_report.report_table(docs)


def test_fallback_when_the_cli_fails(train_cfg, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise ImportError("scfs.eval.knn is being rewritten")

    monkeypatch.setattr(reports, "_run_cli", broken)
    docs = reports.evaluate_checkpoints({"random init": "random", "missing": str(tmp_path / "nope.ckpt")},
                                        train_cfg, tmp_path, ks=(1, 5, 20), linear_epochs=5)
    _check_docs(docs)  # the missing checkpoint is reported and skipped
    assert "fallback" in docs[0]["notes"][0]


def test_report_goes_to_an_offline_wandb_run(train_cfg, tmp_path, monkeypatch):
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setenv("WANDB_MODE", "offline")
    docs = [{"kind": "knn", "metrics": {"top1": 12.5}, "checkpoint": {"label": "x"}}]
    fig = tmp_path / "f.png"
    eval_report.accuracy_vs_k_figure(docs).savefig(fig)
    run_dir = reports.log_report_to_wandb(docs, {"f": fig}, "| t |", tmp_path)
    assert run_dir and run_dir.startswith(str(tmp_path)) and list((tmp_path / "wandb").glob("offline-run-*"))

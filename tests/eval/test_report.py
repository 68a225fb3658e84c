"""Reports: W&B offline run holds the summary metrics (read back with wandb's protobuf records), files parse,
the compare table puts a trained checkpoint next to random init, and wandb is optional."""

import builtins
import json
import sys

from scfs.eval.compare import compare_table, find_runs, load_run
from scfs.eval.compare import main as compare_main
from scfs.eval.knn import run_knn
from scfs.eval.linear import run_linear
from scfs.eval.report import find_wandb_file, read_wandb_records, read_wandb_summary


def test_wandb_offline_run_holds_summary_metrics(tiny_ckpt, tmp_path, eval_cfg):
    doc = run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}", "logger.wandb=true"), tmp_path)
    assert doc["wandb_dir"] and doc["wandb_dir"].startswith(str(tmp_path))
    wandb_file = find_wandb_file(tmp_path)
    kinds = {rec.WhichOneof("record_type") for rec in read_wandb_records(wandb_file)}
    assert {"run", "config", "summary", "history"} <= kinds
    summary = read_wandb_summary(tmp_path)
    for key, value in doc["metrics"].items():
        assert summary[f"knn/{key}"] == value
    assert summary["checkpoint_id"] == doc["checkpoint"]["id"]
    assert summary["knn/per_class._type"] == "table-file" and summary["knn/confusion._type"] == "image-file"
    assert (tmp_path / "wandb_files").is_dir()  # W&B's cache/config/data folders stay in the run dir


def test_compare_trained_vs_random_init(tiny_ckpt, tmp_path, eval_cfg, capsys):
    run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}", "label=trained"), tmp_path / "knn-trained")
    run_knn(eval_cfg("knn", "ckpt=random"), tmp_path / "knn-random")
    run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "fast=true", "probe.epochs=2", "label=trained"),
               tmp_path / "linear-trained")
    docs = [load_run(p) for p in find_runs([str(tmp_path / "knn-*"), str(tmp_path / "linear-trained")])]
    table = compare_table(docs)
    lines = table.splitlines()
    assert lines[0].startswith("| metric | ") and "trained" in lines[0] and "random init (resnet18)" in lines[0]
    assert len(lines[0].split("|")) == 5  # metric + 2 columns: the linear run joins the trained column
    assert any(line.startswith("| knn top-1 (k=20) |") for line in lines)
    linear_row = next(line for line in lines if line.startswith("| linear (fast) top-1 |"))
    assert "| - |" in linear_row and "**" not in linear_row  # random init has no linear run; nothing to rank
    out = tmp_path / "table.md"
    capsys.readouterr()
    compare_main([str(tmp_path / "knn-trained"), str(tmp_path / "knn-random"), "--all", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "knn top-1 k=200" in printed and out.read_text().strip() == printed.strip()


def test_works_without_wandb(tiny_ckpt, tmp_path, eval_cfg, monkeypatch, caplog):
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_wandb)
    doc = run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}", "logger.wandb=true"), tmp_path)
    assert doc["wandb_dir"] is None and "wandb is not installed" in caplog.text
    assert json.loads((tmp_path / "metrics.json").read_text())["metrics"] == doc["metrics"]

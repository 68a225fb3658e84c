"""kNN: faiss result == brute-force torch protocol; feature cache reuse and invalidation; the CLI run end to end."""

import json

import pytest
import torch
import torch.nn.functional as F

from scfs.eval.features import cached_features, dataset_key
from scfs.eval.knn import knn_accuracy, knn_evaluate, knn_predict_scores, knn_search, run_knn
from scfs.models import Backbone
from scfs.models.checkpoint import safe_load


def _brute_force(train, train_y, test, k, T, C):
    sims = test @ train.T
    top = sims.topk(k, dim=1)
    votes = torch.zeros(test.shape[0], C).scatter_add_(1, train_y[top.indices], (top.values / T).exp())
    return top.values, top.indices, votes


@pytest.mark.parametrize("k", [1, 10, 20, 100, 200])
def test_faiss_knn_equals_brute_force(k):
    g = torch.Generator().manual_seed(k)
    train = F.normalize(torch.randn(600, 48, generator=g), dim=1)
    test = F.normalize(torch.randn(150, 48, generator=g), dim=1)
    train_y = torch.randint(0, 13, (600,), generator=g)
    sims, idx = knn_search(train, test, k)
    ref_sims, ref_idx, ref_votes = _brute_force(train, train_y, test, k, 0.07, 13)
    assert torch.equal(idx, ref_idx)  # exact same neighbours, same order
    torch.testing.assert_close(sims, ref_sims, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(knn_predict_scores(train, train_y, test, k, 0.07, 13), ref_votes, rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("k", [1, 20, 200])
def test_torch_search_equals_faiss(k):
    """backend="torch" (what a machine with faiss-cpu and a GPU uses) finds the same neighbours, in the same order,
    as faiss; small query chunks exercise the chunking."""
    from scfs.eval.knn import _torch_search

    g = torch.Generator().manual_seed(100 + k)
    train = F.normalize(torch.randn(700, 40, generator=g), dim=1)
    test = F.normalize(torch.randn(130, 40, generator=g), dim=1)
    f_sims, f_idx = knn_search(train, test, k, backend="faiss")
    t_sims, t_idx = knn_search(train, test, k, backend="torch")
    assert torch.equal(t_idx, f_idx)
    torch.testing.assert_close(t_sims, f_sims, rtol=1e-5, atol=1e-6)
    c_sims, c_idx = _torch_search(train, test, k, chunk_bytes=4 * 700 * 7)  # 7 queries per chunk
    assert torch.equal(c_idx, f_idx) and torch.equal(c_sims, t_sims)
    with pytest.raises(ValueError, match="allowed are auto, faiss, torch"):
        knn_search(train, test, k, backend="gpu")


@pytest.mark.parametrize("setting", ["none", "tf32", "ieee"])
def test_the_torch_search_leaves_the_matmul_precision_exactly_as_it_was(setting):
    """The search runs without TF32 and puts the process's setting back exactly: `fp32_precision` is part of
    inductor's cache keys, so a kNN before the first compile must not make the run's keys differ from a fresh
    process's (the background child's and the parallel helper's)."""
    from scfs.eval.knn import _torch_search

    matmul = torch.backends.cuda.matmul
    was = matmul.fp32_precision
    try:
        matmul.fp32_precision = setting
        x = F.normalize(torch.randn(50, 8), dim=1)
        _torch_search(x, x[:5], 3)
        assert matmul.fp32_precision == setting
    finally:
        matmul.fp32_precision = was


@pytest.mark.parametrize("setting", ["none", "tf32"])
def test_ieee_matmuls_turns_tf32_off_inside_and_puts_the_setting_back(setting):
    from scfs.eval.knn import ieee_matmuls

    matmul = torch.backends.cuda.matmul
    was = matmul.fp32_precision
    try:
        matmul.fp32_precision = setting
        with ieee_matmuls():
            assert matmul.fp32_precision == "ieee" and not matmul.allow_tf32
        assert matmul.fp32_precision == setting
        with pytest.raises(RuntimeError, match="inside"), ieee_matmuls():
            raise RuntimeError("inside")
        assert matmul.fp32_precision == setting
    finally:
        matmul.fp32_precision = was


def test_accuracies_for_all_k_from_one_search_match_brute_force():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(8, 32, generator=g)
    train_y, test_y = torch.randint(0, 8, (400,), generator=g), torch.randint(0, 8, (100,), generator=g)
    train = F.normalize(centers[train_y] + 1.5 * torch.randn(400, 32, generator=g), dim=1)
    test = F.normalize(centers[test_y] + 1.5 * torch.randn(100, 32, generator=g), dim=1)
    ks = [10, 20, 100, 200]
    res = knn_evaluate(train, train_y, test, test_y, ks, 0.07, 8, report_k=20)
    for k in ks:
        votes = _brute_force(train, train_y, test, k, 0.07, 8)[2]
        top = votes.topk(5, dim=1).indices
        assert res.metrics[f"top1_k{k}"] == pytest.approx(100.0 * (top[:, 0] == test_y).double().mean().item())
        top5 = (top == test_y[:, None]).any(1).double().mean().item()
        assert res.metrics[f"top5_k{k}"] == pytest.approx(100.0 * top5)
    assert [r["k"] for r in res.curve] == ks and res.report_k == 20 and res.scores.shape == (100, 8)
    assert knn_accuracy(train, train_y, test, test_y, ks, 0.07) == res.metrics  # the signature train.py uses
    assert 30 < res.metrics["top1_k20"] <= 100  # separable enough to be a meaningful check


class _Images(torch.utils.data.Dataset):
    transform = "identity"

    def __init__(self, n=20):
        self.x = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 3


def _count_forwards(monkeypatch) -> list:
    calls = []
    orig = Backbone.forward

    def counting(self, x):
        calls.append(x.shape[0])
        return orig(self, x)

    monkeypatch.setattr(Backbone, "forward", counting)
    return calls


def test_feature_cache_is_reused_and_keyed(tmp_path, monkeypatch):
    calls = _count_forwards(monkeypatch)
    b = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 8, 8, 16))
    ds = _Images()
    key = dataset_key({"name": "synthetic", "root": str(tmp_path)}, "train", ds)
    first = cached_features(b, ds, model_id="ckpt-a", data_key=key, cache_dir=tmp_path, batch_size=8)
    assert not first.from_cache and sum(calls) == 20 and first.features.shape == (20, 16)
    calls.clear()
    again = cached_features(b, ds, model_id="ckpt-a", data_key=key, cache_dir=tmp_path, batch_size=8)
    assert again.from_cache and calls == [] and torch.equal(again.features, first.features)
    assert torch.equal(again.labels, first.labels)
    other_split = dataset_key({"name": "synthetic", "root": str(tmp_path)}, "val", ds)
    cached_features(b, ds, model_id="ckpt-a", data_key=other_split, cache_dir=tmp_path, batch_size=8)
    cached_features(b, ds, model_id="ckpt-b", data_key=key, cache_dir=tmp_path, batch_size=8)
    assert sum(calls) == 40  # another split and another model id are both recomputed


def test_cli_run_reuses_cache_and_invalidates_on_new_checkpoint(tmp_path, monkeypatch, eval_cfg):
    """A changed checkpoint file (same path!) must not read the old features: the key is the content hash."""
    calls = _count_forwards(monkeypatch)
    torch.manual_seed(0)
    body = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1),
                    channels=(8, 16, 16, 32)).body
    ckpt = tmp_path / "weights.pth"
    torch.save(body.state_dict(), ckpt)
    cfg = eval_cfg("knn", f"ckpt={ckpt}", "ks=[5,10]", "report_k=5")
    first = run_knn(cfg, tmp_path / "r1")
    assert sum(calls) == 48 + 24
    calls.clear()
    second = run_knn(cfg, tmp_path / "r2")
    assert calls == [] and second["metrics"] == first["metrics"]  # no forward pass at all
    assert "read from the cache" in " ".join(second["notes"])
    with torch.no_grad():
        for p in body.parameters():
            p.add_(0.1)
    torch.save(body.state_dict(), ckpt)
    third = run_knn(cfg, tmp_path / "r3")
    assert sum(calls) == 48 + 24 and third["checkpoint"]["id"] != first["checkpoint"]["id"]


def test_knn_cli_on_real_checkpoint_writes_report(tiny_ckpt, tmp_path, eval_cfg):
    raw = safe_load(tiny_ckpt)  # a real Lightning checkpoint loads with weights_only=True
    assert "state_dict" in raw and raw["hyper_parameters"]["backbone"]["channels"]
    doc = run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}", "label=trained"), tmp_path)
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk["metrics"] == doc["metrics"] and on_disk["kind"] == "knn"
    assert on_disk["checkpoint"]["format"] == "scfs-lightning" and on_disk["checkpoint"]["which"] == "teacher"
    assert set(on_disk["metrics"]) >= {"top1", "top5", "top1_k10", "top5_k200"}
    assert [r["k"] for r in on_disk["knn_curve"]] == [10, 20, 100, 200]
    assert sum(r["n"] for r in on_disk["per_class"]) == 24 and len(on_disk["confusion"]) == 10
    report = (tmp_path / "report.md").read_text()
    assert "| top1 |" in report and "kNN accuracy vs k" in report and "Per-class accuracy" in report
    for name in ("confusion.png", "per_class.png", "knn_vs_k.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    student = run_knn(eval_cfg("knn", f"ckpt={tiny_ckpt}", "which=student"), tmp_path / "student")
    assert student["checkpoint"]["which"] == "student"


@pytest.mark.parametrize(("module", "args", "code", "expected"), [
    ("knn", [], 2, "config error: ckpt=... is required"),
    ("knn", ["ckpt={tmp}"], 1, "is a folder, not a checkpoint file"),
    ("knn", ["ckpt={tmp}/nope.ckpt"], 1, "nope.ckpt does not exist"),
    ("knn", ["ckpt={tmp}/junk.ckpt"], 1, "is not a readable PyTorch checkpoint"),
    ("knn", ["ckpt=random", "which=middle"], 2, "config key which='middle' is invalid"),
    ("knn", ["ckpt=random", "dataa=cifar10"], 2, "Could not override 'dataa'"),
    ("linear", ["ckpt={tmp}/r50.pth", "fast=true"], 1, "backbone=resnet50"),
    ("detect", ["ckpt=random", "model.arch=yolo"], 2, "config key model.arch='yolo' is invalid"),
], ids=["no-ckpt", "ckpt-folder", "ckpt-missing", "ckpt-junk", "which", "typo-key", "other-backbone", "det-arch"])
def test_eval_cli_user_mistakes_fail_in_one_line(tmp_path, module, args, code, expected):
    """The eval CLIs printed Hydra's report with a traceback for every one of these."""
    import subprocess
    import sys

    import timm

    (tmp_path / "junk.ckpt").write_bytes(bytes(range(256)) * 8)
    if module == "linear":
        torch.save(timm.create_model("resnet50").state_dict(), tmp_path / "r50.pth")
    env = {**__import__("os").environ, "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    p = subprocess.run([sys.executable, "-m", f"scfs.eval.{module}", *(a.format(tmp=tmp_path) for a in args),
                        "logger.wandb=false", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == code, p.stderr[-2000:]
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"scfs.eval.{module}: "), p.stderr
    assert expected in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_a_config_error():
    from scfs.config import ConfigError
    from scfs.eval.common import resolve_device

    with pytest.raises(ConfigError, match="torch sees no CUDA GPU.*device=cpu"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("value", ["abc", [10, "x"], [], 0, [20, -1], True])
def test_bad_ks_is_a_config_error_before_any_feature(value):
    from scfs.config import ConfigError
    from scfs.eval.knn import parse_ks

    with pytest.raises(ConfigError, match="config key ks=.* is invalid: expected positive integers"):
        parse_ks(value)


def test_ks_accepts_one_int_or_a_list():
    from omegaconf import OmegaConf

    from scfs.eval.knn import parse_ks

    assert parse_ks(20) == [20] and parse_ks(OmegaConf.create({"ks": [10, 200]}).ks) == [10, 200]


def test_auto_backend_uses_the_gpu_only_when_the_bank_fits(monkeypatch):
    """auto: faiss-cpu machines with a GPU search there only when the bank and a 1 GiB block fit in a quarter of
    the free memory; otherwise faiss on the CPU (an ImageNet bank is 10 GiB)."""
    import scfs.eval.knn as knn

    used: list[str] = []
    monkeypatch.setattr(knn, "_gpu_faiss", lambda: False)
    monkeypatch.setattr(knn.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(knn, "_torch_search", lambda tr, te, k: used.append("torch") or knn.knn_search(
        tr, te, k, backend="faiss"))
    train, test = F.normalize(torch.randn(50, 8), dim=1), F.normalize(torch.randn(5, 8), dim=1)
    monkeypatch.setattr(knn.torch.cuda, "mem_get_info", lambda: (80 << 30, 80 << 30))
    knn.knn_search(train, test, 3)
    monkeypatch.setattr(knn.torch.cuda, "mem_get_info", lambda: (2 << 30, 80 << 30))
    knn.knn_search(train, test, 3)
    assert used == ["torch"]

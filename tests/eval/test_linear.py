"""Linear probe: heads, the batched grid, the CLI's fast and full paths and its report."""

import json

import pytest
import torch

from scfs.eval.linear import GridSGD, LinearProbe, probe_scores, run_linear, train_linear_on_features
from scfs.eval.report import topk_accuracy
from scfs.models import Backbone


def _separable(n, gen, centers):
    y = torch.randint(0, centers.shape[0], (n,), generator=gen)
    return centers[y] + 0.5 * torch.randn(n, centers.shape[1], generator=gen), y


def test_fast_probe_reaches_99_percent_on_separable_data():
    gen = torch.Generator().manual_seed(0)
    centers = 3.0 * torch.randn(10, 32, generator=gen)
    (xtr, ytr), (xva, yva) = _separable(2048, gen, centers), _separable(512, gen, centers)
    # DINO's ViT defaults (SGD 0.9, lr 0.001 x 256/256, no wd, cosine, raw features), fewer epochs for the test
    probe = train_linear_on_features(xtr, ytr, 10, epochs=20, batch_size=256)
    acc = topk_accuracy(probe_scores(probe, xva), yva)
    assert acc["top1"] >= 99.0 and acc["top5"] == 100.0


def test_probe_keeps_backbone_frozen_in_eval_mode():
    b = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 8, 8, 16))
    probe = LinearProbe(16, 3, b, feature_norm="bn")
    probe.train()
    assert not b.training and all(not p.requires_grad for p in b.parameters())
    before = b.body.bn1.running_mean.clone()
    loss = probe.training_step((torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])), 0)
    loss.backward()
    assert torch.equal(b.body.bn1.running_mean, before) and probe.heads.weight.grad is not None


def test_grid_shares_one_backbone_forward():
    """The full protocol's sweep: G heads, one backbone forward per batch, each head its own logits."""
    b = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 8, 8, 16))
    calls = []
    pooled = b.pooled
    b.pooled = lambda x: calls.append(x.shape[0]) or pooled(x)
    probe = LinearProbe(16, 3, b, lr=[0.01, 0.1, 1.0], weight_decay=[0.0, 0.0, 1e-4])
    logits = probe(torch.randn(4, 3, 32, 32))
    assert logits.shape == (3, 4, 3) and calls == [4]


def test_grid_training_equals_independent_probes():
    """Each grid member follows exactly the trajectory of a single probe with its lr / weight decay (GridSGD is
    torch's SGD per member; the loss sums members' mean losses)."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(300, 12, generator=gen), torch.randint(0, 4, (300,), generator=gen)
    lrs, wds = [0.01, 0.3, 0.3], [0.0, 0.0, 1e-2]
    kw = dict(epochs=3, batch_size=64, seed=5, feature_norm="bn")
    grid = train_linear_on_features(x, y, 4, lr=lrs, weight_decay=wds, **kw)
    for g, (lr, wd) in enumerate(zip(lrs, wds, strict=True)):
        single = train_linear_on_features(x, y, 4, lr=lr, weight_decay=wd, **kw)
        torch.testing.assert_close(grid.heads.weight[g], single.heads.weight[0], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(probe_scores(grid, x, member=g), probe_scores(single, x), rtol=1e-4, atol=1e-5)


def test_grid_sgd_matches_torch_sgd():
    torch.manual_seed(0)
    w0 = torch.randn(2, 3, 5)
    a, b = torch.nn.Parameter(w0.clone()), [torch.nn.Parameter(w0[i].clone()) for i in range(2)]
    lrs, wds = [0.1, 0.5], [0.0, 0.01]
    opt = GridSGD([a], lrs, wds, 0.9)
    refs = [torch.optim.SGD([b[i]], lr=lrs[i], momentum=0.9, weight_decay=wds[i]) for i in range(2)]
    for _ in range(4):
        g = torch.randn(2, 3, 5)
        a.grad = g.clone()
        opt.step()
        for i in range(2):
            b[i].grad = g[i].clone()
            refs[i].step()
    for i in range(2):
        torch.testing.assert_close(a.data[i], b[i].data)


@pytest.mark.parametrize("norm", ["none", "bn", "l2"])
def test_exported_head_is_the_probe(norm):
    """linear_head.pt's weight / bias reproduce the probe's logits: BatchNorm statistics are folded in."""
    gen = torch.Generator().manual_seed(2)
    x, y = 3.0 + 2.0 * torch.randn(200, 8, generator=gen), torch.randint(0, 3, (200,), generator=gen)
    probe = train_linear_on_features(x, y, 3, epochs=2, batch_size=50, lr=0.1, feature_norm=norm)
    head = probe.export_head(0)
    inp = torch.nn.functional.normalize(x, dim=1) if head["feature_norm"] == "l2" else x
    torch.testing.assert_close(inp @ head["weight"].T + head["bias"], probe_scores(probe, x), rtol=1e-4, atol=1e-4)
    assert head["feature_norm"] == ("l2" if norm == "l2" else "none")


def test_linear_cli_fast_and_full(tiny_ckpt, tmp_path, eval_cfg):
    fast = run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "fast=true", "probe.epochs=3"), tmp_path / "fast")
    doc = json.loads((tmp_path / "fast" / "metrics.json").read_text())
    assert doc["kind"] == "linear" and doc["metrics"] == fast["metrics"] and set(doc["metrics"]) == {"top1", "top5"}
    assert "fast path" in " ".join(doc["notes"]) and (tmp_path / "fast" / "linear_head.pt").is_file()
    pr = doc["probe"]
    assert pr["selection"] == "held-out sweep" and len(pr["sweep"]) == 7 * 3 and pr["feature_norm"] == "bn"
    best = pr["sweep"][pr["chosen_index"]]
    assert (pr["lr"], pr["weight_decay"]) == (best["lr"], best["weight_decay"])
    assert best["holdout_top1"] == max(r["holdout_top1"] for r in pr["sweep"])
    assert pr["n_fit"] + pr["n_holdout"] == doc["data"]["n_train"] and pr["n_holdout"] == round(0.1 * 48)
    report = (tmp_path / "fast" / "report.md").read_text()
    assert "## Learning-rate / weight-decay sweep" in report and "**chosen**" in report
    head = torch.load(tmp_path / "fast" / "linear_head.pt", weights_only=True)
    assert head["lr"] == pr["lr"] and head["feature_norm"] == "none"  # bn folded in: a plain linear layer

    full = run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "probe.epochs=1", "probe.batch_size=16",
                               "probe.val_every_n_epochs=1", "probe.lr_grid=[0.01,1.0]", "probe.weight_decay=0"),
                      tmp_path / "full")
    assert "full protocol" in " ".join(full["notes"]) and 0 <= full["metrics"]["top1"] <= 100
    assert "RandomResizedCropFlip" in " ".join(full["notes"])
    assert [(r["lr"], r["weight_decay"]) for r in full["probe"]["sweep"]] == [(0.01, 0.0), (1.0, 0.0)]
    assert full["probe"]["wd_mode"] == "fixed" and full["timings"]["sweep_s"] > 0


def test_linear_cli_fixed_lr_has_no_sweep(tiny_ckpt, tmp_path, eval_cfg):
    doc = run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "fast=true", "probe.epochs=2", "probe.lr=0.03",
                              "probe.weight_decay=0", "probe.feature_norm=none", "logger.wandb=true"), tmp_path)
    pr = doc["probe"]
    assert pr["selection"] == "fixed" and pr["sweep"] == [] and pr["lr"] == 0.03 and "n_holdout" not in pr
    assert "## Learning-rate" not in (tmp_path / "report.md").read_text()
    from scfs.eval.report import read_wandb_summary

    summary = read_wandb_summary(tmp_path)
    assert summary["linear/lr"] == 0.03 and summary["linear/selection"] == "fixed"
    assert summary["linear/top1"] == doc["metrics"]["top1"]

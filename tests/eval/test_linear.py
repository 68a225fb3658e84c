"""Linear probe: the DINO-protocol fast path separates a linearly separable problem; the CLI runs both paths."""

import json

import torch

from scfs.eval.linear import LinearProbe, probe_scores, run_linear, train_linear_on_features
from scfs.eval.report import topk_accuracy
from scfs.models import Backbone


def _separable(n, gen, centers):
    y = torch.randint(0, centers.shape[0], (n,), generator=gen)
    return centers[y] + 0.5 * torch.randn(n, centers.shape[1], generator=gen), y


def test_fast_probe_reaches_99_percent_on_separable_data():
    gen = torch.Generator().manual_seed(0)
    centers = 3.0 * torch.randn(10, 32, generator=gen)
    (xtr, ytr), (xva, yva) = _separable(2048, gen, centers), _separable(512, gen, centers)
    # DINO defaults (SGD 0.9, lr 0.001 x 256/256, no wd, cosine), fewer epochs for the test
    probe = train_linear_on_features(xtr, ytr, 10, epochs=20, batch_size=256)
    acc = topk_accuracy(probe_scores(probe, xva), yva)
    assert acc["top1"] >= 99.0 and acc["top5"] == 100.0


def test_probe_keeps_backbone_frozen_in_eval_mode():
    b = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 8, 8, 16))
    probe = LinearProbe(16, 3, b)
    probe.train()
    assert not b.training and all(not p.requires_grad for p in b.parameters())
    before = b.body.bn1.running_mean.clone()
    loss = probe.training_step((torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])), 0)
    loss.backward()
    assert torch.equal(b.body.bn1.running_mean, before) and probe.linear.weight.grad is not None


def test_linear_cli_fast_and_full(tiny_ckpt, tmp_path, eval_cfg):
    fast = run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "fast=true", "probe.epochs=3"), tmp_path / "fast")
    doc = json.loads((tmp_path / "fast" / "metrics.json").read_text())
    assert doc["kind"] == "linear" and doc["metrics"] == fast["metrics"] and set(doc["metrics"]) == {"top1", "top5"}
    assert "fast path" in " ".join(doc["notes"]) and (tmp_path / "fast" / "linear_head.pt").is_file()
    full = run_linear(eval_cfg("linear", f"ckpt={tiny_ckpt}", "probe.epochs=1", "probe.batch_size=16",
                               "probe.val_every_n_epochs=1"), tmp_path / "full")
    assert "full protocol" in " ".join(full["notes"]) and 0 <= full["metrics"]["top1"] <= 100
    assert "RandomResizedCropFlip" in " ".join(full["notes"])

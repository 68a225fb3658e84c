"""Weighted kNN classification (DINO protocol) on faiss.

Features are L2-normalised; the k nearest training features by cosine similarity vote for their class with
weight exp(sim / T). This is the protocol of DINO's `eval_knn.py`, with faiss doing the search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader


@torch.no_grad()
def extract_features(model: nn.Module, loader: DataLoader | Iterable, device: torch.device | str = "cpu",
                     progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `model` (image -> (B, D) feature) over `loader`; returns L2-normalised float32 features and labels."""
    was_training = model.training
    model.eval()
    feats, labels = [], []
    it = loader
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(loader, desc="features", leave=False)
    for x, y in it:
        f = model(x.to(device, non_blocking=True))
        feats.append(F.normalize(f.float(), dim=1).cpu())
        labels.append(torch.as_tensor(y).cpu())
    model.train(was_training)
    return torch.cat(feats), torch.cat(labels).long()


def knn_predict_scores(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                       k: int, temperature: float = 0.07, num_classes: int | None = None) -> torch.Tensor:
    """Class scores (n_test, num_classes): sum over the k nearest neighbours of exp(sim/T) one-hot(label)."""
    if k < 1:
        raise ValueError(f"k={k}: must be >= 1")
    num_classes = int(num_classes or int(train_labels.max()) + 1)
    k = min(k, train_feats.shape[0])
    index = faiss.IndexFlatIP(train_feats.shape[1])
    index.add(np.ascontiguousarray(train_feats.float().numpy()))
    sims, idx = index.search(np.ascontiguousarray(test_feats.float().numpy()), k)
    sims, idx = torch.from_numpy(sims), torch.from_numpy(idx)
    votes = torch.zeros(test_feats.shape[0], num_classes)
    votes.scatter_add_(1, train_labels[idx], (sims / temperature).exp())
    return votes


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, ks: Sequence[int] = (20,), temperature: float = 0.07,
                 num_classes: int | None = None) -> dict[str, float]:
    """Top-1 (and top-5 when there are more than 5 classes) accuracy in percent for each k."""
    num_classes = int(num_classes or int(max(train_labels.max(), test_labels.max())) + 1)
    out: dict[str, float] = {}
    for k in ks:
        scores = knn_predict_scores(train_feats, train_labels, test_feats, k, temperature, num_classes)
        top = scores.topk(min(5, num_classes), dim=1).indices
        out[f"top1_k{k}"] = 100.0 * (top[:, 0] == test_labels).float().mean().item()
        if num_classes > 5:
            out[f"top5_k{k}"] = 100.0 * (top == test_labels[:, None]).any(1).float().mean().item()
    return out


def evaluate_backbone_knn(backbone: nn.Module, bank_loader: DataLoader, query_loader: DataLoader,
                          ks: Sequence[int] = (20,), temperature: float = 0.07,
                          device: torch.device | str = "cpu") -> dict[str, float]:
    """kNN accuracy of a backbone's pooled feature (`backbone.pooled`) from two loaders."""
    model = _Pooled(backbone)
    tr_f, tr_y = extract_features(model, bank_loader, device)
    te_f, te_y = extract_features(model, query_loader, device)
    return knn_accuracy(tr_f, tr_y, te_f, te_y, ks, temperature)


class _Pooled(nn.Module):
    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone.pooled(x)

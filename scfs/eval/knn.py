"""Weighted kNN classification (DINO protocol) on faiss.

Features are L2-normalised; the k nearest training features by cosine similarity vote for their class with
weight exp(sim / T). This is the protocol of DINO's `eval_knn.py`, with faiss doing the search.

CLI: `python -m scfs.eval.knn ckpt=<path|random> [data=cifar10] [which=student] [+experiment=imagenet]` (config
`conf/eval/knn.yaml`): features are extracted once per (checkpoint, dataset, transform) and cached on disk, then
top-1/top-5 for every k in `ks` are reported in `runs/eval/knn-<time>/` (report.md, metrics.json, figures, W&B).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader

from scfs.eval.features import extract_pooled


def _gpu_faiss() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def knn_search(train_feats: torch.Tensor, test_feats: torch.Tensor, k: int, use_gpu: bool | None = None,
               backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k nearest neighbours by inner product (= cosine for L2-normalised features).

    Returns (similarities, indices), both (n_test, k), most similar first, on the CPU. `backend`:
    * ``"faiss"``: faiss `IndexFlatIP`, on the GPU when GPU faiss is installed and a GPU is visible (`use_gpu=None`);
    * ``"torch"``: chunked matmul + topk on CUDA when a GPU is visible (else the CPU): the same exact search for
      machines with faiss-cpu and a GPU. Measured: a CIFAR-sized search (50k x 512 bank, 10k queries, k=200) takes
      8.9 s in faiss-cpu on 2 cores, while the features already sit next to an idle GPU;
    * ``"auto"``: GPU faiss if available, else torch on a visible GPU with room for the bank, else faiss on the CPU.
    """
    if k < 1:
        raise ValueError(f"k={k}: must be >= 1")
    if backend not in ("auto", "faiss", "torch"):
        raise ValueError(f"knn backend={backend!r}: allowed are auto, faiss, torch")
    k = min(k, train_feats.shape[0])
    gpu_faiss = _gpu_faiss() if use_gpu is None else use_gpu
    if backend == "torch" or (backend == "auto" and not gpu_faiss and _bank_fits_gpu(train_feats)):
        return _torch_search(train_feats, test_feats, k)
    index = faiss.IndexFlatIP(train_feats.shape[1])
    if gpu_faiss and k <= 2048:  # GPU faiss caps k at 2048
        res = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(res, torch.cuda.current_device() if torch.cuda.is_available() else 0, index)
    index.add(np.ascontiguousarray(train_feats.detach().float().cpu().numpy()))
    sims, idx = index.search(np.ascontiguousarray(test_feats.detach().float().cpu().numpy()), k)
    return torch.from_numpy(sims), torch.from_numpy(idx).long()


def _bank_fits_gpu(train_feats: torch.Tensor) -> bool:
    """A visible GPU with room for the float32 bank plus a 1 GiB similarity block in a quarter of its free memory
    (an ImageNet bank of 1.28M x 2048 is 10 GiB: on a small GPU faiss on the CPU is the safer choice)."""
    if not torch.cuda.is_available():
        return False
    free, _ = torch.cuda.mem_get_info()
    return 4 * train_feats.numel() + (1 << 30) < free // 4


@torch.no_grad()
def _torch_search(train_feats: torch.Tensor, test_feats: torch.Tensor, k: int,
                  chunk_bytes: int = 1 << 30) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact inner-product top-k with torch, query chunks sized so one similarity block stays near `chunk_bytes`;
    float32 throughout (no TF32: neighbour order must not depend on the matmul precision setting)."""
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    bank = train_feats.detach().to(dev, torch.float32)
    rows = max(1, chunk_bytes // (4 * bank.shape[0]))
    sims, idx = [], []
    with ieee_matmuls():
        for q in test_feats.detach().split(rows):
            s, i = (q.to(dev, torch.float32) @ bank.T).topk(k, dim=1)
            sims.append(s.cpu())
            idx.append(i.cpu())
    return torch.cat(sims), torch.cat(idx).long()


@contextlib.contextmanager
def ieee_matmuls() -> Iterator[None]:
    """float32 matmuls without TF32 inside, the process's setting exactly as it was after.

    Exactly: torch's `fp32_precision` is part of inductor's and AOTAutograd's cache keys, and saving and restoring
    the older `allow_tf32` flag turns its default "none" into "ieee". A run that evaluated kNN before its first
    compile would then compile under other keys than a fresh process: the `compile_background` child's and the
    `compile_parallel` helper's cache entries would all miss."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):  # a torch before the fp32_precision setting
        tf32 = matmul.allow_tf32
        matmul.allow_tf32 = False
        try:
            yield
        finally:
            matmul.allow_tf32 = tf32
        return
    before = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def knn_votes(sims: torch.Tensor, idx: torch.Tensor, train_labels: torch.Tensor, k: int, temperature: float,
              num_classes: int) -> torch.Tensor:
    """Class scores from the first `k` neighbours of a (sorted) search result: sum of exp(sim/T) per label."""
    sims, idx = sims[:, :k], idx[:, :k]
    votes = torch.zeros(sims.shape[0], num_classes)
    votes.scatter_add_(1, train_labels.cpu().long()[idx], (sims / temperature).exp())
    return votes


def knn_predict_scores(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                       k: int, temperature: float = 0.07, num_classes: int | None = None) -> torch.Tensor:
    """Class scores (n_test, num_classes): sum over the k nearest neighbours of exp(sim/T) one-hot(label)."""
    num_classes = int(num_classes or int(train_labels.max()) + 1)
    sims, idx = knn_search(train_feats, test_feats, k)
    return knn_votes(sims, idx, train_labels, k, temperature, num_classes)


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, ks: Sequence[int] = (20,), temperature: float = 0.07,
                 num_classes: int | None = None) -> dict[str, float]:
    """Top-1 (and top-5 when there are more than 5 classes) accuracy in percent for each k (one search, max k)."""
    return knn_evaluate(train_feats, train_labels, test_feats, test_labels, ks, temperature, num_classes).metrics


@dataclass
class KNNResult:
    """Accuracies for every k (`top1_k20`, `top5_k20`, ...), the curve over k, and the scores at `report_k`."""

    metrics: dict[str, float]
    curve: list[dict[str, float]]
    report_k: int
    scores: torch.Tensor



def parse_ks(value: Any) -> list[int]:
    """The `ks` setting as a list of positive ints (`ks=20` or `ks=[10,20]`); a clear config error otherwise."""
    from omegaconf import ListConfig

    from scfs.config import ConfigError

    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
    if not items or not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in items):
        raise ConfigError(f"config key ks={value!r} is invalid: expected positive integers, e.g. ks=20 or "
                          "ks=[10,20,100,200]")
    return [int(k) for k in items]

def knn_evaluate(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, ks: Sequence[int] = (10, 20, 100, 200), temperature: float = 0.07,
                 num_classes: int | None = None, report_k: int | None = None) -> KNNResult:
    """The DINO kNN protocol for several k from a single faiss search with the largest k.

    Features must already be L2-normalised (see `normalize`). Neighbour lists of a smaller k are prefixes of the
    largest k's (faiss returns them sorted), so the votes of every k are exact.
    """
    if not ks:
        raise ValueError("ks is empty: give at least one k")
    num_classes = int(num_classes or int(max(train_labels.max(), test_labels.max())) + 1)
    report_k = int(report_k if report_k is not None else (20 if 20 in ks else ks[0]))
    all_k = sorted({*map(int, ks), report_k})
    sims, idx = knn_search(train_feats, test_feats, max(all_k))
    test_labels = test_labels.cpu().long()
    metrics: dict[str, float] = {}
    curve: list[dict[str, float]] = []
    report_scores = torch.empty(0)
    for k in all_k:
        scores = knn_votes(sims, idx, train_labels, k, temperature, num_classes)
        top = scores.topk(min(5, num_classes), dim=1).indices
        row: dict[str, float] = {"k": k, "top1": 100.0 * (top[:, 0] == test_labels).double().mean().item()}
        if num_classes > 5:
            row["top5"] = 100.0 * (top == test_labels[:, None]).any(1).double().mean().item()
        if k in ks:
            curve.append(row)
            metrics.update({f"{m}_k{k}": v for m, v in row.items() if m != "k"})
        if k == report_k:
            report_scores = scores
    return KNNResult(metrics, curve, report_k, report_scores)


def normalize(features: torch.Tensor) -> torch.Tensor:
    """L2-normalise rows (cosine similarity = inner product)."""
    return F.normalize(features.float(), dim=1)


def evaluate_backbone_knn(backbone: nn.Module, bank_loader: DataLoader, query_loader: DataLoader,
                          ks: Sequence[int] = (20,), temperature: float = 0.07,
                          device: torch.device | str = "cpu", timings: dict[str, float] | None = None
                          ) -> dict[str, float]:
    """kNN accuracy of a backbone's pooled feature (`backbone.pooled`) from two loaders. `timings`, when given,
    receives the seconds of each part (bank and query features, search and votes): where a slow pass goes."""
    t0 = time.perf_counter()
    tr_f, tr_y = extract_pooled(backbone, bank_loader, device, l2=True)
    t1 = time.perf_counter()
    te_f, te_y = extract_pooled(backbone, query_loader, device, l2=True)
    t2 = time.perf_counter()
    acc = knn_accuracy(tr_f, tr_y, te_f, te_y, ks, temperature)
    if timings is not None:
        timings.update(bank_s=t1 - t0, query_s=t2 - t1, search_s=time.perf_counter() - t2)
    return acc


# ---- CLI: python -m scfs.eval.knn ckpt=... --------------------------------------------------------------------
def run_knn(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """kNN evaluation of `cfg.ckpt` on `cfg.data` (train split = memory bank, val split = queries); writes the
    report into `run_dir` and returns the metrics document (also `<run_dir>/metrics.json`)."""
    from scfs.eval.common import (
        class_names,
        eval_backbone_and_splits,
        make_run_dir,
        resolve_device,
        split_features,
        to_plain,
    )
    from scfs.eval.report import EvalLogger, EvalResult, confusion_matrix
    from scfs.reliability import scrub

    t0 = time.time()
    ks = parse_ks(cfg.ks)  # before any feature is computed
    run_dir = make_run_dir(cfg, run_dir)
    device = resolve_device(cfg.get("device"))
    backbone, info, tf, sets = eval_backbone_and_splits(cfg, device)
    t_load = time.time()
    feats = {split: split_features(cfg, backbone, info, split, ds, device) for split, ds in sets.items()}
    t_feat = time.time()
    tr, va = feats["train"], feats["val"]
    num_classes = int(getattr(sets["train"], "num_classes", 0) or int(max(tr.labels.max(), va.labels.max())) + 1)
    res = knn_evaluate(normalize(tr.features), tr.labels, normalize(va.features), va.labels, ks,
                       float(cfg.temperature), num_classes, cfg.get("report_k"))
    t_knn = time.time()
    k = res.report_k
    metrics = {"top1": res.metrics.get(f"top1_k{k}"), **({"top5": res.metrics[f"top5_k{k}"]}
                                                           if f"top5_k{k}" in res.metrics else {}), **res.metrics}
    cached = all(f.from_cache for f in feats.values())
    result = EvalResult(
        kind="knn", metrics={m: float(v) for m, v in metrics.items() if v is not None}, checkpoint=info.as_dict(),
        data={"name": cfg.data.name, "root": str(cfg.data.get("root")), "n_train": len(sets["train"]),
              "n_val": len(sets["val"]), "num_classes": num_classes, "transform": repr(tf)},
        class_names=class_names(sets["train"], num_classes),
        confusion=confusion_matrix(res.scores.argmax(1), va.labels, num_classes),
        config=scrub(to_plain(cfg)), knn_curve=res.curve, extra={"report_k": k},
        timings={"load_s": t_load - t0, "features_s": t_feat - t_load, "knn_s": t_knn - t_feat},
        notes=[f"protocol: DINO weighted kNN, L2-normalised pooled {info.which} features, cosine similarity, "
               f"T={cfg.temperature}, ks={ks}; top1/top5 at k={k}",
               f"features {'read from the cache' if cached else 'extracted'} ({cfg.get('feature_cache')})"])
    with EvalLogger(run_dir, to_plain(cfg.get("logger")), f"knn-{info.label}", result.config) as elog:
        result.timings["total_s"] = time.time() - t0
        doc = elog.write(result)
    doc["run_dir"] = str(run_dir)
    print(summary_line(doc), flush=True)
    return doc


def summary_line(doc: dict[str, Any]) -> str:
    """One line for the terminal: the headline numbers and where the report is."""
    from scfs.eval.common import headline, report_tail

    per_k = ", ".join(f"{r['k']}: {r['top1']:.1f}" for r in doc.get("knn_curve") or [])
    return f"{headline(doc, 'kNN')} at k={doc.get('report_k')} (top-1 by k: {per_k}) | {report_tail(doc)}"


def main() -> None:
    """`python -m scfs.eval.knn ckpt=<path|random> [data=...] [which=student] [+experiment=imagenet]`."""
    from scfs.eval.common import hydra_cli

    hydra_cli("knn", run_knn)


if __name__ == "__main__":
    main()

"""Backbone features of a dataset, extracted once and cached on disk.

A linear probe on the fast path, a kNN sweep over k and a comparison of runs all need the same pooled features;
on ImageNet the forward pass is the expensive part, so the features are stored under a key made of the
checkpoint id (content hash), the dataset (config, split, size) and the transform (its repr). A changed
checkpoint, dataset or transform gives a new key, so a stale cache is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger("scfs.eval.features")


@dataclass
class FeatureSet:
    """Raw (not normalised) float32 pooled features (N, D), int64 labels (N,), and whether they came from disk."""

    features: torch.Tensor
    labels: torch.Tensor
    from_cache: bool = False
    path: Path | None = None


@torch.no_grad()
def extract_pooled(backbone: nn.Module, loader: DataLoader, device: torch.device | str = "cpu",
                   progress: bool = False, desc: str = "features",
                   l2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`backbone.pooled` over `loader` in eval mode: raw float32 features and labels, on the CPU. `l2`:
    L2-normalised on `device` first, as kNN compares them (cosine similarity).

    Runs eagerly even when the backbone (or its blocks) were compiled for training (`compile=true`): BatchNorm in
    eval mode, the evaluation batch size and a partial last batch each fail the training graphs' guards, so a
    compiled pass would make dynamo trace and inductor lower new graphs (and CUDA graph trees record them, in a
    memory pool of their own) for a pass that runs once every few epochs. The weights are the same either way;
    the compiled and eager features differ only by the kernels' float rounding."""
    was_training = backbone.training
    backbone.eval()
    feats, labels = [], []
    it: Any = loader
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(loader, desc=desc, leave=False, dynamic_ncols=True)
    try:
        with torch.compiler.set_stance("force_eager"):
            for x, y in it:
                f = backbone.pooled(x.to(device, non_blocking=True)).float()
                feats.append((F.normalize(f, dim=1) if l2 else f).cpu())
                labels.append(torch.as_tensor(y).cpu())
    finally:
        backbone.train(was_training)
    return torch.cat(feats), torch.cat(labels).long()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def dataset_key(data_cfg: Mapping[str, Any], split: str, dataset: Dataset) -> dict[str, Any]:
    """What identifies a dataset's features apart from the model: its config (root made absolute), split, size and
    transform."""
    cfg = _jsonable(dict(data_cfg))
    if cfg.get("root") is not None:
        cfg["root"] = str(Path(os.path.expanduser(str(cfg["root"]))).resolve())
    return {"data": cfg, "split": split, "n": len(dataset), "transform": repr(getattr(dataset, "transform", None))}


def cache_key(model_id: str, data_key: Mapping[str, Any]) -> str:
    """Hash of (model id, dataset key): the cache file name."""
    blob = json.dumps({"model": model_id, **_jsonable(dict(data_key))}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached_features(backbone: nn.Module, dataset: Dataset, *, model_id: str, data_key: Mapping[str, Any],
                    cache_dir: str | os.PathLike | None, device: torch.device | str = "cpu", batch_size: int = 256,
                    num_workers: int = 0, progress: bool = False, desc: str = "features") -> FeatureSet:
    """Features of `dataset` under `backbone`, read from `cache_dir` when this (model, data) was seen before.

    `model_id` must change whenever the weights do (we use the checkpoint's content hash); `cache_dir=None`
    disables the cache.
    """
    path = Path(cache_dir) / f"{cache_key(model_id, data_key)}.pt" if cache_dir else None
    if path is not None and path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            feats, labels = blob["features"], blob["labels"]
            if feats.shape[0] == labels.shape[0] == data_key.get("n", feats.shape[0]):
                log.info("features of %s (%s) read from cache %s", data_key.get("split"), model_id, path)
                return FeatureSet(feats, labels, True, path)
            log.warning("feature cache %s has the wrong size, recomputing", path)
        except Exception as err:  # a truncated or foreign file: recompute rather than fail the evaluation
            log.warning("feature cache %s is unreadable (%s), recomputing", path, err)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        pin_memory=torch.device(device).type == "cuda")
    feats, labels = extract_pooled(backbone, loader, device, progress, desc)
    if path is not None:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"features": feats, "labels": labels, "meta": json.dumps(
                {"model": model_id, **_jsonable(dict(data_key))})}, tmp)
            os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
            log.info("features of %s cached in %s", data_key.get("split"), path)
        except (OSError, RuntimeError) as err:  # a full or read-only cache folder must not cost the evaluation
            tmp.unlink(missing_ok=True)
            cause = err.__context__ if isinstance(err.__context__, OSError) else err  # torch's zip writer wraps it
            log.warning("could not write the feature cache %s (%s): the evaluation goes on without caching; free "
                        "space there or set feature_cache=<writable folder>", path, str(cause).splitlines()[0])
            path = None
    return FeatureSet(feats, labels, False, path)

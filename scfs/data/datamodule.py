"""LightningDataModule: multi-crop training batches plus the plain-view loaders that kNN evaluation uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


def _plain(v: Any) -> Any:
    """OmegaConf ListConfig -> tuple, so transforms get plain Python values."""
    if isinstance(v, str) or not hasattr(v, "__iter__") or isinstance(v, Mapping):
        return v
    return tuple(v)


class SSLDataModule(L.LightningDataModule):
    """Builds the training set and, for monitoring, train/val sets with the evaluation transform (`knn_loaders`).

    With `batch_aug=True` (fixed-size in-memory data: shapes, CIFAR-10) the training loader yields raw uint8
    image batches and the LightningModule makes all views of the batch at once on its device
    (`scfs.data.batch_aug.BatchMultiCrop`); otherwise every sample goes through the per-sample `MultiCrop`
    in the DataLoader workers.
    """

    def __init__(self, data: Mapping[str, Any], crops: Mapping[str, Any], batch_size: int, num_workers: int = 0,
                 eval_batch_size: int = 256, batch_aug: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.data_cfg = {k: _plain(v) for k, v in dict(data).items()}
        self.crops_cfg = {k: _plain(v) for k, v in dict(crops).items()}
        self.batch_size, self.num_workers, self.eval_batch_size = batch_size, num_workers, eval_batch_size
        self.batch_aug, self.seed = batch_aug, seed
        self.train_set: Dataset | None = None

    def _loader_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": torch.cuda.is_available()}
        if self.num_workers > 0:
            kw["persistent_workers"] = True
        return kw

    def setup(self, stage: str | None = None) -> None:
        from scfs.data.datasets import build_dataset
        from scfs.data.multicrop import MultiCrop

        if self.train_set is None:
            transform = None if self.batch_aug else MultiCrop(**self.crops_cfg)
            self.train_set = build_dataset(self.data_cfg, "train", transform)
            if len(self.train_set) < self.batch_size:
                raise ValueError(
                    f"batch_size={self.batch_size} is larger than the training set ({len(self.train_set)} images) "
                    "and every batch would be dropped: lower batch_size")

    def train_dataloader(self) -> DataLoader:
        self.setup()
        from scfs.data.samplers import EpochSeededRandomSampler

        sampler = EpochSeededRandomSampler(len(self.train_set), self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                          **self._loader_kwargs())

    def eval_transform(self):
        from scfs.data.multicrop import EvalTransform

        size = self.data_cfg.get("eval_size") or self.crops_cfg.get("global_size", 224)
        return EvalTransform(size, resize=self.data_cfg.get("eval_resize"))

    def knn_loaders(self) -> tuple[DataLoader, DataLoader]:
        """(memory bank = train split, queries = val split), both with the evaluation transform."""
        from scfs.data.datasets import build_dataset

        tf = self.eval_transform()
        bank, query = build_dataset(self.data_cfg, "train", tf), build_dataset(self.data_cfg, "val", tf)
        kw = {"batch_size": self.eval_batch_size, "shuffle": False, "num_workers": self.num_workers}
        return DataLoader(bank, **kw), DataLoader(query, **kw)

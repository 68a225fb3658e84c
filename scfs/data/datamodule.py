"""LightningDataModule: multi-crop training batches plus the plain-view loaders that kNN evaluation uses."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from scfs.data.epoch_spanning import EpochSpanningLoader
from scfs.names import DATA_DECODE

log = logging.getLogger("scfs.data")


def _plain(v: Any) -> Any:
    """OmegaConf ListConfig -> tuple, so transforms get plain Python values."""
    if isinstance(v, str) or not hasattr(v, "__iter__") or isinstance(v, Mapping):
        return v
    return tuple(v)


def crop_min_side(crops: Mapping[str, Any]) -> int:
    """Shortest image side at which every multi-crop view keeps its full resolution: side >= size / sqrt(min scale)
    for the global and (if any) the local crops; a smaller image makes the smallest crops upsample."""
    import math

    need = [crops.get("global_size", 224) / math.sqrt(crops.get("global_scale", (0.25, 1.0))[0])]
    if crops.get("n_local", 0):
        need.append(crops.get("local_size", 96) / math.sqrt(crops.get("local_scale", (0.05, 0.25))[0]))
    return math.ceil(max(need))


class SSLDataModule(L.LightningDataModule):
    """Builds the training set and, for monitoring, train/val sets with the evaluation transform (`knn_loaders`).

    With `batch_aug=True` (fixed-size in-memory data: shapes, CIFAR-10) the training loader yields raw uint8
    image batches and the LightningModule makes all views of the batch at once on its device
    (`scfs.data.batch_aug.BatchMultiCrop`); otherwise every sample goes through the per-sample `MultiCrop`
    in the DataLoader workers (workers persist across epochs, batches are pinned when training on CUDA).

    `on_device=True` (needs `batch_aug`) keeps the whole training split as one uint8 tensor on the training
    device and yields batches by indexing it (`DeviceBatchLoader`): no worker, pinning or host-to-device copy
    per step. Under DDP each rank trains on its slice of every global batch (`EpochSeededRandomSampler`), with
    either loader.

    `data.decode=gpu` (image folders of any image sizes) moves the JPEG decoding there too: workers only read
    the files' bytes and the module decodes the batch and makes its views on its device
    (`scfs.data.encoded`); `cpu` (the default) decodes in the workers.

    With workers, `prefetch_across_epochs=True` lets them run on into the next epoch
    (`scfs.data.epoch_spanning`): each epoch's first batch is ready when it starts instead of waiting for a
    worker to make it, which on short epochs is a few per cent of the run.
    """

    def __init__(self, data: Mapping[str, Any], crops: Mapping[str, Any], batch_size: int, num_workers: int = 0,
                 eval_batch_size: int = 256, batch_aug: bool = False, seed: int = 0, on_device: bool = False,
                 prefetch_across_epochs: bool = True) -> None:
        super().__init__()
        self.prefetch_across_epochs = prefetch_across_epochs
        self.data_cfg = {k: _plain(v) for k, v in dict(data).items()}
        self.crops_cfg = {k: _plain(v) for k, v in dict(crops).items()}
        self.batch_size, self.num_workers, self.eval_batch_size = batch_size, num_workers, eval_batch_size
        self.batch_aug, self.seed, self.on_device = batch_aug, seed, on_device
        if on_device and not batch_aug:
            raise ValueError("data.on_device=true needs data.batch_aug=true (fixed-size images whose views are made "
                             "on the device); per-sample multi-crop runs in DataLoader workers")
        # per-sample crops in the workers, colour on the device; with batch_aug every view is made on the device
        # anyway, so the flag has nothing left to do (e.g. +experiment=imagenet with data=shapes)
        self.decode = str(self.data_cfg.get("decode") or "cpu")
        if self.decode not in DATA_DECODE:
            raise ValueError(f"data.decode={self.decode!r}: expected one of {', '.join(DATA_DECODE)}")
        if self.decode == "gpu" and batch_aug:
            raise ValueError("data.decode=gpu decodes image files on the device and makes their views there; "
                             "data.batch_aug / data.on_device are for fixed-size in-memory images: set "
                             "data.batch_aug=false (and data.on_device=false) or data.decode=cpu")
        # with decode=gpu every view is made on the device from the decoded images: nothing left for the flag
        self.colour_on_device = (bool(self.data_cfg.get("colour_on_device", False)) and not batch_aug
                                 and self.decode == "cpu")
        self.train_set: Dataset | None = None
        self._device_data: tuple[torch.Tensor, torch.Tensor] | None = None
        self._eval_data: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _loader_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": torch.cuda.is_available()}
        if self.num_workers > 0:
            kw["persistent_workers"] = True
        return kw

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _device(self) -> torch.device:
        trainer = getattr(self, "trainer", None)
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def train_sampler(self):
        """This rank's sampler: same global permutation on every rank, a disjoint slice of each global batch."""
        from scfs.data.samplers import EpochSeededRandomSampler

        rank, world = self._rank_world()
        return EpochSeededRandomSampler(len(self.train_set), self.seed, batch_size=self.batch_size,
                                        num_replicas=world, rank=rank)

    def setup(self, stage: str | None = None) -> None:
        from scfs.data.datasets import build_dataset
        from scfs.data.multicrop import MultiCrop, MultiCropGeometry

        if self.train_set is not None:
            return
        if self.decode == "gpu":  # workers read bytes; the module decodes and makes the views on its device
            from scfs.data.datasets import ImageFileDataset
            from scfs.data.encoded import EncodedImageFiles

            files = build_dataset({**self.data_cfg, "decode_min_side": 0}, "train", None)
            if not isinstance(files, ImageFileDataset):
                raise ValueError(f"data.decode=gpu reads image files; data.name={self.data_cfg.get('name')} here is "
                                 f"held in memory ({type(files).__name__}): use data.decode=cpu")
            self.train_set = EncodedImageFiles.of(files)
        else:
            # colour_on_device: workers crop (uint8), the module flips, colours and normalises on its device
            crop_cls = MultiCropGeometry if self.colour_on_device else MultiCrop
            transform = None if self.batch_aug else crop_cls(**self.crops_cfg)
            cfg = {**self.data_cfg, "decode_min_side": self.train_decode_min_side()}
            self.train_set = build_dataset(cfg, "train", transform)
        if len(self.train_set) < self.batch_size:
            from scfs.config import ConfigError

            raise ConfigError(
                f"batch_size={self.batch_size} is larger than the training set ({len(self.train_set)} images) "
                "and every batch would be dropped: lower batch_size")

    def train_decode_min_side(self) -> int | None:
        """Shorter side that training crops need from an image file (`data.decode_min_side`: auto | 0 = off | N).

        auto: the per-sample multi-crop path decodes large JPEGs at a reduced scale that still gives every crop its
        full resolution: side >= size / sqrt(min scale) for the global and the local crops (224 px at scale 0.25
        -> 448). The batched paths (`batch_aug`) need images of one size, so they decode at full size; evaluation
        always does (the standard protocol's resize)."""
        v = self.data_cfg.get("decode_min_side", "auto")
        if self.batch_aug or self.decode == "gpu" or v in (0, "0", False):  # decode=gpu: nvJPEG decodes full size
            return None
        if v not in (None, "auto"):
            return int(v) if int(v) > 0 else None
        return crop_min_side(self.crops_cfg)

    def train_dataloader(self) -> DataLoader | DeviceBatchLoader:
        self.setup()
        sampler = self.train_sampler()
        if self.on_device:
            device = self._device()
            if self._device_data is None or self._device_data[0].device != device:
                images, labels = materialise(self.train_set, self.data_cfg, self.num_workers)
                self._device_data = (images.to(device), labels.to(device))
            return DeviceBatchLoader(*self._device_data, sampler, self.batch_size, dataset=self.train_set)
        kw = self._loader_kwargs()
        if self.decode == "gpu":
            from scfs.data.encoded import encoded_collate

            kw["collate_fn"] = encoded_collate(bool(self.data_cfg.get("strict", False)))
        loader = EpochSpanningLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, drop_last=True,
                                     **kw)
        if self.prefetch_across_epochs and self.num_workers > 0:
            self._span(loader)
        return loader

    def _span(self, loader: EpochSpanningLoader) -> None:
        """Let the workers run on across the epochs the trainer will run, when it runs whole epochs."""
        trainer = getattr(self, "trainer", None)
        last_epoch = None
        if trainer is not None:
            limit = trainer.limit_train_batches
            whole = limit >= len(loader) if isinstance(limit, int) else float(limit) >= 1.0
            if not whole:
                log.debug("train loader: each epoch stops at limit_train_batches=%s, so its workers stop with it",
                          limit)
                return
            max_epochs = trainer.max_epochs
            last_epoch = int(max_epochs) - 1 if isinstance(max_epochs, int) and max_epochs >= 0 else None
        why = loader.span_epochs(last_epoch)
        if why:
            log.debug("train loader: workers restart each epoch (%s)", why)

    def _eval_split(self, split: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A split as uint8 + labels on `device`, decoded once (and cached on disk for image folders)."""
        from scfs.data.datasets import build_dataset

        cached = self._eval_data.get(split)
        if cached is None or cached[0].device != device:
            if split == "train" and self._device_data is not None and self._device_data[0].device == device:
                cached = self._device_data
            elif cached is not None:
                cached = (cached[0].to(device), cached[1].to(device))
            else:
                imgs, labels = materialise(build_dataset(self.data_cfg, split, None), self.data_cfg, self.num_workers)
                cached = (imgs.to(device), labels.to(device))
            self._eval_data[split] = cached
        return cached

    def eval_transform(self):
        from scfs.data.multicrop import EvalTransform

        size = self.data_cfg.get("eval_size") or self.crops_cfg.get("global_size", 224)
        return EvalTransform(size, resize=self.data_cfg.get("eval_resize"))

    def knn_loaders(self) -> tuple[DataLoader | DeviceEvalBatches, DataLoader | DeviceEvalBatches]:
        """(memory bank = train split, queries = val split), both with the evaluation transform.

        With `on_device` and an evaluation view that is the image itself (eval size = image size, no resize, as
        CIFAR-10 and shapes), both splits are decoded once, kept as uint8 on the device and normalised per batch
        there (`DeviceEvalBatches`): a kNN evaluation then costs no JPEG decoding (30-40 s per CIFAR-10 kNN on
        the GPU machine otherwise). Same values as the DataLoader path (tests/data/test_on_device.py)."""
        from scfs.data.datasets import build_dataset

        tf = self.eval_transform()
        eval_cfg = {**self.data_cfg, "decode_min_side": 0}  # full-size decoding: the standard evaluation protocol
        if self.on_device and tf.resize == tf.size:
            device = self._device()
            splits = [self._eval_split(split, device) for split in ("train", "val")]
            if all(imgs.shape[-2:] == (tf.size, tf.size) for imgs, _ in splits):
                return tuple(DeviceEvalBatches(imgs, labels, self.eval_batch_size, tf.mean, tf.std)  # type: ignore
                             for imgs, labels in splits)
        bank, query = build_dataset(eval_cfg, "train", tf), build_dataset(eval_cfg, "val", tf)
        kw = {"batch_size": self.eval_batch_size, "shuffle": False, "num_workers": self.num_workers}
        return DataLoader(bank, **kw), DataLoader(query, **kw)


class DeviceEvalBatches:
    """`(normalised float images, labels)` batches of a uint8 split that lives on a device, in split order: the
    evaluation view `EvalTransform` gives when it neither resizes nor crops (x / 255 - mean) / std."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, mean: Any, std: Any) -> None:
        self.images, self.labels, self.batch_size = images, labels, int(batch_size)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(0, len(self.images), self.batch_size):
            x = self.images[i:i + self.batch_size].to(torch.float32) / 255.0
            yield (x - self.mean) / self.std, self.labels[i:i + self.batch_size]


class DeviceBatchLoader:
    """Batches of a uint8 (N,C,H,W) tensor that already lives on the training device: `(images, labels)`
    per step by `index_select` with this rank's indices (moved to the device once per epoch), so a step costs
    no worker, no pinning and no host-to-device copy, and never syncs the host.

    Same order as the DataLoader path for the same sampler. Carries `sampler` (Lightning calls its
    `set_epoch`) and the mid-epoch resume protocol of `scfs.training.checkpointing.ResumableDataLoader`
    (`batches_done`, `state_dict`, `load_state_dict`)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, sampler: Any, batch_size: int,
                 dataset: Dataset | None = None) -> None:
        self.images, self.labels, self.sampler, self.batch_size = images, labels, sampler, int(batch_size)
        self.dataset = dataset
        self.batches_done = 0
        self._pending: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        pending, self._pending = self._pending, None
        skip = int((pending or {}).get("batches", 0) or 0)
        if pending and pending.get("epoch") not in (None, self.sampler.epoch):
            skip = 0  # the checkpoint closed its epoch: this is a fresh one
        idx = self.sampler.indices().to(self.images.device, non_blocking=True)
        b = self.batch_size
        for k in range(skip, len(self)):
            sel = idx[k * b:(k + 1) * b]
            yield self.images.index_select(0, sel), self.labels.index_select(0, sel)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": int(self.sampler.epoch), "batches": int(self.batches_done), "batch_size": self.batch_size}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._pending = dict(state_dict)
        self.batches_done = int(state_dict.get("batches", 0) or 0)
        if state_dict.get("epoch") is not None:
            self.sampler.set_epoch(int(state_dict["epoch"]))


def materialise(dataset: Dataset, data_cfg: Mapping[str, Any], num_workers: int = 0) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """The whole split as (uint8 (N,C,H,W), int64 (N,)) CPU tensors, in dataset order.

    In-memory datasets are stacked directly; image files are decoded once (in `num_workers` processes) and
    cached under `<root>/.scfs_cache/` keyed by the file list, so later runs (and the other DDP ranks) load one
    file instead of decoding 50,000 JPEGs again."""
    import numpy as np

    from scfs.data.datasets import CIFAR10Batches, ImageFileDataset, ShapesDataset

    if isinstance(dataset, ShapesDataset):
        imgs = torch.from_numpy(np.ascontiguousarray(dataset.data.images)).permute(0, 3, 1, 2).contiguous()
        return imgs, torch.as_tensor(dataset.targets, dtype=torch.int64)
    if isinstance(dataset, CIFAR10Batches):
        imgs = torch.from_numpy(np.ascontiguousarray(dataset.base.data)).permute(0, 3, 1, 2).contiguous()
        return imgs, torch.as_tensor(dataset.targets, dtype=torch.int64)
    cache = None
    if isinstance(dataset, ImageFileDataset) and data_cfg.get("root"):
        key = hashlib.sha256("\n".join(f"{p}\t{y}" for p, y in dataset.samples).encode()).hexdigest()[:16]
        cache = Path(os.path.expanduser(str(data_cfg["root"]))) / ".scfs_cache" / f"uint8-{len(dataset)}-{key}.pt"
        if cache.is_file():
            d = torch.load(cache, weights_only=True)
            return d["images"], d["labels"]
    loader = DataLoader(dataset, batch_size=512, shuffle=False, num_workers=num_workers)
    try:
        parts = [(x, y) for x, y in loader]
    except RuntimeError as err:  # default_collate: "stack expects each tensor to be equal size"
        raise ValueError("data.on_device=true needs images of one size (e.g. CIFAR-10, shapes); this dataset has "
                         f"images of different sizes: {err}") from err
    imgs, labels = torch.cat([p[0] for p in parts]), torch.cat([torch.as_tensor(p[1]) for p in parts]).long()
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            torch.save({"images": imgs, "labels": labels}, tmp)
            os.replace(tmp, cache)  # atomic: concurrent DDP ranks never read a torn file
        except OSError as err:
            log.warning("could not cache the decoded training split at %s: %s", cache, err)
    return imgs, labels


def warm_cache(data_cfg: Mapping[str, Any], num_workers: int = 8) -> list[str]:
    """Decode the train and val splits of an image-folder dataset into `<root>/.scfs_cache/` once, before several
    runs start at the same time (each would otherwise decode 60,000 JPEGs on its own). Returns one line per split."""
    from scfs.data.datasets import build_dataset

    lines = []
    for split in ("train", "val"):
        cfg = {**dict(data_cfg), "decode_min_side": 0}
        imgs, labels = materialise(build_dataset(cfg, split, None), cfg, num_workers)
        lines.append(f"{split}: {tuple(imgs.shape)} uint8, {int(labels.max()) + 1} classes")
    return lines

"""Linear probe on a frozen backbone (DINO protocol), and a fast path on cached features.

DINO protocol (the default, `conf/eval/linear.yaml`): a linear layer (weights N(0, 0.01), bias 0) on the pooled
backbone feature, SGD momentum 0.9, no weight decay, lr = 0.001 x total batch / 256, cosine to 0 over 100 epochs;
training views RandomResizedCrop + horizontal flip, validation Resize + CenterCrop (the eval transform). The
backbone stays in eval mode (BatchNorm statistics frozen) and gets no gradient.

`fast=true` trains the same layer, with the same optimiser and schedule, on cached features of the eval view
(no augmentation) for quick iteration: seconds instead of hours, usually a little below the full protocol.

CLI: `python -m scfs.eval.linear ckpt=<path|random> [fast=true] [data=...] [+experiment=imagenet]`.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

log = logging.getLogger("scfs.eval.linear")


class LinearProbe(L.LightningModule):
    """nn.Linear on frozen features: the backbone's pooled feature (`backbone` given) or precomputed features."""

    def __init__(self, in_dim: int, num_classes: int, backbone: nn.Module | None = None, lr: float = 0.001,
                 batch_size: int = 256, momentum: float = 0.9, weight_decay: float = 0.0, epochs: int = 100,
                 scale_lr: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone
        if backbone is not None:
            for p in backbone.parameters():
                p.requires_grad_(False)
            backbone.eval()
        self.linear = nn.Linear(in_dim, num_classes)
        nn.init.normal_(self.linear.weight, mean=0.0, std=0.01)
        nn.init.zeros_(self.linear.bias)

    def train(self, mode: bool = True) -> LinearProbe:
        """Only the linear layer ever trains: the backbone's BatchNorm statistics stay those of the checkpoint."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.backbone is None:
            return x
        with torch.no_grad():
            return self.backbone.pooled(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x))

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        n = y.shape[0]
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=n)
        self.log(f"{stage}/top1", 100.0 * (top[:, 0] == y).float().mean(), on_step=False, on_epoch=True,
                 prog_bar=stage == "val", batch_size=n)
        if logits.shape[1] > 5:
            self.log(f"{stage}/top5", 100.0 * (top == y[:, None]).any(1).float().mean(), on_step=False,
                     on_epoch=True, batch_size=n)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self):
        h = self.hparams
        world = self.trainer.world_size if self._trainer is not None else 1
        lr = h.lr * h.batch_size * world / 256 if h.scale_lr else h.lr
        opt = torch.optim.SGD(self.linear.parameters(), lr=lr, momentum=h.momentum, weight_decay=h.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(int(h.epochs), 1), eta_min=0.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def feature_loader(features: torch.Tensor, labels: torch.Tensor, batch_size: int, shuffle: bool,
                   seed: int = 0) -> DataLoader:
    """Batches of in-memory features, indexed a batch at a time (no per-sample collate)."""
    ds = TensorDataset(features.float(), labels.long())
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(seed)) if shuffle else SequentialSampler(ds)
    return DataLoader(ds, sampler=BatchSampler(sampler, batch_size, drop_last=False), batch_size=None)


def _trainer(cfg: DictConfig | dict, epochs: int, logger: Any, run_dir: Path | None, fast: bool,
             val_every: int) -> L.Trainer:
    tcfg = dict(cfg.get("trainer") or {})
    kwargs: dict[str, Any] = {
        "max_epochs": epochs, "logger": logger if logger is not None else False, "enable_checkpointing": False,
        "enable_model_summary": False, "enable_progress_bar": bool(cfg.get("progress", False)),
        "num_sanity_val_steps": 0, "log_every_n_steps": 1, "default_root_dir": str(run_dir) if run_dir else None,
        "accelerator": tcfg.get("accelerator", "auto"), "devices": 1 if fast else tcfg.get("devices", 1),
        "precision": "32-true" if fast else tcfg.get("precision", "32-true"),
    }
    if val_every > 0:
        kwargs["check_val_every_n_epoch"] = val_every
    else:
        kwargs["limit_val_batches"] = 0
    # both are intended here: the frozen backbone sits in eval mode, and validation is optional
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"You defined a `validation_step` but have no `val_dataloader`")
    return L.Trainer(**kwargs)


def train_linear_on_features(train_f: torch.Tensor, train_y: torch.Tensor, num_classes: int, *, epochs: int = 100,
                             batch_size: int = 256, lr: float = 0.001, momentum: float = 0.9,
                             weight_decay: float = 0.0, seed: int = 0, val: tuple[torch.Tensor, torch.Tensor] | None
                             = None, val_every: int = 0, logger: Any = None, run_dir: Path | None = None,
                             progress: bool = False) -> LinearProbe:
    """The fast path: the DINO linear probe trained on precomputed (raw, unnormalised) features."""
    L.seed_everything(seed, verbose=False)
    probe = LinearProbe(train_f.shape[1], num_classes, None, lr, batch_size, momentum, weight_decay, epochs)
    trainer = _trainer({"progress": progress}, epochs, logger, run_dir, True, val_every if val else 0)
    val_loader = feature_loader(*val, batch_size, False) if val is not None and val_every > 0 else None
    threads = torch.get_num_threads()
    try:
        # small (B, D) x (D, C) matmuls gain nothing from intra-op threads, and on a shared CPU the thread
        # hand-off dominates: 1 thread measured 10-50x faster than 2 on a loaded 2-core machine (shapes probe)
        if batch_size * train_f.shape[1] * num_classes < 1 << 24:
            torch.set_num_threads(1)
        trainer.fit(probe, feature_loader(train_f, train_y, batch_size, True, seed), val_loader)
    finally:
        torch.set_num_threads(threads)
    return probe.cpu().eval()


@torch.no_grad()
def probe_scores(probe: LinearProbe, features: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """Logits of the linear layer for precomputed features."""
    probe.linear.cpu().eval()
    return torch.cat([probe.linear(f.float()) for f in features.split(batch_size)])


# ---- CLI: python -m scfs.eval.linear ckpt=... ----------------------------------------------------------------
def run_linear(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Linear probe of `cfg.ckpt` on `cfg.data` (full protocol, or `fast=true` on cached features); writes the
    report into `run_dir` and returns the metrics document (also `<run_dir>/metrics.json`)."""
    from scfs.config import check_accelerator
    from scfs.eval.common import (
        RandomResizedCropFlip,
        build_split,
        class_names,
        eval_size,
        eval_transform,
        load_eval_backbone,
        make_run_dir,
        resolve_device,
        to_plain,
    )
    from scfs.eval.features import cached_features, dataset_key
    from scfs.eval.report import EvalLogger, EvalResult, confusion_matrix, topk_accuracy
    from scfs.train import scrub

    t0 = time.time()
    run_dir = make_run_dir(cfg, run_dir)
    p = cfg.probe
    fast = bool(cfg.fast)
    device = resolve_device(cfg.get("device"))
    if not fast:  # the full protocol trains in a Lightning Trainer: its accelerator is checked before any work
        check_accelerator(cfg.get("trainer"))
    backbone, info = load_eval_backbone(cfg)
    backbone.to(device)
    tf = eval_transform(cfg)
    sets = {"train": build_split(cfg, "train", tf), "val": build_split(cfg, "val", tf)}
    t_load = time.time()

    def features(split: str):
        ds = sets[split]
        return cached_features(backbone, ds, model_id=info.model_id, data_key=dataset_key(to_plain(cfg.data), split,
                               ds), cache_dir=cfg.get("feature_cache"), device=device,
                               batch_size=int(cfg.batch_size), num_workers=int(cfg.num_workers),
                               progress=bool(cfg.get("progress", True)), desc=f"{split} features")

    va = features("val")  # the final evaluation always uses the eval view: cached in both paths
    num_classes = int(getattr(sets["train"], "num_classes", 0) or int(va.labels.max()) + 1)
    result_cfg = scrub(to_plain(cfg))
    elog = EvalLogger(run_dir, to_plain(cfg.get("logger")), f"linear{'-fast' if fast else ''}-{info.label}",
                      result_cfg)
    try:
        lightning_logger = elog.lightning_logger()
        epochs, bs = int(p.epochs), int(p.batch_size)
        if fast:
            tr = features("train")
            t_feat = time.time()
            probe = train_linear_on_features(tr.features, tr.labels, num_classes, epochs=epochs, batch_size=bs,
                                             lr=float(p.lr), momentum=float(p.momentum),
                                             weight_decay=float(p.weight_decay), seed=int(cfg.seed),
                                             val=(va.features, va.labels), val_every=int(p.val_every_n_epochs),
                                             logger=lightning_logger, run_dir=run_dir,
                                             progress=bool(cfg.get("progress", True)))
            train_note = f"fast path: trained on cached {info.which} features of the eval view (no augmentation)"
        else:
            t_feat = time.time()
            L.seed_everything(int(cfg.seed), verbose=False)
            train_tf = RandomResizedCropFlip(eval_size(cfg)[0], tuple(p.scale), cfg.get("interpolation", "bilinear"))
            train_set = build_split(cfg, "train", train_tf)
            loader = DataLoader(train_set, batch_size=bs, shuffle=True, num_workers=int(cfg.num_workers),
                                pin_memory=device.type == "cuda", persistent_workers=int(cfg.num_workers) > 0)
            val_every = int(p.val_every_n_epochs)
            val_loader = (DataLoader(sets["val"], batch_size=int(cfg.batch_size), num_workers=int(cfg.num_workers))
                          if val_every > 0 else None)
            probe = LinearProbe(backbone.embed_dim, num_classes, backbone, float(p.lr), bs, float(p.momentum),
                                float(p.weight_decay), epochs)
            trainer = _trainer(cfg, epochs, lightning_logger, run_dir, False, val_every)
            trainer.fit(probe, loader, val_loader)
            probe = probe.cpu().eval()
            train_note = f"full protocol: frozen {info.which} backbone, training views {train_tf!r}"
        t_train = time.time()
        scores = probe_scores(probe, va.features)
        metrics = topk_accuracy(scores, va.labels, (1, 5))
        torch.save({"weight": probe.linear.weight.detach(), "bias": probe.linear.bias.detach(),
                    "checkpoint_id": info.id, "which": info.which}, run_dir / "linear_head.pt")
        lr_eff = float(p.lr) * bs / 256
        result = EvalResult(
            kind="linear", metrics=metrics, checkpoint=info.as_dict(),
            data={"name": cfg.data.name, "root": str(cfg.data.get("root")), "n_train": len(sets["train"]),
                  "n_val": len(sets["val"]), "num_classes": num_classes, "transform": repr(tf)},
            class_names=class_names(sets["train"], num_classes),
            confusion=confusion_matrix(scores.argmax(1), va.labels, num_classes), config=result_cfg,
            timings={"load_s": t_load - t0, "features_s": t_feat - t_load, "train_s": t_train - t_feat},
            notes=[f"protocol: linear layer on pooled features, SGD momentum {p.momentum}, wd {p.weight_decay}, "
                   f"lr {p.lr} x {bs}/256 = {lr_eff:g}, cosine to 0, {epochs} epochs, batch {bs}", train_note,
                   "top1/top5 of the final linear layer on the val split (eval view)"])
        result.timings["total_s"] = time.time() - t0
        doc = elog.write(result)
    finally:
        elog.finish()
    doc["run_dir"] = str(run_dir)
    print(summary_line(doc), flush=True)
    return doc


def summary_line(doc: dict[str, Any]) -> str:
    m, ck = doc["metrics"], doc["checkpoint"]
    mode = "fast" if doc["config"].get("fast") else "full"
    head = f"linear probe ({mode}) {ck['which']} {ck['label']} on {doc['data']['name']}: top-1 {m['top1']:.2f}%"
    if "top5" in m:
        head += f", top-5 {m['top5']:.2f}%"
    return (f"{head} | {doc['timings'].get('total_s', 0):.1f}s | report {doc['run_dir']}/report.md | "
            f"wandb {doc.get('wandb_dir')}")


def main() -> None:
    """`python -m scfs.eval.linear ckpt=<path|random> [fast=true] [data=...] [+experiment=imagenet]`."""
    from scfs.eval.common import hydra_cli

    hydra_cli("linear", run_linear)


if __name__ == "__main__":
    main()

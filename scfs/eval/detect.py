"""Detection transfer: fine-tune torchvision Faster / Mask R-CNN from an SCFS / DINO backbone, COCO-style AP.

CLI: ``python -m scfs.eval.detect ckpt=<path|random> [+experiment=coco_maskrcnn_1x|voc_fasterrcnn]
[data.format=coco data.images=... data.annotations=... data.val_images=... data.val_annotations=...]``.

With no data arguments it runs on the embedded shapes data (a detection split exported to COCO json with boxes
and instance masks), Faster R-CNN at the images' own 64 px (``model.arch=mask_rcnn`` adds segm AP at ~1.8x the
time), 800 iterations on one CPU thread in under 5 minutes - the same code path as COCO. The trunk is the
checkpoint's own network (`scfs.eval.detection_model`: the timm ResNet body is torchvision `BackboneWithFPN`'s
body), trained by a Lightning loop (progress bar, checkpoints in ``<run>/checkpoints``, W&B offline by default)
with the detectron2 schedule (SGD momentum 0.9, linear warmup, lr steps, weight decay except on norm layers).
The final evaluation is pycocotools' COCOeval on the val split (bbox, and segm for Mask R-CNN); the run folder
gets ``metrics.json`` / ``report.md`` / ``predictions.png`` (and ``val_detections.json``, COCO results format);
``python -m scfs.eval.compare`` puts runs side by side.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader

from scfs.eval.detection_data import (
    CocoDetectionDataset,
    DetectionSplit,
    build_detection_splits,
    coco_api,
    collate,
    detection_format,
)
from scfs.eval.detection_metrics import IOU_TYPES, coco_evaluate, to_coco_results
from scfs.eval.detection_model import build_detector, parameter_groups

log = logging.getLogger("scfs.eval.detect")


def lr_factor(step: int, warmup_iters: int, warmup_factor: float, steps: list[int], gamma: float) -> float:
    """detectron2's WarmupMultiStepLR: linear warmup from `warmup_factor`, then x`gamma` at each of `steps`."""
    f = gamma ** sum(step >= s for s in steps)
    if step < warmup_iters:
        alpha = step / warmup_iters
        f *= warmup_factor * (1 - alpha) + alpha
    return f


class DetectionModule(L.LightningModule):
    """A torchvision detector in a Lightning loop: training losses, COCO-format predictions for evaluation.

    Evaluation (`trainer.validate`, or periodic validation) gathers every rank's results, runs COCOeval once on
    rank 0 and broadcasts the numbers; DistributedSampler's padding duplicates are dropped by image id. The last
    evaluation's full output (per-category AP, COCOeval's table, the raw results) stays in `last_eval`.
    """

    def __init__(self, detector: nn.Module, label_to_cat: Mapping[int, int], iou_types: tuple[str, ...],
                 schedule: Mapping[str, Any], model_cfg: Mapping[str, Any] | None = None,
                 class_names: Mapping[int, str] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["detector"])
        self.detector = detector
        self.label_to_cat = {int(k): int(v) for k, v in label_to_cat.items()}
        self.iou_types = tuple(iou_types)
        self.schedule = dict(schedule)
        self.gt: Any = None  # pycocotools COCO of the val split; set before validation
        self.last_eval: dict[str, Any] | None = None
        self._results: dict[int, list[dict[str, Any]]] = {}

    def forward(self, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]] | None = None) -> Any:
        return self.detector(images, targets)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        losses = self.detector(images, targets)
        loss = sum(losses.values())
        if not torch.isfinite(loss):
            parts = ", ".join(f"{k} {float(v):.4g}" for k, v in losses.items())
            raise FloatingPointError(f"non-finite detection loss at step {self.global_step} ({parts}); lower "
                                     "schedule.lr or raise schedule.warmup_iters")
        n = len(images)
        self.log_dict({f"train/{k}": v.detach() for k, v in losses.items()}, batch_size=n)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=n)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._results = {}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, targets = batch
        outputs = self.detector(images)
        masks = "segm" in self.iou_types
        for out, t in zip(outputs, targets, strict=True):
            iid = int(t["image_id"])
            self._results[iid] = to_coco_results(out, iid, self.label_to_cat, masks)

    def on_validation_epoch_end(self) -> None:
        import torch.distributed as dist

        results = self._results
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, results)
            results = {k: v for part in gathered for k, v in part.items()}
        payload: list[Any] = [None]
        if self.trainer.is_global_zero:
            if self.gt is None:
                raise RuntimeError("DetectionModule.gt (the val ground truth) is not set")
            flat = [r for iid in sorted(results) for r in results[iid]]
            ev = coco_evaluate(self.gt, flat, self.iou_types, img_ids=list(results))
            ev["results"] = flat
            ev["n_images"] = len(results)
            payload = [ev]
        if distributed:
            dist.broadcast_object_list(payload, src=0)
        ev = payload[0]
        if self.trainer.is_global_zero:
            self.last_eval = ev
        vals = {f"val/{k}": float(v) for k, v in ev["metrics"].items() if v is not None}
        self.log_dict(vals, rank_zero_only=False, sync_dist=False)
        self._results = {}

    def configure_optimizers(self):
        s = self.schedule
        opt = torch.optim.SGD(parameter_groups(self.detector, float(s["weight_decay"])), lr=float(s["lr"]),
                              momentum=float(s["momentum"]))
        steps = [int(x) for x in s.get("steps", [])]
        warm, wf, gamma = int(s.get("warmup_iters", 0)), float(s.get("warmup_factor", 0.001)), float(s["gamma"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: lr_factor(it, warm, wf, steps, gamma))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


# ---- the run ---------------------------------------------------------------------------------------------------
def _loader(ds: CocoDetectionDataset, batch_size: int, shuffle: bool, num_workers: int, seed: int) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, collate_fn=collate,
                      persistent_workers=num_workers > 0, drop_last=shuffle,
                      generator=torch.Generator().manual_seed(seed) if shuffle else None)


def _trainer(cfg: DictConfig, run_dir: Path, logger: Any, max_iters: int) -> L.Trainer:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from scfs.eval.common import to_plain
    from scfs.models.checkpoint_io import AtomicCheckpointIO

    s = cfg.schedule
    every = int(cfg.get("checkpoint_every_n_iters") or 0)
    # periodic: iter<step>.ckpt every `every` iterations (all kept) + last.ckpt; otherwise last.ckpt only, at the end
    callbacks: list[Any] = [ModelCheckpoint(dirpath=run_dir / "checkpoints", filename="iter{step:06d}",
                                            auto_insert_metric_name=False, every_n_train_steps=every or max_iters,
                                            save_last=True, save_top_k=-1 if every else 0,
                                            enable_version_counter=False)]
    if logger is not None:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    tcfg = dict(to_plain(cfg.get("trainer")) or {})
    val_every = int(s.get("val_every_n_iters") or 0)
    kwargs: dict[str, Any] = {
        "max_steps": max_iters, "max_epochs": -1, "logger": logger if logger is not None else False,
        "callbacks": callbacks, "default_root_dir": str(run_dir), "num_sanity_val_steps": 0,
        "enable_progress_bar": bool(cfg.get("progress", True)), "enable_model_summary": False,
        "log_every_n_steps": int(cfg.get("log_every_n_steps", 20)), "plugins": [AtomicCheckpointIO()],
        "accelerator": tcfg.pop("accelerator", "auto"), "devices": tcfg.pop("devices", 1),
        "precision": tcfg.pop("precision", "32-true"),
        "gradient_clip_val": float(s.get("clip_grad") or 0) or None, **tcfg,
    }
    if val_every > 0:
        kwargs.update(val_check_interval=val_every, check_val_every_n_epoch=None)
    else:
        kwargs["limit_val_batches"] = 0
    warnings.filterwarnings("ignore", message=r"You defined a `validation_step` but have no `val_dataloader`")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    # evaluation results are gathered from every rank, de-duplicated by image id, scored once and broadcast, so
    # the padded DistributedSampler and per-rank logging of identical numbers are both intended
    warnings.filterwarnings("ignore", message=r"Using `DistributedSampler` with the dataloaders. During `trainer.val")
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('val/")
    return L.Trainer(**kwargs)


def _data_doc(cfg: DictConfig, splits: Mapping[str, DetectionSplit], train_set: CocoDetectionDataset,
              val_set: CocoDetectionDataset) -> dict[str, Any]:
    from scfs.eval.common import to_plain

    data = to_plain(cfg.data)
    fmt = detection_format(data)
    stats = {name: {**sp.stats, **(train_set if name == "train" else val_set).stats} for name, sp in splits.items()}
    doc = {"name": data.get("name") or fmt, "format": fmt, "n_train": len(train_set), "n_val": len(val_set),
           "num_classes": len(splits["train"].categories), "class_names": splits["train"].class_names,
           "train_source": splits["train"].source, "val_source": splits["val"].source, "stats": stats}
    if fmt == "shapes":
        doc["shapes"] = {k: data.get(k) for k in ("image_size", "n_train", "n_val", "num_classes", "max_objects",
                                                   "seed", "clutter", "object_scale")}
    return doc


def _with_backbone_of(cfg: DictConfig, ckpt: str) -> DictConfig:
    """A copy of `cfg` whose `backbone` is the network config stored in our checkpoint `ckpt`: `ckpt=random
    random_like=<ckpt>` is the same architecture as the pretrained run it is compared with, at random init."""
    from omegaconf import OmegaConf, open_dict

    from scfs.models.checkpoint import backbone_config_from, is_lightning_checkpoint, safe_load

    raw = safe_load(ckpt)
    if not is_lightning_checkpoint(raw):
        raise ValueError(f"random_like={ckpt}: not an scfs Lightning checkpoint (no hyper_parameters.backbone); "
                         "set backbone=... instead")
    bcfg = {k: list(v) if isinstance(v, tuple) else v for k, v in backbone_config_from(raw).items()}
    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.backbone = OmegaConf.create(bcfg)
    return cfg


def run_detect(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune the detector of `cfg` on `cfg.data` from `cfg.ckpt`'s backbone, evaluate with COCOeval and write
    the report into `run_dir`; returns the metrics document (also `<run_dir>/metrics.json`)."""
    from scfs.config import ConfigError, check_accelerator
    from scfs.eval.common import load_eval_backbone, make_run_dir, to_plain
    from scfs.eval.detection_report import json_safe, plot_predictions, write_report
    from scfs.eval.report import EvalLogger
    from scfs.reliability import scrub

    t0 = time.time()
    if cfg.get("threads"):  # on a busy shared CPU, 1 intra-op thread beats threads waiting on each other
        torch.set_num_threads(int(cfg.threads))
    check_accelerator(cfg.get("trainer"))
    run_dir = make_run_dir(cfg, run_dir)
    model_cfg = to_plain(cfg.model)
    arch = model_cfg["arch"]
    if arch not in IOU_TYPES:
        raise ConfigError(f"config key model.arch={arch!r} is invalid: expected one of {', '.join(IOU_TYPES)}")
    iou_types = IOU_TYPES[arch]
    masks = "segm" in iou_types
    seed = int(cfg.seed)

    splits = build_detection_splits(to_plain(cfg.data), run_dir, masks)
    d = cfg.data
    train_set = CocoDetectionDataset(splits["train"], masks=masks, train=True, flip_p=float(d.get("flip_p", 0.5)),
                                     skip_empty=bool(d.get("skip_empty", True)))
    val_set = CocoDetectionDataset(splits["val"], masks=masks, train=False)
    if [c["id"] for c in splits["train"].categories] != [c["id"] for c in splits["val"].categories]:
        raise ValueError("the train and val annotation files have different categories")

    L.seed_everything(seed, verbose=False)
    if str(cfg.ckpt) == "random" and cfg.get("random_like"):
        cfg = _with_backbone_of(cfg, cfg.random_like)
    backbone, info = load_eval_backbone(cfg)  # also seeds ckpt=random's init at cfg.seed
    num_classes = len(splits["train"].categories)
    detector = build_detector(backbone.body, num_classes, model_cfg)
    s = to_plain(cfg.schedule)
    module = DetectionModule(detector, val_set.label_to_cat, iou_types, s, model_cfg,
                             {c["id"]: c["name"] for c in splits["train"].categories})
    module.gt = coco_api(splits["val"].coco)
    t_load = time.time()

    result_cfg = scrub(to_plain(cfg))
    # one W&B run per evaluation: DDP's other ranks (started by Lightning with their rank in the environment) log
    # nothing; rank 0 writes the report
    from lightning.pytorch.utilities import rank_zero_only

    logger_cfg = to_plain(cfg.get("logger")) if rank_zero_only.rank == 0 else {"wandb": False}
    elog = EvalLogger(run_dir, logger_cfg, f"detect-{arch}-{info.label}", result_cfg)
    try:
        max_iters = int(s["max_iters"])
        trainer = _trainer(cfg, run_dir, elog.lightning_logger() if rank_zero_only.rank == 0 else None, max_iters)
        world = max(trainer.world_size, 1)
        batch, eval_batch = int(s["batch_size"]), int(cfg.get("eval_batch_size") or s["batch_size"])
        if batch % world:
            raise ValueError(f"schedule.batch_size={batch} is not divisible by the {world} devices")
        workers = int(cfg.num_workers)
        train_loader = _loader(train_set, batch // world, True, workers, seed)
        val_loader = _loader(val_set, max(eval_batch // world, 1), False, workers, seed)
        trainable = sum(p.numel() for p in detector.parameters() if p.requires_grad)
        log.info("detect: %s, %d trainable parameters, %d iterations of batch %d", arch, trainable, max_iters, batch)
        resume = cfg.get("resume") or None
        trainer.fit(module, train_loader, val_loader if int(s.get("val_every_n_iters") or 0) > 0 else None,
                    ckpt_path=resume)
        final_loss = trainer.callback_metrics.get("train/loss")
        t_train = time.time()
        trainer.limit_val_batches = 1.0  # the final evaluation always covers the whole val split
        trainer.validate(module, val_loader, verbose=False)
        t_eval = time.time()
        if not trainer.is_global_zero:
            return {}
        ev = module.last_eval
        doc: dict[str, Any] = {
            "kind": "detect", "metrics": ev["metrics"], "iou_types": list(iou_types), "checkpoint": info.as_dict(),
            "data": _data_doc(cfg, splits, train_set, val_set),
            "model": {k: model_cfg.get(k) for k in ("arch", "returned_layers", "fpn_channels", "norm",
                                                     "trainable_layers", "min_size", "max_size", "anchor_sizes")},
            "train": {"iters": int(trainer.global_step), "batch_size": batch, "lr": s["lr"], "steps": s["steps"],
                      "warmup_iters": s.get("warmup_iters"), "trainable_parameters": trainable,
                      "final_loss": float(final_loss) if final_loss is not None else None,
                      "detector_checkpoint": str(run_dir / "checkpoints" / "last.ckpt")},
            "per_category": ev["per_category"], "coco_summary": ev["summary"],
            "n_detections": ev["n_detections"], "n_eval_images": ev["n_images"],
            "timings": {"load_s": t_load - t0, "train_s": t_train - t_load, "eval_s": t_eval - t_train},
            "notes": [f"COCOeval ({', '.join(iou_types)}) on {ev['n_images']} val images, {ev['n_detections']} "
                      "detections; AP numbers in percent, '-' = no ground truth in that size range",
                      f"trunk initialised from {info.format} weights ({info.which})" if info.format != "random"
                      else f"trunk at random init (seed {seed}): the reference for pretrained trunks"],
            "wandb_dir": elog.wandb_dir, "config": result_cfg,
        }
        (run_dir / "val_detections.json").write_text(json.dumps(ev["results"]))
        doc["figures"] = {}
        n_fig = int(cfg.get("figure_images", 8))
        if n_fig > 0:
            by_img: dict[int, list] = {}
            for r in ev["results"]:
                by_img.setdefault(r["image_id"], []).append(r)
            infos = val_set.infos[:n_fig]
            gts = [[a for a in splits["val"].coco["annotations"] if a["image_id"] == i["id"]] for i in infos]
            names = {c["id"]: c["name"] for c in splits["val"].categories}
            plot_predictions([splits["val"].images(i) for i in infos], gts, [by_img.get(i["id"], []) for i in infos],
                             names, run_dir / "predictions.png", f"{arch} - {info.label} - {doc['data']['name']}")
            doc["figures"]["predictions"] = "predictions.png"
        doc["timings"]["total_s"] = time.time() - t0
        doc = json_safe(doc)
        write_report(doc, run_dir, elog.run)
    finally:
        elog.finish()
    doc["run_dir"] = str(run_dir)
    print(summary_line(doc), flush=True)
    return doc


def summary_line(doc: Mapping[str, Any]) -> str:
    m, ck = doc["metrics"], doc["checkpoint"]

    def f(k: str) -> str:
        v = m.get(k)
        return "-" if v is None else f"{v:.1f}"

    parts = [f"{doc['model']['arch']} {ck['which']} {ck['label']} on {doc['data']['name']}"]
    parts += [f"{iou} AP {f(f'{iou}/AP')} / AP50 {f(f'{iou}/AP50')} / AP75 {f(f'{iou}/AP75')}"
              for iou in doc["iou_types"]]
    parts += [f"{doc['timings'].get('total_s', 0):.0f}s", f"report {doc['run_dir']}/report.md",
              f"wandb {doc.get('wandb_dir')}"]
    return " | ".join(parts)


def main() -> None:
    """`python -m scfs.eval.detect ckpt=<path|random> [+experiment=coco_maskrcnn_1x|voc_fasterrcnn] [data...]`."""
    from scfs.eval.common import hydra_cli

    hydra_cli("detect", run_detect)


if __name__ == "__main__":
    main()

"""Evaluation: kNN on faiss, linear probe, reports, compare.

* `scfs.eval.knn`: DINO weighted kNN (also the core `knn_accuracy` / `evaluate_backbone_knn` used during training);
  CLI `python -m scfs.eval.knn ckpt=<path|random>`.
* `scfs.eval.linear`: linear probe on the frozen backbone (DINO protocol) or, `fast=true`, on cached features;
  CLI `python -m scfs.eval.linear ckpt=<path|random>`.
* `scfs.eval.features`: the pooled-feature extractor (`extract_pooled`, also behind the training-time kNN) and
  its on-disk cache keyed by checkpoint hash + dataset + transform.
* `scfs.eval.report`: metrics.json / report.md / PNG figures and the W&B run of an evaluation.
* `scfs.eval.compare`: `python -m scfs.eval.compare RUN...`, a side-by-side markdown table.
* `scfs.eval.search_maps`: what the search finds for local-crop queries on a global view, per stage and mode
  (`compute_search_maps`; `scfs.viz` draws the result).
* `scfs.eval.precision`: search precision (share of the searched weight mass inside the crop's object mask) on
  the shapes validation set; CLI `python -m scfs.eval.precision SCFS=<ckpt> DINO=<ckpt> random`.
* `scfs.eval.detect`: detection transfer, torchvision Faster / Mask R-CNN (FPN) on the checkpoint's trunk, fine-tuned
  in a Lightning loop and scored with pycocotools COCOeval (`detection_data`: shapes / COCO json / VOC readers with
  annotation checks; `detection_model`: the detector around our trunk; `detection_metrics`, `detection_report`);
  CLI `python -m scfs.eval.detect ckpt=<path|random> [+experiment=coco_maskrcnn_1x|voc_fasterrcnn]`.
* `scfs.eval.common`: config composition (`compose_eval_cfg`), the backbone under test, transforms.
"""

import logging

# faiss logs its CPU-feature probing (failed AVX-512 imports) at INFO: noise under Hydra's INFO logging
logging.getLogger("faiss.loader").setLevel(logging.WARNING)

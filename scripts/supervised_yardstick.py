"""Supervised yardstick: how fast can the *same* backbone learn the shapes classes with labels?

Trains backbone + linear classifier with cross-entropy on the same data, batched multi-crop (one global view)
and step budget as a self-supervised run, and records val kNN (k=20, the SSL protocol) and linear accuracy
over steps. If labels cannot lift kNN within a budget, no self-supervised objective can be expected to.

python scripts/supervised_yardstick.py --steps 400 --out benchmarks/results/shapes-supervised-yardstick.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from scfs.data.batch_aug import BatchMultiCrop
from scfs.data.datamodule import SSLDataModule
from scfs.eval.knn import evaluate_backbone_knn
from scfs.models import Backbone


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--clutter", type=float, default=1.0)
    p.add_argument("--object-scale", type=float, nargs=2, default=(0.22, 0.42))
    p.add_argument("--stem-stride", type=int, default=2)
    p.add_argument("--channels", type=int, nargs=4, default=(16, 32, 64, 128))
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    data = {"name": "shapes", "root": "data/shapes", "image_size": a.image_size, "n_train": 3000, "n_val": 1000,
            "num_classes": 10, "seed": 0, "clutter": a.clutter, "object_scale": tuple(a.object_scale)}
    crops = {"global_size": a.image_size, "local_size": a.image_size // 2, "n_local": 0,
             "global_scale": (0.35, 1.0), "local_scale": (0.1, 0.35)}
    dm = SSLDataModule(data, crops, batch_size=a.batch_size, batch_aug=True)
    dm.setup()
    bank, query = dm.knn_loaders()
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, stem_stride=a.stem_stride, layers=(1, 1, 1, 1),
                  channels=tuple(a.channels))
    head = torch.nn.Linear(bb.embed_dim, 10)
    params = [*bb.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=a.lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps)
    aug = BatchMultiCrop(**crops)
    curve = [{"step": 0, **evaluate_backbone_knn(bb, bank, query, [20])}]
    step, t0 = 0, time.time()
    while step < a.steps:
        for x, y in dm.train_dataloader():
            loss = F.cross_entropy(head(bb.pooled(aug(x)["views"][0])), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % a.eval_every == 0 or step == a.steps:
                curve.append({"step": step, "train_loss": round(loss.item(), 4),
                              **evaluate_backbone_knn(bb, bank, query, [20]), "seconds": round(time.time() - t0)})
                print(curve[-1], flush=True)
            if step >= a.steps:
                break
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python scripts/supervised_yardstick.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
        for k, v in vars(a).items()), "curve": curve}, indent=2))


if __name__ == "__main__":
    main()

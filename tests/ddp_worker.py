"""Subprocess entry of tests/test_ddp.py: a few training steps of the tiny config, then the weights and the
per-step losses of this rank to `<out>/rank<r>.pt`.

Run as a script (Lightning's DDP launcher re-executes `sys.argv` once per extra rank; inside pytest DDP must
live in a subprocess). The Trainer is built with `scfs.train.trainer_kwargs`, so the sampler sharding, SyncBN
switch and global-batch split under test are the ones `python -m scfs.train` uses.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--run", action="store_true",
                    help="train through scfs.train.run (checkpoints, resume=...) into --out instead of recording")
    ap.add_argument("--crash-at", type=int, default=-1, help="with --run: every rank raises at this global step")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.run:
        return _run(args)

    import lightning as L
    import torch
    from helpers import compose_cfg

    from scfs.train import build, trainer_kwargs

    torch.set_num_threads(1)
    # exact fp32 on GPUs too: cuDNN's default TF32 convolutions round at ~1e-3, and the 1-GPU and 2-GPU runs batch
    # their convolutions differently, so TF32 alone would exceed the test's 1e-4 tolerance
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = compose_cfg(args.overrides, data_root=args.data)
    L.seed_everything(cfg.seed, verbose=False)
    dm, model = build(cfg)
    losses: list[torch.Tensor] = []
    batches: list[torch.Tensor] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            losses.append(outputs["loss"].detach().to("cpu", copy=True))
            batches.append(batch[1].detach().to("cpu", copy=True))  # labels: which images this rank trained on

    kw = trainer_kwargs(cfg)
    trainer = L.Trainer(**kw, logger=False, enable_checkpointing=False, callbacks=[Record()])
    trainer.fit(model, datamodule=dm)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # on the CPU: the ranks of a GPU run save tensors of different devices, compared in one process
    torch.save({"losses": torch.stack(losses), "labels": batches, "world": trainer.world_size,
                "state": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}},
               Path(args.out) / f"rank{trainer.global_rank}.pt")


def _run(args: argparse.Namespace) -> None:
    """The real entry (`scfs.train.run`: LastCheckpoint every step, ResumeState, resume=...), under DDP; with
    `--crash-at N` every rank fails at step N before its forward (no rank is left waiting in a collective)."""
    import torch
    from helpers import compose_cfg

    from scfs.methods.base import SelfDistillation
    from scfs.train import run

    torch.set_num_threads(1)
    if args.crash_at >= 0:
        original = SelfDistillation.training_step

        def crash(self: SelfDistillation, batch: Any, batch_idx: int) -> Any:
            if self.global_step == args.crash_at:
                raise RuntimeError(f"simulated crash at step {args.crash_at}")
            return original(self, batch, batch_idx)

        SelfDistillation.training_step = crash
    run(compose_cfg(args.overrides, data_root=args.data), args.out)


if __name__ == "__main__":
    main()

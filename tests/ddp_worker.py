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
    ap.add_argument("--background-go-at", type=int, default=-1,
                    help="with --run and compile_background=true: a stand-in child (dynamo's eager backend for the "
                         "compile) that writes its ok status once rank 0 ends this global step; each rank writes "
                         "whether each of its steps ran compiled to <out>/compiled-rank<r>.json")
    ap.add_argument("--parallel-helper", choices=("ok", "fail"),
                    help="with --run and compile_parallel=true: a stand-in helper (dynamo's eager backend for the "
                         "compile) that writes both parts and an ok status, or ends with status 1 and no file; each "
                         "rank writes its callback's report to <out>/parallel-rank<r>.json")
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
    if args.background_go_at >= 0:
        _stand_in_background_child(Path(args.out), args.background_go_at)
    if args.parallel_helper:
        _stand_in_parallel_helper(Path(args.out), args.parallel_helper)
    run(compose_cfg(args.overrides, data_root=args.data), args.out)


# the stand-in child: waits for the go file, then writes an ok status the way the real one does (whole or not at all)
CHILD = """
import json, os, sys, time
status, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.01)
open(status + ".tmp", "w").write(json.dumps({"ok": True, "seconds": 0.0, "fx_cache": "0 hit / 0 miss"}))
os.replace(status + ".tmp", status)
"""


# the stand-in helper, through the real protocol's writers: begins both parts, then writes them and its status; or
# begins them and crashes, no file
HELPER = """
import sys, time
from pathlib import Path
from scfs.training.background_compile import PARTS, part_path, started_path, write_status
status, mode = Path(sys.argv[1]), sys.argv[2]
for part in PARTS:
    write_status(started_path(status, part), {"ok": True})
time.sleep(1.0)
if mode == "fail":
    sys.exit(1)
for part in PARTS:
    write_status(part_path(status, part), {"ok": True})
write_status(status, {"ok": True, "seconds": 1.0})
"""


def _eager_compile() -> None:
    """`torch.compile` through dynamo's eager backend: the compiled-step code paths without inductor's minutes."""
    import torch
    from torch import nn

    import scfs.methods.base as base

    real_compile, real_module_compile = torch.compile, nn.Module.compile
    base.torch.compile = lambda fn, **kw: real_compile(fn, backend="eager", dynamic=False)
    nn.Module.compile = lambda self, **kw: real_module_compile(self, backend="eager", dynamic=False)


def _stand_in_parallel_helper(out: Path, mode: str) -> None:
    """`compile_parallel` under DDP with the real callback and file protocol and a stand-in helper (started by rank 0
    only): every rank's first step waits at the method's gate until the parts exist or the helper's end is known
    (on rank 1 only through the status file rank 0 writes for it)."""
    import json

    import lightning as L

    import scfs.training.background_compile as bgc

    _eager_compile()

    real_start = bgc.start_child

    def start_child(cfg, batch_size, status_path, *args, **kwargs):
        # both parts begun as the helper starts (before the ranks' barrier): the stand-in's imports take longer
        # than the ranks' way to their gates, and a part not begun is not waited for
        proc = real_start(cfg, batch_size, status_path, *args, **kwargs)
        for part in bgc.PARTS:
            bgc.write_status(bgc.started_path(status_path, part), {"ok": True})
        return proc

    bgc.start_child = start_child

    class StandIn(bgc.ParallelCompile):
        def command(self, device: str) -> list[str]:
            return [sys.executable, "-c", HELPER, str(self.status_path), mode]

        def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            super().teardown(trainer, pl_module, stage)
            (out / f"parallel-rank{trainer.global_rank}.json").write_text(json.dumps(self.report))

    bgc.ParallelCompile = StandIn


def _stand_in_background_child(out: Path, go_at: int) -> None:
    """`compile_background` under DDP with the real callback and file protocol, a stand-in child and dynamo's eager
    backend for the compile; every rank records per step whether its step ran compiled."""
    import json

    import lightning as L

    import scfs.training.background_compile as bgc

    _eager_compile()
    bgc.CHECK_EVERY = 1
    go = out / "go"

    class StandIn(bgc.BackgroundCompile):
        compiled: list[bool] = []

        def command(self, device: str) -> list[str]:
            return [sys.executable, "-c", CHILD, str(self.status_path), str(go)]

        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            self.compiled.append(bool(pl_module.compile_nets))
            if trainer.global_rank == 0 and trainer.global_step - 1 == go_at:
                go.touch()

        def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            super().teardown(trainer, pl_module, stage)
            (out / f"compiled-rank{trainer.global_rank}.json").write_text(
                json.dumps({"compiled": self.compiled, "switched_at": self.switched_at}))

    bgc.BackgroundCompile = StandIn


if __name__ == "__main__":
    main()

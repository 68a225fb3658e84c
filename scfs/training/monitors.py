"""Online linear monitor (as in solo-learn): a stop-gradient linear classifier on the student's features.

It tells during pretraining whether the representation becomes linearly separable, at the cost of one small
matmul per batch and without touching the method: the callback owns its `nn.Linear` and its optimiser, reads
the detached features the module leaves behind, and never sends a gradient into the network.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("scfs.monitors")


class OnlineLinearMonitor(L.Callback):
    """Trains a linear classifier on `pl_module.last_features` / `pl_module.last_labels` after every training
    batch and logs its running training accuracy of the epoch as `online/linear_top1` (and `online/linear_loss`)
    every `every_n_epochs` epochs.

    The module must set, in `training_step`, `last_features` (B, D) pooled student features of global view 1,
    detached, and `last_labels` (B,) ints; when either is missing or None the callback does nothing (e.g. on an
    unlabelled dataset). `num_classes=None` reads `trainer.datamodule.train_set.num_classes`. Under DDP every
    rank trains a replica; gradients are averaged over ranks so the replicas stay identical.
    """

    def __init__(self, num_classes: int | None = None, every_n_epochs: int = 1, lr: float = 0.1,
                 momentum: float = 0.9, weight_decay: float = 0.0, prefix: str = "online") -> None:
        super().__init__()
        self.num_classes, self.every = num_classes, int(every_n_epochs)
        self.lr, self.momentum, self.weight_decay, self.prefix = lr, momentum, weight_decay, prefix
        self.linear: nn.Linear | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._pending_state: dict[str, Any] | None = None
        self._restored_counts: torch.Tensor | None = None
        self._reset_counts()

    def _reset_counts(self) -> None:
        """Counts live on the features' device as one (correct, seen, loss_sum) tensor: adding to it costs no
        host sync per step (`int(...)` / `float(...)` of a CUDA value would stall the training step)."""
        self.counts: torch.Tensor | None = None

    def _num_classes(self, trainer: L.Trainer) -> int | None:
        if self.num_classes:
            return int(self.num_classes)
        dm = getattr(trainer, "datamodule", None)
        ds = getattr(dm, "train_set", None)
        n = getattr(ds, "num_classes", None)
        return int(n) if n else None

    def _build(self, dim: int, num_classes: int, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)  # same init on every rank
        self.linear = nn.Linear(dim, num_classes)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, 0.01, generator=gen)
            self.linear.bias.zero_()
        self.linear.to(device)
        self.optimizer = torch.optim.SGD(self.linear.parameters(), lr=self.lr, momentum=self.momentum,
                                         weight_decay=self.weight_decay)
        if self._pending_state is not None:  # resumed: restore the classifier of the checkpoint
            self.linear.load_state_dict(self._pending_state["linear"])
            self.optimizer.load_state_dict(self._pending_state["optimizer"])
            self._pending_state = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        restored, self._restored_counts = self._restored_counts, None
        if restored is not None:  # resumed mid-epoch: the epoch's accuracy keeps the batches before the stop
            self.counts = restored
        else:
            self._reset_counts()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        feats = getattr(pl_module, "last_features", None)
        labels = getattr(pl_module, "last_labels", None)
        if not isinstance(feats, torch.Tensor) or not isinstance(labels, torch.Tensor):
            return
        labels = labels.to(feats.device).long().view(-1)
        if feats.ndim != 2 or labels.shape[0] != feats.shape[0]:
            return
        if self.linear is None:
            n = self._num_classes(trainer)
            if n is None:
                n = int(labels.max().item()) + 1
                log.warning("OnlineLinearMonitor: num_classes unknown, using %d from the first batch", n)
            self._build(feats.shape[1], n, feats.device)
        assert self.linear is not None and self.optimizer is not None
        self._to(feats.device)
        with torch.enable_grad(), torch.autocast(feats.device.type, enabled=False):
            logits = self.linear(feats.detach().float())
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        self._sync_grads()
        self.optimizer.step()
        with torch.no_grad():
            n = labels.shape[0]
            step = torch.stack(((logits.argmax(1) == labels).sum().float(), torch.full_like(loss, float(n)),
                                loss.detach().float() * n))
            self.counts = step if self.counts is None else self.counts.to(step.device) + step

    def _to(self, device: torch.device) -> None:
        """Follow the features' device, optimiser state (momentum buffers) included."""
        if self.linear.weight.device == device:
            return
        self.linear.to(device)
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = v.to(device)

    def _sync_grads(self) -> None:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        world = torch.distributed.get_world_size()
        for p in self.linear.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= world

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every <= 0 or (trainer.current_epoch + 1) % self.every:
            return
        counts = (self.counts if self.counts is not None else torch.zeros(3)).to(pl_module.device, torch.float32)
        self._reset_counts()  # an epoch-end checkpoint (written after this) then carries no counts
        counts = trainer.strategy.reduce(counts, reduce_op="sum")
        correct, seen, loss_sum = (float(v) for v in counts)
        if seen == 0:
            return
        pl_module.log_dict({f"{self.prefix}/linear_top1": 100.0 * correct / seen,
                            f"{self.prefix}/linear_loss": loss_sum / seen}, on_step=False, on_epoch=True)

    def state_dict(self) -> dict[str, Any]:
        if self.linear is None or self.optimizer is None:
            return {}
        state = {"linear": self.linear.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.counts is not None:  # a mid-epoch checkpoint: this epoch's running counts so far
            state["counts"] = self.counts.detach().cpu()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._restored_counts = state_dict.get("counts")
        self._pending_state = state_dict
        w = state_dict["linear"]["weight"]
        self._build(w.shape[1], w.shape[0], w.device)

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
        self._ones: torch.Tensor | None = None
        self._tally: torch.Tensor | None = None
        self._reset_counts()

    def _reset_counts(self) -> None:
        """The epoch's counts live on the features' device, (correct, sum of log p(label)) in `_acc`, with the
        number of samples seen as a host int (it is known without reading the device): adding to them costs no
        host sync per step (`int(...)` / `float(...)` of a CUDA value would stall the training step)."""
        self._acc: torch.Tensor | None = None
        self._seen = 0

    @property
    def counts(self) -> torch.Tensor | None:
        """The epoch's running (correct, seen, loss_sum), as one float32 tensor; None before the first batch."""
        if self._acc is None:
            return None
        correct, picked = self._acc.unbind()
        return torch.stack((correct, torch.full_like(correct, float(self._seen)), -picked))

    @counts.setter
    def counts(self, value: torch.Tensor | None) -> None:
        if value is None:
            self._reset_counts()
            return
        value = value.detach().float()
        self._acc, self._seen = torch.stack((value[0], -value[2])), int(value[1])

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
        x = feats.detach().float()
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                self._step(x, labels)
        else:  # entering the context costs host time on every step, and Lightning runs this hook outside autocast
            self._step(x, labels)

    @torch.no_grad()
    def _step(self, x: torch.Tensor, labels: torch.Tensor) -> None:
        """One step of `torch.optim.SGD` (momentum, weight decay) on the mean softmax cross-entropy of the linear
        layer, with its closed-form gradient instead of autograd, plus the batch's counts.

        The per-step host time is what matters on a GPU whose step the host only just keeps fed: autograd's
        backward, `zero_grad` and `optimizer.step()` cost far more host time than the few kernels they launch.
        With p = softmax(x W^T + b) and onehot(labels), the gradient of the mean loss is
        W: (p - onehot)^T x / B, b: sum over the batch of (p - onehot) / B, which `addmm_` / `addmv_` add straight
        into the momentum buffers (`beta=momentum`). The buffers are the optimiser's own
        `state[p]["momentum_buffer"]` and the hyper-parameters its `param_groups[0]`, so checkpoints keep the
        format of `torch.optim.SGD` and a resumed optimiser state applies unchanged. A missing buffer starts at
        zero, which gives the first step of `SGD` exactly (momentum * 0 + d_p = d_p).
        """
        assert self.linear is not None and self.optimizer is not None
        w, b = self.linear.weight, self.linear.bias
        group = self.optimizer.param_groups[0]
        lr, momentum, wd = float(group["lr"]), float(group["momentum"]), float(group["weight_decay"])
        n = labels.shape[0]
        ones, tally = self._scratch(n, x.device)
        logits = torch.addmm(b, x, w.t())
        logp = torch.log_softmax(logits, dim=1)
        target = labels.view(-1, 1)
        torch.eq(logits.argmax(1), labels, out=tally[:, 0])  # (hit, log p(label)) per sample,
        torch.gather(logp, 1, target, out=tally[:, 1:])  # summed over the batch by one addmv
        if self._acc is None:
            self._acc = torch.zeros(2, device=x.device)
        elif self._acc.device != x.device:
            self._acc = self._acc.to(x.device)
        self._acc.addmv_(tally.t(), ones)
        self._seen += n
        g = logp.exp_().scatter_(1, target, -1.0, reduce="add")  # softmax - onehot, in place
        params = [w, b]
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if momentum and not distributed:
            bufs = self._momentum_buffers()
            bufs[0].addmm_(g.t(), x, beta=momentum, alpha=1.0 / n)
            bufs[1].addmv_(g.t(), ones, beta=momentum, alpha=1.0 / n)
            if wd:
                torch._foreach_add_(bufs, params, alpha=wd)
            update = bufs
        else:
            update = self._mean_grads(g, x, ones, n, distributed)
            if wd:
                torch._foreach_add_(update, params, alpha=wd)
            if momentum:
                bufs = self._momentum_buffers()
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, update)
                update = bufs
        torch._foreach_add_(params, update, alpha=-lr)

    def _scratch(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A ones vector (n,) and an (n, 2) tally buffer, kept between steps: allocating and filling them per step
        would add host work and kernels; they change only with the batch size or the device."""
        if self._ones is None or self._ones.shape[0] != n or self._ones.device != device:
            self._ones = torch.ones(n, device=device)
            self._tally = torch.empty(n, 2, device=device)
        assert self._tally is not None
        return self._ones, self._tally

    def _momentum_buffers(self) -> list[torch.Tensor]:
        assert self.linear is not None and self.optimizer is not None
        bufs = []
        for p in (self.linear.weight, self.linear.bias):
            state = self.optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            bufs.append(state["momentum_buffer"])
        return bufs

    def _mean_grads(self, g: torch.Tensor, x: torch.Tensor, ones: torch.Tensor, n: int,
                    distributed: bool) -> list[torch.Tensor]:
        """The gradients of the batch's mean loss; under DDP averaged over the ranks (each rank's mean, as autograd
        would give it, then the mean over ranks) with one all-reduce of one flat buffer."""
        assert self.linear is not None
        c, d = self.linear.weight.shape
        flat = x.new_empty(c * d + c)
        gw, gb = flat[: c * d].view(c, d), flat[c * d:]
        torch.mm(g.t(), x, out=gw)
        torch.mv(g.t(), ones, out=gb)
        world = torch.distributed.get_world_size() if distributed else 1
        flat.mul_(1.0 / (n * world))
        if distributed:
            torch.distributed.all_reduce(flat)
        return [gw, gb]

    def _to(self, device: torch.device) -> None:
        """Follow the features' device, optimiser state (momentum buffers) included."""
        assert self.linear is not None and self.optimizer is not None
        if self.linear.weight.device == device:
            return
        self.linear.to(device)
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = v.to(device)

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

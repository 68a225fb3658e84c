"""Linear probe on a frozen backbone, with the learning rate chosen on a held-out part of the training split.

Protocol (`conf/eval/linear.yaml`; see docs/EVALUATION.md):

1. Sweep: a fixed, seeded, class-stratified `probe.holdout_fraction` of the *training* split is held out; one
   linear head per (lr, weight decay) of `probe.lr_grid` x `probe.wd_grid` is trained on the rest, all heads at
   once (one (G, C, D) weight tensor: the features, and on the full protocol the backbone's forward pass, are
   shared, so the sweep costs about one probe run), and each head is scored on the held-out part (eval view).
   The test (val) split plays no part in the choice.
2. Final: the chosen setting is trained on the whole training split and scored once on the val split.

`probe.lr` / `probe.weight_decay` = `auto` sweep their grid; a number fixes that value (both numbers: no sweep,
no held-out part). Head: weights N(0, 0.01), bias 0, on `probe.feature_norm`-normalised pooled features (`bn`
by default: BatchNorm without affine, as MoCo v3 / MAE), SGD momentum 0.9, lr = base lr x total batch / 256,
cosine to 0. The backbone stays in eval mode (BatchNorm statistics frozen) and gets no gradient.

`fast=true` runs both stages on cached features of the eval view (no augmentation): seconds instead of hours.
The full protocol trains on RandomResizedCrop + flip views through the frozen backbone; its sweep is a second
training run (on 1 - holdout_fraction of the data, `probe.sweep_epochs` epochs), so it costs about twice one probe.

CLI: `python -m scfs.eval.linear ckpt=<path|random> [fast=true] [probe.lr=0.03] [data=...] [+experiment=imagenet]`.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)

log = logging.getLogger("scfs.eval.linear")

FEATURE_NORMS = ("none", "l2", "bn")


# ---- the probe: G linear heads trained side by side ----------------------------------------------------------
class FeatureNorm(nn.Module):
    """What the heads see: raw pooled features (`none`), L2-normalised ones (`l2`), or BatchNorm without affine
    (`bn`, running statistics at evaluation)."""

    def __init__(self, mode: str, dim: int) -> None:
        super().__init__()
        if mode not in FEATURE_NORMS:
            raise ValueError(f"feature_norm={mode!r}: allowed are {', '.join(FEATURE_NORMS)}")
        self.mode = mode
        self.bn = nn.BatchNorm1d(dim, affine=False) if mode == "bn" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "l2":
            return F.normalize(x.float(), dim=1)
        if self.bn is not None:
            if self.training and x.shape[0] == 1:  # a last batch of one has no batch variance
                return F.batch_norm(x, self.bn.running_mean, self.bn.running_var, eps=self.bn.eps)
            return self.bn(x)
        return x


class GridLinear(nn.Module):
    """G independent linear layers on the same input: weight (G, C, D), bias (G, C); (B, D) -> (G, B, C)."""

    def __init__(self, members: int, in_dim: int, num_classes: int) -> None:
        super().__init__()
        w = torch.empty(num_classes, in_dim)
        nn.init.normal_(w, mean=0.0, std=0.01)
        # every member starts from the same init, so members differ only in their lr / weight decay
        self.weight = nn.Parameter(w.expand(members, -1, -1).clone())
        self.bias = nn.Parameter(torch.zeros(members, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, c, d = self.weight.shape
        # one (B, D) x (D, G*C) matmul: a batched matmul over G small heads measured slower on the CPU
        out = torch.addmm(self.bias.reshape(-1), x, self.weight.reshape(g * c, d).T)
        return out.view(x.shape[0], g, c).transpose(0, 1)


class GridSGD(torch.optim.Optimizer):
    """torch.optim.SGD (momentum, no dampening, weight decay on every parameter) where dim 0 of each parameter
    indexes a grid member with its own lr and weight decay; the group's `lr` is a factor (the cosine schedule)."""

    def __init__(self, params: Any, lrs: Sequence[float], weight_decays: Sequence[float], momentum: float) -> None:
        super().__init__(params, {"lr": 1.0, "momentum": float(momentum)})
        self.lrs = torch.tensor([float(v) for v in lrs])
        self.wds = torch.tensor([float(v) for v in weight_decays])
        self._on: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _member_values(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(lrs, wds) on p's device: copied once, not a host-to-device copy every step."""
        key = (p.device, p.dtype)
        if key not in self._on:
            self._on[key] = (self.lrs.to(p), self.wds.to(p))
        return self._on[key]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                shape = (-1,) + (1,) * (p.dim() - 1)
                lrs, wds = self._member_values(p)
                d = p.grad + wds.view(shape) * p
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = d.clone()
                else:
                    buf.mul_(group["momentum"]).add_(d)
                p.sub_(lrs.view(shape) * group["lr"] * buf)
        return loss


class LinearProbe(L.LightningModule):
    """Linear heads on frozen features: the backbone's pooled feature (`backbone` given) or precomputed features.
    `lr` / `weight_decay` given as sequences of equal length train one head per pair (a sweep)."""

    def __init__(self, in_dim: int, num_classes: int, backbone: nn.Module | None = None,
                 lr: float | Sequence[float] = 0.001, batch_size: int = 256, momentum: float = 0.9,
                 weight_decay: float | Sequence[float] = 0.0, epochs: int = 100, scale_lr: bool = True,
                 feature_norm: str = "none", log_prefix: str = "train") -> None:
        super().__init__()
        lrs = [float(v) for v in (lr if isinstance(lr, Sequence) else [lr])]
        wds = [float(v) for v in (weight_decay if isinstance(weight_decay, Sequence) else [weight_decay])]
        if len(wds) == 1 and len(lrs) > 1:
            wds = wds * len(lrs)
        if len(wds) != len(lrs):
            raise ValueError(f"{len(lrs)} learning rates but {len(wds)} weight decays")
        self.save_hyperparameters(ignore=["backbone"])
        self.lrs, self.wds = lrs, wds
        self.backbone = backbone
        if backbone is not None:
            for p in backbone.parameters():
                p.requires_grad_(False)
            backbone.eval()
        self.norm = FeatureNorm(feature_norm, in_dim)
        self.heads = GridLinear(len(lrs), in_dim, num_classes)
        self.log_prefix = log_prefix

    @property
    def members(self) -> int:
        return len(self.lrs)

    def train(self, mode: bool = True) -> LinearProbe:
        """Only the heads (and the norm's running statistics) train: the backbone's BatchNorm statistics stay
        those of the checkpoint."""
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
        """(G, B, C) logits: one row block per grid member, from one backbone forward."""
        return self.heads(self.norm(self.features(x)))

    @staticmethod
    def grid_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The sum over members of each member's mean cross-entropy, from (G, B, C) logits: every head gets
        exactly its own single-probe gradient."""
        g, n, c = logits.shape
        flat = logits.transpose(0, 1).reshape(n * g, c).float()  # (B, G, C) rows: a view for GridLinear's output
        return F.cross_entropy(flat, y.repeat_interleave(g), reduction="sum") / n

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        g, n, c = logits.shape
        loss = self.grid_loss(logits, y)
        self.log(f"{stage}/loss", loss / g, on_step=False, on_epoch=True, batch_size=n)
        if g == 1:
            top = logits[0].topk(min(5, c), dim=1).indices
            self.log(f"{stage}/top1", 100.0 * (top[:, 0] == y).float().mean(), on_step=False, on_epoch=True,
                     prog_bar=stage == "val", batch_size=n)
            if c > 5:
                self.log(f"{stage}/top5", 100.0 * (top == y[:, None]).any(1).float().mean(), on_step=False,
                         on_epoch=True, batch_size=n)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, self.log_prefix)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def lr_scale(self) -> float:
        h = self.hparams
        world = self.trainer.world_size if self._trainer is not None else 1
        return h.batch_size * world / 256 if h.scale_lr else 1.0

    def configure_optimizers(self):
        h = self.hparams
        scale = self.lr_scale()
        opt = GridSGD(self.heads.parameters(), [lr * scale for lr in self.lrs], self.wds, h.momentum)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(int(h.epochs), 1), eta_min=0.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    def export_head(self, member: int = 0) -> dict[str, Any]:
        """Member `member` as one linear layer: with `bn` the running statistics are folded in, so `weight`/`bias`
        act on raw pooled features; with `l2` they act on L2-normalised features (`feature_norm` says which)."""
        w = self.heads.weight[member].detach().float().cpu()
        b = self.heads.bias[member].detach().float().cpu()
        mode = self.norm.mode
        if self.norm.bn is not None:
            bn = self.norm.bn
            inv = (bn.running_var.detach().float().cpu() + bn.eps).rsqrt()
            w = w * inv[None, :]
            b = b - w @ bn.running_mean.detach().float().cpu()
            mode = "none"
        return {"weight": w, "bias": b, "feature_norm": mode}


class EpochOrder(IterableDataset):
    """One item per pass: the order in which an epoch visits the `n` training samples, drawn as the per-minibatch
    loop drew it (Lightning on `feature_loader(shuffle=True, seed=seed)`), so the fast path's one-step-per-epoch
    loop sees the same minibatches in the same order.

    That loader's `RandomSampler` takes one permutation from its generator (seeded once) per pass, then a second
    one for the remainder of `num_samples / n` (empty), but only when it is read past its n-th index: the batch
    sampler reads on to form a shorter last batch, whereas with `n % batch_size == 0` Lightning stops after the
    loader's known number of batches and the second draw never happens."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        super().__init__()
        if n < 1 or batch_size < 1:
            raise ValueError(f"{n} training samples in batches of {batch_size}: both must be at least 1")
        self.n, self.batch_size = int(n), int(batch_size)
        self.generator = torch.Generator().manual_seed(int(seed))

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        perm = torch.randperm(self.n, generator=self.generator)
        if self.n % self.batch_size:
            torch.randperm(self.n, generator=self.generator)
        yield perm


class FeatureProbe(LinearProbe):
    """The fast path's `LinearProbe`: the training features sit on the training device once (`attach`), and one
    Lightning step runs a whole epoch of minibatches (its batch is the epoch's `EpochOrder`).

    Same updates as the per-minibatch loop (`LinearProbe` with automatic optimization on `feature_loader`): each
    minibatch of `batch_size` in the epoch's order gets a fresh gradient of `grid_loss` and one `GridSGD` step,
    and the cosine factor moves once per epoch. What it saves is the host work around each minibatch: Lightning's
    per-step hooks and logging, the loader's indexing and the host-to-device copy. Nothing in the loop reads a
    value back to the host; the epoch's loss (and top-1 / top-5 for a single head) is logged once, at its end."""

    _train_data: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def automatic_optimization(self) -> bool:
        return False

    def attach(self, features: torch.Tensor, labels: torch.Tensor) -> FeatureProbe:
        """The training split, moved to the training device when fit starts and dropped when it ends."""
        if features.dim() != 2 or features.shape[0] != labels.shape[0]:
            raise ValueError(f"features {tuple(features.shape)} and labels {tuple(labels.shape)}: expected (N, D) "
                             "features with one label each")
        self._train_data = (features.float(), labels.long())
        return self

    def on_fit_start(self) -> None:
        if self._train_data is None:
            raise RuntimeError("FeatureProbe.attach(features, labels) must come before Trainer.fit")
        f, y = self._train_data
        self._train_data = (f.to(self.device), y.to(self.device))

    def on_fit_end(self) -> None:
        self._train_data = None

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        """One epoch: `batch` is its sample order, cut into minibatches of `batch_size` (the last one shorter).

        The fast path runs on one device in fp32 (`_trainer`), where Lightning's `manual_backward` and optimizer
        wrapper add only per-call hooks (0.4 to 0.6 ms a minibatch on the 2-core CPU) to `backward` and
        `GridSGD.step`: the loop calls those directly. So `trainer.global_step` stays 0, and the logger's step
        axis counts epochs (one Lightning step each), not minibatches."""
        assert self._train_data is not None
        f, y = self._train_data
        opt = self.optimizers().optimizer
        order = batch.to(f.device)
        g, n_all = self.members, order.numel()
        losses: list[torch.Tensor] = []
        hits: list[torch.Tensor] = []
        for idx in order.split(int(self.hparams.batch_size)):
            x, t = f.index_select(0, idx), y.index_select(0, idx)  # a gather as `f[idx]`, without its overhead
            logits = self(x)
            loss = self.grid_loss(logits, t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach() * t.numel())
            if g == 1:
                hits.append(logits.detach()[0].topk(min(5, logits.shape[2]), dim=1).indices == t[:, None])
        self.lr_schedulers().step()
        stage = self.log_prefix
        self.log(f"{stage}/loss", torch.stack(losses).sum() / (g * n_all), on_step=False, on_epoch=True,
                 batch_size=n_all)
        if g == 1:
            hit = torch.cat(hits)
            self.log(f"{stage}/top1", 100.0 * hit[:, 0].float().mean(), on_step=False, on_epoch=True,
                     batch_size=n_all)
            if self.heads.weight.shape[1] > 5:
                self.log(f"{stage}/top5", 100.0 * hit.any(1).float().mean(), on_step=False, on_epoch=True,
                         batch_size=n_all)


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
    # intended here: the frozen backbone sits in eval mode, and validation is optional
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"You defined a `validation_step` but have no `val_dataloader`")
    # the fast path's EpochOrder: one item a pass, read in the main process (no workers to split it)
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")
    return L.Trainer(**kwargs)


def train_linear_on_features(train_f: torch.Tensor, train_y: torch.Tensor, num_classes: int, *, epochs: int = 100,
                             batch_size: int = 256, lr: float | Sequence[float] = 0.001, momentum: float = 0.9,
                             weight_decay: float | Sequence[float] = 0.0, seed: int = 0,
                             feature_norm: str = "none", val: tuple[torch.Tensor, torch.Tensor] | None = None,
                             val_every: int = 0, logger: Any = None, run_dir: Path | None = None,
                             progress: bool = False, log_prefix: str = "train") -> LinearProbe:
    """The fast path: linear head(s) trained on precomputed features (one head per lr / weight-decay pair), one
    Lightning step per epoch (`FeatureProbe`); the same minibatches and updates as `LinearProbe` on
    `feature_loader(train_f, train_y, batch_size, shuffle=True, seed=seed)`."""
    L.seed_everything(seed, verbose=False)
    probe = FeatureProbe(train_f.shape[1], num_classes, None, lr, batch_size, momentum, weight_decay, epochs,
                         feature_norm=feature_norm, log_prefix=log_prefix).attach(train_f, train_y)
    trainer = _trainer({"progress": progress}, epochs, logger, run_dir, True, val_every if val else 0)
    val_loader = feature_loader(*val, batch_size, False) if val is not None and val_every > 0 else None
    epochs_loader = DataLoader(EpochOrder(train_f.shape[0], batch_size, seed), batch_size=None)
    threads = torch.get_num_threads()
    try:
        # small (B, D) x (D, C) matmuls gain nothing from intra-op threads, and on a shared CPU the thread
        # hand-off dominates: 1 thread measured 10-50x faster than 2 on a loaded 2-core machine (shapes probe);
        # a 21-head grid at CIFAR size too (5 vs 29 ms a step), so grid members do not count here
        if batch_size * train_f.shape[1] * num_classes < 1 << 24:
            torch.set_num_threads(1)
        trainer.fit(probe, epochs_loader, val_loader)
    finally:
        torch.set_num_threads(threads)
    return probe.cpu().eval()


@torch.no_grad()
def probe_scores(probe: LinearProbe, features: torch.Tensor, batch_size: int = 4096,
                 member: int | None = 0) -> torch.Tensor:
    """Logits of head `member` (N, C) for precomputed features, or of every head (G, N, C) with `member=None`."""
    probe.norm.cpu().eval()
    probe.heads.cpu().eval()
    out = torch.cat([probe.heads(probe.norm(f.float())) for f in features.split(batch_size)], dim=1)
    return out if member is None else out[member]


# ---- the held-out split and the choice ------------------------------------------------------------------------
def stratified_holdout(labels: torch.Tensor, fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit, holdout) indices into `labels`, sorted: round(fraction x N) samples held out, spread over classes in
    proportion to their counts (largest remainder), each class keeping at least one sample to fit on. Depends
    only on the labels, the fraction and the seed."""
    labels = labels.long().cpu()
    n = labels.numel()
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction {fraction}: must be in (0, 1)")
    if n < 2:
        raise ValueError(f"{n} training samples: a held-out split needs at least 2")
    classes, counts = labels.unique(return_counts=True)
    room = counts - 1  # each class keeps one sample to fit on
    n_hold = min(max(1, round(fraction * n)), int(room.sum()))
    if n_hold < 1:
        raise ValueError("every class has a single training sample: nothing can be held out")
    quota = n_hold * counts.double() / n
    take = torch.minimum(quota.floor().long(), room)
    rest = quota - take
    for i in torch.argsort(-rest, stable=True).tolist() * 2:  # largest remainders first; second pass fills caps
        if int(take.sum()) >= n_hold:
            break
        if take[i] < room[i]:
            take[i] += 1
    gen = torch.Generator().manual_seed(int(seed))
    hold = []
    for c, k in zip(classes.tolist(), take.tolist(), strict=True):
        idx = (labels == c).nonzero().flatten()
        hold.append(idx[torch.randperm(idx.numel(), generator=gen)[:k]])
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.cat(hold)] = True
    return (~mask).nonzero().flatten(), mask.nonzero().flatten()


@dataclass
class SweepRow:
    """One grid member: its base lr, weight decay and held-out score (top-1 %, mean cross-entropy)."""

    lr: float
    weight_decay: float
    holdout_top1: float
    holdout_loss: float
    finite: bool


def score_members(scores: torch.Tensor, labels: torch.Tensor, lrs: Sequence[float], wds: Sequence[float]
                  ) -> list[SweepRow]:
    """Held-out top-1 and cross-entropy of every member from (G, N, C) logits; a diverged member scores 0 / inf."""
    rows = []
    for g in range(scores.shape[0]):
        s = scores[g].double()
        finite = bool(torch.isfinite(s).all())
        top1 = 100.0 * (s.argmax(1) == labels).double().mean().item() if finite else 0.0
        loss = F.cross_entropy(s, labels).item() if finite else math.inf
        rows.append(SweepRow(float(lrs[g]), float(wds[g]), top1, loss, finite))
    return rows


def choose(rows: Sequence[SweepRow]) -> int:
    """The member with the best held-out top-1; ties go to the lower held-out loss, then to the earlier member."""
    return min(range(len(rows)), key=lambda i: (-rows[i].holdout_top1, rows[i].holdout_loss, i))


def sweep_on_features(train_f: torch.Tensor, train_y: torch.Tensor, num_classes: int, lrs: Sequence[float],
                      wds: Sequence[float], *, holdout_fraction: float = 0.1, seed: int = 0,
                      **train_kwargs: Any) -> tuple[list[SweepRow], int, dict[str, torch.Tensor]]:
    """The fast path's sweep: one head per (lrs[g], wds[g]) trained at once on the fit part of a stratified
    held-out split of the training features, scored on the held-out part. Returns (rows, chosen index,
    {"fit": indices, "holdout": indices}). Only the training split goes in: nothing else can steer the choice."""
    fit_idx, hold_idx = stratified_holdout(train_y, holdout_fraction, seed)
    probe = train_linear_on_features(train_f[fit_idx], train_y[fit_idx], num_classes, lr=list(lrs),
                                     weight_decay=list(wds), seed=seed, **train_kwargs)
    rows = score_members(probe_scores(probe, train_f[hold_idx], member=None), train_y[hold_idx], lrs, wds)
    return rows, choose(rows), {"fit": fit_idx, "holdout": hold_idx}


# ---- config ---------------------------------------------------------------------------------------------------
@dataclass
class ProbePlan:
    """The resolved `probe.*` settings: the grid (one (lr, wd) pair per member) and whether it is swept."""

    lrs: list[float]
    wds: list[float]
    holdout_fraction: float
    feature_norm: str
    sweep_epochs: int
    lr_mode: str
    wd_mode: str

    @property
    def sweep(self) -> bool:
        return len(self.lrs) > 1


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _grid(p: DictConfig, key: str, allow_zero: bool) -> list[float]:
    from omegaconf import ListConfig

    from scfs.config import ConfigError

    value = p.get(key)
    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
    if not items or not all(_is_number(v) and (v >= 0 if allow_zero else v > 0) for v in items):
        kind = "non-negative" if allow_zero else "positive"
        raise ConfigError(f"config key probe.{key}={value!r} is invalid: expected a non-empty list of {kind} "
                          f"numbers, e.g. probe.{key}=[{'0,1e-4' if allow_zero else '0.01,0.1,1'}]")
    return [float(v) for v in items]


def probe_plan(p: DictConfig) -> ProbePlan:
    """`cfg.probe` resolved and checked; a bad value is one `ConfigError` line naming its key."""
    from scfs.config import ConfigError

    def values(key: str, grid_key: str, allow_zero: bool) -> tuple[list[float], str]:
        v = p.get(key)
        if v == "auto":
            return _grid(p, grid_key, allow_zero), "auto"
        if _is_number(v) and (v >= 0 if allow_zero else v > 0):
            return [float(v)], "fixed"
        raise ConfigError(f"config key probe.{key}={v!r} is invalid: expected auto (sweep probe.{grid_key} on a "
                          f"held-out part of the training split) or a {'non-negative' if allow_zero else 'positive'} "
                          "number")

    lr_values, lr_mode = values("lr", "lr_grid", False)
    wd_values, wd_mode = values("weight_decay", "wd_grid", True)
    frac = p.get("holdout_fraction", 0.1)
    if not _is_number(frac) or not 0.0 < frac < 1.0:
        raise ConfigError(f"config key probe.holdout_fraction={frac!r} is invalid: expected a number in (0, 1), "
                          "e.g. 0.1")
    norm = p.get("feature_norm", "bn")
    if norm not in FEATURE_NORMS:
        raise ConfigError(f"config key probe.feature_norm={norm!r} is invalid: expected one of "
                          f"{', '.join(FEATURE_NORMS)}")
    epochs = p.get("epochs")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ConfigError(f"config key probe.epochs={epochs!r} is invalid: expected a positive integer")
    sweep_epochs = p.get("sweep_epochs")
    if sweep_epochs is None:
        sweep_epochs = epochs
    elif not isinstance(sweep_epochs, int) or isinstance(sweep_epochs, bool) or sweep_epochs < 1:
        raise ConfigError(f"config key probe.sweep_epochs={sweep_epochs!r} is invalid: expected a positive integer "
                          "or null (= probe.epochs)")
    pairs = list(itertools.product(lr_values, wd_values))
    return ProbePlan([a for a, _ in pairs], [b for _, b in pairs], float(frac), str(norm), int(sweep_epochs),
                     lr_mode, wd_mode)


def sweep_table(rows: Sequence[SweepRow], chosen: int, lr_scale: float) -> str:
    """Markdown table of the sweep (base lr, effective lr, weight decay, held-out top-1 / loss), chosen in bold."""
    lines = ["| base lr | effective lr | weight decay | held-out top-1 | held-out loss | |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        mark = "**chosen**" if i == chosen else ("diverged" if not r.finite else "")
        lines.append(f"| {r.lr:g} | {r.lr * lr_scale:g} | {r.weight_decay:g} | {r.holdout_top1:.2f} | "
                     f"{r.holdout_loss:.4f} | {mark} |")
    return "\n".join(lines)


# ---- CLI: python -m scfs.eval.linear ckpt=... ----------------------------------------------------------------
def run_linear(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Linear probe of `cfg.ckpt` on `cfg.data` (full protocol, or `fast=true` on cached features): lr / weight
    decay swept on a held-out part of the training split (`probe.lr=auto`), then the chosen setting trained on
    the whole training split and scored on the val split. Writes the report into `run_dir` and returns the
    metrics document (also `<run_dir>/metrics.json`)."""
    from scfs.config import check_accelerator
    from scfs.eval.common import (
        RandomResizedCropFlip,
        build_split,
        class_names,
        eval_backbone_and_splits,
        eval_size,
        make_run_dir,
        resolve_device,
        split_features,
        to_plain,
    )
    from scfs.eval.report import EvalLogger, EvalResult, confusion_matrix, topk_accuracy
    from scfs.reliability import scrub

    t0 = time.time()
    p = cfg.probe
    plan = probe_plan(p)  # before any work
    run_dir = make_run_dir(cfg, run_dir)
    fast = bool(cfg.fast)
    device = resolve_device(cfg.get("device"))
    if not fast:  # the full protocol trains in a Lightning Trainer: its accelerator is checked before any work
        check_accelerator(cfg.get("trainer"))
    backbone, info, tf, sets = eval_backbone_and_splits(cfg, device)
    t_load = time.time()

    def features(split: str):
        return split_features(cfg, backbone, info, split, sets[split], device)

    va = features("val")  # the final evaluation always uses the eval view: cached in both paths
    # the sweep scores its held-out part on the eval view too, so it needs the training split's eval features
    tr = features("train") if fast or plan.sweep else None
    num_classes = int(getattr(sets["train"], "num_classes", 0) or int(va.labels.max()) + 1)
    if tr is not None:
        num_classes = max(num_classes, int(tr.labels.max()) + 1)
    result_cfg = scrub(to_plain(cfg))
    elog = EvalLogger(run_dir, to_plain(cfg.get("logger")), f"linear{'-fast' if fast else ''}-{info.label}",
                      result_cfg)
    try:
        lightning_logger = elog.lightning_logger()
        epochs, bs, seed = int(p.epochs), int(p.batch_size), int(cfg.seed)
        momentum = float(p.momentum)
        progress = bool(cfg.get("progress", True))
        train_tf = None if fast else RandomResizedCropFlip(eval_size(cfg)[0], tuple(p.scale),
                                                          cfg.get("interpolation", "bilinear"))

        def fit(lrs: list[float], wds: list[float], n_epochs: int, idx: torch.Tensor | None,
                final: bool) -> LinearProbe:
            """Train one head per (lr, wd) on the training split (`idx`: its fit part) for `n_epochs`; the fast
            path's sweep goes through `sweep_on_features` instead."""
            # the sweep logs nothing to the run's logger: its held-out scores are the report, and a second
            # Lightning run on one W&B run would restart its step counter
            logger = lightning_logger if final else None
            val_every = int(p.val_every_n_epochs) if final else 0
            if fast:
                assert tr is not None
                f, y = (tr.features, tr.labels) if idx is None else (tr.features[idx], tr.labels[idx])
                return train_linear_on_features(f, y, num_classes, epochs=n_epochs, batch_size=bs, lr=lrs,
                                                momentum=momentum, weight_decay=wds, seed=seed,
                                                feature_norm=plan.feature_norm, val=(va.features, va.labels),
                                                val_every=val_every, logger=logger, run_dir=run_dir,
                                                progress=progress)
            L.seed_everything(seed, verbose=False)
            train_set = build_split(cfg, "train", train_tf)
            if idx is not None:
                train_set = Subset(train_set, idx.tolist())
            loader = DataLoader(train_set, batch_size=bs, shuffle=True, num_workers=int(cfg.num_workers),
                                pin_memory=device.type == "cuda", persistent_workers=int(cfg.num_workers) > 0)
            val_loader = (DataLoader(sets["val"], batch_size=int(cfg.batch_size), num_workers=int(cfg.num_workers))
                          if val_every > 0 else None)
            probe = LinearProbe(backbone.embed_dim, num_classes, backbone, lrs, bs, momentum, wds, n_epochs,
                                feature_norm=plan.feature_norm, log_prefix="train" if final else "sweep")
            trainer = _trainer(cfg, n_epochs, logger, run_dir, False, val_every)
            trainer.fit(probe, loader, val_loader)
            return probe.cpu().eval()

        t_feat = time.time()
        rows: list[SweepRow] = []
        chosen = 0
        split_info: dict[str, Any] = {}
        if plan.sweep:
            assert tr is not None
            if fast:
                rows, chosen, parts = sweep_on_features(
                    tr.features, tr.labels, num_classes, plan.lrs, plan.wds, holdout_fraction=plan.holdout_fraction,
                    seed=seed, epochs=plan.sweep_epochs, batch_size=bs, momentum=momentum,
                    feature_norm=plan.feature_norm, progress=progress, log_prefix="sweep")
                fit_idx, hold_idx = parts["fit"], parts["holdout"]
            else:
                fit_idx, hold_idx = stratified_holdout(tr.labels, plan.holdout_fraction, seed)
                sweep_probe = fit(plan.lrs, plan.wds, plan.sweep_epochs, fit_idx, final=False)
                rows = score_members(probe_scores(sweep_probe, tr.features[hold_idx], member=None),
                                     tr.labels[hold_idx], plan.lrs, plan.wds)
                chosen = choose(rows)
            split_info = {"n_fit": int(fit_idx.numel()), "n_holdout": int(hold_idx.numel())}
            log.info("lr sweep on %d held-out training samples: chose lr %g, weight decay %g (held-out top-1 "
                     "%.2f%%)", hold_idx.numel(), rows[chosen].lr, rows[chosen].weight_decay,
                     rows[chosen].holdout_top1)
        t_sweep = time.time()
        lr, wd = plan.lrs[chosen], plan.wds[chosen]
        probe = fit([lr], [wd], epochs, None, final=True)
        t_train = time.time()
        if fast:
            train_note = f"fast path: trained on cached {info.which} features of the eval view (no augmentation)"
        else:
            train_note = f"full protocol: frozen {info.which} backbone, training views {train_tf!r}"
        scores = probe_scores(probe, va.features)
        metrics = topk_accuracy(scores, va.labels, (1, 5))
        head = probe.export_head(0)
        torch.save({**head, "checkpoint_id": info.id, "which": info.which, "lr": lr, "weight_decay": wd},
                   run_dir / "linear_head.pt")
        lr_scale = bs / 256
        probe_doc = {"lr": lr, "lr_effective": lr * lr_scale, "weight_decay": wd, "feature_norm": plan.feature_norm,
                     "selection": "held-out sweep" if plan.sweep else "fixed", "lr_mode": plan.lr_mode,
                     "wd_mode": plan.wd_mode, "epochs": epochs, "batch_size": bs,
                     "holdout_fraction": plan.holdout_fraction if plan.sweep else None,
                     "sweep_epochs": plan.sweep_epochs if plan.sweep else None, **split_info,
                     "sweep": [asdict(r) for r in rows], "chosen_index": chosen if plan.sweep else None}
        if plan.sweep:
            sel = (f"lr and weight decay chosen on a held-out {plan.holdout_fraction:g} of the training split "
                   f"(class-stratified, seed {seed}; {split_info['n_fit']} fit / {split_info['n_holdout']} held out, "
                   f"{plan.sweep_epochs} epochs, {len(rows)} settings trained at once), then retrained on the whole "
                   "training split; the val split is used once, for the numbers below")
        else:
            sel = "lr and weight decay fixed by the config (no sweep)"
        result = EvalResult(
            kind="linear", metrics=metrics, checkpoint=info.as_dict(),
            data={"name": cfg.data.name, "root": str(cfg.data.get("root")), "n_train": len(sets["train"]),
                  "n_val": len(sets["val"]), "num_classes": num_classes, "transform": repr(tf)},
            class_names=class_names(sets["train"], num_classes),
            confusion=confusion_matrix(scores.argmax(1), va.labels, num_classes), config=result_cfg,
            timings={"load_s": t_load - t0, "features_s": t_feat - t_load, "sweep_s": t_sweep - t_feat,
                     "train_s": t_train - t_sweep},
            notes=[f"protocol: linear layer on {plan.feature_norm}-normalised pooled features, SGD momentum "
                   f"{momentum:g}, wd {wd:g}, lr {lr:g} x {bs}/256 = {lr * lr_scale:g}, cosine to 0, {epochs} "
                   f"epochs, batch {bs}", sel, train_note,
                   "top1/top5 of the final linear layer on the val split (eval view)"],
            extra={"probe": probe_doc})
        result.timings["total_s"] = time.time() - t0
        doc = elog.write(result)
        if plan.sweep:
            _append_sweep_section(run_dir / "report.md", rows, chosen, lr_scale, plan)
        if elog.run is not None:
            _log_sweep_wandb(elog.run, probe_doc, rows)
    finally:
        elog.finish()
    doc["run_dir"] = str(run_dir)
    print(summary_line(doc), flush=True)
    return doc


def _append_sweep_section(report: Path, rows: Sequence[SweepRow], chosen: int, lr_scale: float,
                          plan: ProbePlan) -> None:
    text = report.read_text()
    section = ["## Learning-rate / weight-decay sweep (held-out part of the training split)", "",
               f"Grid: base lr {sorted(set(plan.lrs))} ({plan.lr_mode}) x weight decay {sorted(set(plan.wds))} "
               f"({plan.wd_mode}); effective lr = base lr x {lr_scale:g}; {plan.sweep_epochs} epochs on "
               f"{1 - plan.holdout_fraction:g} of the training split. Chosen: lr {rows[chosen].lr:g}, weight decay "
               f"{rows[chosen].weight_decay:g}.", "", sweep_table(rows, chosen, lr_scale), ""]
    marker = "\n## Per-class accuracy"
    at = text.find(marker)
    block = "\n".join(section)
    report.write_text(text[:at] + "\n" + block + text[at:] if at >= 0 else text + "\n" + block)


def _log_sweep_wandb(run: Any, probe_doc: dict[str, Any], rows: Sequence[SweepRow]) -> None:
    import wandb

    summary = {"linear/lr": probe_doc["lr"], "linear/lr_effective": probe_doc["lr_effective"],
               "linear/weight_decay": probe_doc["weight_decay"], "linear/feature_norm": probe_doc["feature_norm"],
               "linear/selection": probe_doc["selection"]}
    if rows:
        cols = ["lr", "weight_decay", "holdout_top1", "holdout_loss", "finite"]
        run.log({"linear/sweep": wandb.Table(columns=cols, data=[[getattr(r, c) for c in cols] for r in rows])})
        best = rows[probe_doc["chosen_index"]]
        summary["linear/holdout_top1"] = best.holdout_top1
    run.summary.update(summary)


def summary_line(doc: dict[str, Any]) -> str:
    from scfs.eval.common import headline, report_tail

    head = headline(doc, f"linear probe ({'fast' if doc['config'].get('fast') else 'full'})")
    pr = doc.get("probe") or {}
    if pr:
        head += f" | lr {pr['lr']:g} wd {pr['weight_decay']:g} ({pr['selection']})"
    return f"{head} | {report_tail(doc)}"


def main() -> None:
    """`python -m scfs.eval.linear ckpt=<path|random> [fast=true] [data=...] [+experiment=imagenet]`."""
    from scfs.eval.common import hydra_cli

    hydra_cli("linear", run_linear)


if __name__ == "__main__":
    main()

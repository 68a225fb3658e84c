"""Optimizers of the pretraining run (the `optim` config group) and when they may use their fused kernels.

A leaf module (nothing from scfs): config validation and the training module both use it.

A fused step (one multi-tensor kernel per step instead of a few foreach ops per group) can run with these rules:

* Under fp16 loss scaling a fused optimizer unscales the gradients inside its own step, so gradients cannot be
  clipped before it (they are still scaled): fused + fp16 + clipping is refused at start-up.
* Lightning's mixed-precision plugin refuses clipping with a fused optimizer under *every* mixed precision, bf16
  too, although bf16 has no loss scaler. `clip_gradients_` is the clipping the training module uses instead
  (`configure_gradient_clipping`), so bf16 and fp32 runs can take the fused step with clipping.
* torch's fused SGD needs every momentum buffer of a group or none (`fill_momentum_buffers_`).

The policy itself is torch-free, so config validation can use it at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

OPTIMIZERS = ("sgd", "adamw", "lars")
FUSABLE = ("sgd", "adamw")  # torch optimizers with a `fused=True` kernel; timm's LARS has none
FP16_SCALED = ("16-mixed", "16")  # trainer.precision values that run a GradScaler


class FusedOptimizerError(ValueError):
    """`optim.fused=true` asked for a fused step that cannot run with this optimizer, precision or clipping."""


def use_fused_optimizer(want: bool | str, name: str, fp16_scaled: bool, clip_val: float) -> bool:
    """Whether to build the optimizer `name` with `fused=True`.

    `auto` keeps the foreach step: on an H200 the fused step was not faster on the shipped recipes (ResNet-50
    SCFS B=32 125.1 vs 119.1 ms, B=64 121.8 vs 135.9, DINO B=32 91.2 vs 80.9, CIFAR B=512 105.5 vs 100.2: within
    the run-to-run spread either way; benchmarks/results/step-h200-2026-12-01-fused-ab.md). `true` asks for it and
    runs wherever it can; where it cannot, `FusedOptimizerError` names the fix.
    """
    if want == "auto" or not want:
        return False
    if name not in FUSABLE:
        raise FusedOptimizerError(f"optim.fused=true is not available for optim.name={name}: only "
                                  f"{' and '.join(FUSABLE)} have a fused step. Use optim.fused=auto or false")
    if fp16_scaled and clip_val > 0:
        raise FusedOptimizerError(
            "optim.fused=true cannot be combined with fp16 loss scaling (trainer.precision=16-mixed) and gradient "
            f"clipping (trainer.gradient_clip_val={clip_val}): the fused step unscales the gradients itself, after "
            "clipping would have run. Use optim.fused=auto, trainer.precision=bf16-mixed, or "
            "trainer.gradient_clip_val=0")
    return True


def build_optimizer(groups: list[dict[str, Any]], cfg: Mapping[str, Any], fused: bool) -> torch.optim.Optimizer:
    """SGD, AdamW or LARS (timm) over `groups` from the `optim` config; `lr` is overwritten every step."""
    import torch

    name = cfg.get("name", "sgd")
    kw: dict[str, Any] = {"fused": True} if fused else {}
    if name == "sgd":
        return torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg.get("momentum", 0.9), **kw)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg.get("betas", (0.9, 0.999))), **kw)
    if name == "lars":
        from timm.optim import Lars

        return Lars(groups, lr=cfg["lr"], momentum=cfg.get("momentum", 0.9))
    raise ValueError(f"optim.name={name!r} is not known: allowed are {', '.join(OPTIMIZERS)}")


def fill_momentum_buffers_(optimizer: torch.optim.Optimizer) -> None:
    """Give every SGD parameter that has a gradient but no momentum buffer yet a zero buffer.

    torch's fused SGD takes a group's buffers all at once and fails ("expected Tensor ... but got NoneType") when
    some exist and others do not: the last layer, whose gradients are dropped while it is frozen, gets its first
    gradient epochs after the rest. With dampening 0 a zero buffer is exactly SGD's first step (buffer = grad)."""
    import torch

    for group in optimizer.param_groups:
        if not group.get("momentum") or group.get("dampening"):
            continue
        for p in group["params"]:
            if p.grad is not None and optimizer.state[p].get("momentum_buffer") is None:
                optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)


def clip_gradients_(params: Iterable[torch.Tensor], clip_val: float, algorithm: str | None) -> None:
    """Clip true (unscaled) gradients in place by their global norm (`norm`, the default) or by value.

    The same operation as Lightning's clipping (`clip_grad_norm_` over every parameter of the optimizer), without
    its refusal of fused optimizers: the caller guarantees that no loss scaler is active."""
    import torch

    grads = [p for p in params if p.grad is not None]
    if not grads or not clip_val:
        return
    if str(getattr(algorithm, "value", algorithm) or "norm").lower() == "value":
        torch.nn.utils.clip_grad_value_(grads, clip_val, foreach=True)
    elif len({(p.grad.device, p.grad.dtype) for p in grads}) == 1:
        clip_grad_norm_one_group_([p.grad for p in grads], float(clip_val))
    else:
        torch.nn.utils.clip_grad_norm_(grads, clip_val, foreach=True)


def clip_grad_norm_one_group_(grads: list[torch.Tensor], max_norm: float) -> None:
    """`torch.nn.utils.clip_grad_norm_(..., foreach=True)` (2-norm) for gradients of one device and dtype, with the
    same ops in the same order, less one no-op `.to(device)` per gradient that torch dispatches to move every
    per-tensor norm to the first one's device: on a host-bound step those are a few hundred dispatched ops."""
    import torch

    with torch.no_grad():
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        clip_coef = max_norm / (total_norm + 1e-6)
        torch._foreach_mul_(grads, torch.clamp(clip_coef, max=1.0))

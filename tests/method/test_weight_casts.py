"""Under Lightning's bf16 autocast (its weight cache off) the eager student casts each weight once per step,
not once per view batch (`scfs.methods.precision.cached_weight_casts`), and trains as before to bf16 rounding."""

from __future__ import annotations

import collections
import copy

import lightning as L
import pytest
import torch
from helpers import TINY_RESNET18, compose_cfg, train_losses
from torch.utils._python_dispatch import TorchDispatchMode

import scfs.methods.base as base
from scfs.methods.precision import cached_weight_casts
from scfs.train import build

SMALL = [*TINY_RESNET18, "trainer.precision=bf16-mixed"]


class WeightCasts(TorchDispatchMode):
    """Counts the dtype casts (`_to_copy`) of the given tensors, by name."""

    def __init__(self, named: dict[int, str]) -> None:
        super().__init__()
        self.named, self.casts = named, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ == "_to_copy" and isinstance(args[0], torch.Tensor):
            name = self.named.get(args[0].data_ptr())
            if name is not None:
                self.casts[name] += 1
        return func(*args, **kwargs)


def _two_uses(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net(x).sum() + net(x[:2] * 2).sum()


@pytest.mark.parametrize("cached", [False, True])
def test_the_context_casts_a_weight_once_and_keeps_its_gradient(cached):
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    ref = copy.deepcopy(net)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):  # as Lightning enters it
        _two_uses(ref, x).backward()
        counter = WeightCasts({net.weight.data_ptr(): "weight", net.bias.data_ptr(): "bias"})
        with counter, (cached_weight_casts("cpu") if cached else torch.autocast("cpu", enabled=True)):
            loss = _two_uses(net, x)
    loss.backward()
    assert counter.casts == {"weight": 1 if cached else 2, "bias": 1 if cached else 2}
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):  # bf16 sums of two bf16 gradients
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-2, atol=1e-2)


def test_the_context_does_nothing_without_autocast_or_with_its_cache_on():
    with cached_weight_casts("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16), cached_weight_casts("cpu"):  # cache on: left as it is
        assert torch.is_autocast_cache_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with cached_weight_casts("cpu"):
            assert torch.is_autocast_cache_enabled() and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert not torch.is_autocast_cache_enabled()


def _student_casts_per_step(model: L.LightningModule, cfg) -> collections.Counter:
    named = {p.data_ptr(): n for n, p in model.student.named_parameters()}
    counter = WeightCasts(named)

    class Count(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                counter.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 1:
                counter.__exit__(None, None, None)

    from scfs.bench.step import SyntheticData
    from scfs.train import trainer_kwargs

    kw = trainer_kwargs(cfg)
    kw.update(max_steps=2, limit_train_batches=2, logger=False, enable_checkpointing=False)
    L.Trainer(**kw, callbacks=[Count()]).fit(model, SyntheticData(size=32, n=16, batch=8, seed=0))
    return counter.casts


@pytest.mark.parametrize("method", ["scfs", "dino"])
def test_an_eager_bf16_step_casts_each_student_weight_once(method, monkeypatch):
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    cfg = compose_cfg([*SMALL, f"method={method}"])
    _, model = build(cfg)
    casts = _student_casts_per_step(model, cfg)
    backbone = [n for n in casts if n.startswith("backbone.")]
    assert backbone and all(casts[n] == 1 for n in backbone), {n: casts[n] for n in backbone if casts[n] != 1}

    monkeypatch.setattr(base, "cached_weight_casts", lambda device_type: torch.autocast(device_type))
    L.seed_everything(0, verbose=False)
    _, plain = build(cfg)
    uncached = _student_casts_per_step(plain, cfg)
    assert all(uncached[n] == 2 for n in backbone)  # the global and the local views, each cast anew


def test_cached_casts_train_as_uncached_ones_to_bf16_rounding(monkeypatch):
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    cfg = compose_cfg([*SMALL, "method=scfs"])
    _, cached = build(cfg)
    plain = copy.deepcopy(cached)
    got = train_losses(cached, cfg, 3)
    monkeypatch.setattr(base, "cached_weight_casts", lambda device_type: torch.autocast(device_type))
    want = train_losses(plain, cfg, 3)
    assert got[0] == want[0]  # the first loss comes before any weight update: the same forward
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=2e-2, atol=2e-2)
    for k, v in plain.student.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(cached.student.state_dict()[k], v, rtol=2e-2, atol=2e-3, msg=k)

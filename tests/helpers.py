"""Shared test helpers: compose the real Hydra config with tiny, fast overrides; compare training states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF = str(Path(__file__).resolve().parent.parent / "conf")

TINY = [
    "++data.n_train=48", "++data.n_val=24", "++data.image_size=32", "batch_size=16", "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2", "backbone.channels=[8,16,16,32]", "method.out_dim=64", "method.hidden_dim=32",
    "method.bottleneck_dim=16", "++method.stage_out_dim=32", "++method.stage_hidden_dim=16",
    "++method.stage_bottleneck_dim=8", "logger=csv", "eval.figure=false", "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1", "+trainer.enable_model_summary=false",
]

# with TINY: a one-block-per-stage ResNet-18 on 32/16-px crops, the search on its reference backend (the
# method-level tests that train a few real steps)
TINY_RESNET18 = ["backbone.name=resnet18", "backbone.cifar_stem=true", "backbone.layers=[1,1,1,1]",
                 "search.backend=reference", "crops.global_size=32", "crops.local_size=16", "crops.n_local=2"]


def compose_cfg(overrides: list[str] | None = None, data_root: str | Path | None = None,
                config_name: str = "config") -> DictConfig:
    extra = [f"data.root={data_root}"] if data_root else []
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=config_name, overrides=[*TINY, *extra, *(overrides or [])])


def assert_compiled_build_refused(overrides: list[str], match: str) -> None:
    """Building the tiny config compiled with `overrides` raises one `ConfigError` line matching `match`."""
    import pytest

    from scfs.config import ConfigError
    from scfs.train import build

    with pytest.raises(ConfigError, match=match) as err:
        build(compose_cfg(["compile=true", *overrides]))
    assert "\n" not in str(err.value)


def compile_with_backend(monkeypatch: Any, backend: str) -> None:
    """Make the method's `torch.compile` calls and every in-place `nn.Module.compile` use `backend` for the test's
    duration (`aot_eager`: the graphs traced as inductor would take them, without generating kernels: seconds)."""
    from torch import nn

    compile_fn, compile_module = torch.compile, nn.Module.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_fn(fn, **{**kw, "backend": backend}))
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: compile_module(self, **{**kw, "backend": backend}))


def assert_same_tensors(a: Any, b: Any, name: str) -> None:
    """Every tensor in the nested dicts / lists `a` and `b` equal bit for bit (rtol=0, atol=0), same structure."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{name}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            assert_same_tensors(a[k], b[k], f"{name}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), name
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same_tensors(u, v, f"{name}.{i}")


def train_losses(model: Any, cfg: DictConfig, steps: int) -> list[float]:
    """Train `model` for `steps` steps of B=8 synthetic 32-px images (seed 0) with the Trainer that `cfg` makes, as
    `python -m scfs.train` would; the loss of every step."""
    import lightning as L

    from scfs.bench.step import SyntheticData
    from scfs.train import trainer_kwargs

    losses: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"] if isinstance(outputs, dict) else outputs))

    kw = trainer_kwargs(cfg)
    kw.update(max_steps=steps, limit_train_batches=steps, logger=False, enable_checkpointing=False)
    L.Trainer(**kw, callbacks=[Record()]).fit(model, SyntheticData(size=32, n=8 * steps, batch=8, seed=0))
    return losses

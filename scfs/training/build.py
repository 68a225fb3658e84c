"""A run's data module and method from a composed config, and the batch per process.

Its own module because two processes build from a config: the training run (`scfs.training.setup`) and the child
that compiles the step beside it (`scfs.training.compile_child`)."""

from __future__ import annotations

import contextlib

from omegaconf import DictConfig, OmegaConf

from scfs import autotune_budget, inductor_options


def build(cfg: DictConfig, model_device: str | None = None):
    """Data module and the method's LightningModule (`method.name`, see `scfs.methods`) from a composed config
    (also used by notebooks and tests).

    `model_device`: make the method's parameters and buffers there, initialised there, instead of on the CPU. A
    compile helper passes its GPU: its compile needs the run's shapes, dtypes and strides, never the run's values.
    Building the ResNet-50 recipe took 6-12 s of each helper's start, about half of it initialising and copying
    its 160M parameters on the CPU, on the cores of the host the run was setting up on. The run itself builds on
    the CPU, so that a seed gives the same weights on any machine."""
    import torch

    from scfs.config import validate_config
    from scfs.data.datamodule import SSLDataModule
    from scfs.methods import method_class

    validate_config(cfg)
    inductor_options.use(cfg.get("compile_inductor"))
    autotune_budget.use(cfg.get("compile_autotune_ms"))
    method = method_class(cfg.method.name)  # an unknown name fails here, before any data is touched
    crops = OmegaConf.to_container(cfg.crops, resolve=True)
    batch_aug = bool(cfg.data.get("batch_aug", False))
    batch_size = per_device_batch_size(cfg)
    dm = SSLDataModule(OmegaConf.to_container(cfg.data, resolve=True), crops, batch_size=batch_size,
                       num_workers=cfg.num_workers, batch_aug=batch_aug, seed=cfg.seed,
                       on_device=bool(cfg.data.get("on_device", False)),
                       prefetch_across_epochs=bool(cfg.get("prefetch_across_epochs", True)))
    backbone_cfg = OmegaConf.to_container(cfg.backbone, resolve=True)
    for k in ("layers", "channels"):
        if k in backbone_cfg:
            backbone_cfg[k] = tuple(backbone_cfg[k])
    with torch.device(model_device) if model_device else contextlib.nullcontext():
        model = method(backbone_cfg, OmegaConf.to_container(cfg.method, resolve=True),
                       OmegaConf.to_container(cfg.search, resolve=True),
                       OmegaConf.to_container(cfg.optim, resolve=True),
                       batch_size=batch_size, n_local=cfg.crops.n_local,
                       crops=crops if batch_aug or cfg.data.get("colour_on_device", False)
                       or cfg.data.get("decode", "cpu") == "gpu" else None,
                       seed=cfg.seed, compile=bool(cfg.get("compile", False)),
                       compile_mode=str(cfg.get("compile_mode", "default")),
                       compile_scope=str(cfg.get("compile_scope", "model")),
                       compile_student_graphs=str(cfg.get("compile_student_graphs", "one")),
                       compile_backend=str(cfg.get("compile_backend", "inductor")),
                       compile_views=bool(cfg.get("compile_views", False)),
                       compile_background=bool(cfg.get("compile_background", False)),
                       finite_check_every_n_steps=int(cfg.get("finite_check_every_n_steps", 1)))
    return dm, model


# ---- processes and batch size ------------------------------------------------------------------------------------
def world_size(cfg: DictConfig) -> int:
    """Processes of the run: trainer.devices x trainer.num_nodes (1 on the CPU default)."""
    from scfs.config import devices

    return devices(cfg) * max(int(cfg.trainer.get("num_nodes", 1) or 1), 1)


def per_device_batch_size(cfg: DictConfig) -> int:
    """`batch_size` is per device; `global_batch_size` (when set) wins and is split over all processes, so
    `global_batch_size=512` trains on the same 512 images per step on 1, 2 or 8 GPUs."""
    gb = cfg.get("global_batch_size")
    if gb in (None, 0):
        return int(cfg.batch_size)
    world = world_size(cfg)
    if int(gb) % world:
        from scfs.config import ConfigError

        raise ConfigError(f"config key global_batch_size={gb} is invalid: it is not divisible across {world} "
                          "processes (devices x num_nodes)")
    return int(gb) // world

"""Config validation at start-up: a bad value fails in one line naming the key, the value and what is allowed,
before any data is touched or any model is built."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from scfs.names import (
    BACKBONE_ARCHS,
    DATA_DECODE,
    LOCAL_TARGETS,
    RETIRED_KEYS,
    SEARCH_BACKENDS,
    STAGES,
    VIT_LAST_STAGE,
    WEIGHTINGS,
    backbone_arch,
    is_vit_stage,
)
from scfs.optim import FP16_SCALED, OPTIMIZERS, FusedOptimizerError, use_fused_optimizer

DATASETS = ("shapes", "folder", "cifar10", "imagenet")


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what is allowed."""


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def _check(cfg: DictConfig, key: str, ok: Callable[[Any], bool], allowed: str, required: bool = True) -> None:
    value = _get(cfg, key, default=...)
    if value is ...:
        if required:
            raise ConfigError(f"config key {key} is missing: expected {allowed}")
        return
    try:
        good = ok(value)
    except (TypeError, ValueError):
        good = False
    if not good:
        raise ConfigError(f"config key {key}={value!r} is invalid: expected {allowed}")


def _pos(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _scale(v: Any) -> bool:
    lo, hi = (float(x) for x in v)
    return 0 < lo <= hi <= 1


def devices(cfg: DictConfig) -> int:
    d = _get(cfg, "trainer.devices", 1)
    if isinstance(d, int):
        return max(d, 1)
    if isinstance(d, str):
        return 1 if d == "auto" else max(len([x for x in d.split(",") if x.strip()]), 1)
    return max(len(list(d)), 1)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("model", "blocks")  # what compile=true compiles (`SelfDistillation._compile`)
# the student's step-time call under the model scope: one graph, or one per view batch plus one for the heads
COMPILE_STUDENT_GRAPHS = ("one", "per_view_size")
COMPILE_BACKENDS = ("inductor", "cudagraphs")  # how compile=true compiles (`SelfDistillation._compile`)


def _refuse_conflicts(cfg: DictConfig, option: str, conflicts: list[tuple[Any, str]]) -> None:
    """With `option=true`: the first of `conflicts` (a condition, and what conflicts and how to fix it) that holds,
    as one line. An `auto` option is not refused: it resolves to off where it does not apply."""
    if _get(cfg, option, False) is not True:
        return
    for bad, msg in conflicts:
        if bad:
            raise ConfigError(f"config key {option}=true is invalid with {msg} (or {option}=false)")


def validate_config(cfg: DictConfig) -> None:
    """Raise `ConfigError` on the first invalid value."""
    _check(cfg, "method.name", lambda v: isinstance(v, str) and v != "", "a method name (the registered ones: "
           "scfs.methods.methods())")  # the name itself is checked against the registry in scfs.train.build
    for key, why in RETIRED_KEYS.items():
        if _get(cfg, key, default=...) is not ...:
            raise ConfigError(why)
    _check(cfg, "search.weighting", lambda v: v in WEIGHTINGS, f"one of {', '.join(WEIGHTINGS)}")
    _check(cfg, "search.local_target", lambda v: v in LOCAL_TARGETS, f"one of {', '.join(LOCAL_TARGETS)}")
    _check(cfg, "search.backend", lambda v: v in SEARCH_BACKENDS, f"one of {', '.join(SEARCH_BACKENDS)}",
           required=False)
    _check(cfg, "backbone.arch", lambda v: v in BACKBONE_ARCHS, f"one of {', '.join(BACKBONE_ARCHS)}",
           required=False)
    if backbone_arch(_get(cfg, "backbone")) == "vit":
        _check(cfg, "search.stages", lambda v: len(v) > 0 and all(is_vit_stage(s) for s in v),
               f"a non-empty list of ViT blocks (block1..block<depth>, or {VIT_LAST_STAGE}) with backbone.arch=vit")
        patch = _get(cfg, "backbone.patch_size")
        for key in ("crops.global_size", "crops.local_size"):  # a view is cut into whole patches
            if _pos_int(patch) and _pos_int(_get(cfg, key)):
                _check(cfg, key, lambda v: v % patch == 0, f"a multiple of backbone.patch_size={patch} (pixels)")
    else:
        _check(cfg, "search.stages", lambda v: len(v) > 0 and all(s in STAGES for s in v),
               f"a non-empty list of stage names from {', '.join(STAGES)}")
    _check(cfg, "search.centre", lambda v: isinstance(v, bool), "true or false (false: the published raw cosine; "
           "true: centred on the image's mean feature)", required=False)
    _check(cfg, "search.topk", lambda v: 0 < v <= 1, "a fraction in (0, 1]", required=False)
    _check(cfg, "search.temperature", _pos, "a number > 0", required=False)
    _check(cfg, "search.roi_scale", _scale, "[lo, hi] with 0 < lo <= hi <= 1", required=False)
    _check(cfg, "crops.global_size", _pos_int, "an integer > 0 (pixels)")
    _check(cfg, "crops.local_size", _pos_int, "an integer > 0 (pixels)")
    _check(cfg, "crops.n_local", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    _check(cfg, "crops.global_scale", _scale, "[lo, hi] with 0 < lo <= hi <= 1")
    _check(cfg, "crops.local_scale", _scale, "[lo, hi] with 0 < lo <= hi <= 1")
    if cfg.method.name == "scfs" and cfg.search.local_target != "none" and cfg.crops.n_local < 1:
        raise ConfigError(f"config key crops.n_local={cfg.crops.n_local} is invalid: search.local_target="
                          f"{cfg.search.local_target} needs at least 1 local crop (or use search=none / method=dino)")
    for key in ("method.out_dim", "method.hidden_dim", "method.bottleneck_dim", "method.stage_out_dim",
                "method.stage_hidden_dim", "method.stage_bottleneck_dim"):  # stage keys: methods with stage heads
        _check(cfg, key, _pos_int, "an integer > 0", required=not key.startswith("method.stage_"))
    for key in ("method.out_dim", "method.stage_out_dim"):  # softmax over 1 output = 1: the loss is identically 0
        _check(cfg, key, lambda v: _pos_int(v) and v >= 2, "an integer >= 2 (the DINO loss over a single output "
               "is identically zero: nothing would be learned)", required=key == "method.out_dim")
    for key in ("method.teacher_temp", "method.warmup_teacher_temp", "method.student_temp"):
        _check(cfg, key, _pos, "a temperature > 0", required=key != "method.warmup_teacher_temp")
    _check(cfg, "method.momentum_teacher", lambda v: 0 <= v <= 1, "a number in [0, 1]")
    _check(cfg, "method.center_momentum", lambda v: 0 <= v <= 1, "a number in [0, 1]", required=False)
    _check(cfg, "method.stage_weight", lambda v: v >= 0, "a number >= 0", required=False)
    _check(cfg, "method.stage_norm", lambda v: v in ("batchnorm", "groupnorm1"), "batchnorm or groupnorm1",
           required=False)
    _check(cfg, "method.stage_pooled_bn", lambda v: isinstance(v, bool), "true or false", required=False)
    _check(cfg, "method.stage_branch_channels", lambda v: v is None or _pos_int(v),
           "null (a quarter of each stage's channels) or an integer > 0 (channels)", required=False)
    _check(cfg, "optim.name", lambda v: v in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}")
    _check(cfg, "optim.lr", _pos, "a learning rate > 0")
    _check(cfg, "optim.weight_decay", lambda v: v >= 0, "a number >= 0", required=False)
    _check(cfg, "optim.warmup_epochs", lambda v: v >= 0, "a number of epochs >= 0", required=False)
    _check(cfg, "optim.fused", lambda v: v in (True, False, "auto"), "true, false or auto (the foreach step)",
           required=False)
    try:  # a fused step that cannot run is said at start-up, not from inside Lightning at the first step
        use_fused_optimizer(_get(cfg, "optim.fused", "auto"), str(_get(cfg, "optim.name", "sgd")),
                            str(_get(cfg, "trainer.precision", "32-true")) in FP16_SCALED,
                            float(_get(cfg, "trainer.gradient_clip_val", 0.0) or 0.0))
    except FusedOptimizerError as err:
        raise ConfigError(f"config key optim.fused={_get(cfg, 'optim.fused')} is invalid: {err}") from None
    _check(cfg, "batch_size", _pos_int, "an integer > 0 (images per device)")
    _check(cfg, "checkpoint.background_writes", lambda v: v == "auto" or isinstance(v, bool), "auto, true or false",
           required=False)
    _check(cfg, "checkpoint.last_min_interval_s", lambda v: _pos(v) or (v == 0 and not isinstance(v, bool)),
           "seconds >= 0 (0 = write last.ckpt at every epoch end)", required=False)
    _check(cfg, "chunk_minutes", lambda v: v is None or (isinstance(v, (int, float)) and v > 0),
           "null or a number of minutes > 0", required=False)
    _check(cfg, "compile_mode", lambda v: v in COMPILE_MODES, f"one of {', '.join(COMPILE_MODES)}", required=False)
    _check(cfg, "compile_cache", lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
           "null or a folder path", required=False)
    _check(cfg, "compile_scope", lambda v: v in COMPILE_SCOPES, f"one of {', '.join(COMPILE_SCOPES)}",
           required=False)
    _check(cfg, "compile_student_graphs", lambda v: v in COMPILE_STUDENT_GRAPHS,
           f"one of {', '.join(COMPILE_STUDENT_GRAPHS)}", required=False)
    _check(cfg, "compile_backend", lambda v: v in COMPILE_BACKENDS, f"one of {', '.join(COMPILE_BACKENDS)}",
           required=False)
    if _get(cfg, "compile_backend", "inductor") == "cudagraphs" and _get(cfg, "compile_mode", "default") != "default":
        raise ConfigError(f"config key compile_mode={_get(cfg, 'compile_mode')} is invalid with "
                          "compile_backend=cudagraphs: the modes are inductor's, and that backend replays CUDA graphs "
                          "already; set compile_mode=default")
    if _get(cfg, "compile_student_graphs", "one") != "one" and _get(cfg, "compile_scope", "model") != "model":
        raise ConfigError(f"config key compile_student_graphs={_get(cfg, 'compile_student_graphs')} is invalid with "
                          f"compile_scope={_get(cfg, 'compile_scope')}: that scope compiles blocks, not the student's "
                          "call; set compile_scope=model or compile_student_graphs=one")
    _check(cfg, "compile_views", lambda v: isinstance(v, bool), "true or false", required=False)
    if _get(cfg, "compile_views", False) and _get(cfg, "compile_backend", "inductor") != "inductor":
        raise ConfigError("config key compile_views=true is invalid with compile_backend="
                          f"{_get(cfg, 'compile_backend')}: the view ops are fused by inductor only; set "
                          "compile_views=false or compile_backend=inductor")
    _check(cfg, "compile_artifacts", lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
           "null or a file path", required=False)
    _check(cfg, "compile_background", lambda v: isinstance(v, bool), "true or false", required=False)
    _check(cfg, "compile_parallel", lambda v: isinstance(v, bool) or v == "auto", "true, false or auto",
           required=False)
    _check(cfg, "compile_parallel_backward", lambda v: isinstance(v, bool) or v == "auto", "true, false or auto",
           required=False)
    _check(cfg, "compile_cudnn_warmup", lambda v: isinstance(v, bool) or v == "auto", "true, false or auto",
           required=False)
    _check(cfg, "compile_cudnn_warmup_forward", lambda v: isinstance(v, bool), "true or false", required=False)
    backend = _get(cfg, "compile_backend", "inductor")
    no_group = "has no process group, so its graphs (plain BatchNorm) are not the run's; set sync_bn=false"
    _refuse_conflicts(cfg, "compile_background", [
        (not _get(cfg, "compile", False), "compile=false: there is no compile to run in the background; set "
                                          "compile=true"),
        (backend != "inductor", f"compile_backend={backend}: that backend's warm-up is the tracing alone (seconds) "
                                "and leaves no cache to fill; set compile_backend=inductor"),
        (_get(cfg, "sync_bn", False), f"sync_bn=true: the child process that compiles the step {no_group}")])
    _refuse_conflicts(cfg, "compile_parallel", [
        (not _get(cfg, "compile", False), "compile=false: there is no compile to share; set compile=true"),
        (_get(cfg, "compile_background", False),
         "compile_background=true: that child compiles the whole step already; set one of them"),
        (backend != "inductor", f"compile_backend={backend}: that backend's warm-up is the tracing alone; set "
                                "compile_backend=inductor"),
        (_get(cfg, "compile_scope", "model") != "model",
         f"compile_scope={_get(cfg, 'compile_scope')}: the helper compiles the teacher's call and the losses of the "
         "model scope; set compile_scope=model"),
        (_get(cfg, "sync_bn", False), f"sync_bn=true: the helper process {no_group}")])
    _refuse_conflicts(cfg, "compile_parallel_backward", [
        (_get(cfg, "compile_parallel", False) is False,
         "compile_parallel=false: the backward's helper works beside compile_parallel's; set compile_parallel=true "
         "or auto")])
    _refuse_conflicts(cfg, "compile_cudnn_warmup", [
        (not _get(cfg, "compile", False), "compile=false: the first backward comes right after the first forward, "
                                          "with no compile to overlap; set compile=true"),
        (_get(cfg, "compile_background", False),
         "compile_background=true: its eager steps benchmark the algorithms from the first step; set one of them"),
        (str(_get(cfg, "trainer.accelerator", "cpu")) == "cpu", "trainer.accelerator=cpu: cuDNN runs on CUDA only; "
                                                                 "use trainer=gpu"),
        (not _get(cfg, "trainer.benchmark", False), "trainer.benchmark=false: cuDNN's heuristics choose the "
                                                    "algorithms, so there are no benchmarks to run early; set "
                                                    "trainer.benchmark=true")])
    _refuse_conflicts(cfg, "compile_cudnn_warmup_forward", [
        (_get(cfg, "compile_cudnn_warmup", False) is False,
         "compile_cudnn_warmup=false: the forward's benchmarks run with the warm-up; set compile_cudnn_warmup=auto")])
    inductor = _get(cfg, "compile_inductor", None)
    if inductor is not None:
        from scfs import inductor_options

        preset = isinstance(inductor, str) and inductor in inductor_options.PRESETS
        if not isinstance(inductor, Mapping) and not preset:
            raise ConfigError(f"config key compile_inductor={inductor!r} is invalid: it must be a preset "
                              f"({', '.join(sorted(inductor_options.PRESETS))}) or a mapping of torch._inductor.config "
                              "options, e.g. compile_inductor.triton.autotune_pointwise=false")
        bad = inductor_options.unknown(inductor)
        if bad:
            import torch

            raise ConfigError(f"config key compile_inductor.{bad[0]} is not an option of torch._inductor.config in "
                              f"torch {torch.__version__}; remove it or name an existing option (e.g. "
                              "compile_inductor.triton.autotune_pointwise=false)")
    _check(cfg, "compile_autotune_ms", lambda v: v is None or _pos(v),
           "a positive number of milliseconds per launch config (e.g. 5), or null for inductor's own 25 ms",
           required=False)
    _check(cfg, "num_workers", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0", required=False)
    _check(cfg, "prefetch_across_epochs", lambda v: isinstance(v, bool), "true or false", required=False)
    _check(cfg, "trainer.max_epochs", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1", required=False)
    _check(cfg, "trainer.accumulate_grad_batches", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1",
           required=False)
    global_batch = _get(cfg, "global_batch_size")
    if global_batch is not None and global_batch % devices(cfg):
        raise ConfigError(f"config key global_batch_size={global_batch} is invalid: it is not divisible across "
                          f"{devices(cfg)} devices; pick a multiple of the device count")
    _check(cfg, "data.name", lambda v: v in DATASETS, f"one of {', '.join(DATASETS)}")
    if cfg.data.name != "shapes":
        root = _get(cfg, "data.root")
        if root in (None, "???") or not Path(str(root)).exists():
            hint = (
                "python -m scfs.data.prepare cifar10 --archive ../shared/data/cifar10-jpeg.tar.xz --out data/cifar10"
                if cfg.data.name == "cifar10"
                else "point data.root=... at an ImageFolder tree with train/ and val/"
            )
            raise ConfigError(f"config key data.root={root!r} is invalid: the folder does not exist; prepare it with: "
                              f"{hint}")
    _check(cfg, "data.decode", lambda v: v in DATA_DECODE, "cpu (decode in the DataLoader workers) or gpu (on "
           "the training device)", required=False)
    if _get(cfg, "data.decode", "cpu") == "gpu" and (cfg.data.name == "shapes" or _get(cfg, "data.batch_aug", False)):
        why = "the shapes data are generated arrays, not files" if cfg.data.name == "shapes" else (
            "data.batch_aug=true makes the views of fixed-size in-memory images; set data.batch_aug=false")
        raise ConfigError(f"config key data.decode=gpu is invalid: it decodes image files on the device; {why} "
                          "(or use data.decode=cpu)")
    if cfg.data.name == "shapes":
        _check(cfg, "data.image_size", lambda v: _pos_int(v) and v >= 8, "an integer >= 8 (pixels)")
        _check(cfg, "data.n_train", _pos_int, "an integer > 0")
        _check(cfg, "data.n_val", _pos_int, "an integer > 0")


def uses_cuda(accelerator: str) -> bool:
    """Whether Lightning's `accelerator` setting trains on the GPU on this machine ("auto": when one is visible)."""
    if accelerator in ("cuda", "gpu"):
        return True
    if accelerator != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def check_accelerator(trainer: Any, key: str = "trainer", driver_first: bool = False) -> None:
    """`trainer.accelerator=gpu|cuda` on a machine where torch sees no (or too few) CUDA GPUs: one line naming the
    key and the fix, before data or model are built. Lightning says only "No supported gpu backend found!", from
    deep inside the Trainer, after the data set-up. Not part of `validate_config` (kept torch-free, and a GPU
    recipe is valid on any machine until it runs).

    `driver_first`: where the CUDA driver already shows what the trainer asks (`scfs.cuda_driver`), pass without
    importing torch, so that a run's compile helpers start 3-4 s sooner; the caller then checks again without it
    once torch is imported anyway (`scfs.train.run`). Anything else is torch's answer, as without it."""
    trainer = trainer or {}
    accel = str(trainer.get("accelerator", "cpu"))
    if accel not in ("gpu", "cuda"):
        return
    if driver_first:
        from scfs.cuda_driver import cuda_driver_devices

        if driver_shows_enough(trainer, cuda_driver_devices()):
            return
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    problem = accelerator_problem(trainer, key, n, lambda: torch.cuda.is_bf16_supported(including_emulation=False))
    if problem:
        raise ConfigError(problem)


def accelerator_problem(trainer: Any, key: str, n: int, native_bf16: Callable[[], bool]) -> str | None:
    """What a GPU trainer asks that `n` visible GPUs (and `native_bf16()`, asked only for a bf16 precision) do not
    give, as the one line naming the key and the fix; None where they give it. torch's view and the CUDA driver's
    are judged by these same rules."""
    accel = str(trainer.get("accelerator", "cpu"))
    if n == 0:
        return (f"config key {key}.accelerator={accel} is invalid: torch sees no CUDA GPU on this machine; "
                f"use {key}.accelerator=cpu (or auto)")
    devices = trainer.get("devices", 1)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > n:
        return (f"config key {key}.devices={devices} is invalid: torch sees {n} CUDA GPU(s) here; use "
                f"{key}.devices={n} or fewer (or -1 for all)")
    precision = str(trainer.get("precision", "32-true"))
    if precision.startswith("bf16") and not native_bf16():
        return (f"config key {key}.precision={precision} is invalid: this GPU has no native bfloat16 "
                f"(before Ampere); use {key}.precision=16-mixed (fp16 with loss scaling)")
    return None


def driver_shows_enough(trainer: Any, caps: list[tuple[int, int]] | None) -> bool:
    """Whether the CUDA driver's GPUs (`caps`, their compute capabilities; None: it could not say) pass the checks
    `check_accelerator` makes with torch (`accelerator_problem`); native bfloat16 is compute capability 8 or more,
    on the first GPU as torch asks it."""
    return bool(caps) and accelerator_problem(trainer, "trainer", len(caps), lambda: caps[0][0] >= 8) is None

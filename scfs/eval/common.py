"""What the eval CLIs share: config composition, the backbone under test and its id, transforms, datasets.

The eval configs live in `conf/eval/` and reuse the training config groups (`data`, `backbone`) through
`hydra.searchpath: [file://${scfs_conf_dir:}]`; the resolver is registered when this module is imported, so
import it (any `scfs.eval.*` CLI module does) before composing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torchvision.transforms.v2.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torchvision.transforms import InterpolationMode, v2

from scfs.data.multicrop import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, as_uint8_chw
from scfs.names import CONF_DIR

if TYPE_CHECKING:
    from scfs.eval.features import FeatureSet

log = logging.getLogger("scfs.eval")
EVAL_CONF_DIR = str(CONF_DIR / "eval")

OmegaConf.register_new_resolver("scfs_conf_dir", lambda: str(CONF_DIR), replace=True)


def compose_eval_cfg(kind: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `conf/eval/<kind>.yaml` with overrides (for notebooks and tests; the CLIs go through hydra.main)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=EVAL_CONF_DIR, version_base="1.3"):
        return compose(config_name=kind, overrides=list(overrides))


def to_plain(cfg: Any) -> Any:
    """OmegaConf node -> plain Python containers (resolved); anything else is returned unchanged."""
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg


def resolve_device(name: str | None) -> torch.device:
    """`device=auto|cpu|cuda[:i]`; asking for CUDA where torch sees none is a config error, said before any work
    (torch's own error comes from deep inside the first `.to()`)."""
    from scfs.config import ConfigError

    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(str(name))
    except RuntimeError as err:
        raise ConfigError(f"config key device={name!r} is invalid: expected auto, cpu or cuda[:index] ({err})") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config key device={name!r} is invalid: torch sees no CUDA GPU on this machine; use "
                          "device=cpu or device=auto")
    return device


def make_run_dir(cfg: DictConfig, run_dir: str | Path | None) -> Path:
    """The run folder: the given one (Hydra's output dir from the CLIs), else runs/eval/<kind>-<time>."""
    path = Path(run_dir) if run_dir else Path("runs") / "eval" / f"{cfg.kind}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- transforms ----------------------------------------------------------------------------------------------
class ResizeCenterCrop(EvalTransform):
    """`EvalTransform` with a choice of interpolation: DINO's eval uses bicubic Resize(256) + CenterCrop(224)."""

    def __init__(self, size: int, resize: int | None = None, interpolation: str = "bilinear") -> None:
        super().__init__(size, resize)
        self.interpolation = InterpolationMode(interpolation)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if self.interpolation == InterpolationMode.BILINEAR:
            return super().__call__(img)
        img = as_uint8_chw(img)
        img = F.resize(img, [self.resize], interpolation=self.interpolation, antialias=True)
        img = F.center_crop(img, [self.size, self.size])
        return F.normalize(F.to_dtype(img, torch.float32, scale=True), self.mean, self.std)

    def __repr__(self) -> str:
        return f"EvalTransform(size={self.size}, resize={self.resize}, interpolation={self.interpolation.value})"


class RandomResizedCropFlip:
    """Linear-probe training view (DINO): RandomResizedCrop(size) + horizontal flip, normalised."""

    def __init__(self, size: int, scale: Sequence[float] = (0.08, 1.0), interpolation: str = "bilinear") -> None:
        self.size, self.scale = int(size), (float(scale[0]), float(scale[1]))
        self.interpolation = InterpolationMode(interpolation)
        self._crop = v2.RandomResizedCrop(self.size, scale=self.scale, interpolation=self.interpolation,
                                          antialias=True)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        img = self._crop(as_uint8_chw(img))
        if torch.rand(()) < 0.5:
            img = F.horizontal_flip(img)
        return F.normalize(F.to_dtype(img, torch.float32, scale=True), list(IMAGENET_MEAN), list(IMAGENET_STD))

    def __repr__(self) -> str:
        return f"RandomResizedCropFlip(size={self.size}, scale={self.scale}, interpolation={self.interpolation.value})"


def eval_size(cfg: DictConfig) -> tuple[int, int | None]:
    """(crop size, resize): eval_size / eval_resize, else the data config's eval_size / image_size, else 224."""
    data = cfg.data
    size = cfg.get("eval_size") or data.get("eval_size") or data.get("image_size") or 224
    resize = cfg.get("eval_resize") or data.get("eval_resize") or None
    return int(size), (int(resize) if resize else None)


def eval_transform(cfg: DictConfig) -> ResizeCenterCrop:
    size, resize = eval_size(cfg)
    return ResizeCenterCrop(size, resize, cfg.get("interpolation", "bilinear"))


# ---- the backbone under evaluation ---------------------------------------------------------------------------
@dataclass
class CheckpointInfo:
    """What was evaluated: reported in every run and used as the feature-cache key (`model_id`)."""

    path: str
    id: str
    which: str
    format: str  # scfs-lightning | published | state-dict | random
    label: str
    backbone: dict[str, Any] = field(default_factory=dict)
    method: str | None = None

    @property
    def model_id(self) -> str:
        return f"{self.id}:{self.which}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _label_for(path: Path, method: str | None) -> str:
    if path.parent.name == "checkpoints":  # runs/<name>/<time>/checkpoints/<file>
        run = f"{path.parent.parent.parent.name}/{path.parent.parent.name}"
    else:
        run = path.parent.name
    name = f"{run}/{path.stem}" if run else path.stem
    return f"{method.upper()} {name}" if method else name


def load_eval_backbone(cfg: DictConfig) -> tuple[nn.Module, CheckpointInfo]:
    """The backbone named by `cfg.ckpt` (a file, or `random` for the random init of `cfg.backbone` at `cfg.seed`)
    and its description."""
    from scfs.models.backbone import build_backbone
    from scfs.models.checkpoint import (
        CheckpointMismatchError,
        backbone_config_from,
        file_digest,
        is_lightning_checkpoint,
        load_into,
        safe_load,
        select_state_dict,
    )

    which = str(cfg.get("which", "teacher"))
    ckpt = cfg.get("ckpt")
    if ckpt in (None, "", "???"):
        from scfs.config import ConfigError

        raise ConfigError("ckpt=... is required: a checkpoint file, or ckpt=random for a random-init backbone")
    if which not in ("teacher", "student"):
        from scfs.config import ConfigError

        raise ConfigError(f"config key which={which!r} is invalid: expected teacher or student")
    if str(ckpt) == "random":
        bcfg = to_plain(cfg.backbone)
        torch.manual_seed(int(cfg.get("seed", 0)))
        backbone = build_backbone(bcfg).eval()
        info = CheckpointInfo("random", f"random-{_digest([bcfg, cfg.get('seed', 0)])}", which, "random",
                              cfg.get("label") or f"random init ({bcfg.get('name')})", bcfg)
        return backbone, info
    path = Path(str(ckpt)).expanduser()
    raw = safe_load(path)
    method = None
    if is_lightning_checkpoint(raw):
        bcfg, fmt = backbone_config_from(raw), "scfs-lightning"
        method = (raw["hyper_parameters"].get("method") or {}).get("name")
    else:
        bcfg = to_plain(cfg.backbone)
        fmt = "published" if isinstance(raw, Mapping) and isinstance(raw.get(which), Mapping) else "state-dict"
    backbone = build_backbone(bcfg)
    try:
        load_into(backbone.body, select_state_dict(raw, which), source=f"checkpoint {path} ({which})")
    except CheckpointMismatchError as err:
        if fmt == "scfs-lightning":
            raise
        raise CheckpointMismatchError(f"{err}. This {fmt} file carries no network config, so the configured "
                                      f"backbone={bcfg.get('name')} was used: pick the matching one, e.g. "
                                      "backbone=resnet50 for the published / torchvision ResNet-50") from err
    bcfg = {k: list(v) if isinstance(v, tuple) else v for k, v in bcfg.items()}
    info = CheckpointInfo(str(path.resolve()), file_digest(path), which, fmt,
                          cfg.get("label") or _label_for(path.resolve(), method), bcfg, method)
    log.info("evaluating %s (%s, %s, id %s)", path, fmt, which, info.id)
    return backbone.eval(), info


def build_split(cfg: DictConfig, split: str, transform: Any):
    from scfs.data.datasets import build_dataset

    return build_dataset(to_plain(cfg.data), split, transform)


def eval_backbone_and_splits(cfg: DictConfig, device: torch.device
                             ) -> tuple[nn.Module, CheckpointInfo, ResizeCenterCrop, dict[str, Any]]:
    """The backbone under test on `device`, its description, the eval view and the train / val splits seen
    through it: what the kNN and linear CLIs start from."""
    backbone, info = load_eval_backbone(cfg)
    backbone.to(device)
    tf = eval_transform(cfg)
    return backbone, info, tf, {"train": build_split(cfg, "train", tf), "val": build_split(cfg, "val", tf)}


def split_features(cfg: DictConfig, backbone: nn.Module, info: CheckpointInfo, split: str, dataset: Any,
                   device: torch.device) -> FeatureSet:
    """Pooled features of `dataset`, split `split` of `cfg.data`, under the backbone, through the feature cache
    (`cfg.feature_cache`): the kNN and linear CLIs key and extract them alike."""
    from scfs.eval.features import cached_features, dataset_key

    return cached_features(backbone, dataset, model_id=info.model_id,
                           data_key=dataset_key(to_plain(cfg.data), split, dataset),
                           cache_dir=cfg.get("feature_cache"), device=device, batch_size=int(cfg.batch_size),
                           num_workers=int(cfg.num_workers), progress=bool(cfg.get("progress", True)),
                           desc=f"{split} features")


def class_names(dataset: Any, num_classes: int) -> list[str]:
    names = list(getattr(dataset, "classes", []) or [])
    return [str(n) for n in names] if len(names) == num_classes else [str(i) for i in range(num_classes)]


def headline(doc: Mapping[str, Any], what: str) -> str:
    """`<what> <which> <label> on <data>: top-1 x%, top-5 y%`: how the classification CLIs' summary lines start."""
    m, ck = doc["metrics"], doc["checkpoint"]
    head = f"{what} {ck['which']} {ck['label']} on {doc['data']['name']}: top-1 {m['top1']:.2f}%"
    return head + (f", top-5 {m['top5']:.2f}%" if "top5" in m else "")


def report_tail(doc: Mapping[str, Any]) -> str:
    """How every eval CLI's summary line ends: seconds, the report and the W&B folder."""
    return f"{doc['timings'].get('total_s', 0):.1f}s | report {doc['run_dir']}/report.md | wandb {doc.get('wandb_dir')}"


def hydra_cli(config_name: str, run: Callable[[DictConfig, str], Any]) -> None:
    """The eval CLIs' entry point: `run(cfg, run_dir)` as a Hydra app on `conf/eval/<config_name>.yaml`, with the
    run folder Hydra made (`hydra.run.dir`). User mistakes (bad override, missing or wrong checkpoint, missing
    data) end in one line `scfs.eval.<name>: [config] error: ...` with exit status 2 / 1, as in `scfs.train`."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from scfs.cli import cli_with_one_line_errors, run_reporting_errors

    prog = f"scfs.eval.{config_name}"

    def task(cfg: DictConfig) -> None:
        run_reporting_errors(prog, run, cfg, HydraConfig.get().runtime.output_dir)

    task.__module__ = prog  # Hydra names the job (and its log file) after the module
    cli_with_one_line_errors(prog, hydra.main(version_base="1.3", config_path=EVAL_CONF_DIR,
                                              config_name=config_name)(task))

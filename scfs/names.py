"""Names and places the whole package agrees on: backbone stages, the search settings, the config folder.

A leaf module (no scfs, torch or Hydra import), so the config checks, the training module, evaluation and the
figures all read the same tuples.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_DIR / "conf"

STAGES = ("layer1", "layer2", "layer3", "layer4")  # ResNet stages a stage head can sit on (ViTs: blocks, below)
SEARCH_STAGES = ("layer2", "layer3", "layer4")  # the published choice, and what the figures show by default
VIT_STAGE_PATTERN = r"block([1-9][0-9]*)"  # ViT stages: block1..block<depth> (1-based), or VIT_LAST_STAGE
VIT_LAST_STAGE = "last"
BACKBONE_ARCHS = ("cnn", "vit")  # backbone.arch: a timm CNN (features_only stages) or a timm ViT (block stages)
DATA_DECODE = ("cpu", "gpu")  # data.decode: where training JPEGs are decoded (DataLoader workers | training device)
WEIGHTINGS = ("soft", "hard", "softmax")  # search.weighting: how the similarity map weights the teacher map
LOCAL_TARGETS = ("search", "roi", "none")  # search.local_target: the local term's teacher target
SEARCH_BACKENDS = ("auto", "reference", "triton", "cuda")

# Keys a config may no longer set, with what replaces them (the error names the new spelling).
RETIRED_KEYS = {
    "search.mode": "config key search.mode no longer exists: it is two keys now, search.weighting "
                   f"({' | '.join(WEIGHTINGS)}: how the similarity map weights the teacher map) and "
                   f"search.local_target ({' | '.join(LOCAL_TARGETS)}: where the local term's target comes from); "
                   "pick a preset with search=soft|hard|softmax|roi|none, or set the two keys",
}


def search_settings(search_cfg: Mapping[str, Any] | None) -> tuple[str, str]:
    """(weighting, local_target) of a search config, also from checkpoints written with the single `mode` key
    (its roi / none were local targets, soft / hard / softmax weightings of the search)."""
    cfg = search_cfg or {}
    if "mode" in cfg and "weighting" not in cfg and "local_target" not in cfg:
        mode = str(cfg["mode"])
        return ("soft", mode) if mode in ("roi", "none") else (mode, "search")
    return str(cfg.get("weighting", "soft")), str(cfg.get("local_target", "search"))


def search_centred(search_cfg: Mapping[str, Any] | None) -> bool:
    """Whether the search similarity is centred on the image's mean feature (`search.centre`; absent: raw)."""
    return bool((search_cfg or {}).get("centre", False))


def search_label(search_cfg: Mapping[str, Any] | None) -> str:
    """One word for run names and summaries: the weighting when the local target is the search (with `-centred`
    when `search.centre` is on, e.g. `soft-centred`), else the target."""
    weighting, target = search_settings(search_cfg)
    if target != "search":
        return target
    return f"{weighting}-centred" if search_centred(search_cfg) else weighting


def is_vit_stage(name: Any) -> bool:
    """Whether `name` spells a ViT stage (`block<N>` or `last`); its range is checked against the ViT's depth."""
    return isinstance(name, str) and (name == VIT_LAST_STAGE or re.fullmatch(VIT_STAGE_PATTERN, name) is not None)


def backbone_arch(backbone_cfg: Mapping[str, Any] | None) -> str:
    """`cnn` or `vit` from a backbone config (`arch`; configs and checkpoints without the key are CNNs)."""
    return str((backbone_cfg or {}).get("arch", "cnn"))

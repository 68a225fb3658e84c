"""Read backbone weights from the checkpoint formats we meet, without ever executing pickled code
(`scfs.models.backbone.load_backbone` builds the network around them).

Formats (detected from the keys, not the file name):
* ours: a Lightning checkpoint, ``state_dict`` with ``teacher.backbone.body.*`` / ``student.backbone.body.*`` and
  ``hyper_parameters.backbone`` (the Backbone config, so no config is needed to rebuild the network); also the
  same stripped to a weights-only teacher file, ``{"state_dict": {teacher.backbone.*}, "hyper_parameters": ...}``
  in any float dtype (fp16 to halve it; the weights load into the fp32 network);
* the published SCFS / DINO ResNet-50 checkpoints: top-level ``teacher`` / ``student`` dicts whose keys carry
  ``module.`` (DDP), ``backbone.`` and torchextractor (``model.`` / ``_model.``) prefixes, plus head weights (the
  DINO ``head.*`` and, in SCFS, the per-stage ``layer2_head.*`` .. ``layer4_head.*``), which are dropped;
* plain torchvision / timm ResNet state dicts (``fc.*`` is dropped) or anything wrapping one under
  ``state_dict`` / ``model`` / ``module``.

Every file goes through ``torch.load(weights_only=True)``: a file that would need pickle code execution is
refused with an `UnsafeCheckpointError`. The only globals allowed beyond torch's own list are plain-data
containers that published training scripts put in their checkpoints (``argparse.Namespace`` of DINO's ``args``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scfs.errors import ReportedError

# Globals that are data, not code: constructing them only sets attributes. Nothing callable goes here.
SAFE_GLOBALS: tuple[type, ...] = (argparse.Namespace,)
# Leading key components that wrap a backbone (DDP, our Backbone/Lightning layout, DINO, torchextractor).
WRAPPER_PREFIXES = ("module", "backbone", "body", "model", "_model", "encoder", "base_encoder", "net")
# Leading key components of heads that a backbone never has (classifier, DINO/SCFS projection heads, loss buffers).
HEAD_PREFIXES = ("fc", "head", "heads", "stage_heads", "classifier", "dino_loss", "stage_losses", "projector",
                 "predictor")
# Per-stage heads of the published SCFS wrappers (``layer2_head.conv1.weight`` ...) and any other ``<name>_head``:
# a timm/torchvision ResNet has no module whose name ends in _head.
HEAD_PATTERN = re.compile(r"^\w+_head$")
SHOWN_KEYS = 8


class UnsafeCheckpointError(ReportedError, RuntimeError):
    """The file holds pickled objects whose loading would run code; we refuse to load it."""


class CheckpointMismatchError(ReportedError, RuntimeError):
    """The checkpoint's weights do not fit the backbone (missing / unexpected / mis-shaped keys)."""


class NotACheckpointError(ReportedError, ValueError):
    """The file is no PyTorch checkpoint of weights (random bytes, a text file, a dict without tensors): the
    entry points report it in one line, as a user mistake, not as a crash."""


class NonFiniteWeightsError(FloatingPointError):
    """The checkpoint's weights hold NaN/Inf: features, accuracies and resumed training from it are meaningless."""


# What torch.load raises for a file cut short (an interrupted copy or download, a full disk at save time): the
# zip reader's "failed finding central directory" / "failed reading zip archive", a bare EOFError for 0 bytes,
# and "Ran out of input" / "truncated" from the legacy (non-zip) pickle reader.
TRUNCATED = re.compile(r"PytorchStreamReader failed|central directory|zip archive|Ran out of input|truncated",
                       re.IGNORECASE)


def missing_checkpoint(path: str | os.PathLike, key: str | None = None) -> OSError:
    """The error for a checkpoint path that is not a file: a folder gets its newest .ckpt suggested (run folders
    keep them in checkpoints/), so `ckpt=runs/x/<time>` is one edit away from working."""
    path = Path(path)
    name = f"{key}={path}" if key else f"checkpoint {path}"
    if path.is_dir():
        found = sorted((p for pat in ("*.ckpt", "checkpoints/*.ckpt", "*/checkpoints/*.ckpt") for p in path.glob(pat)),
                       key=lambda p: p.stat().st_mtime)
        hint = f", e.g. {key or 'ckpt'}={found[-1]}" if found else " (there is no .ckpt file in it)"
        return IsADirectoryError(f"{name} is a folder, not a checkpoint file: pass the file itself{hint}")
    return FileNotFoundError(f"{name} does not exist")


def safe_load(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)`` with a clear refusal for files that need pickle code execution."""
    path = Path(path)
    if not path.is_file():
        raise missing_checkpoint(path)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except EOFError as err:
        raise _truncated(path) from err
    except Exception as err:  # torch raises pickle.UnpicklingError (sometimes wrapped) for disallowed globals
        msg = str(err)
        if TRUNCATED.search(msg):
            raise _truncated(path) from err
        if "weights_only" not in msg.lower() and "unsupported global" not in msg.lower():
            raise
        code = [ln.strip() for ln in msg.splitlines() if re.search(r"GLOBAL|reduce", ln)]
        if not code:  # not a pickle of allowed types at all (e.g. a text file, a truncated download)
            detail = next((ln.strip() for ln in msg.splitlines() if "Unsupported" in ln), msg.splitlines()[0])
            raise NotACheckpointError(f"{path} is not a readable PyTorch checkpoint ({detail}): pass a .ckpt / .pth "
                                      "file saved by torch.save (e.g. runs/<name>/<time>/checkpoints/last.ckpt)"
                                      ) from None
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled Python objects that would run code when loaded "
            f"({'; '.join(dict.fromkeys(code))}). Only tensors, numbers, strings and containers are accepted "
            "(torch.load weights_only=True). If you trust the file, re-save just its weights: "
            "torch.save(torch.load(p, weights_only=False)['state_dict'], 'weights.pt')") from None


def _truncated(path: Path) -> NotACheckpointError:
    size = path.stat().st_size
    what = "empty (0 bytes)" if size == 0 else f"truncated or corrupt ({size:,} bytes, the file ends early)"
    return NotACheckpointError(
        f"checkpoint {path} is {what}: it was cut short (an interrupted copy or download, a disk that filled up "
        "while saving, a killed non-atomic write); copy it again, or use another checkpoint of the run (e.g. "
        "checkpoints/epochNNN.ckpt next to last.ckpt)")


def check_finite_weights(state: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse weights holding NaN/Inf: an eval on them prints a plausible-looking accuracy of a broken network."""
    from scfs.reliability import check_finite

    bad = check_finite(dict(state))
    if bad:
        raise NonFiniteWeightsError(
            f"{source} holds non-finite weights (NaN/Inf) in {', '.join(bad)}{' ...' if len(bad) >= 8 else ''}: a "
            "network with them gives meaningless features; use an earlier checkpoint of the run (e.g. "
            "checkpoints/epochNNN.ckpt), saved before the training diverged")


def file_digest(path: str | os.PathLike, length: int = 16) -> str:
    """sha256 of the file content (hex prefix): the checkpoint id used in reports and feature-cache keys."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:length]


def is_lightning_checkpoint(ckpt: Any) -> bool:
    """Ours: a Lightning checkpoint of a `scfs.methods` module (state_dict + hyper_parameters.backbone)."""
    return (isinstance(ckpt, Mapping) and isinstance(ckpt.get("state_dict"), Mapping)
            and isinstance(ckpt.get("hyper_parameters"), Mapping) and "backbone" in ckpt["hyper_parameters"])


def select_state_dict(ckpt: Any, which: str = "teacher") -> dict[str, torch.Tensor]:
    """The flat tensor dict of network `which` (teacher/student) from any of the supported layouts."""
    if which not in ("teacher", "student"):
        raise ValueError(f"which={which!r}: allowed are teacher, student")
    if not isinstance(ckpt, Mapping):
        raise TypeError(f"checkpoint content is a {type(ckpt).__name__}, expected a dict of tensors")
    sd: Any = ckpt
    for _ in range(4):  # unwrap {"state_dict": {...}}, {"model": {...}}, {"teacher": {...}} ...
        if not isinstance(sd, Mapping):
            break
        if isinstance(sd.get(which), Mapping):  # published SCFS / DINO: {"teacher": {...}, "student": {...}}
            sd = sd[which]
            continue
        inner = next((sd[k] for k in ("state_dict", "model", "module", "model_state_dict")
                      if isinstance(sd.get(k), Mapping)), None)
        if inner is None:
            break
        sd = inner
    tensors = {str(k): v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise NotACheckpointError(f"no tensors found in the checkpoint (top-level keys: {list(ckpt)[:SHOWN_KEYS]}): "
                                  "pass a file holding network weights")
    prefixed = {k for k in tensors if k.split(".", 1)[0] in ("teacher", "student")}
    if prefixed:  # ours: one state_dict holding both networks
        tensors = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == which}
        if not tensors:
            held = sorted({k.split(".", 1)[0] for k in prefixed})
            other = "teacher" if which == "student" else "student"
            raise NotACheckpointError(f"the checkpoint has no {which!r} network (it holds only {', '.join(held)} "
                                      f"weights, e.g. a weights-only teacher file): use which={other}")
    return tensors


def normalize_keys(state: Mapping[str, torch.Tensor], target_keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes (``module.``, ``backbone.``, ``body.``, ``model.``, ``_model.`` ...) and drop head
    weights, so the keys read like a bare timm/torchvision ResNet (``conv1.weight``, ``layer1.0.bn1.bias``)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        parts = key.split(".")
        if not (target_keys and key in target_keys):
            while len(parts) > 1 and parts[0] in WRAPPER_PREFIXES:
                parts = parts[1:]
                if target_keys and ".".join(parts) in target_keys:
                    break
        k = ".".join(parts)
        if _is_head(parts[0]) and not (target_keys and k in target_keys):
            continue
        out[k] = value
    return out


def _is_head(first: str) -> bool:
    return first in HEAD_PREFIXES or bool(HEAD_PATTERN.match(first))


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:SHOWN_KEYS])
    return f"{len(keys)} ({shown}{', ...' if len(keys) > SHOWN_KEYS else ''})"


def load_into(module: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Strictly load normalised `state` into `module`; a mismatch raises with the missing/unexpected keys.

    Missing BatchNorm ``num_batches_tracked`` counters are tolerated (old torchvision files lack them; they do
    not affect evaluation-mode outputs).
    """
    target = module.state_dict()
    state = normalize_keys(state, set(target))
    check_finite_weights(state, source)
    missing = sorted(k for k in target if k not in state and not k.endswith("num_batches_tracked"))
    unexpected = sorted(k for k in state if k not in target)
    shapes = sorted(f"{k}: {tuple(state[k].shape)} vs {tuple(target[k].shape)}" for k in state
                    if k in target and state[k].shape != target[k].shape)
    if missing or unexpected or shapes:
        parts = [f"{source} does not match the backbone ({type(module).__name__}, {len(target)} tensors): check "
                 "backbone.name / layers / channels / cifar_stem against the checkpoint"]  # the fix first
        if missing:
            parts.append(f"missing keys: {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_listing(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches (checkpoint vs backbone): {_listing(shapes)}")
        raise CheckpointMismatchError("; ".join(parts))
    merged = {k: state.get(k, v) for k, v in target.items()}
    module.load_state_dict(merged, strict=True)


def backbone_config_from(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """The Backbone config stored in our Lightning checkpoint's hyper_parameters."""
    return dict(ckpt["hyper_parameters"]["backbone"])

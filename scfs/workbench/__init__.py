"""Notebook plumbing: where things go, the Hydra config of the CLI, and pretraining runs shared between notebooks.

Notebooks stay thin by calling these. Outputs go under one root (`runs/notebooks/`, or `$SCFS_NB_RUNS`):
`<root>/<notebook>/` for each notebook's figures and reports, `<root>/pretrain/<name>-<key>/` for training runs,
keyed by a hash of the resolved config, so notebook 2 and 3 reuse the runs notebook 1 trained with the same
settings instead of training again. Data stays in the repository's git-ignored `data/`.

The layer above train, eval and viz: it runs them, none of them imports it. `scfs.workbench.reports` runs
notebook 3's evaluations; `python -m scfs.workbench.docs_figures` makes the docs' PNGs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scfs.names import CONF_DIR, REPO_DIR, search_label

REPO = REPO_DIR  # module attributes: notebooks read them, tests point them elsewhere
DATA_ROOT = REPO / "data" / "shapes"

# CI / smoke-test settings (env SCFS_NB_SMALL=1): the same code path in seconds. Mirrors tests/helpers.py TINY.
SMALL_OVERRIDES = [
    "++data.n_train=96", "++data.n_val=48", "batch_size=32", "trainer.max_epochs=1", "+trainer.limit_train_batches=3",
    "backbone.channels=[8,16,16,32]", "method.out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16",
    "++method.stage_out_dim=32", "++method.stage_hidden_dim=16", "++method.stage_bottleneck_dim=8",
    "trainer.log_every_n_steps=1", "+trainer.enable_model_summary=false",
]
# config entries that do not change what is trained: left out of the run key
_NOT_IN_KEY = ("logger", "eval.figure", "trainer.enable_progress_bar", "trainer.enable_model_summary",
               "trainer.log_every_n_steps", "num_workers", "resume", "run_dir")


def env_flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() in ("1", "true", "yes", "on")


def small_mode() -> bool:
    """CI's switch: `SCFS_NB_SMALL=1` runs every notebook with tiny settings."""
    return env_flag("SCFS_NB_SMALL")


def setup_notebook_env() -> None:
    """Offline W&B with its folders out of the home directory, no hub downloads, quiet logs."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_CODE", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    base = runs_root() / "wandb_files"
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        os.environ.setdefault(var, str(base / var.split("_")[1].lower()))
    import warnings

    for msg in (r".*does not have many workers.*", r".*overridden `on_after_batch_transfer`.*",
                r".*Checkpoint directory .* exists and is not empty.*", r".*in eval mode.*"):
        warnings.filterwarnings("ignore", message=msg)


def runs_root() -> Path:
    return Path(os.environ.get("SCFS_NB_RUNS") or REPO / "runs" / "notebooks").expanduser().resolve()


def notebook_dir(name: str) -> Path:
    """`<runs root>/<name>/`: the run folder of one notebook (figures, reports, W&B)."""
    path = runs_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def base_overrides(small: bool, extra: Sequence[str] = ()) -> list[str]:
    """Small settings (if asked), the absolute data root (so the notebook's cwd does not matter), then `extra`."""
    return [*(SMALL_OVERRIDES if small else []), f"data.root={DATA_ROOT}", *extra]


def compose_train_cfg(overrides: Sequence[str] = (), small: bool = False, extra: Sequence[str] = ()):
    """The CLI's config (`python -m scfs.train <overrides>`) through Hydra's compose API."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*base_overrides(small, extra), *overrides])


def _drop(d: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d.get(p) if isinstance(d, dict) else None  # type: ignore[assignment]
        if d is None:
            return
    if isinstance(d, dict):
        d.pop(last, None)


def run_key(cfg: Any) -> str:
    """Hash of the resolved config, without the entries that do not change training (`_NOT_IN_KEY`)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    for k in _NOT_IN_KEY:
        _drop(plain, k)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:10]


def pretrain_dir(cfg: Any) -> Path:
    """`<runs root>/pretrain/<name>-<search mode>-<key>/` (the key changes with any training setting)."""
    mode = search_label(cfg.search) if cfg.method.name == "scfs" else "none"
    return runs_root() / "pretrain" / f"{cfg.name}-{mode}-{run_key(cfg)}"


def fresh_run_dir(cfg: Any) -> Path:
    """The run folder of `cfg`, emptied: a rerun replaces the previous run of the same settings."""
    path = pretrain_dir(cfg)
    if path.exists():
        shutil.rmtree(path)
    return path


def find_run(cfg: Any) -> dict[str, Any] | None:
    """The summary of a finished run of exactly these settings, or None."""
    path = pretrain_dir(cfg)
    summary = path / "summary.json"
    if summary.is_file() and (path / "checkpoints" / "last.ckpt").is_file():
        return json.loads(summary.read_text())
    return None


def pretrain(cfg: Any, reuse: bool = True) -> dict[str, Any]:
    """`scfs.train.run(cfg)` into `pretrain_dir(cfg)`, or the summary of the finished run there when `reuse`."""
    if reuse:
        found = find_run(cfg)
        if found is not None:
            what = found["method"].upper() + (f" ({found['search']})" if found["method"] == "scfs" else "")
            print(f"reusing the finished {what} run {pretrain_dir(cfg)}")
            return found
    from scfs.train import run

    return run(cfg, fresh_run_dir(cfg))


def summaries_table(summaries: Mapping[str, Mapping[str, Any]], k: int = 20) -> str:
    """Markdown: one row per run, kNN of the trained teacher vs the same network at random init, loss vs its
    uniform level (a loss at the uniform level means nothing was learnt), time."""
    key = f"top1_k{k}"
    lines = ["| run | kNN top-1 trained | kNN top-1 random init | gain | loss | uniform level | steps | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in summaries.items():
        tr = s["knn"][key]
        init = s.get("knn_init", {}).get(key, float("nan"))
        lines.append(f"| {label} | {tr:.1f} | {init:.1f} | {tr - init:+.1f} | {s['loss']:.3f} | "
                     f"{s['uniform_loss']:.3f} | {s['steps']} | {s['seconds']:.0f} |")
    return "\n".join(lines)


def summaries_figure(summaries: Mapping[str, Mapping[str, Any]], k: int = 20):
    """Bars: kNN top-1 (k) of each run's trained teacher next to its random init; loss as a share of uniform."""
    import numpy as np

    from scfs.plotting import new_figure

    key = f"top1_k{k}"
    labels = list(summaries)
    x = np.arange(len(labels))
    fig = new_figure(4.2 + 1.2 * len(labels), 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    trained = [summaries[n]["knn"][key] for n in labels]
    init = [summaries[n].get("knn_init", {}).get(key, np.nan) for n in labels]
    ax1.bar(x - 0.2, init, 0.4, label="random init", color="#bbbbbb")
    ax1.bar(x + 0.2, trained, 0.4, label="trained teacher", color="tab:blue")
    ax1.set_xticks(x, labels=labels, fontsize=8)
    ax1.set_ylabel(f"kNN top-1 (k={k}, val) %")
    ax1.set_title("kNN accuracy", fontsize=10)
    ax1.set_ylim(0, max([*trained, *[v for v in init if v == v], 1.0]) * 1.3)
    ax1.legend(fontsize=7, loc="upper left")
    ratio = [summaries[n]["loss"] / summaries[n]["uniform_loss"] for n in labels]
    ax2.bar(x, ratio, 0.5, color="tab:orange")
    ax2.axhline(1.0, color="grey", ls="--", lw=1)
    ax2.set_xticks(x, labels=labels, fontsize=8)
    ax2.set_ylabel("final loss / uniform level")
    ax2.set_title("loss (1 = nothing learnt)", fontsize=10)
    fig.tight_layout()
    return fig


def latest_checkpoint(name: str, runs_root: str | Path | None = None) -> str | None:
    """`runs/<name>/<time>/checkpoints/last.ckpt` of the newest finished run of that name (a `summary.json` beside
    it), e.g. `latest_checkpoint("scfs-shapes")` after `python -m scfs.train`; None when there is none."""
    root = Path(runs_root) if runs_root is not None else REPO / "runs"
    found = [p for p in (root / name).glob("*/checkpoints/last.ckpt") if (p.parent.parent / "summary.json").is_file()]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def checkpoint_cfg(ckpt: str | Path, key: str) -> Any:
    """The `key` section (e.g. `data`, `crops`) of the Hydra config saved beside a training run's checkpoint
    (`<run>/.hydra/config.yaml`, for `<run>/checkpoints/last.ckpt`), or None when the run has none."""
    from omegaconf import OmegaConf

    path = Path(ckpt).resolve().parent.parent / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    cfg = OmegaConf.load(path)
    return cfg.get(key)


def shapes_split(cfg: Any, split: str = "val"):
    """The shapes split of a training config or of its `data` section (generated on first use)."""
    from scfs.data.shapes import ShapesSpec, ensure_shapes, load_shapes

    d = cfg.data if "data" in cfg else cfg
    defaults = ShapesSpec()
    fields = {f: int(d.get(f, getattr(defaults, f))) for f in
              ("image_size", "n_train", "n_val", "num_classes", "max_objects", "seed")}
    # every spec field, as scfs.data.datasets reads them: the split is the one the run trained on
    fields["clutter"] = float(d.get("clutter", defaults.clutter))
    fields["object_scale"] = tuple(float(v) for v in d.get("object_scale", defaults.object_scale))
    root = Path(str(d.root)).expanduser()
    if not root.is_absolute():  # a run's saved config says data/shapes: the repository's, whatever the cwd
        root = REPO / root
    return load_shapes(ensure_shapes(root, ShapesSpec(**fields), verbose=False), split)


def backbone_cfg(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.backbone, resolve=True)  # type: ignore[return-value]


def random_backbone(cfg: Any):
    """The teacher backbone of `cfg` at random init, exactly the network a run of `cfg` starts from (same seed,
    same construction order as `scfs.train.run`): the 'no training' reference of its kNN summary."""
    import lightning as L

    from scfs.train import build

    L.seed_everything(cfg.seed, verbose=False)
    _, model = build(cfg)
    return model.backbone("teacher").eval()


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write a figure as PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def show_md(text: str) -> None:
    """Markdown in a notebook, plain text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)

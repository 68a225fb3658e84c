"""Search precision: how much of what the search keeps lies on the object the local crop shows.

For a local crop (the query) and the global view of the same image, the search gives a weight per position of
the teacher's stage map. The crop covers some object: the one with the largest mask overlap with the crop's box
(crops on background only are skipped). Search precision is the share of the positive weight mass that falls
inside that object's mask, each feature cell counted by the fraction of its pixels inside the mask:

    precision = sum_p w+(p) * inside(p) / sum_p w+(p),   w+ = max(weight, 0)

averaged over the (image, crop) pairs of the shapes validation set. Uniform weights score the object's share of
the image (`chance`); a search that finds the object the crop shows scores higher. Reported per stage and search
mode for each backbone (SCFS-trained vs DINO-trained vs random init).

CLI (writes precision.json, precision.md and precision.png into a run folder):

    python -m scfs.eval.precision runs/scfs-shapes/<time>/checkpoints/last.ckpt \\
        runs/dino-shapes/<time>/checkpoints/last.ckpt random [--modes soft hard softmax] [--n-val 1000]

Several checkpoints per label (`SCFS=a.ckpt,b.ckpt,c.ckpt`, one per training seed; `--random-seeds 0 1 2` for
random init) are also pooled over seeds: the mean, each seed's value and a 95 % Student-t interval over seeds
beside each seed's within-seed interval (`scfs.eval.seeds`).

`--multirun runs/multirun/<study>-<time>` adds the teachers of a finished multirun (a study): each method's
checkpoints from its jobs' `summary.json`, one seed group per method in job order.

`--centre` scores the search with the similarity centred on each image's mean feature (`feature_search(centre=
True)`) instead of the published raw cosine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scfs.errors import ReportedError
from scfs.eval.search_maps import eval_mode, resolve_backbones, sample_crop_boxes, search_batch
from scfs.names import CONF_DIR, SEARCH_STAGES, WEIGHTINGS, search_label
from scfs.plotting import new_figure

RANDOM_GROUP = "random init"  # the label of `random` (pooled with --random-seeds: the seeds' own inits)

log = logging.getLogger("scfs.eval.precision")


# ---- the metric on one map ----------------------------------------------------------------------------------
def covered_object(mask: np.ndarray, box: Sequence[float]) -> int:
    """Instance id (1..K) of the object with the most mask pixels inside `box` (x0,y0,x1,y1, x1/y1 exclusive);
    0 when the box holds background only."""
    x0, y0, x1, y1 = (int(round(float(v))) for v in box)
    region = np.asarray(mask)[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)]
    counts = np.bincount(region.ravel().astype(np.int64), minlength=1)
    counts[0] = 0
    return int(counts.argmax()) if counts.max() > 0 else 0


def inside_fraction(object_mask: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(..., H, W) bool mask -> (..., h, w): the fraction of each feature cell's pixels inside the object."""
    lead = object_mask.shape[:-2]
    m = object_mask.reshape(-1, 1, *object_mask.shape[-2:]).float()
    return F.adaptive_avg_pool2d(m, grid).reshape(*lead, *grid)


def mass_inside(weights: np.ndarray | torch.Tensor, object_mask: np.ndarray | torch.Tensor) -> float:
    """Share of the positive weight mass of a (h,w) map inside a (H,W) object mask (NaN without positive mass)."""
    w = torch.as_tensor(np.asarray(weights, dtype=np.float32)).clamp_min(0)
    frac = inside_fraction(torch.as_tensor(np.asarray(object_mask, dtype=bool)), tuple(w.shape[-2:]))
    total = w.sum()
    return float((w * frac).sum() / total) if total > 0 else float("nan")


def _batch_precision(weights: torch.Tensor, object_masks: torch.Tensor) -> torch.Tensor:
    """(B,N,h,w) weights, (B,N,H,W) bool object masks -> (B,N) precision (NaN where there is no positive mass)."""
    w = weights.clamp_min(0)
    frac = inside_fraction(object_masks, tuple(w.shape[-2:]))
    total = w.sum(dim=(-2, -1))
    return torch.where(total > 0, (w * frac).sum(dim=(-2, -1)) / total.clamp_min(1e-30), torch.nan)


# ---- over a dataset -----------------------------------------------------------------------------------------
@dataclass
class PrecisionScores:
    """Per-(image, crop) values: precision[mode][stage] (I,N) (NaN = skipped), object ids (I,N) (0 = background
    crop), chance (I,N) = object area share, labels (I,N) of the covered object (-1 when unknown)."""

    precision: dict[str, dict[str, np.ndarray]]
    objects: np.ndarray
    chance: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray

    def mean(self, mode: str) -> dict[str, float]:
        return {s: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
                for s, v in self.precision[mode].items()}

    @property
    def n_used(self) -> int:
        return int((self.objects > 0).sum())

    @property
    def chance_mean(self) -> float:
        ok = self.objects > 0
        return float(self.chance[ok].mean()) if ok.any() else float("nan")

    def mean_ci(self, mode: str, stage: str, minus_chance: bool = False) -> tuple[float, float, float]:
        """(mean, 95 % CI low, high) of a stage's precision over the used pairs (`minus_chance`: of precision minus
        each pair's own chance level). The crops of one image are not independent, so the interval comes from the
        per-image means (normal approximation over images)."""
        v = self.precision[mode][stage] - (self.chance if minus_chance else 0.0)
        return mean_ci(v)

    def chance_ci(self) -> tuple[float, float, float]:
        """(mean, 95 % CI) of the per-crop chance level (the covered object's share of the image)."""
        return mean_ci(np.where(self.objects > 0, self.chance, np.nan))


def mean_ci(values: np.ndarray, z: float = 1.96) -> tuple[float, float, float]:
    """Mean of the finite entries of an (images, crops) array and its 95 % interval from per-image means."""
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v)
    if not ok.any():
        return (float("nan"),) * 3
    per_image = np.array([row[m].mean() for row, m in zip(v, ok) if m.any()])
    mean = float(v[ok].mean())
    half = z * float(per_image.std(ddof=1)) / np.sqrt(len(per_image)) if len(per_image) > 1 else float("nan")
    return mean, mean - half, mean + half


def precision_scores(backbone: nn.Module, images: np.ndarray, masks: np.ndarray,
                     objects: Sequence[Sequence[Mapping[str, Any]]] | None = None, crops: np.ndarray | None = None, *,
                     stages: Sequence[str] = SEARCH_STAGES, modes: Sequence[str] = WEIGHTINGS, n_crops: int = 4,
                     local_size: int = 16, scale: Sequence[float] = (0.1, 0.35), seed: int = 0, topk: float = 0.25,
                     temperature: float = 0.1, batch_size: int = 128,
                     query_backbone: nn.Module | None = None, centre: bool = False) -> PrecisionScores:
    """Search precision of every (image, crop) pair, for several modes from one pass of the backbone; `centre`:
    of the centred similarity (`feature_search(centre=True)`)."""
    images, masks = np.asarray(images), np.asarray(masks)
    if images.ndim != 4 or masks.shape != images.shape[:3]:
        raise ValueError(f"images (N,H,W,3) and masks (N,H,W) must match, got {images.shape} and {masks.shape}")
    n_img, h, w = images.shape[:3]
    boxes = sample_crop_boxes(n_img, n_crops, h, w, scale, seed=seed) if crops is None else np.asarray(crops)
    if boxes.shape[:1] != (n_img,) or boxes.ndim != 3:
        raise ValueError(f"crops must be (N_images={n_img}, N_crops, 4), got {boxes.shape}")
    obj = np.array([[covered_object(masks[i], b) for b in boxes[i]] for i in range(n_img)], dtype=np.int64)
    areas = np.stack([np.bincount(m.ravel().astype(np.int64), minlength=256) for m in masks]) / float(h * w)
    chance = np.take_along_axis(areas, obj, axis=1)
    labels = np.full(obj.shape, -1, dtype=np.int64)
    if objects is not None:
        for i, row in enumerate(obj):
            for n, k in enumerate(row):
                if 0 < k <= len(objects[i]):
                    labels[i, n] = int(objects[i][k - 1]["label"])
    maps_bb, _ = resolve_backbones(backbone)
    query_bb = query_backbone or maps_bb
    out = {m: {s: np.full(obj.shape, np.nan, dtype=np.float64) for s in stages} for m in modes}
    with eval_mode(maps_bb, query_bb):
        for i in range(0, n_img, batch_size):
            sl = slice(i, i + batch_size)
            _, weights, _ = search_batch(maps_bb, images[sl], boxes[sl], stages, modes, local_size, query_bb, topk,
                                         temperature, centre)
            ids = torch.as_tensor(obj[sl])
            obj_masks = torch.from_numpy(np.array(masks[sl])).long()[:, None] == ids[:, :, None, None]
            valid = (ids > 0).numpy()
            for m in modes:
                for s in stages:
                    p = _batch_precision(weights[m][s], obj_masks).double().numpy()
                    out[m][s][sl] = np.where(valid, p, np.nan)
    return PrecisionScores(out, obj, chance, labels, boxes)


def search_precision(backbone: nn.Module, images: np.ndarray, masks: np.ndarray,
                     objects: Sequence[Sequence[Mapping[str, Any]]] | None = None, crops: np.ndarray | None = None, *,
                     stages: Sequence[str] = SEARCH_STAGES, mode: str = "soft", **kwargs: Any) -> dict[str, float]:
    """Mean search precision per stage, `{stage: value in [0, 1]}`, over the (image, crop) pairs whose crop covers
    an object. `crops` (N_images, N_crops, 4) or sampled like training local crops (`n_crops`, `scale`, `seed`);
    other keywords as in `precision_scores`."""
    return precision_scores(backbone, images, masks, objects, crops, stages=stages, modes=(mode,), **kwargs).mean(mode)


# ---- several backbones: table, plot, files ------------------------------------------------------------------
@dataclass
class PrecisionReport:
    """Mean precision for each backbone x mode x stage with 95 % intervals, the chance level and what was measured.

    `values[model][mode][stage]` is the mean precision; `ci` the same keys with [low, high]; `lift` the mean of
    precision minus each pair's own chance level, with `lift_ci`. `chance` is the mean per-crop chance (the covered
    object's share of the image: what uniform weights score), `chance_interval` its 95 % interval."""

    values: dict[str, dict[str, dict[str, float]]]  # model -> mode -> stage -> precision
    chance: float
    n_pairs: int
    n_images: int
    stages: tuple[str, ...]
    modes: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, str] = field(default_factory=dict)
    ci: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    lift: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    lift_ci: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    chance_interval: list[float] = field(default_factory=list)
    seeds: dict[str, list[str]] = field(default_factory=dict)  # label -> the members that are its seeds

    def pooled(self) -> dict[str, Any]:
        """The seed groups pooled (`scfs.eval.seeds.pool_over_seeds`): mean, per-seed values, t-interval."""
        from scfs.eval.seeds import pool_over_seeds

        return pool_over_seeds(self.values, self.ci, self.seeds) if self.seeds else {}

    def _seed_table(self, labels: Mapping[str, int], cell: Any) -> str:
        """A markdown table with one row per label (`labels`: label -> its number of seeds) and mode, one column
        per stage, `cell(label, mode, stage)` in each."""
        lines = ["| model (seeds) | mode | " + " | ".join(self.stages) + " |",
                 "|---|---|" + "---:|" * len(self.stages)]
        for label, n in labels.items():
            for m in self.modes:
                lines.append(f"| {label} ({n}) | {m} | " + " | ".join(cell(label, m, s) for s in self.stages) + " |")
        return "\n".join(lines)

    @staticmethod
    def _half(ci: Sequence[float]) -> str:
        lo, hi = ci
        return f" ± {100 * (hi - lo) / 2:.1f}" if lo == lo else ""

    def seeds_markdown(self) -> str:
        """The table over seeds: per label, mode and stage the mean over seeds ± half its 95 % t-interval, the
        seeds' values and the mean half-width of their within-seed intervals ('' without seed groups)."""
        pools = self.pooled()
        if not pools:
            return ""

        def cell(label: str, m: str, s: str) -> str:
            pool = pools[label]
            within = [(b - a) / 2 for a, b in pool.within[m][s] if a == a and b == b]
            w = f"; within-seed ± {100 * float(np.mean(within)):.1f}" if within else ""
            seeds = " / ".join(f"{100 * v:.1f}" for v in pool.per_seed[m][s])
            return f"{100 * pool.mean[m][s]:.1f}{self._half(pool.ci[m][s])} (seeds {seeds}{w})"

        return self._seed_table({label: len(p.members) for label, p in pools.items()}, cell)

    def gain_over_init(self) -> dict[str, Any]:
        """Each pooled label's gain over the pooled random init, paired by seed (`scfs.eval.seeds.paired_gain`):
        the k-th checkpoint of a label against `random@<k-th --random-seeds>`, its own init when it was trained
        with that seed."""
        from scfs.eval.seeds import paired_gain

        return paired_gain(self.pooled(), RANDOM_GROUP)

    def gain_markdown(self) -> str:
        """The paired gains over init: per label, mode and stage the mean difference ± half its 95 % t-interval
        and each seed's difference, in points ('' without a pooled random init)."""
        gains = self.gain_over_init()
        if not gains:
            return ""

        def cell(label: str, m: str, s: str) -> str:
            g = gains[label][m][s]
            seeds = " / ".join(f"{100 * v:+.1f}" for v in g["per_seed"])
            return f"{100 * g['mean']:+.1f}{self._half(g['ci'])} (seeds {seeds})"

        pools = self.pooled()
        return self._seed_table({label: len(pools[label].members) for label in gains}, cell)

    def rows(self) -> list[dict[str, Any]]:
        return [{"model": mdl, "mode": m, **{s: v[s] for s in self.stages}}
                for mdl, per_mode in self.values.items() for m, v in per_mode.items()]

    def best_stage(self, model: str, mode: str) -> str:
        """The stage where `model` puts the most weight on the crop's object."""
        v = self.values[model][mode]
        return max(self.stages, key=lambda s: v[s] if v[s] == v[s] else -1.0)

    def _cell(self, mdl: str, m: str, s: str) -> str:
        v = self.values[mdl][m][s]
        lo_hi = self.ci.get(mdl, {}).get(m, {}).get(s)
        if lo_hi and all(x == x for x in lo_hi):
            return f"{100 * v:.1f} ± {100 * (lo_hi[1] - lo_hi[0]) / 2:.1f}"
        return f"{100 * v:.1f}"

    def markdown(self) -> str:
        head = "| model | mode | " + " | ".join(self.stages) + " |"
        lines = [head, "|---|---|" + "---:|" * len(self.stages)]
        for r in self.rows():
            lines.append(f"| {r['model']} | {r['mode']} | "
                         + " | ".join(self._cell(r["model"], r["mode"], s) for s in self.stages) + " |")
        ch = f"{100 * self.chance:.1f}"
        if len(self.chance_interval) == 2 and all(x == x for x in self.chance_interval):
            ch += f" ± {100 * (self.chance_interval[1] - self.chance_interval[0]) / 2:.1f}"
        lines.append("| uniform weights (chance, per crop) | - | " + " | ".join(ch for _ in self.stages) + " |")
        return "\n".join(lines)

    def document(self) -> dict[str, Any]:
        return {"metric": "search precision: share of the positive searched-weight mass inside the mask of the "
                          "object the local crop covers (mean over image x crop pairs; percent in the table, "
                          "± = half the 95 % interval from per-image means)",
                "values": self.values, "ci95": self.ci, "lift_over_chance": self.lift, "lift_ci95": self.lift_ci,
                "chance": self.chance, "chance_ci95": self.chance_interval, "n_pairs": self.n_pairs,
                "n_images": self.n_images, "stages": list(self.stages), "modes": list(self.modes),
                "settings": self.settings, "checkpoints": self.checkpoints,
                "over_seeds": {label: {"members": list(p.members), "mean": p.mean, "per_seed": p.per_seed,
                                       "t_ci95": p.ci, "within_seed_ci95": p.within}
                               for label, p in self.pooled().items()},
                "gain_over_init": self.gain_over_init()}

    def figure(self, title: str | None = None):
        """One panel per mode on one shared y axis: precision (%) per stage, a line with 95 % error bars per
        backbone (offset sideways so overlapping lines stay visible), chance dashed with its interval shaded."""
        fig = new_figure(3.4 * len(self.modes) + 0.6, 3.4)
        axes = fig.subplots(1, len(self.modes), squeeze=False, sharey=True)[0]
        x = np.arange(len(self.stages), dtype=float)
        pools = self.pooled()
        pooled_members = {m for p in pools.values() for m in p.members}
        lines: list[tuple[str, dict[str, dict[str, float]], dict[str, Any], Any]] = [
            (mdl, per_mode, self.ci.get(mdl, {}), None) for mdl, per_mode in self.values.items()
            if mdl not in pooled_members]
        lines += [(f"{label} ({len(p.members)} seeds)", p.mean, p.ci, p) for label, p in pools.items()]
        models = [ln[0] for ln in lines]
        offsets = (np.arange(len(models)) - (len(models) - 1) / 2) * 0.07
        for ax, m in zip(axes, self.modes):
            for k, (mdl, per_mode, cis, pool) in enumerate(lines):
                y = np.array([100 * per_mode[m][s] for s in self.stages])
                ci = cis.get(m, {})
                err = None
                if all(s in ci for s in self.stages):
                    lo = np.array([100 * ci[s][0] for s in self.stages])
                    hi = np.array([100 * ci[s][1] for s in self.stages])
                    err = np.nan_to_num(np.stack([y - lo, hi - y]))
                bar = ax.errorbar(x + offsets[k], y, yerr=err, marker="o", ms=4, capsize=3, lw=1.5, label=mdl)
                if pool is not None:  # each seed a dot beside its label's mean
                    for j, s in enumerate(self.stages):
                        vals = 100 * np.asarray(pool.per_seed[m][s])
                        ax.scatter(np.full(len(vals), x[j] + offsets[k] + 0.03), vals, s=10, alpha=0.6,
                                   color=bar.lines[0].get_color(), zorder=3)
            ax.axhline(100 * self.chance, color="grey", ls="--", lw=1, label="chance (uniform weights)")
            if len(self.chance_interval) == 2 and all(v == v for v in self.chance_interval):
                ax.axhspan(100 * self.chance_interval[0], 100 * self.chance_interval[1], color="grey", alpha=0.15)
            ax.set_xticks(x, labels=list(self.stages))
            ax.set_title(f"search = {m}", fontsize=10)
            ax.grid(alpha=0.3)
        axes[0].set_ylim(0, 100)  # a share of the weights: every precision figure on the same axis, raw or centred
        axes[0].set_ylabel("weight mass on the crop's object (%)", fontsize=8)
        axes[0].legend(fontsize=7, loc="best")
        similarity = "centred similarity, " if self.settings.get("centre") else ""
        bars = "\nbars: 95 % CI (over seeds for pooled labels; dots: the seeds)" if pools else "bars: 95 % CI"
        fig.suptitle(title or f"Search precision on shapes val ({similarity}{self.n_pairs} crop x image pairs, "
                              f"{self.n_images} images{'' if pools else '; '}{bars})", fontsize=10)
        fig.tight_layout()
        return fig

    def save(self, run_dir: str | Path) -> dict[str, str]:
        """precision.json, precision.md and precision.png in `run_dir`; returns their paths."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        paths = {"json": run_dir / "precision.json", "markdown": run_dir / "precision.md",
                 "figure": run_dir / "precision.png"}
        paths["json"].write_text(json.dumps(self.document(), indent=2))
        md = ["# Search precision", "", self.document()["metric"] + ".", "",
              f"{self.n_pairs} (image, crop) pairs on {self.n_images} images; settings: "
              + ", ".join(f"{k}={v}" for k, v in self.settings.items()), "", self.markdown(), ""]
        if self.seeds:
            md += ["## Over seeds", "", "Mean over seeds ± half its 95 % Student-t interval (n - 1 degrees of "
                   "freedom), each seed's value, and the mean half-width of the seeds' within-seed intervals.", "",
                   self.seeds_markdown(), ""]
        gains = self.gain_markdown()
        if gains:
            md += ["## Gain over each seed's own init (paired)", "", "Points of precision over the random init at the "
                   "same seed (the k-th checkpoint of a label against the k-th `--random-seeds`; a run trained with "
                   "seed k starts from exactly that network): mean over seeds ± half its 95 % t-interval, each "
                   "seed's difference.", "", gains, ""]
        md += ["![search precision](precision.png)", ""]
        md += [f"* {k}: `{v}`" for k, v in self.checkpoints.items()]
        paths["markdown"].write_text("\n".join(md) + "\n")
        self.figure().savefig(paths["figure"], dpi=110)
        return {k: str(v) for k, v in paths.items()}


def precision_report(backbones: Mapping[str, nn.Module], images: np.ndarray, masks: np.ndarray,
                     objects: Sequence[Sequence[Mapping[str, Any]]] | None = None, crops: np.ndarray | None = None, *,
                     stages: Sequence[str] = SEARCH_STAGES, modes: Sequence[str] = WEIGHTINGS, n_crops: int = 4,
                     local_size: int = 16, scale: Sequence[float] = (0.1, 0.35), seed: int = 0, topk: float = 0.25,
                     temperature: float = 0.1, batch_size: int = 128,
                     checkpoints: Mapping[str, str] | None = None, centre: bool = False,
                     seeds: Mapping[str, Sequence[str]] | None = None) -> PrecisionReport:
    """`search_precision` of several backbones on the same crops, every mode, as one report (`centre`: of the
    centred similarity). `seeds`: label -> the backbones (keys of `backbones`) that are its seeds, pooled in the
    report beside each seed's own row."""
    images = np.asarray(images)
    if crops is None:
        crops = sample_crop_boxes(len(images), n_crops, images.shape[1], images.shape[2], scale, seed=seed)
    values: dict[str, dict[str, dict[str, float]]] = {}
    ci: dict[str, dict[str, dict[str, list[float]]]] = {}
    lift: dict[str, dict[str, dict[str, float]]] = {}
    lift_ci: dict[str, dict[str, dict[str, list[float]]]] = {}
    scores = None
    for name, bb in backbones.items():
        scores = precision_scores(bb, images, masks, objects, crops, stages=stages, modes=modes,
                                  local_size=local_size, topk=topk, temperature=temperature, batch_size=batch_size,
                                  centre=centre)
        values[name] = {m: scores.mean(m) for m in modes}
        ci[name], lift[name], lift_ci[name] = {}, {}, {}
        for m in modes:
            ci[name][m], lift[name][m], lift_ci[name][m] = {}, {}, {}
            for s in stages:
                ci[name][m][s] = list(scores.mean_ci(m, s)[1:])
                d = scores.mean_ci(m, s, minus_chance=True)
                lift[name][m][s], lift_ci[name][m][s] = d[0], list(d[1:])
    if scores is None:
        raise ValueError("no backbones given")
    settings = {"local_size": local_size, "n_crops": int(crops.shape[1]), "crop_scale": list(scale), "seed": seed,
                "topk": topk, "temperature": temperature, "image_size": int(images.shape[1]), "centre": bool(centre)}
    return PrecisionReport(values, scores.chance_mean, scores.n_used, len(images), tuple(stages), tuple(modes),
                           settings, dict(checkpoints or {}), ci, lift, lift_ci, list(scores.chance_ci()[1:]),
                           {k: list(v) for k, v in (seeds or {}).items()})


# ---- CLI --------------------------------------------------------------------------------------------------------
def _yaml(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


def _label(path: str, raw: Mapping[str, Any] | None, used: set[str]) -> str:
    if path == "random":
        base = "random init"
    elif raw is not None and isinstance(raw.get("hyper_parameters"), Mapping):
        hp = raw["hyper_parameters"]
        method = (hp.get("method") or {}).get("name", "?")
        base = method.upper() + (f" ({search_label(hp.get('search'))})" if method == "scfs" else "")
    else:
        base = Path(path).stem
    label, k = base, 2
    while label in used:
        label, k = f"{base} #{k}", k + 1
    used.add(label)
    return label


def load_backbones(specs: Sequence[str], which: str = "teacher", backbone: str = "tiny",
                   seed: int = 0) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """Backbones named on the command line: `PATH`, `LABEL=PATH`, or `random` (the random init, at `seed`, of the
    first scfs checkpoint's backbone config, else of conf/backbone/<backbone>.yaml; `random@K` at seed K)."""
    from scfs.models.backbone import load_backbone
    from scfs.models.checkpoint import backbone_config_from, is_lightning_checkpoint, safe_load

    parsed = [(s.split("=", 1) if "=" in s and not Path(s).exists() else (None, s)) for s in specs]
    raws = {p: safe_load(p) for _, p in parsed if p != "random" and not p.startswith("random@")}
    bcfg = next((backbone_config_from(r) for r in raws.values() if is_lightning_checkpoint(r)), None)
    bcfg = bcfg or _yaml(CONF_DIR / "backbone" / f"{backbone}.yaml")
    used: set[str] = set()
    out: dict[str, nn.Module] = {}
    paths: dict[str, str] = {}
    for label, path in parsed:
        label = label or _label(path, raws.get(path), used)
        if path == "random" or path.startswith("random@"):
            at = int(path.split("@", 1)[1]) if "@" in path else seed
            torch.manual_seed(at)
            out[label] = load_backbone("random", backbone_cfg=bcfg)
            paths[label] = f"random ({bcfg.get('name')}, seed {at})"
        else:
            out[label] = load_backbone(path, which)
            paths[label] = str(Path(path).resolve())
    return out, paths


def seed_groups(specs: Sequence[str], random_seeds: Sequence[int] = ()) -> tuple[list[str], dict[str, list[str]]]:
    """Command-line specs with seed groups expanded: `LABEL=a.ckpt,b.ckpt,c.ckpt` (one checkpoint per training
    seed) becomes the members `LABEL [1]=a.ckpt` ..., and with `random_seeds` `random` becomes `random init [seed
    k]` for each; returns (member specs for `load_backbones`, {label: member labels})."""
    out: list[str] = []
    groups: dict[str, list[str]] = {}
    for spec in specs:
        if spec == "random" and len(random_seeds) > 1:
            members = [f"random init [seed {k}]" for k in random_seeds]
            out += [f"{m}=random@{k}" for m, k in zip(members, random_seeds)]
            groups[RANDOM_GROUP] = members
            continue
        label, _, paths = spec.partition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
        files = [p for p in paths.split(",") if p]
        if label and len(files) > 1:
            members = [f"{label} [{k + 1}]" for k in range(len(files))]
            out += [f"{m}={f}" for m, f in zip(members, files)]
            groups[label] = members
        elif spec == "random" and random_seeds:
            out.append(f"random init=random@{random_seeds[0]}")
        else:
            out.append(spec)
    return out, groups


class MultirunFolderError(ReportedError, ValueError):
    """`--multirun DIR` names no finished multirun: the message says which folder or job and what to run."""


def multirun_checkpoints(sweep_dir: str | Path) -> list[str]:
    """The teachers of a finished multirun as seed groups on the command line, `METHOD=a.ckpt,b.ckpt` per method
    (`multirun_teachers`), so a study's folder is scored without listing its checkpoints by hand."""
    return [f"{method}=" + ",".join(ckpts) for method, ckpts in multirun_teachers(sweep_dir).items()]


def multirun_teachers(sweep_dir: str | Path) -> dict[str, list[str]]:
    """{METHOD: checkpoints} of a finished multirun (upper case, methods in the order they first appear), read
    from the jobs' `summary.json` (`method`, `checkpoint`). Each list is in job-number order, the order of the
    sweep's seeds, because the gain over init pairs a group's k-th checkpoint with the k-th `--random-seeds`."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise MultirunFolderError(f"--multirun {root}: no such folder; pass the multirun's hydra.sweep.dir "
                                  "(e.g. runs/multirun/<study>-<time>)")

    def job_number(summary: Path) -> tuple[int, int, str]:
        name = summary.parent.name
        return (0, int(name), "") if name.isdigit() else (1, 0, name)

    summaries = sorted(root.glob("*/summary.json"), key=job_number)
    if not summaries:
        raise MultirunFolderError(f"--multirun {root}: no job folder there has a summary.json, so there are no "
                                  "checkpoints to score; run the study until its jobs finish (scripts/gpu_study.sh "
                                  "says done), or name the checkpoints themselves")
    groups: dict[str, list[str]] = {}
    unfinished: list[str] = []
    for f in summaries:
        try:
            summary = json.loads(f.read_text())
        except ValueError:
            summary = {}
        if summary.get("stopped_by_chunk_budget") or not summary.get("checkpoint") or not summary.get("method"):
            unfinished.append(f.parent.name)
        else:
            groups.setdefault(str(summary["method"]).upper(), []).append(str(summary["checkpoint"]))
    if unfinished:
        raise MultirunFolderError(f"--multirun {root}: job(s) {', '.join(unfinished)} did not finish (stopped by "
                                  "the chunk budget, or summary.json without method and checkpoint); run the study "
                                  "again until it says done, or name the checkpoints themselves")
    return groups


def default_stages(backbones: dict[str, nn.Module]) -> list[str]:
    """The stages one report compares: the published layer2..4 for CNNs, the middle and the last block for ViTs
    (of one depth); CNNs and ViTs have no stage in common, so they are refused together."""
    from scfs.models.vit import ViTBackbone, default_search_stages

    depths = {bb.depth for bb in backbones.values() if isinstance(bb, ViTBackbone)}
    if not depths:
        return list(SEARCH_STAGES)
    if len(depths) > 1 or not all(isinstance(b, ViTBackbone) for b in backbones.values()):
        from scfs.config import ConfigError

        raise ConfigError("CNN and ViT backbones (or ViTs of different depths) have no stages in common: run "
                          "python -m scfs.eval.precision once per kind, or name common ones with --stages")
    return list(default_search_stages(depths.pop()))


def _parser() -> argparse.ArgumentParser:
    data = _yaml(CONF_DIR / "data" / "shapes.yaml")
    crops = _yaml(CONF_DIR / "crops" / "shapes.yaml")
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="python -m scfs.eval.precision", description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[-1])
    p.add_argument("ckpts", nargs="*", metavar="CKPT",
                   help="checkpoint file, LABEL=file, LABEL=a.ckpt,b.ckpt,c.ckpt (one per training seed, pooled over "
                        "seeds), or 'random'")
    p.add_argument("--multirun", type=Path, metavar="DIR",
                   help="a finished Hydra multirun (its hydra.sweep.dir): each method's teachers from its jobs' "
                        "summary.json, as METHOD=a.ckpt,b.ckpt in job order, before the CKPTs")
    p.add_argument("--random-seeds", type=int, nargs="+", default=[], metavar="SEED",
                   help="random init at each of these seeds, pooled over seeds like a checkpoint list")
    p.add_argument("--which", default="teacher", choices=("teacher", "student"))
    p.add_argument("--modes", nargs="+", default=list(WEIGHTINGS), choices=WEIGHTINGS)
    p.add_argument("--stages", nargs="+", default=None,
                   help=f"default: {' '.join(SEARCH_STAGES)} (CNNs); the middle and the last block (ViTs)")
    p.add_argument("--centre", action="store_true",
                   help="search with the similarity centred on each image's mean feature (default: the raw cosine)")
    p.add_argument("--backbone", default="tiny", help="conf/backbone/<name>.yaml for 'random' without a scfs ckpt")
    g = p.add_argument_group("shapes data (defaults: conf/data/shapes.yaml)")
    g.add_argument("--data-root", default=str(data["root"]))
    g.add_argument("--image-size", type=int, default=int(data["image_size"]))
    g.add_argument("--n-train", type=int, default=int(data["n_train"]))
    g.add_argument("--n-val", type=int, default=int(data["n_val"]))
    g.add_argument("--num-classes", type=int, default=int(data["num_classes"]))
    g.add_argument("--max-objects", type=int, default=int(data.get("max_objects", 3)))
    g.add_argument("--data-seed", type=int, default=int(data["seed"]))
    g.add_argument("--clutter", type=float, default=float(data.get("clutter", 1.0)))
    g.add_argument("--object-scale", type=float, nargs=2,
                   default=[float(v) for v in data.get("object_scale", (0.22, 0.42))])
    g.add_argument("--limit", type=int, default=0, help="use only the first N validation images (0 = all)")
    c = p.add_argument_group("local crops (defaults: conf/crops/shapes.yaml)")
    c.add_argument("--n-crops", type=int, default=4)
    c.add_argument("--local-size", type=int, default=int(crops["local_size"]))
    c.add_argument("--local-scale", type=float, nargs=2, default=[float(v) for v in crops["local_scale"]])
    c.add_argument("--topk", type=float, default=0.25)
    c.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0, help="crop sampling and random init")
    p.add_argument("--out", type=Path, help="run folder (default runs/eval/precision-<time>)")
    p.add_argument("--figure", type=Path, help="also save the plot here (e.g. docs/precision_default.png)")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`python -m scfs.eval.precision CKPT [CKPT ...]`: the report files and a one-line summary per backbone."""
    from scfs.data.shapes import ShapesSpec, ensure_shapes, load_shapes

    parser = _parser()
    args = parser.parse_args(argv)
    if not args.ckpts and args.multirun is None:
        parser.error("nothing to score: name checkpoints, 'random', or --multirun DIR")
    ckpts = [*multirun_checkpoints(args.multirun), *args.ckpts] if args.multirun is not None else args.ckpts
    t0 = time.time()
    spec = ShapesSpec(image_size=args.image_size, n_train=args.n_train, n_val=args.n_val,
                      num_classes=args.num_classes, max_objects=args.max_objects, seed=args.data_seed,
                      clutter=args.clutter, object_scale=tuple(args.object_scale))
    val = load_shapes(ensure_shapes(args.data_root, spec), "val")
    n = args.limit or len(val)
    specs, groups = seed_groups(ckpts, args.random_seeds)
    backbones, paths = load_backbones(specs, args.which, args.backbone, args.seed)
    args.stages = args.stages or default_stages(backbones)
    report = precision_report(backbones, val.images[:n], val.masks[:n], val.objects[:n], stages=args.stages,
                              modes=args.modes, n_crops=args.n_crops, local_size=args.local_size,
                              scale=args.local_scale, seed=args.seed, topk=args.topk, temperature=args.temperature,
                              checkpoints=paths, centre=args.centre, seeds=groups)
    report.settings["command"] = "python -m scfs.eval.precision " + " ".join(
        sys.argv[1:] if argv is None else argv)
    out = args.out or Path("runs") / "eval" / f"precision-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    files = report.save(out)
    if args.figure:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        report.figure().savefig(args.figure, dpi=80)
        files["docs_figure"] = str(args.figure)
    print(report.markdown())
    for mdl in report.values:
        for m in report.modes:
            b = report.best_stage(mdl, m)
            lo, hi = report.ci[mdl][m][b]
            print(f"{mdl} {m}: best stage {b} {100 * report.values[mdl][m][b]:.1f} % "
                  f"[{100 * lo:.1f}, {100 * hi:.1f}] (chance {100 * report.chance:.1f} %)")
    for label, pool in report.pooled().items():
        for m in report.modes:
            b = max(report.stages, key=lambda s: pool.mean[m][s] if pool.mean[m][s] == pool.mean[m][s] else -1.0)
            lo, hi = pool.ci[m][b]
            print(f"{label} over {len(pool.members)} seeds {m}: best stage {b} {100 * pool.mean[m][b]:.1f} % "
                  f"[{100 * lo:.1f}, {100 * hi:.1f}] (t-interval over seeds; seeds "
                  + ", ".join(f"{100 * v:.1f}" for v in pool.per_seed[m][b]) + ")")
    print(f"search precision of {len(backbones)} backbone(s) on {n} shapes val images in {time.time() - t0:.1f}s | "
          f"report {files['markdown']}", flush=True)
    return {**report.document(), "files": files}


if __name__ == "__main__":
    from scfs.cli import run_reporting_errors

    run_reporting_errors("scfs.eval.precision", main, sys.argv[1:])

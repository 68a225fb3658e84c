"""The small PNGs under docs/, one command each.

    python -m scfs.workbench.docs_figures regions SCFS=<ckpt> DINO=<ckpt> [--out docs/searched_regions_default.png]
    python -m scfs.workbench.docs_figures photos SCFS=<ckpt> DINO=<ckpt> --folder data/imagenet-samples --size 64
    python -m scfs.workbench.docs_figures knn benchmarks/results/shapes-cpu-default-{scfs,dino}-2026-12-01.json
    python -m scfs.workbench.docs_figures attention <ckpt> --folder data/imagenet-samples [--backbone vit_small]
    python -m scfs.workbench.docs_figures attention --multirun runs/multirun/<study>-<time> --folder ...  # per method
    python -m scfs.workbench.docs_figures precision <raw report folder> <centred report folder>

`regions`: the searched-regions figure of each checkpoint's teacher and of the same network at random init, on the
same shapes validation images and crops, one colour scale per image row shared by the three (soft search: the
weights are the similarity). `photos`: on a folder of real photos, one row per photo with the models (the
checkpoints' teachers, then random init) side by side as column groups, one colour scale per row. `--centre`
draws the centred similarity instead of the raw cosine (`feature_search(centre=True)`) and writes to `--out`
with `_centred` before the suffix unless `--out` is given; `--both` writes the raw figure to `--out` and the
centred one beside it (`<stem>_centred.png`), in one call. `knn`: kNN top-1 of the trained teachers against random
init per method, each seed a dot, mean with its range, one shared y axis, chance (1 / classes) dashed.
`attention`: for a ViT (our checkpoint, a published DINO ViT file, or `random`), the last block's CLS attention per
head on photos beside the SCFS search on the same images (`scfs.viz.attention`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scfs.plotting import new_figure


def regions(ckpts: Sequence[str], out: Path, n_images: int = 2, n_crops: int = 4, mode: str = "soft",
            centre: bool = False) -> Path:
    """The checkpoints' teachers and random init on the first shapes validation images (their crop's object
    outlined, its share of the weight next to its chance level)."""
    from omegaconf import OmegaConf

    from scfs import workbench as wb
    from scfs.eval.precision import load_backbones

    backbones, _ = load_backbones([*ckpts, "random"])
    first = next(c.split("=", 1)[-1] for c in ckpts)
    data = wb.checkpoint_cfg(first, "data") or wb.compose_train_cfg([]).data
    crops = wb.checkpoint_cfg(first, "crops") or _saved_crops(first) or wb.compose_train_cfg([]).crops
    crops = OmegaConf.to_container(crops, resolve=True) if not isinstance(crops, dict) else crops
    val = wb.shapes_split(data, "val")
    names = [val.classes[y] for y in val.labels[:n_images]]
    return _side_by_side(backbones, val.images[:n_images], names, out, masks=val.masks[:n_images], n_crops=n_crops,
                         local_size=int(crops["local_size"]), scale=tuple(crops["local_scale"]), mode=mode,
                         centre=centre)


def _saved_crops(ckpt: str) -> dict[str, Any] | None:
    """The crop settings in a checkpoint's hyper_parameters (a weights-only teacher file keeps them; it has no run
    folder beside it), or None."""
    from scfs.models.checkpoint import is_lightning_checkpoint, safe_load

    raw = safe_load(ckpt)
    crops = raw["hyper_parameters"].get("crops") if is_lightning_checkpoint(raw) else None
    return dict(crops) if crops else None


def photos(ckpts: Sequence[str], folder: Path, out: Path, n_images: int = 3, size: int = 64, n_crops: int = 4,
           scale: tuple[float, float] = (0.1, 0.3), mode: str = "soft", centre: bool = False) -> Path:
    """Real photos (any folder, resized to `size`), one row per photo with the models side by side: no object
    masks, so no precision; the crops are the same for every model, each row one colour scale shared by all of
    them. `centre`: the centred similarity."""
    from scfs.data.images import load_image_folder
    from scfs.eval.precision import load_backbones

    backbones, _ = load_backbones([*ckpts, "random"])
    images, names = load_image_folder(folder, size, limit=n_images)
    return photos_figure(backbones, images, names, out, n_crops=n_crops, scale=scale, mode=mode, centre=centre)


def photos_figure(backbones: dict[str, Any], images: np.ndarray, names: Sequence[str], out: Path, *,
                  n_crops: int = 4, scale: tuple[float, float] = (0.1, 0.3), mode: str = "soft",
                  centre: bool = False, dpi: int = 80) -> Path:
    """The photos figure of already loaded backbones: crop 0 (the one each row shows) is a centred square, where
    a photo's subject usually is; the other crops are sampled like training local crops."""
    from scfs.eval.search_maps import compute_search_maps, sample_crop_boxes
    from scfs.viz.figures import searched_regions_by_image

    size = images.shape[1]
    boxes = sample_crop_boxes(len(images), n_crops, size, size, scale)
    side = round(size * (scale[1] ** 0.5))
    lo = (size - side) // 2
    boxes[:, 0] = (lo, lo, lo + side, lo + side)
    maps = {name: compute_search_maps(bb, images, boxes, local_size=max(size // 2, 8), names=list(names),
                                      modes=(mode,), centre=centre) for name, bb in backbones.items()}
    return _save(searched_regions_by_image(maps, mode=mode), out, dpi)


def _side_by_side(backbones: dict[str, Any], images: np.ndarray, names: Sequence[str], out: Path, *,
                  masks: np.ndarray | None, n_crops: int, local_size: int, scale: tuple[float, ...],
                  mode: str, boxes: np.ndarray | None = None, dpi: int = 80, centre: bool = False) -> Path:
    """Every model's searched-regions block on the same images and crops, stacked in one figure (one colour
    scale per image row over all the models), saved once as a small PNG."""
    from scfs.eval.search_maps import compute_search_maps
    from scfs.viz.figures import searched_regions_stack

    maps: dict[str, Any] = {}
    for name, bb in backbones.items():
        maps[name] = compute_search_maps(bb, images, n_crops=n_crops, masks=masks, local_size=local_size,
                                         scale=scale, names=list(names), modes=(mode,), centre=centre,
                                         boxes=next(iter(maps.values())).boxes if maps else boxes)
    title = "{model} teacher: what the {mode} search picks" + (" (centred similarity)" if centre else "")
    return _save(searched_regions_stack(maps, mode=mode, masks=masks, title=title), out, dpi)


def _save(fig: Any, out: Path, dpi: int) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    _shrink(out)
    return out


def centred_path(out: Path) -> Path:
    """Where the centred figure goes beside the raw one: `<stem>_centred<suffix>`."""
    return out.with_name(f"{out.stem}_centred{out.suffix}")


def _shrink(path: Path) -> None:
    """Re-save as a 128-colour palette PNG: the figures are flat colour fields, and docs/ PNGs stay small."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(128).save(path, optimize=True)


def load_vit(ckpt: str, backbone: str = "vit_small", which: str = "teacher", seed: int = 0) -> Any:
    """The ViT of `ckpt`: ours carry their config; a published DINO ViT file or a plain state dict is read with
    conf/backbone/<backbone>.yaml (weights only); `random` is that config's random init at `seed`."""
    import torch
    from omegaconf import OmegaConf

    from scfs.models.backbone import load_backbone
    from scfs.models.checkpoint import is_lightning_checkpoint, safe_load
    from scfs.models.vit import ViTBackbone
    from scfs.names import CONF_DIR

    conf = CONF_DIR / "backbone" / f"{backbone}.yaml"
    if not conf.is_file():
        raise SystemExit(f"--backbone {backbone}: no conf/backbone/{backbone}.yaml (ViTs there: "
                         f"{', '.join(sorted(p.stem for p in conf.parent.glob('vit_*.yaml')))})")
    bcfg = OmegaConf.to_container(OmegaConf.load(conf))
    if ckpt == "random":
        torch.manual_seed(seed)
        net = load_backbone("random", backbone_cfg=bcfg)
    else:
        net = load_backbone(ckpt, which, None if is_lightning_checkpoint(safe_load(ckpt)) else bcfg)
    if not isinstance(net, ViTBackbone):
        raise SystemExit(f"{ckpt} is a {net.body.__class__.__name__}, not a ViT: the attention figure needs a ViT "
                         "checkpoint (trained with backbone=vit_*), a published DINO ViT file, or random")
    return net


def attention(ckpt: str, folder: Path, out: Path, n_images: int = 3, size: int = 224, backbone: str = "vit_small",
              scale: tuple[float, float] = (0.1, 0.3)) -> Path:
    """The CLS attention per head and the search, on the first `n_images` photos of `folder` (centred crop 0)."""
    from scfs.data.images import load_image_folder
    from scfs.eval.search_maps import sample_crop_boxes
    from scfs.viz.attention import attention_figure

    net = load_vit(ckpt, backbone)
    images, names = load_image_folder(folder, size, limit=n_images)
    boxes = sample_crop_boxes(len(images), 4, size, size, scale)
    side = round(size * (scale[1] ** 0.5))
    lo = (size - side) // 2
    boxes[:, 0] = (lo, lo, lo + side, lo + side)
    label = "random init" if ckpt == "random" else Path(ckpt).name
    fig = attention_figure(net, images, names, boxes=boxes,
                           title=f"{label} ({net.body.__class__.__name__} {net.embed_dim}x{net.depth})")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    _shrink(out)
    return out


def multirun_attention_jobs(sweep_dir: Path, out: Path, p: argparse.ArgumentParser) -> list[tuple[str, Path]]:
    """(checkpoint, PNG) per method of a finished multirun: the first job's teacher of each method (the study's
    seed order), drawn to <out stem>-<method><suffix>; a folder that is not a finished study is one parser error."""
    from scfs.eval.precision import MultirunFolderError, multirun_teachers

    try:
        teachers = multirun_teachers(sweep_dir)
    except MultirunFolderError as e:
        p.error(str(e))
    return [(ckpts[0], out.with_name(f"{out.stem}-{method.lower()}{out.suffix}")) for method, ckpts in teachers.items()]


def knn(records: Sequence[Path], out: Path) -> Path:
    runs = [r for rec in records for r in json.loads(Path(rec).read_text())["runs"]]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    groups = [(m.upper() + " trained", [r["knn_top1"] for r in runs if r["method"] == m]) for m in methods]
    groups.append(("random init", [r["knn_init_top1"] for r in runs if r["method"] == methods[0]]))
    fig = new_figure(4.6, 3.2)
    ax = fig.add_subplot(1, 1, 1)
    colours = ["tab:blue", "tab:orange", "tab:gray"]
    for x, ((label, vals), col) in enumerate(zip(groups, colours)):
        v = np.asarray(vals, dtype=float)
        ax.errorbar([x], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]], fmt="o", color=col,
                    capsize=6, ms=8, label=f"{label}: {v.mean():.1f} (seeds {', '.join(f'{a:.1f}' for a in v)})")
        ax.scatter(np.full(len(v), x) + np.linspace(-0.12, 0.12, len(v)), v, s=14, color=col, alpha=0.6)
    ax.axhline(100 / 10, color="grey", ls="--", lw=1, label="chance (10 classes)")
    ax.set_xticks(range(len(groups)), labels=[g[0] for g in groups], fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("kNN top-1 (k=20, val) %", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    ax.set_title(f"CPU default, {len(groups[0][1])} seeds (bars: min-max)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    _shrink(out)
    return out


def stacked(pngs: Sequence[Path], out: Path) -> Path:
    """Figures drawn on the same axes (e.g. the raw and the centred precision reports, both on 0-100 %) as one
    PNG, one above the other, so a reader compares them at a glance."""
    from PIL import Image

    imgs = [Image.open(p).convert("RGB") for p in pngs]
    width = max(i.width for i in imgs)
    canvas = Image.new("RGB", (width, sum(i.height for i in imgs)), "white")
    y = 0
    for img in imgs:
        canvas.paste(img, ((width - img.width) // 2, y))
        y += img.height
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out)
    return out


REGIONS_OUT = {"regions": "docs/searched_regions_default.png", "photos": "docs/searched_regions_photos.png"}


def _similarity_options(parser: argparse.ArgumentParser) -> None:
    """`--centre` (the centred similarity) and `--both` (raw and centred, two figures from one call)."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--centre", dest="similarity", action="store_const", const="centred", default="raw",
                   help="the similarity centred on each image's mean feature (default: the raw cosine)")
    g.add_argument("--both", dest="similarity", action="store_const", const="both",
                   help="two figures: raw to --out, centred to <stem>_centred.png beside it")


def main(argv: Sequence[str] | None = None) -> Path:
    p = argparse.ArgumentParser(prog="python -m scfs.workbench.docs_figures", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("regions", help="searched regions: the checkpoints' teachers and random init")
    r.add_argument("ckpts", nargs="+", help="LABEL=checkpoint (e.g. SCFS=runs/.../last.ckpt)")
    r.add_argument("--out", type=Path, help=f"PNG to write (default {REGIONS_OUT['regions']})")
    r.add_argument("--n-images", type=int, default=2)
    _similarity_options(r)
    ph = sub.add_parser("photos", help="searched regions on real photos: the checkpoints' teachers and random init")
    ph.add_argument("ckpts", nargs="+", help="LABEL=checkpoint (e.g. SCFS=runs/.../last.ckpt)")
    ph.add_argument("--folder", type=Path, default=Path("data/imagenet-samples"), help="a folder of photos")
    ph.add_argument("--size", type=int, default=64, help="photos resized to this (pixels)")
    ph.add_argument("--n-images", type=int, default=3)
    ph.add_argument("--out", type=Path, help=f"PNG to write (default {REGIONS_OUT['photos']})")
    _similarity_options(ph)
    k = sub.add_parser("knn", help="kNN per seed from a scfs.bench.cpu_default record")
    k.add_argument("records", type=Path, nargs="+", help="records whose runs are pooled (e.g. one per method)")
    k.add_argument("--out", type=Path, default=Path("docs/knn_default.png"))
    st = sub.add_parser("precision", help="precision reports (raw, centred, ...) one above the other in one PNG")
    st.add_argument("reports", type=Path, nargs="+", help="precision run folders (holding precision.png)")
    st.add_argument("--out", type=Path, default=Path("docs/precision_seeds.png"))
    at = sub.add_parser("attention", help="a ViT's CLS attention per head beside the SCFS search, on photos")
    at.add_argument("ckpt", nargs="?", help="a ViT checkpoint (ours or a published DINO ViT file) or random")
    at.add_argument("--multirun", type=Path, default=None,
                    help="instead of ckpt, a finished multirun (a ViT study's folder): one figure per method, of its "
                         "first job's teacher, written as <out stem>-<method>.png")
    at.add_argument("--folder", type=Path, default=Path("data/imagenet-samples"), help="a folder of photos")
    at.add_argument("--backbone", default="vit_small",
                    help="conf/backbone/<name>.yaml for files without a config (published DINO ViTs) and random")
    at.add_argument("--size", type=int, default=224, help="photos resized to this (pixels)")
    at.add_argument("--n-images", type=int, default=3)
    at.add_argument("--out", type=Path, default=Path("docs/attention_photos.png"))
    a = p.parse_args(argv)
    if a.what in ("regions", "photos"):
        a.out_given = a.out is not None
        a.out = a.out or Path(REGIONS_OUT[a.what])
    if a.what == "attention":
        if (a.ckpt is None) == (a.multirun is None):
            p.error("attention draws one checkpoint (or random) or the methods of one --multirun folder: pass one "
                    "of the two")
        jobs = [(a.ckpt, a.out)] if a.multirun is None else multirun_attention_jobs(a.multirun, a.out, p)
        for ckpt, _ in jobs:
            if ckpt != "random" and not Path(ckpt).is_file():
                p.error(f"checkpoint file not found: {ckpt} (or pass random)")
        if not a.folder.is_dir():
            p.error(f"photo folder not found: {a.folder} (python -m scfs.data.prepare imagenet-samples makes one)")
        for ckpt, out in jobs:
            path = attention(ckpt, a.folder, out, a.n_images, a.size, a.backbone)
            if len(jobs) > 1:
                print(path)
    elif a.what in ("regions", "photos"):
        missing = [c for c in a.ckpts if not Path(c.split("=", 1)[-1]).is_file()]
        if missing:
            p.error(f"checkpoint file not found: {', '.join(missing)}")
        if a.what == "photos" and not a.folder.is_dir():
            p.error(f"photo folder not found: {a.folder} (python -m scfs.data.prepare imagenet-samples makes one)")
        jobs = {"raw": [(a.out, False)], "centred": [(a.out if a.out_given else centred_path(a.out), True)],
                "both": [(a.out, False), (centred_path(a.out), True)]}[a.similarity]
        for out, centre in jobs:
            path = (regions(a.ckpts, out, a.n_images, centre=centre) if a.what == "regions"
                    else photos(a.ckpts, a.folder, out, a.n_images, a.size, centre=centre))
            if len(jobs) > 1 and not centre:
                print(path)
    elif a.what == "precision":
        missing = [str(r) for r in a.reports if not (r / "precision.png").is_file()]
        if missing:
            p.error(f"no precision.png in: {', '.join(missing)} (python -m scfs.eval.precision ... --out <folder>)")
        path = stacked([r / "precision.png" for r in a.reports], a.out)
    else:
        missing = [str(r) for r in a.records if not r.is_file()]
        if missing:
            p.error(f"record not found: {', '.join(missing)}")
        path = knn(a.records, a.out)
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])

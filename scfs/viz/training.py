"""The searched-regions figure saved at the end of every training run (`scfs.train.run` calls it).

It must cost little (a few validation images, one crop each, a tiny forward) and must never fail a run that
has already trained: every error is logged and turned into `None`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("scfs.viz")
FIGURE_NAME = "searched_regions.png"


def _pixels(sample: Any) -> Any:
    """A dataset sample's image as pixels: with `data.decode=gpu` the training split yields encoded files."""
    from scfs.data.encoded import EncodedFile

    return sample.image() if isinstance(sample, EncodedFile) else sample


def _raw_images(dm: Any, n: int, size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """`n` images as (n, size, size, 3) uint8 global views, and their instance masks when the data has them.

    Shapes: the validation split (with masks). Other data: the training set the data module already built
    (building a validation file list of ImageNet would cost more than the figure), read without its transform.
    """
    from scfs.data.images import prepare_image

    data_cfg = dict(getattr(dm, "data_cfg", {}) or {})
    ds = getattr(dm, "train_set", None)
    if data_cfg.get("name") == "shapes" and ds is not None and hasattr(ds, "folder"):
        from scfs.data.shapes import load_shapes

        val = load_shapes(ds.folder, "val", mmap=True)
        k = min(n, len(val))
        images = np.asarray(val.images[:k])
        masks = np.asarray(val.masks[:k])
        if images.shape[1] != size:
            images = np.stack([prepare_image(im, size) for im in images])
            masks = None
        return images, masks
    if ds is None:
        dm.setup()
        ds = dm.train_set
    transform, ds.transform = ds.transform, None
    try:
        step = max(1, len(ds) // n)
        images = [prepare_image(_pixels(ds[i * step][0]), size) for i in range(min(n, len(ds)))]
    finally:
        ds.transform = transform
    return np.stack(images), None


def save_training_figure(model: Any, dm: Any, run_dir: str | Path, logger: Any = None, n_images: int = 4,
                         seed: int = 0) -> str | None:
    """Save `<run_dir>/searched_regions.png` (teacher maps searched with the student's crop queries, as in
    training, per searched stage, in the run's search mode) and log it to W&B when `logger` is a WandbLogger.

    Returns the file path, or None when anything failed (logged as a warning; training results are unaffected).
    """
    t0 = time.time()
    try:
        from scfs.eval.search_maps import compute_search_maps, mode_of, stages_of
        from scfs.viz.figures import searched_regions_figure

        crops = dict(getattr(dm, "crops_cfg", {}) or {})
        size = int(crops.get("global_size", 224))
        local = int(crops.get("local_size", max(size // 2, 8)))
        scale = tuple(crops.get("local_scale", (0.1, 0.35)))
        images, masks = _raw_images(dm, n_images, size)
        mode, stages = mode_of(model), stages_of(model)
        maps = compute_search_maps(model, images, stages=stages, modes=(mode,), local_size=local, n_crops=4,
                                   scale=scale, seed=seed, masks=masks, query="student",
                                   topk=float(model.search_cfg.get("topk", 0.25)),
                                   temperature=float(model.search_cfg.get("temperature", 0.1)))
        method = str(getattr(model, "method_cfg", {}).get("name", "scfs")).upper()
        note = "" if method == "SCFS" else " (DINO trains no search: shown for comparison)"
        fig = searched_regions_figure(maps, mode=mode, stages=stages, masks=masks,
                                      title=f"{method} after training: what the {mode} search picks{note}")
        path = Path(run_dir) / FIGURE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
        if type(logger).__name__ == "WandbLogger":
            step = getattr(model, "global_step", None)
            logger.log_image(key="searched_regions", images=[str(path)], step=step,
                             caption=[f"{method} {mode} search: local crop (yellow) -> teacher map, per stage"])
        log.info("searched-regions figure %s (%.1fs)", path, time.time() - t0)
        return str(path)
    except Exception as err:  # never let a figure fail a finished training run
        log.warning("searched-regions figure skipped: %s: %s", type(err).__name__, err, exc_info=True)
        return None

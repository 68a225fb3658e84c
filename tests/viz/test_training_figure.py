"""`save_training_figure`: written into the run folder, logged to W&B loggers, never raising."""

import logging

import pytest
from helpers import compile_with_backend, compose_cfg

from scfs.train import build
from scfs.viz import save_training_figure


class WandbLogger:  # same class name as Lightning's: the function dispatches on it
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def log_image(self, **kw) -> None:
        self.calls.append(kw)


def _model_and_dm(shapes_root, overrides=()):
    dm, model = build(compose_cfg(list(overrides), data_root=shapes_root))
    dm.setup()
    return model, dm


def test_figure_is_saved_and_logged(shapes_root, tmp_path):
    model, dm = _model_and_dm(shapes_root)
    model.train()
    logger = WandbLogger()
    path = save_training_figure(model, dm, tmp_path, logger)
    assert path == str(tmp_path / "searched_regions.png") and (tmp_path / "searched_regions.png").stat().st_size > 0
    assert logger.calls and logger.calls[0]["key"] == "searched_regions" and logger.calls[0]["images"] == [path]
    assert model.training and model.teacher.training  # the modes it had are restored


def test_figure_for_dino_and_other_search_modes(shapes_root, tmp_path):
    for overrides in (["method=dino"], ["search=hard"], ["search=roi"], ["data.batch_aug=false"]):
        model, dm = _model_and_dm(shapes_root, overrides)
        out = tmp_path / overrides[0].replace("=", "-")
        assert save_training_figure(model, dm, out, None) == str(out / "searched_regions.png")


def test_failures_are_logged_not_raised(shapes_root, tmp_path, caplog):
    model, _ = _model_and_dm(shapes_root)
    with caplog.at_level(logging.WARNING, logger="scfs.viz"):
        assert save_training_figure(model, object(), tmp_path, None) is None
    assert "searched-regions figure skipped" in caplog.text


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_figure_on_an_image_folder(tmp_path, decode):
    """With `data.decode=gpu` the training split yields encoded JPEG bytes: the figure decodes them itself."""
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for i in range(8):
                Image.new("RGB", (40 + i, 36), (30 * i, 100, 200)).save(tmp_path / "data" / split / cls / f"{i}.jpg")
    dm, model = build(compose_cfg(["data=folder", "batch_size=4", f"data.decode={decode}"],
                                  data_root=tmp_path / "data"))
    dm.setup()
    assert save_training_figure(model, dm, tmp_path / "run", None) == str(tmp_path / "run" / "searched_regions.png")


def test_figure_of_a_compiled_model_compiles_nothing(shapes_root, tmp_path, monkeypatch):
    """With the backbones and heads compiled in place (`compile=true`), the end-of-training figure's search pass
    adds no compiled frame or graph (eval-mode BatchNorm, no grad and its few images would each miss the training
    graphs' guards), its maps are the eager model's, and compilation is back on afterwards."""
    import numpy as np
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from scfs.eval.search_maps import compute_search_maps

    compile_with_backend(monkeypatch, "aot_eager")
    torch.manual_seed(0)
    eager, dm = _model_and_dm(shapes_root)
    torch.manual_seed(0)
    compiled, _ = _model_and_dm(shapes_root, ["compile=true"])
    assert compiled.compile_nets
    torch._dynamo.reset()
    counters.clear()
    assert save_training_figure(compiled, dm, tmp_path, None) == str(tmp_path / "searched_regions.png")
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    got, want = (compute_search_maps(m, images, stages=m.stages, modes=("soft",), query="student")
                 for m in (compiled, eager))
    assert counters["frames"]["total"] == 0 and counters["stats"]["unique_graphs"] == 0
    for s in compiled.stages:
        np.testing.assert_array_equal(got.similarity[s], want.similarity[s])
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert counters["frames"]["total"] == 1  # the pass left the compiler's stance as it found it
    torch._dynamo.reset()

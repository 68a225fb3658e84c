"""docs/ figures from records: the kNN-per-seed plot pools records, and a missing input is a one-line error."""

import json

import pytest

from scfs.workbench.docs_figures import main


def _record(path, method, values):
    runs = [{"method": method, "seed": s, "knn_top1": v, "knn_init_top1": 60.0 + s} for s, v in enumerate(values)]
    path.write_text(json.dumps({"runs": runs}))


def test_knn_figure_pools_records_and_shares_one_axis(tmp_path):
    _record(tmp_path / "a.json", "scfs", [80.0, 70.0, 75.0])
    _record(tmp_path / "b.json", "dino", [60.0, 50.0, 55.0])
    out = main(["knn", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "k.png")])
    assert out.stat().st_size > 5_000


def test_missing_inputs_are_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["knn", str(tmp_path / "nope.json")])
    assert "record not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["regions", f"SCFS={tmp_path / 'x.ckpt'}"])
    assert "checkpoint file not found" in capsys.readouterr().err


def _photos_and_checkpoint(tmp_path):
    """Three random "photos" of different sizes and a tiny backbone's checkpoint."""
    import numpy as np
    import torch
    from PIL import Image

    from scfs.models.backbone import build_backbone

    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (48 + 8 * i, 40, 3), dtype=np.uint8)).save(folder / f"p{i}.jpg")
    cfg = {"name": "resnet18", "cifar_stem": True, "stem_stride": 2, "layers": (1, 1, 1, 1),
           "channels": (8, 16, 16, 32)}
    body = build_backbone(cfg)
    ckpt = tmp_path / "bb.ckpt"
    torch.save({"state_dict": {f"teacher.backbone.{k}": v for k, v in body.state_dict().items()},
                "hyper_parameters": {"backbone": cfg}}, ckpt)
    return folder, ckpt


def test_photos_figure_from_any_checkpoint_and_folder(tmp_path):
    """Real photos: the trained teacher and random init side by side on the same crops, crop 0 centred."""
    folder, ckpt = _photos_and_checkpoint(tmp_path)
    out = main(["photos", f"SCFS={ckpt}", "--folder", str(folder), "--size", "32", "--n-images", "2",
                "--out", str(tmp_path / "p.png")])
    assert out.stat().st_size > 5_000


def test_photos_is_one_row_per_photo_with_the_models_side_by_side(tmp_path, monkeypatch):
    """One Figure saved once to --out (no PNG written and read back): per photo row the global view, the query
    crop, then the models (SCFS, then random init) as column groups of one panel per stage, one colour bar per
    row; `--both` adds the centred figure beside it in the same call, and says so in its panels."""
    import matplotlib.image
    from matplotlib.figure import Figure

    folder, ckpt = _photos_and_checkpoint(tmp_path)
    saved = []
    real_savefig = Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        saved.append((fig, path))
        return real_savefig(fig, path, *args, **kwargs)

    def no_imread(*args, **kwargs):
        raise AssertionError("a figure was read back from a PNG")

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(matplotlib.image, "imread", no_imread)
    before = set(tmp_path.rglob("*"))
    out = main(["photos", f"SCFS={ckpt}", "--folder", str(folder), "--size", "32", "--n-images", "2",
                "--out", str(tmp_path / "p.png"), "--both"])
    centred = tmp_path / "p_centred.png"
    assert [p for _, p in saved] == [tmp_path / "p.png", centred] and out == centred
    assert set(tmp_path.rglob("*")) - before == {tmp_path / "p.png", centred}
    for fig, path in saved:
        assert not fig.subfigs
        panels = [ax.get_title() for ax in fig.axes if ax.get_title()]
        per_row = 2 + 2 * 3  # global view, query crop, 2 models x 3 stages
        assert len(panels) == 2 * per_row and len([c for ax in fig.axes for c in ax.child_axes]) == 2
        models = [t.split(" layer")[0] for t in panels[2:per_row]]
        assert models == ["SCFS"] * 3 + ["random init"] * 3
        word = "centred similarity" if path == centred else "similarity"
        assert all(t.endswith("\n" + word) for t in panels[2:per_row])


def test_centre_alone_writes_the_centred_figure(tmp_path):
    folder, ckpt = _photos_and_checkpoint(tmp_path)
    out = main(["photos", f"SCFS={ckpt}", "--folder", str(folder), "--size", "32", "--n-images", "1",
                "--out", str(tmp_path / "c.png"), "--centre"])
    assert out == tmp_path / "c.png" and out.stat().st_size > 5_000
    assert not (tmp_path / "c_centred.png").exists()


def test_photos_needs_a_folder(tmp_path, capsys):
    (tmp_path / "x.ckpt").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["photos", f"SCFS={tmp_path / 'x.ckpt'}", "--folder", str(tmp_path / "none")])
    assert "photo folder not found" in capsys.readouterr().err


def test_regions_centre_titles_say_centred(tmp_path, monkeypatch):
    """`regions --centre` on a run folder's checkpoint: the shapes split of the run's saved config, every model's
    block titled and captioned as the centred similarity."""
    from matplotlib.figure import Figure
    from omegaconf import OmegaConf

    _, ckpt = _photos_and_checkpoint(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    ckpt = ckpt.rename(run / "checkpoints" / "last.ckpt")
    OmegaConf.save({"data": {"root": str(tmp_path / "shapes"), "image_size": 32, "n_train": 4, "n_val": 4},
                    "crops": {"local_size": 16, "local_scale": [0.25, 0.5]}}, run / ".hydra" / "config.yaml")
    saved = []
    real_savefig = Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        saved.append(fig)
        return real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    out = main(["regions", f"SCFS={ckpt}", "--n-images", "2", "--centre", "--out", str(tmp_path / "r.png")])
    assert out == tmp_path / "r.png" and out.stat().st_size > 5_000
    (fig,) = saved
    assert [sub.get_suptitle() for sub in fig.subfigs[:-1]] == [
        f"{m} teacher: what the soft search picks (centred similarity)" for m in ("SCFS", "random init")]
    assert "centred cosine similarity" in " ".join(t.get_text() for t in fig.subfigs[-1].texts)


def test_precision_reports_stack_into_one_png(tmp_path):
    """`docs_figures precision A B`: the two reports' figures one above the other; a folder without one is one
    clear error."""
    from PIL import Image

    from scfs.workbench.docs_figures import main

    for name, (w, h) in (("raw", (300, 100)), ("centred", (280, 120))):
        (tmp_path / name).mkdir()
        Image.new("RGB", (w, h), "red").save(tmp_path / name / "precision.png")
    out = main(["precision", str(tmp_path / "raw"), str(tmp_path / "centred"), "--out", str(tmp_path / "p.png")])
    assert Image.open(out).size == (300, 220)
    with pytest.raises(SystemExit):
        main(["precision", str(tmp_path), "--out", str(tmp_path / "q.png")])

"""Search precision on hand-made masks and a hand-made 'backbone' whose answer is known."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from scfs.eval.precision import (
    covered_object,
    main,
    mass_inside,
    precision_report,
    precision_scores,
    search_precision,
)


def test_mass_inside_on_a_known_mask():
    mask = np.zeros((8, 8), bool)
    mask[:, :4] = True  # object = left half
    assert mass_inside(np.array([[1.0, 0.0], [1.0, 0.0]]), mask) == 1.0
    assert mass_inside(np.ones((2, 2)), mask) == 0.5  # uniform weights score the object's area share
    assert mass_inside(np.array([[0.0, 3.0], [0.0, 1.0]]), mask) == 0.0
    assert mass_inside(np.array([[1.0, -5.0], [1.0, -5.0]]), mask) == 1.0  # only positive mass counts
    # a 1 x 4 map over the 8 x 8 image: two columns of cells inside the object, two outside
    assert mass_inside(np.array([[2.0, 2.0, 2.0, 2.0]]), mask) == pytest.approx(0.5)
    assert math.isnan(mass_inside(np.zeros((2, 2)), mask))


def test_covered_object_is_the_largest_overlap():
    m = np.zeros((10, 10), np.uint8)
    m[0:4, 0:4] = 1  # 16 px
    m[5:10, 5:10] = 2  # 25 px
    assert covered_object(m, [0, 0, 10, 10]) == 2
    assert covered_object(m, [0, 0, 6, 6]) == 1
    assert covered_object(m, [0, 5, 4, 10]) == 0  # background only


class ColourNet(nn.Module):
    """A 'backbone' whose features are relu(red), relu(blue) per pixel: a red object and a blue background have
    orthogonal features, so a query from a crop inside the object is similar to the object only."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d(3, 2, 1, bias=False)
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[0, 0] = 1.0
            conv.weight[1, 2] = 1.0
        self.body = nn.ModuleDict({"layer2": nn.Sequential(conv, nn.ReLU()), "layer3": nn.AvgPool2d(2)})


def _red_square_on_blue(n: int = 2, size: int = 16):
    images = np.zeros((n, size, size, 3), np.uint8)
    images[..., 2] = 255
    masks = np.zeros((n, size, size), np.uint8)
    images[:, :8, :8] = (255, 0, 0)
    masks[:, :8, :8] = 1
    objects = [[{"label": 3, "box": [0, 0, 8, 8]}] for _ in range(n)]
    return images, masks, objects


def test_search_precision_known_answer():
    images, masks, objects = _red_square_on_blue()
    crops = np.array([[[1, 1, 7, 7], [9, 9, 15, 15]]] * 2)  # inside the object / on background only
    net = ColourNet()
    for mode in ("soft", "hard", "softmax"):
        p = search_precision(net, images, masks, objects, crops, stages=("layer2", "layer3"), mode=mode,
                             local_size=4)
        assert p["layer2"] == pytest.approx(1.0, abs=1e-3), mode  # softmax leaves ~e^-10 on the background
        assert p["layer3"] == pytest.approx(1.0, abs=1e-3), mode
    scores = precision_scores(net, images, masks, objects, crops, stages=("layer2",), modes=("soft",), local_size=4)
    assert scores.n_used == 2 and (scores.objects[:, 1] == 0).all()  # the background crops are skipped
    assert np.isnan(scores.precision["soft"]["layer2"][:, 1]).all()
    assert scores.chance_mean == pytest.approx(64 / 256)
    assert (scores.labels[:, 0] == 3).all()


def test_precision_report_files_and_random_backbone(tmp_path):
    from scfs.models import Backbone

    images, masks, objects = _red_square_on_blue(3, 32)
    torch.manual_seed(0)
    bb = Backbone("resnet18", stages=("layer4",), cifar_stem=True, layers=(1, 1, 1, 1), channels=(8, 8, 8, 8))
    rep = precision_report({"colour": ColourNet(), "random": bb}, images, masks, objects, stages=("layer2", "layer3"),
                           n_crops=3, local_size=8)
    assert set(rep.values) == {"colour", "random"} and set(rep.values["random"]) == {"soft", "hard", "softmax"}
    for per_mode in rep.values.values():
        for v in per_mode.values():
            assert all(0.0 <= x <= 1.0 for x in v.values())
    files = rep.save(tmp_path)
    assert "| colour | soft |" in (tmp_path / "precision.md").read_text()
    assert (tmp_path / "precision.png").stat().st_size > 1000 and files["json"].endswith("precision.json")


def test_precision_cli_random_init(tmp_path, capsys):
    doc = main(["random", "--data-root", str(tmp_path / "shapes"), "--n-train", "4", "--n-val", "6", "--n-crops", "2",
                "--modes", "soft", "hard", "--out", str(tmp_path / "run")])
    assert set(doc["values"]) == {"random init"} and set(doc["values"]["random init"]) == {"soft", "hard"}
    assert (tmp_path / "run" / "precision.json").is_file() and (tmp_path / "run" / "precision.png").is_file()
    assert "uniform weights (chance, per crop)" in capsys.readouterr().out


def test_precision_cli_centre_scores_the_centred_search(tmp_path):
    args = ["random", "--data-root", str(tmp_path / "shapes"), "--n-train", "4", "--n-val", "6", "--n-crops", "2",
            "--modes", "soft"]
    raw = main([*args, "--out", str(tmp_path / "raw")])
    centred = main([*args, "--centre", "--out", str(tmp_path / "centred")])
    assert raw["settings"]["centre"] is False and centred["settings"]["centre"] is True
    assert raw["values"]["random init"]["soft"] != centred["values"]["random init"]["soft"]
    assert json.loads((tmp_path / "centred" / "precision.json").read_text())["settings"]["centre"] is True


def test_mean_ci_uses_per_image_means_and_report_carries_intervals():
    from scfs.eval.precision import mean_ci

    v = np.array([[1.0, 1.0, np.nan], [0.0, 0.0, 0.0], [0.5, np.nan, np.nan]])
    mean, lo, hi = mean_ci(v)
    assert mean == pytest.approx(2.5 / 6)
    per_image = np.array([1.0, 0.0, 0.5])
    half = 1.96 * per_image.std(ddof=1) / np.sqrt(3)
    assert (lo, hi) == pytest.approx((mean - half, mean + half))
    assert all(np.isnan(mean_ci(np.full((2, 2), np.nan))))

    images, masks, objects = _red_square_on_blue(4, 16)
    crops = np.array([[[1, 1, 7, 7], [2, 2, 6, 6]]] * 4)
    rep = precision_report({"colour": ColourNet()}, images, masks, objects, crops, stages=("layer2",),
                           modes=("soft",), local_size=4)
    lo, hi = rep.ci["colour"]["soft"]["layer2"]
    assert lo <= rep.values["colour"]["soft"]["layer2"] <= hi
    # lift = precision minus the crop's own chance (the square is 64 of 256 pixels)
    assert rep.lift["colour"]["soft"]["layer2"] == pytest.approx(1.0 - 0.25, abs=1e-3)
    assert rep.chance_interval[0] <= rep.chance <= rep.chance_interval[1]
    assert rep.best_stage("colour", "soft") == "layer2" and "±" in rep.markdown()


# ---- a multirun folder as the checkpoints to score ---------------------------------------------------------------
def _fake_multirun(root, jobs):
    """A multirun folder of job folders `<n>/summary.json` with the given (method, checkpoint, extra) entries."""
    for n, (method, ckpt, *extra) in enumerate(jobs):
        job = root / str(n)
        job.mkdir(parents=True)
        summary = {"method": method, "checkpoint": ckpt, **(extra[0] if extra else {})}
        (job / "summary.json").write_text(json.dumps(summary))
    return root


def test_multirun_checkpoints_groups_by_method_in_job_number_order(tmp_path):
    from scfs.eval.precision import multirun_checkpoints

    jobs = [("scfs" if n % 2 == 0 else "dino", f"/c/{n}.ckpt") for n in range(12)]
    sweep = _fake_multirun(tmp_path / "sweep", jobs)
    (sweep / ".hydra").mkdir()  # folders without a summary (the sweep's own config, a running job) are not jobs
    (sweep / "12").mkdir()
    # job 10 comes after job 9, not after job 1 as the folder names would sort
    assert multirun_checkpoints(sweep) == ["SCFS=/c/0.ckpt,/c/2.ckpt,/c/4.ckpt,/c/6.ckpt,/c/8.ckpt,/c/10.ckpt",
                                           "DINO=/c/1.ckpt,/c/3.ckpt,/c/5.ckpt,/c/7.ckpt,/c/9.ckpt,/c/11.ckpt"]
    one = _fake_multirun(tmp_path / "one", [("dino", "/d.ckpt")])
    assert multirun_checkpoints(one) == ["DINO=/d.ckpt"]


def test_multirun_checkpoints_refuses_a_folder_without_finished_jobs(tmp_path):
    from scfs.eval.precision import MultirunFolderError, multirun_checkpoints

    (tmp_path / "empty" / "0").mkdir(parents=True)
    with pytest.raises(MultirunFolderError, match="no job folder there has a summary.json.*run the study"):
        multirun_checkpoints(tmp_path / "empty")
    with pytest.raises(MultirunFolderError, match="no such folder"):
        multirun_checkpoints(tmp_path / "missing")
    cut = _fake_multirun(tmp_path / "cut", [("scfs", "/a.ckpt"), ("dino", "/b.ckpt", {"stopped_by_chunk_budget": True}),
                                            ("dino", "")])
    with pytest.raises(MultirunFolderError, match=r"job\(s\) 1, 2 did not finish.*run the study again"):
        multirun_checkpoints(cut)


def test_precision_cli_scores_a_multirun_folder_before_the_named_checkpoints(tmp_path, monkeypatch):
    import scfs.eval.precision as precision

    sweep = _fake_multirun(tmp_path / "sweep", [("scfs", "/s0.ckpt"), ("dino", "/d0.ckpt"), ("scfs", "/s1.ckpt")])
    seen = []

    class Loaded(Exception):
        pass

    def load_backbones(specs, *args):
        seen.extend(specs)
        raise Loaded

    monkeypatch.setattr(precision, "load_backbones", load_backbones)
    with pytest.raises(Loaded):
        main(["--multirun", str(sweep), "random", "--random-seeds", "0", "1", "--data-root", str(tmp_path / "shapes"),
              "--n-train", "4", "--n-val", "6"])
    assert seen == ["SCFS [1]=/s0.ckpt", "SCFS [2]=/s1.ckpt", "DINO=/d0.ckpt", "random init [seed 0]=random@0",
                    "random init [seed 1]=random@1"]


def test_precision_cli_says_in_one_line_what_a_multirun_folder_lacks(tmp_path, capsys):
    from scfs.cli import run_reporting_errors

    (tmp_path / "sweep").mkdir()
    with pytest.raises(SystemExit) as done:
        run_reporting_errors("scfs.eval.precision", main, ["--multirun", str(tmp_path / "sweep"), "random"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith("scfs.eval.precision: error: --multirun ") and "scripts/gpu_study.sh" in err
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2 and "--multirun DIR" in capsys.readouterr().err

"""The ImageFolder data-path benchmark runs on the CPU and writes its record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scfs.bench import loader


def test_loader_benchmark_measures_both_colour_paths(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (60 + i, 80, 3), dtype=np.uint8)).save(photos / f"p{i}.jpg")
    assert loader.main(["--photos", str(photos), "--repeat", "2", "--workers", "0", "--batch", "4", "--batches", "2",
                        "--warmup", "1", "--out", str(tmp_path / "out")]) == 0
    record = json.loads(next((tmp_path / "out").glob("loader-*.json")).read_text())
    assert [r["colour"] for r in record["rows"]] == ["workers", "device"]
    assert all(r["img_per_s"] > 0 and r["batches"] == 2 for r in record["rows"])
    assert set(record["per_worker"]) == {"workers", "device"}
    assert "| ResNet-50 SCFS B=64" in next((tmp_path / "out").glob("loader-*.md")).read_text()


def test_loader_benchmark_compares_cpu_and_device_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--decode cpu gpu`: a row per decode path, each timing float views ready on the device (the CPU here), the
    gpu row through `data.decode=gpu` (encoded batches decoded by decode_jpeg, then every view on the device)."""
    import scfs.data.encoded as encoded

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 255, (60 + i, 80, 3), dtype=np.uint8)).save(photos / f"p{i}.jpg")
    decoded = []
    real = encoded.decode_images
    monkeypatch.setattr(encoded, "decode_images", lambda b, y, d: decoded.append(len(b)) or real(b, y, d))
    assert loader.main(["--photos", str(photos), "--repeat", "2", "--workers", "0", "--batch", "4", "--batches", "2",
                        "--warmup", "1", "--decode", "cpu", "gpu", "--colour", "device", "--device", "cpu",
                        "--out", str(tmp_path / "out")]) == 0
    record = json.loads(next((tmp_path / "out").glob("loader-*.json")).read_text())
    assert [(r["decode"], r["colour"], r["device"]) for r in record["rows"]] == [("cpu", "device", "cpu"),
                                                                                   ("gpu", "device", "cpu")]
    assert all(r["img_per_s"] > 0 and r["batches"] == 2 for r in record["rows"])
    assert decoded == [4] * 3  # the gpu row's warm-up and timed batches were decoded on the device
    assert record["rows"][1]["views"] == [[3, 224, 224]] * 2 + [[3, 96, 96]] * 8
    md = next((tmp_path / "out").glob("loader-*.md")).read_text()
    assert "| gpu | device | 0 | - |" in md and set(record["per_worker"]) == {"device"}  # hosts' cores: cpu rows


def test_loader_benchmark_names_an_empty_photo_folder(tmp_path: Path) -> None:
    from scfs.data.prepare import PrepareError, repeat_photos

    with pytest.raises(PrepareError, match="no images"):
        repeat_photos(tmp_path, tmp_path / "tree", 1)


@pytest.mark.parametrize("args, message", [
    (["--photos", "{tmp}"], "no images"),
    (["--photos", "{tmp}/missing"], "not a folder"),
    (["--root", "{tmp}"], "no train/<class>/ folders"),
])
def test_loader_benchmark_rejects_bad_inputs_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        loader.main([a.format(tmp=tmp_path) for a in args] + ["--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing half-written

"""prepare: checksum, safe extraction (malicious archives refused, nothing written), layout, CLI."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from scfs.data.datasets import build_dataset
from scfs.data.prepare import PrepareError, extract_archive, main, prepare_cifar10

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SCFS_SHARED_DATA", REPO.parent / "shared" / "data"))
SHARED_CIFAR = SHARED / "cifar10-jpeg.tar.xz"


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, "JPEG")
    return buf.getvalue()


def _tar(path: Path, members: list[tuple[str, str, bytes | str | None]], mode: str = "w:gz") -> Path:
    """members: (name, kind in file/dir/sym/hard/chr, data or link target)."""
    with tarfile.open(path, mode) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE}[kind]
            if kind in ("sym", "hard"):
                info.linkname = data
            tar.addfile(info)
    return path


def _cifar_like(path: Path, splits=("train", "test")) -> Path:
    members = [("cifar10", "dir", None)]
    for split in splits:
        for c in ("cat", "dog"):
            members += [(f"cifar10/{split}/{c}/{i:04d}.jpg", "file", _jpeg()) for i in range(2)]
    return _tar(path, members, "w:xz")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def test_cifar10_extract_then_build_dataset(tmp_path: Path, work: Path, capsys) -> None:
    archive = _cifar_like(tmp_path / "c10.tar.xz")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    args = ["cifar10", "--archive", str(archive), "--out", str(work / "c10"), "--sha256", sha.upper()]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "verified SHA256" in printed and "stripped top folder cifar10/" in printed
    assert "train/ 4 images in 2 classes" in printed and "test/ 4 images in 2 classes" in printed
    assert sorted(p.name for p in work.iterdir()) == ["c10"]  # no temp dirs left
    assert (work / "c10" / "train" / "cat" / "0000.jpg").is_file()
    val = build_dataset({"name": "cifar10", "root": str(work / "c10")}, "val")
    assert len(val) == 4 and val.classes == ["cat", "dog"] and val[0][0].shape == (3, 8, 8)


def test_existing_output_kept_unless_force(tmp_path: Path, work: Path, capsys) -> None:
    archive = _cifar_like(tmp_path / "c10.tar.xz")
    out = work / "c10"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["cifar10", "--archive", str(archive), "--out", str(out)]) == 0
    assert "nothing done" in capsys.readouterr().out and (out / "keep.txt").exists()
    assert main(["cifar10", "--archive", str(archive), "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "test" / "dog").is_dir()
    assert sorted(p.name for p in work.iterdir()) == ["c10"]


def test_sha_mismatch_refused(tmp_path: Path, work: Path, capsys) -> None:
    archive = _cifar_like(tmp_path / "c10.tar.xz")
    assert main(["cifar10", "--archive", str(archive), "--out", str(work / "c10"), "--sha256", "0" * 64]) == 2
    assert "SHA256 mismatch" in capsys.readouterr().err
    assert list(work.iterdir()) == []


def test_sums_file(tmp_path: Path, work: Path) -> None:
    archive = _cifar_like(tmp_path / "c10.tar.xz")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{'1' * 64}  other.tar.xz\n{sha}  c10.tar.xz\n")
    extract_archive(archive, work / "a", sums=sums)
    sums.write_text(f"{'f' * 64}  c10.tar.xz\n")  # auto-detected next to the archive, and wrong
    with pytest.raises(PrepareError, match="SHA256 mismatch.*SHA256SUMS"):
        extract_archive(archive, work / "b")
    sums.write_text(f"{sha}  other.tar.xz\n")
    with pytest.raises(PrepareError, match="no entry for c10.tar.xz"):
        extract_archive(archive, work / "b", sums=sums)
    assert sorted(p.name for p in work.iterdir()) == ["a"]


MALICIOUS = {
    "dotdot": [("ok.txt", "file", b"fine"), ("../evil", "file", b"pwned")],
    "nested-dotdot": [("a/../../evil", "file", b"pwned")],
    "absolute": [("/tmp/scfs-evil-absolute", "file", b"pwned")],
    "symlink-escape": [("link", "sym", "../../evil-dir"), ("link/evil", "file", b"pwned")],
    "symlink-absolute": [("link", "sym", "/tmp")],
    "hardlink-escape": [("hard", "hard", "../evil")],
    "device": [("dev", "chr", None)],
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_refused(tmp_path: Path, work: Path, case: str, capsys) -> None:
    archive = _tar(tmp_path / "bad.tar", MALICIOUS[case], "w")
    before = {p for p in tmp_path.rglob("*")}
    assert main(["extract", "--archive", str(archive), "--out", str(work / "out")]) == 2
    err = capsys.readouterr().err
    assert "refusing to extract" in err and "unsafe member" in err and "nothing was written" in err
    assert {p for p in tmp_path.rglob("*")} == before  # no output, no temp dir, nothing outside
    assert not Path("/tmp/scfs-evil-absolute").exists()


def test_layout_check_failure_writes_nothing(tmp_path: Path, work: Path) -> None:
    archive = _cifar_like(tmp_path / "c10.tar.xz", splits=("train",))
    with pytest.raises(PrepareError, match="no test/ folder"):
        prepare_cifar10(archive, work / "c10")
    assert main(["cifar10", "--archive", str(archive), "--out", str(work / "c10")]) == 2
    assert list(work.iterdir()) == []


def test_not_an_archive_and_missing(tmp_path: Path, work: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"definitely not a tarball")
    with pytest.raises(PrepareError, match="cannot read archive"):
        extract_archive(junk, work / "x")
    with pytest.raises(PrepareError, match="not found"):
        extract_archive(tmp_path / "missing.tar", work / "x")
    assert list(work.iterdir()) == []


def test_generic_extract_without_top_folder_and_no_strip(tmp_path: Path, work: Path) -> None:
    flat = _tar(tmp_path / "flat.tar", [("a.jpg", "file", _jpeg()), ("b.jpg", "file", _jpeg())], "w")
    assert sorted(p.name for p in extract_archive(flat, work / "flat").iterdir()) == ["a.jpg", "b.jpg"]
    members = [("samples/a.jpg", "file", _jpeg()), ("samples/in", "sym", "a.jpg")]
    nested = _tar(tmp_path / "n.tar.bz2", members, "w:bz2")
    assert main(["folder", "--archive", str(nested), "--out", str(work / "n"), "--no-strip"]) == 0
    assert (work / "n" / "samples" / "a.jpg").is_file() and (work / "n" / "samples" / "in").is_symlink()


def test_cli_module_entry_point(tmp_path: Path, work: Path) -> None:
    archive = _tar(tmp_path / "s.tar", [("imagenet-samples/n01_x.jpg", "file", _jpeg())], "w")
    cmd = [sys.executable, "-m", "scfs.data.prepare", "imagenet-samples", "--archive", str(archive),
           "--out", str(work / "s")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "extracted 1 member(s)" in res.stdout and (work / "s" / "n01_x.jpg").is_file()


@pytest.mark.slow
def test_real_cifar10_archive(tmp_path: Path) -> None:
    if not SHARED_CIFAR.is_file():
        pytest.skip(f"{SHARED_CIFAR} not present")
    out = prepare_cifar10(SHARED_CIFAR, tmp_path / "cifar10")  # verified by the SHA256SUMS next to it, if any
    train = build_dataset({"name": "cifar10", "root": out}, "train")
    val = build_dataset({"name": "cifar10", "root": out}, "val")
    assert (len(train), len(val), train.num_classes) == (50000, 10000, 10)
    img, label = val[0]
    assert img.shape == (3, 32, 32) and label == 0

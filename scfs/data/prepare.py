"""Prepare datasets from local archives: verify checksum, extract safely, check the layout.

    python -m scfs.data.prepare cifar10 --archive ../shared/data/cifar10-jpeg.tar.xz --out data/cifar10
    python -m scfs.data.prepare imagenet-samples --archive ../shared/data/imagenet-samples-100.tar.xz \
        --out data/imagenet-samples
    python -m scfs.data.prepare extract --archive my-images.tar.gz --out data/my-images   # alias: folder
    python -m scfs.data.prepare repeat --photos data/imagenet-samples --out data/imagenet-e2e --repeat 100

Why this way: archives are untrusted input, so members are passed through tarfile's ``data`` filter (no
absolute paths, no ``..``, no links leaving the output, no devices) and extraction goes to a temp dir that is
renamed into place only when complete, so an interrupted or refused run leaves no half-extracted dataset.
A single top-level folder in the archive (``cifar10/``) is stripped, so ``--out DIR`` gets ``DIR/train/...``.
``repeat`` makes an ImageFolder tree of hard links to a few photos, each repeated, so that an epoch of a real
training run decodes thousands of real JPEGs from a 100-photo sample (``scfs.bench.e2e``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

Log = Callable[[str], None]
SUMS_NAME = "SHA256SUMS"
SPLIT_NAMES = ("train", "val", "test")


class PrepareError(RuntimeError):
    """Refused or failed preparation; the message is meant for the user as is."""


def sha256_of(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_sums(sums: str | os.PathLike, name: str) -> str | None:
    """Checksum listed for file ``name`` in a ``sha256sum``-style file (``<hex>  <name>``), or None."""
    for line in Path(sums).read_text().splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and Path(parts[1].lstrip("*")).name == name:
            return parts[0].lower()
    return None


def verify_archive(archive: Path, sha256: str | None, sums: str | os.PathLike | None,
                   log: Log = print) -> None:
    """Check the archive against ``sha256`` or its entry in ``sums``. Without either, a SHA256SUMS next to the
    archive is used when it lists the archive; otherwise the archive is used unverified (said so)."""
    source = "--sha256"
    if sha256 is None and sums is not None:
        if not Path(sums).is_file():
            raise PrepareError(f"checksum file {sums} not found")
        sha256, source = read_sums(sums, archive.name), str(sums)
        if sha256 is None:
            raise PrepareError(f"{sums} has no entry for {archive.name}")
    elif sha256 is None and (archive.parent / SUMS_NAME).is_file():
        sha256, source = read_sums(archive.parent / SUMS_NAME, archive.name), str(archive.parent / SUMS_NAME)
    if sha256 is None:
        log(f"no checksum given for {archive} (use --sha256 or --sums): not verified")
        return
    actual = sha256_of(archive)
    if actual != sha256.strip().lower():
        raise PrepareError(f"SHA256 mismatch for {archive}: expected {sha256.strip().lower()} "
                           f"(from {source}), got {actual}; refusing to extract")
    log(f"verified SHA256 of {archive.name} ({actual[:16]}...) against {source}")


def _safe_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, plus refusing absolute member names (``data`` would silently strip the
    leading '/'; a dataset archive with absolute names is malformed or hostile either way)."""
    if member.name.startswith(("/", os.sep)) or os.path.isabs(member.name):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, dest)


def _content_root(tmp: Path, strip: bool) -> Path:
    """Folder whose contents become the output: the single top-level folder of the archive, when stripping."""
    entries = list(tmp.iterdir())
    if strip and len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() \
            and entries[0].name not in SPLIT_NAMES:
        return entries[0]
    return tmp


def _summary(folder: Path) -> str:
    n_files = n_bytes = 0
    for dirpath, _, files in os.walk(folder):
        n_files += len(files)
        n_bytes += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return f"{n_files} files, {n_bytes / 1e6:.1f} MB"


def imagefolder_layout(folder: Path, splits: Sequence[str]) -> dict[str, tuple[int, int]]:
    """{split: (n_classes, n_files)} for an ImageFolder tree; PrepareError if a split is missing or empty."""
    out = {}
    for split in splits:
        d = folder / split
        if not d.is_dir():
            found = sorted(p.name for p in folder.iterdir())[:10]
            raise PrepareError(f"archive layout not understood: no {split}/ folder (top level holds {found})")
        classes = [c for c in d.iterdir() if c.is_dir()]
        n = sum(1 for c in classes for f in c.iterdir() if f.is_file())
        if not classes or n == 0:
            raise PrepareError(f"archive layout not understood: {split}/ has no <class>/<image> files")
        out[split] = (len(classes), n)
    return out


def extract_archive(archive: str | os.PathLike, out: str | os.PathLike, *, sha256: str | None = None,
                    sums: str | os.PathLike | None = None, strip: bool = True, force: bool = False,
                    check: Callable[[Path], str] | None = None, log: Log = print) -> Path:
    """Verify, extract safely into a temp dir next to ``out``, optionally check the layout, rename to ``out``.

    ``check(folder)`` may raise PrepareError (nothing is then written) or return a line to print.
    An existing non-empty ``out`` is kept as is unless ``force``.
    """
    archive, out = Path(archive), Path(out).absolute()
    if not archive.is_file():
        raise PrepareError(f"archive {archive} not found")
    if out.exists() and not out.is_dir():
        raise PrepareError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        log(f"{out} already exists; nothing done (use --force to replace it)")
        return out
    verify_archive(archive, sha256, sums, log)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    old = None
    try:
        try:
            with tarfile.open(archive, errorlevel=1) as tar:
                tar.extractall(tmp, filter=_safe_filter)
                n_members = len(tar.getmembers())
        except tarfile.FilterError as e:
            raise PrepareError(
                f"refusing to extract {archive}: unsafe member: {e}; nothing was written to {out}") from e
        except (tarfile.ReadError, tarfile.CompressionError, EOFError) as e:
            raise PrepareError(f"cannot read archive {archive}: {e}") from e
        content = _content_root(tmp, strip)
        note = check(content) if check is not None else None
        if content == tmp:
            tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.is_dir() and any(out.iterdir()):  # force: keep the old tree until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "tree")
        elif out.is_dir():
            out.rmdir()
        os.rename(content, out)
    except BaseException:
        if old is not None and not out.exists():
            os.rename(old / "tree", out)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    stripped = f" (stripped top folder {content.name}/)" if content != tmp else ""
    log(f"extracted {n_members} member(s) of {archive.name} into {out}{stripped}: {_summary(out)} "
        f"in {time.perf_counter() - t0:.1f}s")
    if note:
        log(note)
    return out


def _check_splits(*splits: str) -> Callable[[Path], str]:
    def check(folder: Path) -> str:
        layout = imagefolder_layout(folder, splits)
        return "layout: " + ", ".join(f"{s}/ {n} images in {c} classes" for s, (c, n) in layout.items())
    return check


def prepare_cifar10(archive: str | os.PathLike, out: str | os.PathLike, **kw) -> Path:
    """CIFAR-10 as JPEG ImageFolder tree (archive ``cifar10/{train,test}/<class>/*.jpg``) ->
    ``out/{train,test}``, readable by ``build_dataset({'name': 'cifar10', 'root': out}, ...)``."""
    return extract_archive(archive, out, check=_check_splits("train", "test"), **kw)


PHOTO_EXT = (".jpg", ".jpeg", ".png")
REPEAT_MARK = ".scfs-repeat.json"


def _link(src: Path, dst: Path) -> None:
    """A hard link (no extra disk, the page cache shared by all repeats, as the files of one photo would be on a
    real dataset's disk only once per repeat); a copy where the two folders are on different file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def repeat_photos(photos: str | os.PathLike, out: str | os.PathLike, repeat: int = 100, classes: int = 10,
                  val_per_class: int = 2, log: Log = print) -> dict[str, int]:
    """``out/train/cNN/rRRR-<photo>``: every photo of ``photos`` linked ``repeat`` times, photo i in class
    i % ``classes``; ``out/val/cNN/<photo>``: the first ``val_per_class`` photos of each class, once (the kNN of
    the run's end reads val/). Returns {"photos", "train", "val", "classes"}.

    Idempotent: a tree this function made with the same inputs is kept as is (its marker file says so); one made
    with other inputs is rebuilt; a non-empty folder it did not make is refused, never written into."""
    photos, out = Path(photos), Path(out)
    if repeat < 1 or classes < 1 or val_per_class < 0:
        raise PrepareError(f"repeat={repeat}, classes={classes}, val_per_class={val_per_class}: repeat and classes "
                           "must be >= 1, val_per_class >= 0")
    if not photos.is_dir():
        raise PrepareError(f"photos folder {photos} not found: make it with `python -m scfs.data.prepare "
                           "imagenet-samples --archive .gpudata/imagenet-samples-100.tar.xz --out "
                           f"{photos}`")
    files = sorted(p for p in photos.rglob("*") if p.is_file() and p.suffix.lower() in PHOTO_EXT)
    if not files:
        raise PrepareError(f"no images (*.jpg, *.jpeg, *.png) under {photos}: pass the folder made by "
                           "`python -m scfs.data.prepare imagenet-samples`")
    spec = {"photos": str(photos.resolve()), "files": [f.relative_to(photos).as_posix() for f in files],
            "repeat": repeat, "classes": classes, "val_per_class": val_per_class}
    mark = out / REPEAT_MARK
    if out.is_dir() and any(out.iterdir()):
        if not mark.is_file():
            raise PrepareError(f"{out} exists and was not made by `prepare repeat` (no {REPEAT_MARK}): pass a new "
                               "or empty --out")
        done = json.loads(mark.read_text())
        if done.get("spec") == spec:
            log(f"{out} already holds {done['counts']['train']} train and {done['counts']['val']} val links to "
                f"{len(files)} photos: nothing done")
            return done["counts"]
        mark.unlink()
        for split in ("train", "val"):
            shutil.rmtree(out / split, ignore_errors=True)
    counts = {"photos": len(files), "train": 0, "val": 0, "classes": min(classes, len(files))}
    seen = [0] * classes
    for i, f in enumerate(files):
        c = i % classes
        name = f"{i:04d}-{f.name}"  # photos of one name in two subfolders stay apart
        d = out / "train" / f"c{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for r in range(repeat):
            _link(f, d / f"r{r:03d}-{name}")
            counts["train"] += 1
        if seen[c] < val_per_class:
            (out / "val" / f"c{c:02d}").mkdir(parents=True, exist_ok=True)
            _link(f, out / "val" / f"c{c:02d}" / name)
            counts["val"] += 1
            seen[c] += 1
    mark.write_text(json.dumps({"spec": spec, "counts": counts}, indent=1))
    log(f"{out}: {counts['train']} train images ({len(files)} photos x {repeat}) and {counts['val']} val images in "
        f"{counts['classes']} classes, hard links to {photos}")
    return counts


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scfs.data.prepare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    helps = {
        "cifar10": "CIFAR-10 JPEG archive -> OUT/{train,test}/<class>/*.jpg (layout checked)",
        "imagenet-samples": "folder of sample photos -> OUT/*.jpg",
        "extract": "any tar archive, extracted safely (single top folder stripped)",
    }
    for name, text in helps.items():
        s = sub.add_parser(name, help=text, aliases=["folder"] if name == "extract" else [])
        s.add_argument("--archive", required=True, type=Path, help="tar / tar.gz / tar.xz / tar.bz2 file")
        s.add_argument("--out", required=True, type=Path, help="output folder (created atomically)")
        s.add_argument("--sha256", help="expected SHA256 of the archive (hex)")
        s.add_argument("--sums", type=Path,
                       help=f"sha256sum-style file listing the archive (default: {SUMS_NAME} next to it)")
        s.add_argument("--force", action="store_true", help="replace an existing output folder")
        s.add_argument("--no-strip", dest="strip", action="store_false",
                       help="keep a single top-level folder of the archive")
    r = sub.add_parser("repeat", help="folder of photos -> OUT/{train,val}/<class>/ hard links, each photo repeated")
    r.add_argument("--photos", required=True, type=Path, help="folder of photos (e.g. data/imagenet-samples)")
    r.add_argument("--out", required=True, type=Path, help="output ImageFolder tree (e.g. data/imagenet-e2e)")
    r.add_argument("--repeat", type=int, default=100, help="links per photo in train/ (default 100)")
    r.add_argument("--classes", type=int, default=10, help="class folders (default 10)")
    r.add_argument("--val-per-class", type=int, default=2, help="photos per class linked once into val/")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "repeat":
        try:
            repeat_photos(args.photos, args.out, args.repeat, args.classes, args.val_per_class)
        except PrepareError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    kw = {"sha256": args.sha256, "sums": args.sums, "strip": args.strip, "force": args.force}
    try:
        if args.command == "cifar10":
            prepare_cifar10(args.archive, args.out, **kw)
        else:
            extract_archive(args.archive, args.out, **kw)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

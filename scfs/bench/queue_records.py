"""`python -m scfs.bench.queue_records QUEUE`: a GPU queue's results filed as the repository's records.

A GPU window runs its jobs through `scripts/gpu_queue.sh`, each benchmark writing into its job's folder
(`--out "$JOB_OUT"`), and brings back one archive, `queue.tgz` (`jobs/<job>/`, `logs/<job>.log`, `queue.log`).
Filing those results by hand (a name per record, the command rewritten to where the record lives, the markdown made
again, the logs folder beside it) invites a misnamed record, or one whose command names a folder of the device
machine. This files them the one way every record is named (`scfs.bench.records.record_stem`):

* the compile benchmark's `compile-<date>.json` -> `compile-<gpu>-<date>-<job>-<commit>.{json,md}`, its command's
  `--out` rewritten to that stem;
* the end-to-end benchmark's `<recipe>-e2e-<gpu>-<date>-<commit>.json` ->
  `<recipe>-e2e-<gpu>-<date>-<job>-<commit>.{json,md}` and its `-logs/` folder, the command's `--out` rewritten
  to the records' folder;
* the step benchmark's `step-<gpu>-<date>.json` -> `step-<gpu>-<date>-<job>-<commit>.{json,md}`, the command's
  `--out` rewritten to the records' folder;
* the checkpoint-write benchmark's `checkpoint-writes-<gpu>-<date>-<commit>.json` ->
  `checkpoint-writes-<gpu>-<date>-<job>-<commit>.{json,md}`, the command's `--out` rewritten to the records' folder;
* the GPU smoke's `gpu-smoke.md` -> `gpu-smoke-<date>-<commit>.md` (date and commit from its own header).

Each record's markdown is made again by its benchmark's own `markdown` from the JSON, so a record filed here reads
as one its benchmark wrote in place. A job that ended with a non-zero status, or never ran (`queue.log`), is said
so in the report; a file no importer knows is listed, not guessed at. Nothing is overwritten unless `--force`.

Usage:
    python -m scfs.bench.queue_records queue.tgz [--out benchmarks/results] [--dry-run] [--force]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scfs.bench.records import record_stem, save_record


class QueueRecordsError(RuntimeError):
    """Bad input (no queue there, a record that is not what its name says), said in one line."""


@dataclass
class Filed:
    """What filing one queue did: records written (or that would be, with `--dry-run`), files left, job states."""

    written: list[Path] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)


OUT_FLAG = re.compile(r"--out(?:=|\s+)(\"[^\"]*\"|'[^']*'|\S+)")
SMOKE_TITLE = re.compile(r"^# GPU smoke, (\d{4}-\d{2}-\d{2})")
SMOKE_COMMIT = re.compile(r"^Commit `([^`]+)`", re.M)


def with_out(command: str, out: str) -> str:
    """`command` with its `--out` argument replaced by `out` (appended when it has none)."""
    if OUT_FLAG.search(command):
        return OUT_FLAG.sub(lambda _: f"--out {out}", command, count=1)
    return f"{command} --out {out}"


def job_states(queue_log: str) -> dict[str, str]:
    """{job: "exit 0" | "exit N" | "started, no end" | "left"} from the queue's own log (`scripts/gpu_queue.sh`)."""
    states: dict[str, str] = {}
    for line in queue_log.splitlines():
        if m := re.search(r"\] \+\d+ s start (\S+)", line):
            states[m.group(1)] = "started, no end"
        elif m := re.search(r"\] \+\d+ s (\S+) ended, exit status (\d+)", line):
            states[m.group(1)] = f"exit {m.group(2)}"
        elif m := re.search(r"\] left (\S+) for the next window", line):
            states[m.group(1)] = "left"
    return states


def _write(path: Path, write: Callable[[], None], filed: Filed, dry_run: bool, force: bool) -> None:
    if path.exists() and not force:
        raise QueueRecordsError(f"{path} exists already; pass --force to replace it, or file into another --out")
    if not dry_run:
        write()
    filed.written.append(path)


def job_stem(out: Path, kind: str, device: str, date: str, job: str, commit: str | None) -> Path:
    """`<out>/<kind>-<gpu>-<date>-<job>[-<commit>]`: `record_stem`'s name with the job before the commit, as the
    records of queue jobs have been named by hand."""
    return record_stem(out, kind, device, date, None, f"-{job}" + (f"-{commit}" if commit else ""))


def write_record(d: dict, stem: Path, markdown: Callable[[dict], str], filed: Filed, dry_run: bool,
                 force: bool) -> None:
    """`<stem>.json` and `<stem>.md` (`save_record`), neither replacing a file unless `force`."""
    for path in (stem.with_suffix(".json"), stem.with_suffix(".md")):
        if path.exists() and not force:
            raise QueueRecordsError(f"{path} exists already; pass --force to replace it, or file into another "
                                    "--out")
    if not dry_run:
        save_record(d, stem, markdown)
    filed.written += [stem.with_suffix(".json"), stem.with_suffix(".md")]


def file_compile(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool) -> None:
    from scfs.bench import compile as bench

    d = json.loads(src.read_text())
    if "rows" not in d or "machine" not in d:
        raise QueueRecordsError(f"{src}: not a compile benchmark record (no rows or machine); file it by hand")
    stem = job_stem(out, "compile", d["machine"], d["date"], job, d.get("commit"))
    d["command"] = with_out(str(d.get("command", "")), str(stem))
    write_record(d, stem, bench.markdown, filed, dry_run, force)


def file_meta_record(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool, what: str,
                     kind: Callable[[dict], str], markdown: Callable[[dict], str]) -> Path:
    """A record whose provenance sits under `meta` (gpu, date, commit, command), as the end-to-end and step
    benchmarks write it: filed under `job_stem` with its command's `--out` rewritten to `out`. Returns the stem."""
    d = json.loads(src.read_text())
    meta = d.get("meta") or {}
    if "rows" not in d or "gpu" not in meta or "date" not in meta:
        raise QueueRecordsError(f"{src}: not {what} record (no rows or meta.gpu/date); file it by hand")
    stem = job_stem(out, kind(meta), meta["gpu"], meta["date"], job, meta.get("commit"))
    meta["command"] = with_out(str(meta.get("command", "")), str(out))
    write_record(d, stem, markdown, filed, dry_run, force)
    return stem


def file_e2e(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool) -> None:
    from scfs.bench import e2e as bench

    stem = file_meta_record(src, job, out, filed, dry_run, force, "an end-to-end benchmark",
                            lambda meta: f"{meta.get('recipe', 'imagenet')}-e2e", bench.markdown)
    logs = src.with_name(src.stem + "-logs")
    if logs.is_dir():
        dest = stem.with_name(stem.name + "-logs")
        _write(dest, lambda: (shutil.rmtree(dest, ignore_errors=True), shutil.copytree(logs, dest)), filed,
               dry_run, force)


def file_step(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool) -> None:
    from scfs.bench import step as bench

    file_meta_record(src, job, out, filed, dry_run, force, "a step benchmark", lambda meta: "step", bench.markdown)


def file_checkpoint_writes(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool) -> None:
    from scfs.bench import checkpoint_writes as bench

    file_meta_record(src, job, out, filed, dry_run, force, "a checkpoint-write benchmark",
                     lambda meta: "checkpoint-writes", bench.markdown)


def file_smoke(src: Path, job: str, out: Path, filed: Filed, dry_run: bool, force: bool) -> None:
    text = src.read_text()
    title, commit = SMOKE_TITLE.search(text.splitlines()[0] if text else ""), SMOKE_COMMIT.search(text)
    if title is None or commit is None:
        raise QueueRecordsError(f"{src}: no '# GPU smoke, <date>' title or 'Commit `<sha>`' line; file it by hand")
    dest = out / f"gpu-smoke-{title.group(1)}-{commit.group(1)}.md"
    _write(dest, lambda: (dest.parent.mkdir(parents=True, exist_ok=True), dest.write_text(text)), filed, dry_run,
           force)


IMPORTERS: list[tuple[re.Pattern[str], Callable[..., None]]] = [
    (re.compile(r"^compile-\d{4}-\d{2}-\d{2}\.json$"), file_compile),
    (re.compile(r"^[a-z0-9]+-e2e-.+\.json$"), file_e2e),
    (re.compile(r"^step-[a-z0-9]+-\d{4}-\d{2}-\d{2}\.json$"), file_step),
    (re.compile(r"^checkpoint-writes-.+\.json$"), file_checkpoint_writes),
    (re.compile(r"^gpu-smoke\.md$"), file_smoke),
]


def importer_of(src: Path) -> Callable[..., None] | None:
    """The importer whose file name pattern `src` matches, or None."""
    return next((f for pat, f in IMPORTERS if pat.match(src.name)), None)


def file_queue(queue: Path, out: Path, dry_run: bool = False, force: bool = False) -> Filed:
    """File every record of the queue folder `queue` (an extracted `queue.tgz`) into `out`."""
    jobs = queue / "jobs"
    if not jobs.is_dir():
        raise QueueRecordsError(f"{queue} has no jobs/ folder: pass the queue.tgz a GPU window brought back "
                                "(scripts/gpu_queue.sh watch/collect), or the folder it was extracted to")
    filed = Filed()
    log = queue / "queue.log"
    filed.jobs = job_states(log.read_text(errors="replace")) if log.is_file() else {}
    for job_dir in sorted(p for p in jobs.iterdir() if p.is_dir()):
        importers = {src: importer_of(src) for src in sorted(p for p in job_dir.iterdir() if p.is_file())}
        for src, importer in importers.items():
            if importer is not None:
                importer(src, job_dir.name, out, filed, dry_run, force)
            elif src.suffix == ".json" or (src.suffix == ".md" and not importers.get(src.with_suffix(".json"))):
                # a benchmark's own markdown beside its imported JSON is made again from that JSON, not left
                filed.left.append(f"{job_dir.name}/{src.name}")
    return filed


def open_queue(path: Path, tmp: Path) -> Path:
    """The queue folder: `path` itself, or `queue.tgz` extracted into `tmp`."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise QueueRecordsError(f"{path} does not exist: pass the queue.tgz a GPU window brought back, or its folder")
    try:
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
    except tarfile.TarError as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise QueueRecordsError(f"{path} is not a readable tar archive ({why}); pass the queue.tgz as it came "
                                "back") from err
    return tmp


def report(filed: Filed, dry_run: bool) -> str:
    lines = [("would write" if dry_run else "wrote") + f" {len(filed.written)} file(s):"]
    lines += [f"  {p}" for p in filed.written]
    bad = {j: s for j, s in filed.jobs.items() if s != "exit 0"}
    if bad:
        lines.append("jobs that did not end cleanly: " + ", ".join(f"{j} ({s})" for j, s in bad.items()))
    if filed.left:
        lines.append("left (no importer; file by hand if it is a record): " + ", ".join(filed.left))
    lines.append("next: python -m scfs.bench.targets --out benchmarks/results/speed-targets-<date>")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scfs.bench.queue_records", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("queue", type=Path, help="queue.tgz from a GPU window, or the folder it was extracted to")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="the records' folder")
    p.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    p.add_argument("--force", action="store_true", help="replace records that exist already")
    args = p.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="scfs-queue-") as tmp:
            filed = file_queue(open_queue(args.queue, Path(tmp)), args.out, args.dry_run, args.force)
    except QueueRecordsError as err:
        print(f"scfs.bench.queue_records: error: {err}", file=sys.stderr)
        return 2
    print(report(filed, args.dry_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())

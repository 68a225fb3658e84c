"""Benchmark records: `<stem>.json` (everything measured) beside `<stem>.md` (the table), one write per row; the
benchmarks' subprocesses, each with its output in a log the record keeps; and the phrases in which the compile and
end-to-end records read back what a run's compile helpers said in their status files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def save_record(result: dict, stem: Path, markdown: Callable[[dict], str]) -> str:
    """Write <stem>.json and <stem>.md; called after every row, so a run cut short still leaves its numbers."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    stem.with_suffix(".md").write_text(md)
    return md


def source_commit() -> str | None:
    """The commit a record measured: `COMMIT` from the environment (a device machine's copy of the tree may lack
    .git), else git's short HEAD, `-dirty` when tracked files differ from it (code that no commit holds)."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True, timeout=30).returncode == 1
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip() if out.returncode == 0 else ""
    return (sha + ("-dirty" if dirty else "")) or None


def provenance(commit: str | None, command: str | None) -> str:
    """The sentence every record's markdown opens with: the commit it measured and the command that made it."""
    return f"Commit `{commit or 'unknown'}`; `{command or ''}`."


def device_slug(name: str) -> str:
    """A GPU's name as it appears in record file names ("NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" ->
    "h100"): lower case, without the vendor, the memory's size and kind, and every character a file name could
    trip on, so the records of one GPU sort together whichever benchmark wrote them and under the name the
    hand-named records use; "gpu" when nothing is left."""
    name = re.sub(r"\b\d+\s*gb\b|\bhbm\d*e?\b", "", name.lower().replace("nvidia", ""))
    return re.sub(r"[^a-z0-9]+", "", name) or "gpu"


def record_stem(out: Path, kind: str, device: str, date: str, commit: str | None, tag: str = "") -> Path:
    """`<out>/<kind>-<device slug>-<date>[-<commit>][<tag>]`: every benchmark names its records alike, so one
    GPU's records of one day sort together and each names the code it measured."""
    return out / (f"{kind}-{device_slug(device)}-{date}" + (f"-{commit}" if commit else "") + tag)


def run_logged(cmd: list[str], log: Path, timeout: float | None, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> tuple[int, float]:
    """Run `cmd` (in `cwd`) with its output in `log`; (return code, wall seconds); 124 when it ran past `timeout`."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=cwd,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - t0


def why_it_failed(log: Path) -> str:
    """The line of a failed command's log that says why (`scfs.errors.failure_line`: a failing scfs CLI's
    one-line error, else the traceback's exception)."""
    from scfs.errors import failure_line

    return (failure_line(log.read_text(errors="replace"), limit=300) if log.is_file() else "") or "no output"


def local_backward_phrase(side: dict[str, Any]) -> str:
    """What the local views' helper's status says of its graph's backward run (`_compile_local_graphs`): whether it
    ran, and the seconds to the forward and from it to the graph's entry written (the wait for the local
    backward's entry and that run), where the status has them."""
    ran = side.get("local_backward_run")
    if ran is None:
        return ""
    text = (", the local views' backward run once for AOTAutograd's entry" if ran
            else ", the local views' backward not run (its entry not written before the run asked, or within the wait)")
    if side.get("local_forward_s") is not None and side.get("local_s") is not None:
        text += (f" (the forward compiled and run in {side['local_forward_s']} s, the graph written "
                 f"{round(side['local_s'] - side['local_forward_s'], 1)} s after it)")
    return text


def startup_phrase(early: dict[str, Any]) -> str:
    """`: the interpreter started at 0.4 s, torch imported at 3.0 s, Lightning imported at 4.1 s, imports done at 6.1 s,
    CUDA started at 7.5 s, model built at 9.0 s, on the device at 14.2 s, views made at 15.1 s` from a helper's
    `early` status (`scfs.training.compile_child.compile_in_child`; empty for a status from before it said so)."""
    parts = [f"{label} at {early[key]} s" for key, label in (("entry_s", "the interpreter started"),
                                                           ("torch_s", "torch imported"),
                                                           ("lightning_s", "Lightning imported"),
                                                           ("imported_s", "imports done"),
                                                           ("cuda_s", "CUDA started"),
                                                           ("built_s", "model built"),
                                                           ("on_device_s", "on the device"),
                                                           ("views_s", "views made"))
             if early.get(key) is not None]
    return f": {', '.join(parts)}" if parts else ""

"""Benchmark records: `<stem>.json` (everything measured) beside `<stem>.md` (the table), one write per row."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def save_record(result: dict, stem: Path, markdown: Callable[[dict], str]) -> str:
    """Write <stem>.json and <stem>.md; called after every row, so a run cut short still leaves its numbers."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    stem.with_suffix(".md").write_text(md)
    return md

"""The error a user sees as one line.

`ReportedError` marks exceptions whose message is complete for the user (what happened, what was kept, what to
do next): the CLIs print it as one line without a traceback (`scfs.cli`). `failure_line` finds that line (or the
exception's) in a failed process's output, for whoever launched it. A leaf module, so any package can raise one
without importing the CLI.
"""

import re

# `<prog>: error: ...` / `<prog>: config error: ...`, the one line an scfs CLI ends with when it fails
_CLI_ERROR = re.compile(r"^[\w.]+: (config )?error: ")
# the last line of a Python traceback: `ValueError: ...`, `torch.AcceleratorError: CUDA error: out of memory`
_EXCEPTION = re.compile(r"^([A-Za-z_][\w]*\.)*[A-Z]\w*(Error|Exception|Interrupt|Exit)\b(: |$)")
# a progress bar's frame (`Epoch 0:   0%|...| 0/4 [00:05<?, ?it/s]`) says where it stopped, not why
_PROGRESS = re.compile(r"\d+/\d+ \[[\d:<?]+")


class ReportedError(Exception):
    """Mixed into an error class (first base) whose message names the problem and the fix."""


def failure_line(text: str, limit: int = 500) -> str:
    """The line of a failed process's output that says why: its CLI's one-line error, else the last exception line
    of a traceback, else its last line that is not a progress bar. A process can print after the line that matters
    (CUDA's advice after its error, a progress bar's last frame), so the last line alone often says nothing."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in (_CLI_ERROR, _EXCEPTION):
        hit = next((ln for ln in reversed(lines) if pattern.match(ln)), None)
        if hit:
            return hit[:limit]
    quiet = [ln for ln in lines if not _PROGRESS.search(ln)]
    return (quiet or lines or [""])[-1][:limit]

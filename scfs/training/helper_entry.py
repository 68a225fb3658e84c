"""A compile helper's process entry (`python -m scfs.training.helper_entry`, the command line `helper_command`
makes): it notes where the helper's start-up goes before it runs `scfs.training.compile_child.main`.

A helper started before the run's set-up has to import torch and Lightning and build the model before it can
compile, and on a GPU host that start-up has taken 15-16 s against the 5-6 s of the run's own set-up, so the
backward's helper reaches its compile late and the run's first backward waits for it. The marks say which part to
shorten: seconds since the run spawned the process (`since_spawn`) when this module is reached (the interpreter's
start and the import-light `compile_helpers`), after torch's import, after Lightning's, and after the rest of the
helper's modules. `compile_in_child` adds them to an early helper's status (`early`), and the run's report and the
compile benchmark print them (`scfs.bench.records.startup_phrase`).
"""

from __future__ import annotations

import sys

from scfs.training.compile_helpers import STARTUP_MARKS, since_spawn


def main(argv: list[str] | None = None) -> int:
    STARTUP_MARKS["entry_s"] = since_spawn()
    import torch  # noqa: F401  - imported here to time it

    STARTUP_MARKS["torch_s"] = since_spawn()
    import lightning  # noqa: F401

    STARTUP_MARKS["lightning_s"] = since_spawn()
    from scfs.training import compile_child

    return compile_child.main(argv)


if __name__ == "__main__":
    sys.exit(main())

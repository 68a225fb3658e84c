"""Run a notebook's code cells in order in one plain Python process (no Jupyter kernel).

For machines without Jupyter (the GPU image): IPython magics (`%...`, `!...`) are dropped and, where IPython is not
installed, `IPython.display.display` / `Markdown` print a one-line description instead of rendering. A failing
cell stops the run with its index and the exception. CI runs the notebooks through nbclient instead
(tests/test_notebooks.py); this is only the GPU smoke's way in.

    python scripts/run_notebook_cells.py notebooks/02_searched_regions.ipynb
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path


def _stub_ipython() -> None:
    if importlib.util.find_spec("IPython") is not None:
        return
    display = types.ModuleType("IPython.display")
    display.display = lambda *objs, **_: print(*(f"[display {type(o).__name__}]" for o in objs))  # type: ignore
    display.Markdown = lambda text: text  # type: ignore[attr-defined]
    ipython = types.ModuleType("IPython")
    ipython.display = display  # type: ignore[attr-defined]
    ipython.get_ipython = lambda: None  # type: ignore[attr-defined]
    ipython.version_info = (8, 24, 0, "")  # matplotlib reads it; >= 8.24 asks nothing more of IPython
    sys.modules.update({"IPython": ipython, "IPython.display": display})


def code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        cells.append("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
    return cells


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    _stub_ipython()
    import matplotlib

    matplotlib.use("Agg")
    namespace: dict = {"__name__": "__main__"}
    for i, src in enumerate(code_cells(path)):
        t = time.time()
        try:
            exec(compile(src, f"{path.name}[cell {i}]", "exec"), namespace)
        except Exception as err:
            print(f"{path.name}: code cell {i} failed: {type(err).__name__}: {err}", file=sys.stderr)
            raise
        print(f"[cell {i}: {time.time() - t:.1f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

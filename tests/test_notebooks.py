"""Every notebook runs top to bottom (tiny settings, SCFS_NB_SMALL=1) and is committed without outputs.

The notebooks execute in order in one session and share a runs folder in tmp, so notebooks 2 and 3 reuse the
training runs of notebook 1, as they do for a user. Kernel: the project's `scfs` kernelspec (CI registers it with
`python -m ipykernel install --prefix "$VIRTUAL_ENV" --name scfs`), else `python3`; without either the
execution tests skip and say why.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_searched_regions", "03_linear_eval_report", "04_search_kernel_benchmarks"]
# key figures each notebook must leave in its run folder (relative to <runs>/<notebook>/)
FIGURES = {
    "01_quickstart": ["summary.png", "summary.md"],
    "02_searched_regions": ["searched_regions_scfs.png", "searched_regions_dino.png", "search_modes_scfs.png",
                            "precision/precision.png", "precision/precision.json", "explore_static.png",
                            "attention_vit.png"],
    "03_linear_eval_report": ["accuracy_vs_k.png", "per_class_knn.png", "report.md"],
    "04_search_kernel_benchmarks": [],
}
LITTER = ("wandb", "outputs", "lightning_logs", "multirun", "runs/notebooks")


def find_kernel() -> str | None:
    """The kernelspec to run notebooks with: `scfs`, else `python3`, else None."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return None
    specs = KernelSpecManager().find_kernel_specs()
    return next((name for name in ("scfs", "python3") if name in specs), None)


def test_all_notebooks_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
    assert "widgets" not in nb.metadata, f"{path.name} carries widget state"
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert params and "SCFS_NB_SMALL" in params[0].source, f"{path.name}: no parameters cell with SCFS_NB_SMALL"


@pytest.fixture(scope="module")
def nb_env(tmp_path_factory):
    """Shared runs folder and environment for the notebook kernels; also checks nothing litters the repo."""
    kernel = find_kernel()
    if kernel is None:
        pytest.skip("no Jupyter kernel found: register one with "
                    "`python -m ipykernel install --prefix \"$VIRTUAL_ENV\" --name scfs`")
    pytest.importorskip("nbclient")
    before = {p for p in LITTER if (REPO / p).exists()}
    runs = tmp_path_factory.mktemp("nb-runs")
    # SCFS_NB_STATIC: the ipywidgets explorer renders its static grid here. Executing an `interact` cell headless
    # through nbclient can block forever (jupyter/nbclient#312); the interactive path is not exercised in CI.
    env = {"SCFS_NB_SMALL": "1", "SCFS_NB_STATIC": "1", "SCFS_NB_RUNS": str(runs), "WANDB_MODE": "offline",
           "WANDB_SILENT": "true",
           "HF_HUB_OFFLINE": "1",
           # a kernelspec whose argv says plain `python` must find this interpreter, not another one on PATH
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield kernel, runs
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    created = {p for p in LITTER if (REPO / p).exists()} - before
    assert not created, f"the notebooks wrote {sorted(created)} into the repository"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, nb_env, tmp_path):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    kernel, runs = nb_env
    nb = nbformat.read(path, as_version=4)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    client = NotebookClient(nb, kernel_name=kernel, timeout=300, allow_errors=False,
                            resources={"metadata": {"path": str(cwd)}})
    t0 = time.time()
    try:
        client.execute()
    except CellExecutionError as err:
        pytest.fail(f"{path.name} failed (kernel {kernel}):\n{err}", pytrace=False)
    print(f"{path.stem}: {time.time() - t0:.1f}s with kernel {kernel}")
    out = runs / path.stem
    missing = [f for f in FIGURES[path.stem] if not (out / f).is_file()]
    assert not missing, f"{path.name} did not write {missing} into {out}"
    if path.stem == "04_search_kernel_benchmarks" and list((REPO / "benchmarks" / "results").glob("*.json")):
        assert list(out.glob("*.png")) and (out / "bench.md").is_file()
    assert list(cwd.iterdir()) == [], f"{path.name} wrote into its working directory: {list(cwd.iterdir())}"


@pytest.mark.slow
def test_notebook_02_takes_centre_from_the_environment(nb_env, tmp_path, monkeypatch):
    """`CENTRE=1` (like `CKPT=...`) makes notebook 02 search with the centred similarity: its precision report says
    so."""
    import json

    from nbclient import NotebookClient

    kernel, runs = nb_env
    monkeypatch.setenv("CENTRE", "1")
    path = REPO / "notebooks" / "02_searched_regions.ipynb"
    nb = nbformat.read(path, as_version=4)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    NotebookClient(nb, kernel_name=kernel, timeout=300, resources={"metadata": {"path": str(cwd)}}).execute()
    doc = json.loads((runs / path.stem / "precision" / "precision.json").read_text())
    assert doc["settings"]["centre"] is True

"""The compile probes (scripts/compile_probes.py): their tables from the children's results, what they say when the
backward keys match or differ, and (slow) one real backward-helper probe whose eager forward in the helper must
compute the run's loss."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compile_probes.py"


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Any:
    spec = importlib.util.spec_from_file_location("compile_probes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compile_probes", mod)
    spec.loader.exec_module(mod)
    return mod


def _args(mod: Any) -> Any:
    """The script's own defaults, as its command line parses them."""
    return mod.parse_args(["views"])


def test_views_table_has_one_row_per_mode_in_order(probes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def spawn(kind: str, mode: str, cache: str, args: Any) -> dict[str, Any]:
        seen.append((kind, cache))
        i = probes.VIEW_MODES.index(mode)
        return {"mode": mode, "forward_s": 10.0 + i, "backward_s": 5.0, "first_s": 15.0 + i,
                "steady_ms": 100.0 + i, "graphs": 1 + (mode == "static"), "loss": 0.5,
                "recompiles": ["Recompiling function one triggered by: size mismatch"] if mode == "static" else []}

    monkeypatch.setattr(probes, "_spawn", spawn)
    text = probes.views(_args(probes))
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| mode")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(probes.VIEW_MODES)
    assert "| static | 2 | 11.0 | 5.0 | 16.0 | 101.0 | 0.50000 |" in text
    assert len({cache for _, cache in seen}) == 3, "each mode must compile into its own empty cache folder"
    assert "static: a second graph was compiled: Recompiling function one triggered by: size mismatch" in text
    assert "one-graph: a second graph" not in text
    assert "commit `" in text and "local views 24x3x48x48" in text


@pytest.mark.parametrize("same", [True, False])
def test_backward_helper_names_the_first_differing_key_line(probes: Any, monkeypatch: pytest.MonkeyPatch,
                                                            same: bool) -> None:
    caches: list[str] = []

    def spawn(kind: str, role: str, cache: str, args: Any) -> dict[str, Any]:
        caches.append(cache)
        lines = ["[g1] graph: abc", "[i1] example_inputs[0]: stride=(147, 49, 7, 1)",
                 f"[d1] fx_kwargs[get_decomp_fn]: <function at 0x{id(role):x}>"]  # same hash, text apart
        if role == "run" and not same:
            lines[1] = "[i2] example_inputs[0]: stride=(147, 1, 21, 3)"
        key = "k1" if role == "helper" or same else "k2"
        return {"role": role, "forward_s": 1.0, "backward_s": 2.0, "loss": 0.25, "fxgraph_cache_hit": int(same),
                "fxgraph_cache_miss": 2 - int(same), "backward_key": [key, *lines]}

    monkeypatch.setattr(probes, "_spawn", spawn)
    text = probes.backward_helper(_args(probes))
    assert caches[0] == caches[1], "the run must use the helper's cache folder"
    assert "| helper | 1.0 | 2.0 | " in text and "| run | 1.0 | 2.0 | " in text
    if same:
        assert "has the helper's cache key" in text and "helper: " not in text
    else:
        assert "another cache key than the helper's: 1 of 3 lines of inductor's key details differ (1 of them the " \
               "graph's example inputs); the first 1:" in " ".join(text.split())
        assert "helper: [i1] example_inputs[0]: stride=(147, 49, 7, 1)" in text
        assert "run:    [i2] example_inputs[0]: stride=(147, 1, 21, 3)" in text
        assert "get_decomp_fn" not in text, "a line whose hash matches is not a difference"


def test_a_child_takes_the_probes_options_but_not_its_name_or_output(probes: Any) -> None:
    argv = ["backward-helper", "--recipe", "cifar10", "--out", "x.md", "--compile-only", "--out=y.md", "--tiny"]
    assert probes._child_options(argv) == ["--recipe", "cifar10", "--compile-only", "--tiny"]


def test_a_failing_child_stops_the_probe_with_its_error(probes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*a: Any, **k: Any) -> Any:
        return subprocess.CompletedProcess(a, 1, stdout="", stderr="Traceback: boom")

    monkeypatch.setattr(probes.subprocess, "run", run)
    with pytest.raises(SystemExit, match="the views child 'static' failed \\(exit 1\\):\n.*boom"):
        probes._spawn("views", "static", "/tmp/x", _args(probes))


def test_only_tensors_contiguous_in_both_orders_get_channels_last_strides(probes: Any) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    fix = probes._channels_last_if_ambiguous
    both = torch.zeros(1, 64, 1, 1)  # contiguous in either order: size-1 dimensions
    assert fix(both).stride() == (64, 1, 64, 64) and fix(both).shape == both.shape
    plain = torch.zeros(2, 3, 4, 5)
    assert fix(plain) is plain, "an unambiguous contiguous tensor keeps its strides"
    cl = torch.zeros(1, 8, 2, 2).contiguous(memory_format=torch.channels_last)
    assert fix(cl) is cl
    vec = torch.zeros(64)
    assert fix(vec) is vec and fix(3) == 3
    with FakeTensorMode() as mode:
        fake = torch.empty(1, 32, 1, 1)
    out = fix(fake)
    assert out.fake_mode is mode and out.stride() == (32, 1, 32, 32), "a fake input stays fake in its own mode"


@pytest.mark.slow
def test_backward_helper_probe_runs_and_the_helpers_eager_forward_matches_the_run(tmp_path: Path) -> None:
    out = tmp_path / "probe.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "backward-helper", "--arch", "resnet10t", "--size", "16",
                           "--batch", "1", "--local", "2", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {ln.split(" | ")[0][2:]: ln.split(" | ") for ln in out.read_text().splitlines()
            if ln.startswith("| helper") or ln.startswith("| run")}
    assert set(rows) == {"helper", "run"}
    helper_loss, run_loss = float(rows["helper"][-1].rstrip(" |")), float(rows["run"][-1].rstrip(" |"))
    assert abs(helper_loss - run_loss) <= 1e-4 * max(1.0, abs(run_loss))


@pytest.mark.slow
def test_a_helper_with_lowered_strides_writes_the_backward_the_run_loads(tmp_path: Path) -> None:
    """The road a second `compile_parallel` helper would take, on the project's own student call (the tiny
    default): the helper lowers its forward (no kernels), compiles the backward with the forward call and runs
    nothing; the run's backward must then be a cache hit. A torch release that changes what the backward's cache
    key holds fails here first."""
    out = tmp_path / "probe.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "backward-helper", "--recipe", "default", "--tiny",
                           "--lowered-strides", "--compile-only", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "The run's backward graph has the helper's cache key." in text, text
    run = next(ln for ln in text.splitlines() if ln.startswith("| run"))
    assert run.split(" | ")[3].startswith("1 / "), run  # the backward's entry found: one hit


@pytest.mark.slow
def test_views_probe_runs_all_three_modes_with_the_same_loss(tmp_path: Path) -> None:
    out = tmp_path / "views.md"
    done = subprocess.run([sys.executable, str(SCRIPT), "views", "--arch", "resnet10t", "--size", "32", "--batch",
                           "1", "--local", "2", "--steps", "1", "--channels-last", "--bf16", "--out", str(out)],
                          capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    rows = [ln.split(" | ") for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| mode")
            and not ln.startswith("|---")]
    assert [r[0][2:] for r in rows] == ["one-graph", "static", "dynamic"]
    losses = {float(r[-1].rstrip(" |")) for r in rows}
    assert max(losses) - min(losses) <= 2e-2 * max(1.0, max(losses)), losses  # bf16: the graphs round apart
    assert "channels_last, bf16 autocast, compile mode default, CPU" in text

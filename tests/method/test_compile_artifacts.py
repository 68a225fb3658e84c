"""`compile_artifacts`: the compiled graphs written to one file, loaded by a fresh process on an empty cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# A fresh process with its own empty inductor cache: compiles one small function (one C++ kernel on the CPU) after
# loading the artifacts file (when it exists), then writes the file; prints cache hits/misses and the result.
CHILD = r"""
import json, sys, torch
from torch._dynamo.utils import counters
from scfs.training.compile_artifacts import load_compile_artifacts, save_compile_artifacts
path = sys.argv[1]
loaded = load_compile_artifacts(path) if sys.argv[2] == "load" else None
fn = torch.compile(lambda x: (x.sin() * 2 + 1).relu(), dynamic=False)
y = fn(torch.linspace(-3, 3, 16))
size = save_compile_artifacts(path)
print(json.dumps({"loaded": loaded, "size": size, "y": y.tolist(), "hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "aot_hit": counters["aot_autograd"]["autograd_cache_hit"]}))
"""

def _child(tmp_path: Path, name: str, path: Path, load: bool) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), "load" if load else "no"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


@pytest.mark.slow
def test_artifacts_written_then_loaded_by_a_fresh_process_hit_the_cache(tmp_path):
    """Process 1 compiles on an empty cache and writes the file; process 2, on another empty cache folder (a fresh
    machine), loads it and finds every graph there (no inductor miss, AOTAutograd hit), with the same numbers. Two
    fresh processes, each compiling C++ on the CPU: 1-3 minutes on 2 shared cores."""
    art = tmp_path / "artifacts.bin"
    first = _child(tmp_path, "cache1", art, load=False)
    assert first["size"] and art.stat().st_size == first["size"] and first["miss"] >= 1 and first["hit"] == 0
    second = _child(tmp_path, "cache2", art, load=True)
    assert second["loaded"] and second["loaded"] >= 2  # inductor's graph and AOTAutograd's entry at least
    assert second["miss"] == 0 and second["hit"] >= 1 and second["aot_hit"] >= 1, second
    assert second["y"] == first["y"]


@pytest.mark.slow
def test_corrupt_artifacts_file_warns_once_and_the_run_compiles(tmp_path):
    """A damaged file: one warning line (no traceback), the process compiles as without it and overwrites the
    file with good artifacts, which a third process then loads. Two fresh processes (1-3 minutes)."""
    art = tmp_path / "artifacts.bin"
    art.write_bytes(b"not a cache" * 100)
    out = _child(tmp_path, "cache1", art, load=True)
    assert out["loaded"] is None and out["miss"] >= 1
    warnings = [ln for ln in out["stderr"].splitlines() if "compile_artifacts=" in ln]
    assert len(warnings) == 1 and "could not be loaded" in warnings[0], out["stderr"][-2000:]
    assert "Traceback" not in out["stderr"]
    third = _child(tmp_path, "cache2", art, load=True)
    assert third["loaded"] and third["miss"] == 0 and third["y"] == out["y"]


@pytest.mark.parametrize("content", [None, b"", b"\x00" * 64])
def test_missing_or_bad_file_is_one_warning_line_and_no_error(tmp_path, caplog, content):
    from scfs.training.compile_artifacts import load_compile_artifacts

    art = tmp_path / "a.bin"
    if content is not None:
        art.write_bytes(content)
    with caplog.at_level(logging.INFO):
        assert load_compile_artifacts(art) is None
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "compiling from scratch" in lines[0].getMessage()
    assert "\n" not in lines[0].getMessage() and lines[0].exc_info is None


def test_run_config_wires_load_and_save(tmp_path, monkeypatch):
    """`compile=true compile_artifacts=<file>`: the set-up loads the file into the chosen cache folder, the run's
    callbacks include the writer; without compile (or without the key) neither happens."""
    from omegaconf import OmegaConf

    import scfs.training.compile_artifacts as ca
    from scfs.training.setup import prepare_compile_cache

    seen: list[tuple[str, str | None]] = []
    monkeypatch.setattr(ca, "load_compile_artifacts",
                        lambda p: seen.append((p, os.environ.get("TORCHINDUCTOR_CACHE_DIR"))))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cfg = OmegaConf.create({"compile": True, "compile_cache": str(tmp_path / "c"),
                            "compile_artifacts": str(tmp_path / "a.bin")})
    prepare_compile_cache(cfg)
    assert seen == [(str(tmp_path / "a.bin"), str(tmp_path / "c"))]  # loaded into the folder set first
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    prepare_compile_cache(OmegaConf.merge(cfg, {"compile": False}))
    prepare_compile_cache(OmegaConf.merge(cfg, {"compile_artifacts": None}))
    assert len(seen) == 1


def test_callback_writes_only_new_artifacts_on_rank_zero(tmp_path, monkeypatch):
    import scfs.training.compile_artifacts as ca

    writes: list[str] = []
    new = [True]
    monkeypatch.setattr(ca, "has_new_artifacts", lambda: new[0])
    monkeypatch.setattr(ca, "save_compile_artifacts", lambda p: writes.append(str(p)) or 10)

    class T:
        is_global_zero = True

    cb = ca.CompileArtifacts(tmp_path / "a.bin")
    cb.on_train_batch_end(T(), None, None, None, 0)
    new[0] = False
    cb.on_train_batch_end(T(), None, None, None, 1)
    new[0] = True
    T.is_global_zero = False
    cb.on_train_epoch_end(T(), None)
    assert writes == [str(tmp_path / "a.bin")] and cb.saves == 1


def test_save_is_atomic_and_none_without_compiles(tmp_path, monkeypatch):
    import scfs.training.compile_artifacts as ca

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    assert ca.save_compile_artifacts(tmp_path / "x.bin") is None and not (tmp_path / "x.bin").exists()
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"abc", None))
    assert ca.save_compile_artifacts(tmp_path / "d" / "x.bin") == 3
    assert (tmp_path / "d" / "x.bin").read_bytes() == b"abc" and list((tmp_path / "d").iterdir()) == [
        tmp_path / "d" / "x.bin"]

"""The fused kernels' build message: shown when a compile is due, not when torch only loads its cached build."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp

from scfs.search import cuda_backend as cb


@pytest.fixture
def build_folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(cpp, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    return tmp_path / cb.EXTENSION_NAME


def _write_build(folder: Path, sources: list[Path], age_s: float = 0.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.ninja").write_text("\n".join(f"build x.o: compile {s}" for s in sources))
    lib = folder / f"{cb.EXTENSION_NAME}.so"
    lib.write_bytes(b"")
    newest = max(s.stat().st_mtime for s in (*cb.SOURCES, *cb.HEADERS))
    os.utime(lib, (newest + 10 - age_s, newest + 10 - age_s))


def test_a_build_of_this_tree_newer_than_its_sources_needs_no_compile(build_folder):
    assert cb.cached_build() is None  # nothing built yet
    _write_build(build_folder, cb.SOURCES)
    assert cb.cached_build() == build_folder


def test_a_build_older_than_a_source_or_of_another_tree_is_compiled_again(build_folder):
    _write_build(build_folder, cb.SOURCES, age_s=3600)
    assert cb.cached_build() is None  # a source changed after the build
    _write_build(build_folder, [Path("/elsewhere/csrc") / s.name for s in cb.SOURCES])
    assert cb.cached_build() is None  # ninja's build file names another copy's sources


@pytest.mark.parametrize("cached", [True, False])
def test_the_compile_message_shows_only_when_a_compile_is_due(build_folder, monkeypatch, capsys, cached):
    if cached:
        _write_build(build_folder, cb.SOURCES)
    monkeypatch.setattr(cpp, "load", lambda **kw: types.SimpleNamespace(name=kw["name"]))
    assert cb._build().name == cb.EXTENSION_NAME
    said = capsys.readouterr().err
    assert ("compiling the fused CUDA search kernels" in said) is not cached

"""scripts/gpu_study.sh, a study on the GPUs of one machine, run on the CPU (the local-GPU launcher means jobs per
machine there): a study cut to two tiny jobs ends with its table and, with PRECISION set, the search precision of
its teachers raw and centred, each method's checkpoints grouped from the jobs' summaries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHORT = ["seed=0", "+trainer.limit_train_batches=2", "eval.knn_at_start=false"]


def run_study(tmp_path: Path, overrides: list[str], **env_vars: str) -> subprocess.CompletedProcess:
    """scripts/gpu_study.sh on `shapes_default_seeds` in a copy of the repository (its runs/ stay in tmp_path),
    two jobs at a time, the study's outputs in tmp_path/out; `env_vars` set the script's options."""
    tree = tmp_path / "tree"
    if not tree.exists():
        skip = shutil.ignore_patterns(".git", ".venv", "runs", ".whl", ".gpudata", ".pytest_cache")
        shutil.copytree(REPO, tree, ignore=skip)
    env = {**os.environ, "STUDY": "shapes_default_seeds", "PER_GPU": "2", "OUT": str(tmp_path / "out"),
           "PY": sys.executable, **env_vars}
    return subprocess.run(["bash", "scripts/gpu_study.sh", *SHORT, *overrides], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_study_ends_with_its_table_and_the_precision_of_its_teachers(tmp_path):
    out = tmp_path / "out"
    res = run_study(tmp_path, ["trainer.max_epochs=1"], PRECISION="--limit 8")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "done:" in res.stdout and (out / "shapes_default_seeds.md").is_file()
    for read_out in ("raw", "centred"):
        doc = json.loads((out / f"precision-{read_out}" / "precision.json").read_text())
        labels = json.dumps(doc)
        assert "SCFS" in labels and "DINO" in labels and "random init" in labels
        assert bool(doc["settings"].get("centre")) == (read_out == "centred")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_vit_study_ends_with_each_methods_attention_figure(tmp_path):
    """ATTENTION: once a ViT study is done, the CLS attention of each method's first teacher, one PNG each."""
    import numpy as np
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(photos / "p.jpg")
    out = tmp_path / "out"
    res = run_study(tmp_path, ["trainer.max_epochs=1", "backbone=vit_micro", "search.stages=[block1,last]"],
                    ATTENTION=f"--folder {photos} --size 32 --n-images 1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for method in ("scfs", "dino"):
        assert (out / f"attention-{method}.png").stat().st_size > 1000, res.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_study_cut_by_its_chunk_budget_exits_3_and_the_same_call_finishes_it(tmp_path):
    """Exit status 3 = not done yet, so `until bash scripts/gpu_study.sh; do [ $? -eq 3 ] || break; done` runs a
    study to its end: a budget too short stops the job cleanly at its first check (step 20 of 22), the call
    again resumes and ends it."""
    def call(chunk_min: str) -> subprocess.CompletedProcess:
        return run_study(tmp_path, ["method=dino", "trainer.max_epochs=11"], PER_GPU="1", CHUNK_MIN=chunk_min)

    cut = call("0.0001")
    assert cut.returncode == 3 and "not done yet" in cut.stdout, cut.stdout[-3000:] + cut.stderr[-3000:]
    done = call("7")
    assert done.returncode == 0 and "done:" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]

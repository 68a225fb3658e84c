"""scripts/gpu_cifar10_study.sh, the study's GPU-window driver, on the CPU with a stand-in interpreter: `start`
leaves the study running under setsid after it returns, AFTER_STUDY starts only once the study has ended, and
`collect` waits for both and brings back the record and what the follow-on work wrote under $S/extra."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the stand-in for python: data preparation succeeds, the study runner writes a record after a pause and marks its end
FAKE_PY = """#!/bin/sh
case "$1 $2" in
  "-m scfs.data.prepare") mkdir -p data/cifar10/train data/imagenet-samples; exit 0;;
  "scripts/cifar10_study.py run")
    while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
    sleep 8
    echo '{"runs": []}' > "$out/cifar10-quality-test.json"; echo "# record" > "$out/cifar10-quality-test.md"
    touch "$out/study.ended"; echo "[study] done"; exit 0;;
esac
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("setsid") is None, reason="needs bash and setsid")
def test_after_study_starts_when_the_study_ends_and_collect_brings_it_back(tmp_path):
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("gpu_cifar10_study.sh", "cifar10_data.sh"):
        shutil.copy(REPO / "scripts" / name, tree / "scripts" / name)
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    study, out = tmp_path / "study", tmp_path / "out"
    env = {**os.environ, "PY": str(fake), "OUT": str(out), "STUDY_TREE": str(tmp_path / "study-tree"),
           "STUDY_DIR": str(study), "MINUTES": "1", "RAMP": "0",
           # started by `start`, it must find the study's end marker: it may not start before the study has ended
           "AFTER_STUDY": 'test -f "$S/out/study.ended" && echo "ran after" > "$S/extra/after.txt"'}
    script = ["bash", "scripts/gpu_cifar10_study.sh"]
    start = subprocess.run([*script, "start"], cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    assert "study deadline" in start.stdout and not (study / "out" / "study.ended").exists()
    res = subprocess.run([*script, "collect", "60"], cwd=tree, env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[study] done" in res.stdout and "after the study:" in res.stdout
    with tarfile.open(out / "study.tgz") as tgz:
        names = tgz.getnames()
        assert "out/cifar10-quality-test.json" in names and "extra/after.txt" in names, names
        assert tgz.extractfile("extra/after.txt").read() == b"ran after\n"
    assert (out / "cifar10-quality-test.md").is_file()

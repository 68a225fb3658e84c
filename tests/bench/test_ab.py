"""`python -m scfs.bench.ab`: two source trees' step benchmark alternated in rounds, compared per round.

The subprocess tests run fake trees whose `scfs.bench.step` is a stub writing a record, so they show that each
run imports its own tree's code (and take a fraction of a second each); the slow test runs the real step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scfs.bench.ab import aggregate, main, markdown, round_order

REPO = Path(__file__).resolve().parents[2]

# The stub `scfs/bench/step.py` of a fake tree: writes a record like the real one's (`step-cpu-<date>.json` in the
# `--out` folder it is given) with this tree's step ms, and where it was imported from. FAIL_CALL: the call (1, 2,
# ...) that exits 3 instead, counted in a file beside the tree's scfs/.
STUB = '''
import datetime, json, os, sys
from pathlib import Path

STEP_MS, FAIL_CALL = {step_ms!r}, {fail_call!r}
tree = Path(__file__).resolve().parents[2]
calls = tree / "calls"
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
if n == FAIL_CALL:
    print("boom: the stub failed", file=sys.stderr)
    sys.exit(3)
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
meta = {{"gpu": "cpu", "commit": os.environ.get("COMMIT"), "host_us_per_op": 1.0 + n / 10, "file": __file__,
         "cwd": os.getcwd(), "pythonpath": os.environ["PYTHONPATH"], "argv": sys.argv[1:]}}
rows = [{{"method": m, "B": 64, "setting": "bf16_cl", "step_ms": ms}} for m, ms in STEP_MS.items()]
(out / f"step-cpu-{{datetime.date.today().isoformat()}}.json").write_text(json.dumps({{"meta": meta, "rows": rows}}))
'''


def fake_tree(root: Path, step_ms: dict[str, float], fail_call: int | None = None) -> Path:
    """A tree with scfs/, scfs/bench/ and conf/, whose step benchmark is the stub."""
    (root / "scfs" / "bench").mkdir(parents=True)
    (root / "conf").mkdir()
    (root / "scfs" / "__init__.py").write_text("")
    (root / "scfs" / "bench" / "__init__.py").write_text("")
    (root / "scfs" / "bench" / "step.py").write_text(STUB.format(step_ms=step_ms, fail_call=fail_call))
    return root


def record(ms: dict[str, float | None], host: float | None = None) -> dict[str, Any]:
    """A step record with one row per method (None: the row recorded as an error)."""
    rows = [{"method": m, "B": 64, "setting": "bf16_cl", **({"step_ms": v} if v is not None else {"error": "OOM"})}
            for m, v in ms.items()]
    return {"meta": {"gpu": "cpu", **({"host_us_per_op": host} if host else {})}, "rows": rows}


def test_rounds_alternate_abba() -> None:
    assert round_order(("A", "B"), 3) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]
    assert [t for _, t in round_order(("x", "y"), 4)] == list("xyyxxyyx")


def test_aggregate_medians_ratios_and_spread_per_row() -> None:
    a = [{"scfs": 100.0, "dino": 50.0}, {"scfs": 120.0, "dino": 55.0}, {"scfs": 110.0, "dino": 60.0}]
    b = [{"scfs": 90.0, "dino": 50.0}, {"scfs": 96.0, "dino": 66.0}, {"scfs": 110.0, "dino": 57.0}]
    runs = [{"round": r, "tree": t, "record": record((a if t == "A" else b)[r]), "error": None}
            for r, t in round_order(("A", "B"), 3)]
    scfs, dino = aggregate(runs, ("A", "B"))
    assert (scfs["method"], scfs["B"], scfs["setting"]) == ("scfs", 64, "bf16_cl") and dino["method"] == "dino"
    assert scfs["step_ms"] == {"A": 110.0, "B": 96.0} and dino["step_ms"] == {"A": 55.0, "B": 57.0}
    assert scfs["step_ms_rounds"] == {"A": [100.0, 120.0, 110.0], "B": [90.0, 96.0, 110.0]}
    assert scfs["ratio_rounds"] == pytest.approx([0.9, 0.8, 1.0])
    assert (scfs["ratio_median"], scfs["ratio_min"], scfs["ratio_max"]) == pytest.approx((0.9, 0.8, 1.0))
    assert dino["ratio_rounds"] == pytest.approx([1.0, 1.2, 0.95])
    assert (dino["ratio_median"], dino["ratio_min"], dino["ratio_max"]) == pytest.approx((1.0, 0.95, 1.2))
    assert scfs["errors"] == [] and dino["errors"] == []


def test_a_failed_round_is_left_out_of_the_numbers_and_named_in_the_table() -> None:
    runs = [{"round": 0, "tree": "A", "record": record({"scfs": 100.0, "dino": 50.0}, 4.0), "error": None},
            {"round": 0, "tree": "B", "record": record({"scfs": 90.0, "dino": 45.0}, 4.1), "error": None},
            # a run that failed after writing a row counts for no row
            {"round": 1, "tree": "B", "record": record({"scfs": 1.0}), "error": "exit 1: RuntimeError: boom"},
            {"round": 1, "tree": "A", "record": record({"scfs": 300.0, "dino": 150.0}, 4.2), "error": None},
            {"round": 2, "tree": "A", "record": record({"scfs": 110.0, "dino": 60.0}, 4.3), "error": None},
            # one row of a run that worked failed alone (the step records it as the row's error)
            {"round": 2, "tree": "B", "record": record({"scfs": 121.0, "dino": None}, 4.4), "error": None}]
    scfs, dino = aggregate(runs, ("A", "B"))
    assert scfs["step_ms_rounds"] == {"A": [100.0, 300.0, 110.0], "B": [90.0, None, 121.0]}
    assert scfs["step_ms"] == {"A": 110.0, "B": 105.5}
    assert scfs["ratio_rounds"][1] is None and scfs["ratio_rounds"][0] == pytest.approx(0.9)
    assert (scfs["ratio_median"], scfs["ratio_min"], scfs["ratio_max"]) == pytest.approx((1.0, 0.9, 1.1))
    assert scfs["errors"] == [{"round": 1, "tree": "B", "error": "exit 1: RuntimeError: boom"}]
    assert dino["ratio_rounds"] == [pytest.approx(0.9), None, None] and dino["ratio_median"] == pytest.approx(0.9)
    assert [(e["round"], e["tree"], e["error"]) for e in dino["errors"]] == [
        (1, "B", "exit 1: RuntimeError: boom"), (2, "B", "OOM")]
    md = markdown({"meta": {"command": "python -m scfs.bench.ab x", "trees": {"A": "/a", "B": "/b"}, "rounds": 3,
                            "step_args": ["--batch", "64"], "date": "2026-12-03"},
                   "rounds": runs, "rows": [scfs, dino]})
    assert "| scfs | 64 | bf16_cl | 110.0 | 105.5 | 0.900, r1: B failed, 1.100 | 1.000 [0.900, 1.100] |" in md
    assert "| dino | 64 | bf16_cl | 60.0 | 45.0 | 0.900, r1: B failed, r2: B failed | 0.900 [0.900, 0.900] |" in md
    assert "- round 1, `B`: exit 1: RuntimeError: boom" in md and "- dino B=64 bf16_cl, round 2, `B`: OOM" in md
    assert "A 4.00, 4.20, 4.30; B 4.10, -, 4.40" in md
    assert "Commit `A vs B`; `python -m scfs.bench.ab x`." in md


def test_the_record_written_mid_round_shows_the_missing_side_as_not_run() -> None:
    runs = [{"round": 0, "tree": "A", "record": record({"scfs": 100.0}), "error": None},
            {"round": 0, "tree": "B", "record": record({"scfs": 90.0}), "error": None},
            {"round": 1, "tree": "B", "record": record({"scfs": 99.0}), "error": None}]
    (row,) = aggregate(runs, ("A", "B"))
    assert row["ratio_rounds"] == [pytest.approx(0.9), None] and row["step_ms"] == {"A": 100.0, "B": 94.5}
    md = markdown({"meta": {"command": "c", "trees": {"A": "/a", "B": "/b"}, "rounds": 3, "step_args": [],
                            "date": "d"}, "rounds": runs, "rows": [row]})
    assert "| 0.900, - | 0.900 [0.900, 0.900] |" in md and "failed" not in md.lower()


def test_each_run_imports_its_own_tree(tmp_path: Path) -> None:
    """The records' numbers come from each tree's own stub, run from that tree with COMMIT = its name."""
    a = fake_tree(tmp_path / "ta", {"scfs": 100.0, "dino": 50.0})
    b = fake_tree(tmp_path / "tb", {"scfs": 90.0, "dino": 60.0})
    out = tmp_path / "out"
    t0 = time.perf_counter()
    assert main(["--tree", f"old={a}", "--tree", f"new={b}", "--rounds", "3", "--out", str(out), "--name", "x",
                 "--", "--batch", "64", "--setting", "bf16_cl"]) == 0
    assert time.perf_counter() - t0 < 30
    res = json.loads((out / "x.json").read_text())
    assert [(e["round"], e["tree"]) for e in res["rounds"]] == round_order(("old", "new"), 3)
    for e in res["rounds"]:
        tree, meta = (a if e["tree"] == "old" else b), e["record"]["meta"]
        assert e["error"] is None and meta["commit"] == e["tree"]
        assert Path(meta["file"]).resolve() == tree / "scfs" / "bench" / "step.py"
        assert Path(meta["cwd"]).resolve() == tree and meta["pythonpath"].split(os.pathsep)[0] == str(tree)
        assert meta["argv"][:4] == ["--batch", "64", "--setting", "bf16_cl"] and meta["argv"][4] == "--out"
    assert res["meta"]["trees"] == {"old": str(a), "new": str(b)} and res["meta"]["rounds"] == 3
    assert res["meta"]["step_args"] == ["--batch", "64", "--setting", "bf16_cl"]
    scfs, dino = res["rows"]
    assert scfs["step_ms"] == {"old": 100.0, "new": 90.0} and dino["step_ms"] == {"old": 50.0, "new": 60.0}
    assert scfs["ratio_rounds"] == pytest.approx([0.9] * 3) and dino["ratio_median"] == pytest.approx(1.2)
    md = (out / "x.md").read_text()
    assert "| scfs | 64 | bf16_cl | 100.0 | 90.0 | 0.900, 0.900, 0.900 | 0.900 [0.900, 0.900] |" in md
    assert "old 1.10, 1.20, 1.30; new 1.10, 1.20, 1.30" in md  # host us/op of each side's 1st, 2nd, 3rd call
    assert not (out / "x-logs").exists()


def test_a_failing_run_is_reported_and_the_other_rounds_kept(tmp_path: Path) -> None:
    a = fake_tree(tmp_path / "ta", {"scfs": 100.0})
    b = fake_tree(tmp_path / "tb", {"scfs": 80.0}, fail_call=2)  # its run of round 1
    out = tmp_path / "out"
    assert main(["--tree", f"A={a}", "--tree", f"B={b}", "--rounds", "3", "--out", str(out), "--name", "x"]) == 1
    res = json.loads((out / "x.json").read_text())
    failed = [e for e in res["rounds"] if e["error"]]
    assert [(e["round"], e["tree"], e["record"]) for e in failed] == [(1, "B", None)]
    assert failed[0]["error"].startswith("exit 3") and "boom: the stub failed" in failed[0]["error"]
    (row,) = res["rows"]
    assert row["ratio_rounds"] == [pytest.approx(0.8), None, pytest.approx(0.8)]
    assert row["step_ms"] == {"A": 100.0, "B": 80.0}
    md = (out / "x.md").read_text()
    assert "0.800, r1: B failed, 0.800" in md and "- round 1, `B`: exit 3: boom: the stub failed" in md
    assert "boom" in (out / "x-logs" / "B-r1.log").read_text()  # the failed run's log, beside the record


@pytest.mark.parametrize("make", ["missing", "empty", "no_conf"])
def test_a_tree_that_is_not_one_stops_before_anything_runs(tmp_path: Path, make: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    good = fake_tree(tmp_path / "good", {"scfs": 1.0})
    bad = tmp_path / "bad"
    if make != "missing":
        bad.mkdir()
    if make == "no_conf":
        (bad / "scfs").mkdir()
        (bad / "scfs" / "__init__.py").write_text("")
    out = tmp_path / "out"
    assert main(["--tree", f"A={good}", "--tree", f"B={bad}", "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"B={bad}" in line and "git archive <commit> scfs conf" in line and "scripts/ab_trees.sh" in line
    assert not out.exists() and not (good / "calls").exists()


@pytest.mark.parametrize("argv", [
    ["--tree", "A=x"],
    ["--tree", "A=x", "--tree", "B=y", "--tree", "C=z"],
    ["--tree", "A=x", "--tree", "A=y"],
    ["--tree", "x", "--tree", "B=y"],
    ["--tree", "A=x", "--tree", "B=y", "--", "--out", "/tmp/elsewhere"],
])
def test_bad_arguments_are_argparse_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "--" in capsys.readouterr().err


def test_ab_trees_exports_each_commit_into_its_short_hash(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for f in ("scfs/__init__.py", "conf/config.yaml", "csrc/k.cu", "tests/test_x.py"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text(f)

    def git(*a: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    sha = git("rev-parse", "--short", "HEAD")
    (repo / ".ab" / sha / "stale").mkdir(parents=True)
    script = REPO / "scripts" / "ab_trees.sh"
    done = subprocess.run(["bash", str(script), "HEAD"], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tree = repo / ".ab" / sha
    assert sorted(p.name for p in tree.iterdir()) == ["conf", "csrc", "scfs"]  # replaced: the stale folder is gone
    assert (tree / "scfs" / "__init__.py").read_text() == "scfs/__init__.py"
    assert f".ab/{sha}" in done.stdout and "total:" in done.stdout
    bad = subprocess.run(["bash", str(script), "no-such-commit"], cwd=repo, capture_output=True, text=True)
    assert bad.returncode == 2 and "no-such-commit: not a commit" in bad.stderr


@pytest.mark.slow
def test_ab_runs_the_real_step_from_two_copies_of_this_tree(tmp_path: Path) -> None:
    trees = {}
    for name in ("a", "b"):
        for part in ("scfs", "conf"):
            shutil.copytree(REPO / part, tmp_path / name / part, ignore=shutil.ignore_patterns("__pycache__"))
        trees[name] = tmp_path / name
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "scfs.bench.ab", "--tree", f"a={trees['a']}", "--tree", f"b={trees['b']}",
           "--rounds", "2", "--out", str(out), "--name", "ab", "--", "--device", "cpu", "--tiny", "--batch", "2",
           "--setting", "fp32", "--steps", "2", "--warmup", "1", "--no-ceiling"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((out / "ab.json").read_text())
    assert [e["record"]["meta"]["commit"] for e in res["rounds"]] == ["a", "b", "b", "a"]
    assert {(r["method"], r["B"], r["setting"]) for r in res["rows"]} == {("scfs", 2, "fp32"), ("dino", 2, "fp32")}
    for r in res["rows"]:
        assert all(x is not None and x > 0 for x in r["ratio_rounds"]) and len(r["ratio_rounds"]) == 2
        assert r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"] and not r["errors"]
    assert "| scfs | 2 | fp32 |" in (out / "ab.md").read_text()

"""A/B timing of the training step: two source trees' `python -m scfs.bench.step`, alternated in one call.

Why: the eager step is host-bound, and the host of a rented GPU machine drifts in speed by 20-40 % between
minutes and between machines, so two step records made in different sessions cannot say whether a change of a
few per cent made the step faster. Here both trees run in the same call, in rounds ordered A B, B A, A B, ...
(ABBA: a drift within the call hits both sides alike, and neither side always runs first), and the comparison is
the ratio B / A within each round, with its spread over the rounds.

A tree is a directory holding a copy of the repository's `scfs/`, `conf/` and `csrc/` (the CUDA search kernels,
which the GPU step builds from the tree's own copy), e.g. `scripts/ab_trees.sh <commit> ...`, which exports them
with `git archive` into `.ab/<short hash>/`. Each run is a subprocess `python -m scfs.bench.step <args after --> --out
<scratch>` with the tree as its working directory and first on PYTHONPATH (`python -m` puts the working directory
first on sys.path, so the tree's package wins over an installed one; `scfs.names` finds `conf/` beside the
package), `COMMIT=<name>` (the record names the tree) and a CUDA-extension build folder of its own
(`<tree>/.torch_extensions`: one shared folder would rebuild the kernels at every switch of tree, its build files
naming the other tree's sources).

Per row (method, B, setting): each side's median over the rounds of the step record's `step_ms`, the per-round
ratio B / A, and its median [min, max]. A run that fails (non-zero exit, no record, a row recorded as an error)
is named in the table and left out of that row's numbers; the other rounds stand. The record is written after
every run: `<out>/<name>.json` (every round's step record, the aggregated rows) and `<out>/<name>.md`; the logs of
failed runs go to `<out>/<name>-logs/`. Exit status 0 when every run left a record, 1 otherwise.

Usage:
    scripts/ab_trees.sh <a> <b>
    python -m scfs.bench.ab --tree A=.ab/<a> --tree B=.ab/<b> --rounds 3 -- --batch 64 --setting bf16_cl --no-ceiling
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from scfs.bench.records import provenance, run_logged, save_record, why_it_failed

Key = tuple[str, int, str]  # (method, B, setting): a row of a step record


def parse_tree(spec: str) -> tuple[str, Path]:
    """`NAME=PATH` -> (NAME, PATH); argparse's `type` for `--tree`."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected NAME=PATH, e.g. 09b9e33=.ab/09b9e33")
    return name, Path(path)


def tree_problem(name: str, path: Path) -> str | None:
    """Why `path` cannot be a tree to time (None when it can): a tree holds the repository's scfs/ and conf/."""
    if not path.is_dir():
        what = "no such directory"
    elif not (path / "scfs" / "__init__.py").is_file():
        what = "no scfs/ package there"
    elif not (path / "conf").is_dir():
        what = "no conf/ folder there"
    else:
        return None
    return (f"scfs.bench.ab: --tree {name}={path}: {what}; export the commit's tree with `git archive <commit> scfs "
            f"conf csrc | tar -x -C {path}` (into an existing folder) or `scripts/ab_trees.sh <commit>`")


def round_order(names: tuple[str, str], rounds: int) -> list[tuple[int, str]]:
    """(round, tree) in run order: A then B in even rounds, B then A in odd ones (A B B A A B ...), so a steady
    drift over the call favours neither side and each runs first as often as the other (for an even count)."""
    a, b = names
    return [(r, t) for r in range(rounds) for t in ((a, b) if r % 2 == 0 else (b, a))]


def tree_env(name: str, tree: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run from `tree`: the tree first on PYTHONPATH, COMMIT=name (the record's commit; a
    copy made by git archive has no .git to ask) and the tree's own CUDA-extension build folder."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["COMMIT"] = name
    env["TORCH_EXTENSIONS_DIR"] = str(tree / ".torch_extensions")
    return env


def find_record(folder: Path) -> Path | None:
    """The step record a run wrote into its own (fresh) `--out` folder: `step-<gpu>-<date>[...].json`."""
    found = sorted(folder.glob("step-*.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def run_tree(name: str, tree: Path, rnd: int, step_args: list[str], scratch: Path,
             timeout: float | None) -> tuple[dict[str, Any], Path]:
    """One round's run of one tree: `python -m scfs.bench.step` from the tree, its record in a fresh folder.
    Returns the round entry (`record` None and `error` set when it failed) and the run's log."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    out = scratch / f"{slug}-r{rnd}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log = scratch / f"{slug}-r{rnd}.log"
    cmd = [sys.executable, "-m", "scfs.bench.step", *step_args, "--out", str(out)]
    rc, wall = run_logged(cmd, log, timeout, env=tree_env(name, tree), cwd=tree)
    entry: dict[str, Any] = {"round": rnd, "tree": name, "record": None, "error": None, "wall_s": round(wall, 1)}
    path = find_record(out)
    if rc != 0:
        entry["error"] = (f"timed out after {timeout:.0f} s" if rc == 124 and timeout else f"exit {rc}") + (
            f": {why_it_failed(log)}")
    elif path is None:
        entry["error"] = f"no step record in its --out folder: {why_it_failed(log)}"
    if path is not None:  # a run that failed late may still have written some rows
        try:
            entry["record"] = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            entry["error"] = entry["error"] or f"unreadable record {path.name}: {err}"
    return entry, log


def aggregate(runs: list[dict[str, Any]], names: tuple[str, str]) -> list[dict[str, Any]]:
    """The comparison per row (method, B, setting) from the rounds' entries (`{"round", "tree", "record",
    "error"}`): per side the step ms of every round (None where that round's run or row failed) and their median,
    the ratio B / A per round (None unless both sides have the row in that round) and its median, min and max, and
    the errors by round and tree. Rows appear in the order the runs first recorded them."""
    a, b = names
    rounds = max((e["round"] for e in runs), default=-1) + 1
    keys: list[Key] = []
    ms: dict[tuple[Key, str, int], float] = {}
    row_errors: dict[tuple[Key, str, int], str] = {}
    for e in runs:
        rows = (e.get("record") or {}).get("rows", [])
        keys += [k for k in ((r["method"], r["B"], r["setting"]) for r in rows) if k not in keys]
        if e.get("error"):  # a failed run counts for no row, even where its record kept some
            continue
        for r in rows:
            key = (r["method"], r["B"], r["setting"])
            if r.get("step_ms") is not None and "error" not in r:
                ms[key, e["tree"], e["round"]] = float(r["step_ms"])
            else:
                row_errors[key, e["tree"], e["round"]] = r.get("error") or "no step_ms in the row"
    out: list[dict[str, Any]] = []
    for key in keys:
        per_round = {t: [ms.get((key, t, i)) for i in range(rounds)] for t in names}
        errors = []
        for e in sorted(runs, key=lambda e: (e["round"], names.index(e["tree"]))):
            if (key, e["tree"], e["round"]) in ms:
                continue
            why = row_errors.get((key, e["tree"], e["round"])) or e.get("error") or "row missing from the record"
            errors.append({"round": e["round"], "tree": e["tree"], "error": why})
        ratios = [vb / va if va and vb is not None else None for va, vb in zip(per_round[a], per_round[b])]
        got = [x for x in ratios if x is not None]
        out.append({
            "method": key[0], "B": key[1], "setting": key[2],
            "step_ms": {t: _median(per_round[t]) for t in names}, "step_ms_rounds": per_round,
            "ratio_rounds": ratios, "ratio_median": statistics.median(got) if got else None,
            "ratio_min": min(got) if got else None, "ratio_max": max(got) if got else None, "errors": errors})
    return out


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def markdown(result: dict[str, Any]) -> str:
    """The comparison table, the host yardstick per round and the failed runs, under the provenance line."""
    m = result["meta"]
    a, b = m["trees"]
    metas = [e["record"]["meta"] for e in result["rounds"] if e.get("record")]
    gpu = next((x["gpu"] for x in metas if x.get("gpu")), "?")
    lines = [f"# Training-step A/B: `{a}` against `{b}` ({gpu}, {m['date']})", "",
             provenance(f"{a} vs {b}", m["command"]), "",
             f"{m['rounds']} rounds, each running `python -m scfs.bench.step {shlex.join(m['step_args'])}` once per "
             f"tree, from the tree's own copy, in the order A B, B A, A B, ... (A = `{a}`, B = `{b}`). A side's ms "
             "is the median over the rounds of the step's median ms; B / A per round divides the two sides of one "
             "round, which a drift of the host's speed hits alike; its spread over the rounds is the noise left.",
             "", f"| method | B | setting | {a} ms (median of rounds) | {b} ms | {b} / {a} per round | "
             f"{b} / {a} median [min, max] |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def ms(t: str, r: dict = r) -> str:
            v = r["step_ms"][t]
            return f"{v:.1f}" if v is not None else "-"

        def ratio(i: int, x: float | None, r: dict = r) -> str:
            """A round's B / A, else the side that failed in it ("-": the round has not run yet)."""
            if x is not None:
                return f"{x:.3f}"
            trees = ", ".join(e["tree"] for e in r["errors"] if e["round"] == i)
            return f"r{i}: {trees} failed" if trees else "-"

        per_round = ", ".join(ratio(i, x) for i, x in enumerate(r["ratio_rounds"]))
        spread = (f"{r['ratio_median']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]"
                  if r["ratio_median"] is not None else "-")
        lines.append(f"| {r['method']} | {r['B']} | {r['setting']} | {ms(a)} | {ms(b)} | {per_round} | {spread} |")
    runs = sorted(result["rounds"], key=lambda e: e["round"])
    host = {t: [((e.get("record") or {}).get("meta") or {}).get("host_us_per_op") for e in runs if e["tree"] == t]
            for t in (a, b)}
    if any(v is not None for vs in host.values() for v in vs):
        lines += ["", "Host: us to dispatch one tiny op, per round (the step's yardstick of the host's speed): "
                  + "; ".join(f"{t} " + ", ".join(f"{v:.2f}" if v is not None else "-" for v in host[t])
                              for t in (a, b)) + "."]
    failures = [e for e in result["rounds"] if e.get("error")]
    if failures:
        lines += ["", "Failed runs (left out of the numbers above):", ""]
        lines += [f"- round {e['round']}, `{e['tree']}`: {e['error'][:300]}" for e in failures]
    row_failures = [(r, e) for r in result["rows"] for e in r["errors"]
                    if not any(f["round"] == e["round"] and f["tree"] == e["tree"] for f in failures)]
    if row_failures:
        lines += ["", "Failed rows:", ""]
        lines += [f"- {r['method']} B={r['B']} {r['setting']}, round {e['round']}, `{e['tree']}`: {e['error'][:300]}"
                  for r, e in row_failures]
    lines += ["", "Trees: " + ", ".join(f"`{t}` = `{p}`" for t, p in m["trees"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, step_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m scfs.bench.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s --tree A=PATH --tree B=PATH [options] -- [scfs.bench.step args]")
    ap.add_argument("--tree", type=parse_tree, action="append", default=[], metavar="NAME=PATH",
                    help="a source tree to time (exactly two: A, then B); NAME labels it (the commit)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs both trees, A B / B A alternately")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default=None, help="the record's file stem (default step-ab-<date>)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="seconds one run may take before it counts as failed (default: no limit)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep every run's step record folder and log here (default: a temporary folder)")
    args = ap.parse_args(own)
    if len(args.tree) != 2:
        ap.error(f"--tree: exactly two trees to compare (NAME=PATH each), got {len(args.tree)}")
    names = (args.tree[0][0], args.tree[1][0])
    if names[0] == names[1]:
        ap.error(f"--tree: the two trees need different names, both are {names[0]!r}")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    if "--out" in step_args or any(s.startswith("--out=") for s in step_args):
        ap.error("--out after `--`: each run's --out is set here; give the record's folder as --out before `--`")
    problems = [p for name, path in args.tree if (p := tree_problem(name, path))]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    trees = {name: path.resolve() for name, path in args.tree}
    date = dt.date.today().isoformat()
    stem = args.out / (args.name or f"step-ab-{date}")
    meta = {"command": "python -m scfs.bench.ab " + shlex.join(argv), "trees": {t: str(p) for t, p in trees.items()},
            "rounds": args.rounds, "step_args": step_args, "date": date}
    result: dict[str, Any] = {"meta": meta, "rounds": [], "rows": []}
    with tempfile.TemporaryDirectory(prefix="scfs-ab-") as tmp:
        scratch = args.keep or Path(tmp)
        for rnd, name in round_order(names, args.rounds):
            print(f"round {rnd}: {name} ({trees[name]})", flush=True)
            entry, log = run_tree(name, trees[name], rnd, step_args, scratch, args.timeout)
            result["rounds"].append(entry)
            result["rows"] = aggregate(result["rounds"], names)
            rows = (entry["record"] or {}).get("rows", [])
            print(f"  {entry['wall_s']:.0f} s; " + "; ".join(
                f"{r['method']} B={r['B']} {r['setting']} " + (f"{r['step_ms']:.1f} ms" if "step_ms" in r else "error")
                for r in rows) + (f"; error: {entry['error']}" if entry["error"] else ""), flush=True)
            if entry["error"]:
                logs = stem.parent / f"{stem.name}-logs"
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy2(log, logs / log.name)
            md = save_record(result, stem, markdown)
    print(md, flush=True)
    print(f"record: {stem}.json, {stem}.md", flush=True)
    return 0 if all(e["record"] is not None and not e["error"] for e in result["rounds"]) else 1


if __name__ == "__main__":
    sys.exit(main())

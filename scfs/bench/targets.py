"""The ImageNet recipe's speed targets in one table, each met or missed by how much, read from the records.

Three benchmarks measure them, in different calls and on different machines: the real run on JPEGs against the
step (`scfs.bench.e2e`), the step beside the published one in the same call (`scfs.bench.step --published-tree`),
and the first compile (`scfs.bench.compile`). This reads their records and writes one table: for each target every
measurement with its record, and a verdict over the newest day's (older days are an older commit's: listed as the
history). A target measured on several machines that day keeps every machine's number (the compile and the eager
step follow the host), so the table shows the spread instead of picking the best; it is met when each meets it.

    python -m scfs.bench.targets                        # every record in benchmarks/results
    python -m scfs.bench.targets --records DIR --out benchmarks/results/speed-targets
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scfs.bench.e2e import TARGET as E2E_TARGET
from scfs.bench.host import host_tag
from scfs.bench.records import save_record, source_commit

SPEEDUP = 2.0  # our default path over the published step, same call
SCFS_OVER_DINO = 1.10  # our SCFS step over our DINO step, default path
COMPILE_S = 60.0  # the first steps on a fresh machine (compile included)
SECOND_RUN_S = 30.0  # the first steps of a second run (cache warm)
# The backbone-bound limit of this step on an H200: forward and backward of 2x224 + 8x96 views plus the teacher's
# 2x224 forward, about 4.1 single-crop ResNet-50 training images per SCFS image, so about 1,500 img/s.
CEILING_IMG_S = 1500.0
RECIPE_BATCH = 256  # `+experiment=imagenet`'s batch per GPU
DEFAULT_PATH, EAGER = "bf16_cl_graphs", "bf16_cl"
DAY = r"\d{4}-\d{2}-\d{2}"
RECIPES = {"imagenet": "ResNet-50 (`+experiment=imagenet`)", "cifar10": "CIFAR-10 (`+experiment=cifar10`)"}
# the choices the docs offer for a short run, as `scfs.bench.e2e --override`s: the training command's own first step
# with them is a target row of its own beside the recipe as shipped
SHORT_RUN = frozenset({"compile_student_graphs=per_view_size", "compile_autotune_ms=5"})
# the published step's stage head (`DINOShallowHead`): residual width 256 at every stage and a ReLU after the residual
# sum. With it our step does about the published step's work per image (143.7 against 142.4 GFLOP, the FLOPs
# records), so the speed-up over the published step with this head is the speed-up at equal work.
PUBLISHED_HEAD = {"method.stage_branch_channels": 256, "method.stage_final_relu": True}
_ABSENT = object()


@dataclass
class Target:
    """One target: its statement, its limit (`at_least`: a value must reach it, else stay under it; None: only
    reported), how a value and a shortfall read, and its measurements `(date, value, record)`.

    The verdict is over the measurements of the newest day that has any: the code moves, so an older record says
    what an older commit did (it is still listed, as the history)."""

    name: str
    limit: float | None
    at_least: bool
    show: Callable[[float], str]
    show_miss: Callable[[float], str] | None = None
    measured: list[tuple[str, float, str]] = field(default_factory=list)

    def shortfall(self, value: float) -> float:
        """How far `value` falls short of the limit (0 or less: it meets it)."""
        if self.limit is None:
            return 0.0
        return self.limit - value if self.at_least else value - self.limit

    def current(self) -> list[tuple[str, float, str]]:
        """The measurements the verdict is over: the newest day's."""
        newest = max((d for d, _, _ in self.measured), default="")
        return [m for m in self.measured if m[0] == newest]

    def verdict(self) -> str:
        now = self.current()
        if not now:
            return "not measured"
        if self.limit is None:
            return "reported"
        misses = sorted(self.shortfall(v) for _, v, _ in now if self.shortfall(v) > 0)
        show, n = self.show_miss or self.show, len(now)
        if not misses:
            return "**met**" + (f" (all {n})" if n > 1 else "")
        by = show(misses[0]) if len(misses) == 1 else f"{show(misses[0])} to {show(misses[-1])}"
        if len(misses) == n:
            return f"**missed** by {by}"
        return f"**mixed**: met by {n - len(misses)} of {n}, the others missed by {by}"


@dataclass
class Record:
    """A JSON record: its file name, the day it was measured on, its content."""

    name: str
    date: str
    data: dict[str, Any]


def load(paths: Iterable[Path]) -> list[Record]:
    """Each readable JSON record among `paths`; its day from the record (`date`, `meta.date`), else its name."""
    out = []
    for p in sorted(paths):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        day = data.get("date") or (data.get("meta") or {}).get("date") or (re.findall(DAY, p.name) or [""])[0]
        out.append(Record(p.name, str(day), data))
    return out


def step_rows(records: list[Record]) -> list[tuple[Record, dict[str, Any]]]:
    """ResNet-50 step rows timed beside the published step in the same call (the others compare across machines)."""
    return [(rec, r) for rec in records
            if rec.data.get("published_same_call") and rec.data.get("meta", {}).get("suite", "resnet50") == "resnet50"
            for r in rec.data.get("rows", [])
            if "error" not in r and (r.get("published") or {}).get("source") == "same call"]


def row_changes(rec: Record, row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A step row's setting and the config values it was run with beyond it: its variant (`--vary`, written after the
    setting's name) and its record's `--override`s, each value as the command line gave it, parsed as YAML."""
    base, *variant = str(row.get("setting", "")).split()
    pairs = [*variant, *((rec.data.get("meta") or {}).get("overrides") or [])]
    return base, {key.lstrip("+"): yaml.safe_load(value) for key, _, value in (p.partition("=") for p in pairs)}


@functools.cache
def shipped_config(method: str) -> Any:
    """The ImageNet recipe's config as shipped for `method`: what a row's changed values are compared with."""
    from hydra import compose, initialize_config_dir

    from scfs.names import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["+experiment=imagenet", f"method={method}"],
                       return_hydra_config=True)


def runs_as(method: str, changed: dict[str, Any], want: dict[str, Any] | None = None) -> bool:
    """Whether a row of `method` run with the `changed` values ran the recipe as shipped but for `want`: a value
    it changed to what the recipe ships anyway does not make it a variant (`--vary` lists the shipped value too)."""
    from omegaconf import OmegaConf

    want = want or {}
    cfg = shipped_config(method)

    def value(key: str) -> Any:
        choices = cfg.hydra.runtime.choices  # a config group (`search=none`) is named by the choice, not its node
        if key in choices:
            return choices[key]
        found = OmegaConf.select(cfg, key, default=_ABSENT)
        return OmegaConf.to_container(found) if OmegaConf.is_config(found) else found

    return (all(changed.get(k, value(k)) == v for k, v in want.items())
            and all(v == value(k) for k, v in changed.items() if k not in want))


def command_overrides(command: Any) -> frozenset[str]:
    """The `--override`s a benchmark's recorded command gave."""
    return frozenset(re.findall(r"--override\s+(\S+)", str(command or "")))


def cold_start(meta: dict, parallel: dict, row: dict | None = None) -> bool:
    """Whether an e2e run's first step compiled from an empty cache: as its record says (the run's own
    `compile_cache`, else the record's `meta.compile_cache`: its first run's), or, in a record from before that was
    kept, where the student's forward compile missed the cache."""
    said = ((row or {}).get("compile_cache") or {}).get("empty_at_start")
    if said is None:
        said = (meta.get("compile_cache") or {}).get("empty_at_start")
    if said is not None:
        return bool(said)
    return not any(c.get("graph") == "student_forward" and c.get("inductor_cache") == "hit"
                   for c in parallel.get("compiles") or [])


def targets(records_dir: Path) -> list[Target]:
    """Every target with its measurements from the records in `records_dir`."""
    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    def secs_within(limit: float) -> Callable[[float], str]:
        """Seconds in tenths, in hundredths where tenths would round a value onto `limit` or a miss to nothing."""
        return lambda v: f"{v:.2f} s" if round(v, 1) in (limit, 0.0) and v not in (limit, 0.0) else f"{v:.1f} s"

    def times(v: float) -> str:
        return f"{v:.2f}x"

    e2e = Target(f"`+experiment=imagenet` end to end >= {E2E_TARGET:.0%} of the step benchmark, B=64, real JPEGs "
                 "(the recipe as shipped)", E2E_TARGET, True, pct, lambda v: f"{100 * v:.1f} points")
    # the recipe's own batch, and the training command's own first step: what a user of the recipe meets
    at_recipe_batch = Target(f"`+experiment=imagenet` end to end >= {E2E_TARGET:.0%} of the step benchmark in the "
                             f"same call, B={RECIPE_BATCH} (the recipe's batch), real JPEGs (the recipe as shipped)",
                             E2E_TARGET, True, pct, lambda v: f"{100 * v:.1f} points")
    first_step = Target(f"{RECIPES['imagenet']}: the training command's own first step, empty cache, as shipped "
                        f"(`scfs.bench.e2e`: real JPEGs, B={RECIPE_BATCH}, its loader workers beside the compile; one "
                        f"step, where the compile benchmark's rows below time three), <= {COMPILE_S:.0f} s", COMPILE_S,
                        False, secs_within(COMPILE_S))
    short_first_step = Target(f"{RECIPES['imagenet']}: the training command's own first step, empty cache, the "
                              "short-run choices (`compile_student_graphs=per_view_size compile_autotune_ms=5`; "
                              f"`scfs.bench.e2e` as above), <= {COMPILE_S:.0f} s", COMPILE_S, False,
                              secs_within(COMPILE_S))
    for rec in load(records_dir.glob("imagenet-e2e-*.json")):
        meta = rec.data.get("meta") or {}
        overrides = command_overrides(meta.get("command"))
        if overrides and overrides != SHORT_RUN:  # not the recipe as shipped, nor the short-run choices
            continue
        for row in rec.data.get("rows", []):
            if row.get("decode") != "cpu":
                continue
            par = (row.get("compile") or {}).get("compile_parallel") or {}
            first = par.get("first_step_s")
            if first is not None and row.get("B") == RECIPE_BATCH and cold_start(meta, par, row):
                (short_first_step if overrides else first_step).measured.append(
                    (rec.date, first, with_host(rec.name, meta.get("host"))))
            if overrides:  # the short-run choices: their first step only
                continue
            ratio = (row.get("compare") or {}).get("ratio")
            if ratio is not None and row.get("B") == 64 and "compile_views=false" not in row.get("command", ""):
                e2e.measured.append((rec.date, ratio, rec.name))
            if ratio is not None and row.get("B") == RECIPE_BATCH:
                at_recipe_batch.measured.append((rec.date, ratio, rec.name))
    out = [e2e, at_recipe_batch, first_step, short_first_step]

    gpu_compiles = [rec for rec in load(records_dir.glob("compile-*.json"))
                    if str(rec.data.get("device", "")).startswith("cuda") and not rec.data.get("tiny")]
    # a record made with `--override`s measured another config than its rows' names say: it counts only in a row of
    # its own (below), never as the recipe as shipped
    compiles = [rec for rec in gpu_compiles if not command_overrides(rec.data.get("command"))]
    # the recipes ship both helpers (`compile_parallel=auto` on a GPU machine) and the cuDNN warm-up
    # (`compile_cudnn_warmup=auto`): the `parallel-backward-cudnn-warmup` row
    for setting, label, limit in (("parallel-backward-cudnn-warmup", "first compile, empty cache, as shipped (both "
                                   "helpers: `compile_parallel=true` and `compile_parallel_backward=true`; "
                                   "`compile_cudnn_warmup=auto`)", COMPILE_S),
                                  ("parallel-backward-cudnn-warmup-compile-tune", "first compile, empty cache, as "
                                   "shipped and Triton's launch configs tuned at compile time "
                                   "(`compile_inductor.triton.autotune_at_compile_time=true`)", COMPILE_S),
                                  ("parallel-backward-cudnn-warmup-quick-tune", "first compile, empty cache, as "
                                   "shipped and 5 ms of launch-config benchmarks per candidate "
                                   "(`compile_autotune_ms=5`)", COMPILE_S),
                                  ("parallel-split-cudnn-warmup-quick-tune", "first compile, empty cache, the "
                                   "short-run choices: four helpers (`compile_student_graphs=per_view_size`), "
                                   "`compile_cudnn_warmup=auto` and `compile_autotune_ms=5`", COMPILE_S),
                                  ("parallel-backward-cudnn-warmup-threads", "first compile, empty cache, as "
                                   "shipped and a third of the host's cores for each process's compile workers "
                                   "(`compile_inductor.compile_threads`)", COMPILE_S),
                                  ("parallel-backward", "first compile, empty cache, both helpers, "
                                                        "`compile_cudnn_warmup=false`", COMPILE_S),
                                  ("parallel-backward-lean", "first compile, empty cache, both helpers, "
                                                             "`compile_cudnn_warmup=false` and `compile_inductor=lean`",
                                   COMPILE_S),
                                  ("parallel-split", "first compile, empty cache, four helpers "
                                                     "(`compile_student_graphs=per_view_size`), "
                                                     "`compile_cudnn_warmup=false`", COMPILE_S),
                                  ("parallel-split-lean", "first compile, empty cache, four helpers "
                                                          "(`compile_student_graphs=per_view_size`), "
                                                          "`compile_cudnn_warmup=false` and `compile_inductor=lean`",
                                   COMPILE_S),
                                  ("parallel-split-cudnn-warmup", "first compile, empty cache, four helpers "
                                                                  "(`compile_student_graphs=per_view_size`) and "
                                                                  "`compile_cudnn_warmup=auto`", COMPILE_S),
                                  ("split", "first compile, empty cache, no helper, "
                                            "`compile_student_graphs=per_view_size`", COMPILE_S),
                                  ("cudnn-warmup", "first compile, empty cache, no helper, "
                                                   "`compile_cudnn_warmup=auto`", COMPILE_S),
                                  ("cold", "first compile, empty cache, no helper", COMPILE_S),
                                  ("parallel", "first compile, empty cache, `compile_parallel=true` alone", COMPILE_S),
                                  ("lean", "first compile, empty cache, no helper, `compile_inductor=lean`", COMPILE_S),
                                  ("parallel-lean", "first compile, empty cache, `compile_parallel=true` alone and "
                                                    "`compile_inductor=lean`", COMPILE_S),
                                  ("carried", "first compile with a carried `compile_artifacts` file", COMPILE_S),
                                  ("warm", "second run, cache warm", SECOND_RUN_S)):
        for recipe, title in RECIPES.items():
            t = Target(f"{title}: {label}, <= {limit:.0f} s (the first 3 steps)", limit, False,
                       secs_within(limit))
            t.measured = [(rec.date, row["first_s"], with_host(compile_source(rec.name, row), rec.data.get("host")))
                          for rec in compiles
                          for row in rec.data.get("table", [])
                          if row.get("recipe") == recipe and row.get("setting") == setting and row.get("first_s")]
            out.append(t)

    changed: dict[tuple[str, frozenset[str]], list[tuple[str, float, str]]] = {}
    for rec in gpu_compiles:
        overrides = command_overrides(rec.data.get("command"))
        for row in rec.data.get("table", []) if overrides else []:
            if row.get("setting") == "parallel-backward-cudnn-warmup" and row.get("first_s"):
                changed.setdefault((row.get("recipe"), overrides), []).append(
                    (rec.date, row["first_s"], with_host(compile_source(rec.name, row), rec.data.get("host"))))
    for (recipe, overrides), measured in sorted(changed.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        title = RECIPES.get(recipe, recipe)
        t = Target(f"{title}: first compile, empty cache, as shipped but `{' '.join(sorted(overrides))}`, <= "
                   f"{COMPILE_S:.0f} s (the first 3 steps)", COMPILE_S, False, secs_within(COMPILE_S))
        t.measured = measured
        out.append(t)

    for key, label in (("first_s", "`compile_background=true`: the first (eager) step, empty cache"),
                       ("lost_s", "`compile_background=true`: what the compile costs the run against a step compiled "
                                  "from step 0")):
        for recipe, title in RECIPES.items():
            t = Target(f"{title}: {label}, <= {COMPILE_S:.0f} s", COMPILE_S, False, secs_within(COMPILE_S))
            t.measured = [(rec.date, row[key], rec.name) for rec in compiles for row in rec.data.get("table", [])
                          if row.get("recipe") == recipe and row.get("setting") == "background" and row.get(key)]
            out.append(t)

    steps = step_rows(load(records_dir.glob("step-*.json")))

    def rows(method: str, setting: str, batch: int, want: dict[str, Any] | None = None,
             rec: Record | None = None) -> list[tuple[Record, dict[str, Any]]]:
        """`method`'s rows at `setting` and `batch` that ran the recipe as shipped but for `want`, in `rec` alone
        where given."""
        found = []
        for r_rec, r in steps:
            base, changed = row_changes(r_rec, r)
            if (r["method"] == method and base == setting and r["B"] == batch and (rec is None or r_rec is rec)
                    and runs_as(method, changed, want)):
                found.append((r_rec, r))
        return found

    def scfs(setting: str, batch: int, want: dict[str, Any] | None = None) -> list[tuple[Record, dict[str, Any]]]:
        return rows("scfs", setting, batch, want)

    for batch in (32, 64):
        t = Target(f"default path >= {SPEEDUP:.1f}x the published step in the same call, B={batch}", SPEEDUP, True,
                   times)
        t.measured = [(rec.date, r["img_per_s"] / r["published"]["img_per_s"], rec.name)
                      for rec, r in scfs(DEFAULT_PATH, batch)]
        out.append(t)
    head = " ".join(f"{k}={str(v).lower()}" for k, v in PUBLISHED_HEAD.items())
    for batch in (32, 64):
        t = Target(f"default path with the published step's stage head (`{head}`: about the published step's work "
                   f"per image) >= {SPEEDUP:.1f}x the published step in the same call, B={batch}", SPEEDUP, True,
                   times)
        t.measured = [(rec.date, r["img_per_s"] / r["published"]["img_per_s"], rec.name)
                      for rec, r in scfs(DEFAULT_PATH, batch, PUBLISHED_HEAD)]
        out.append(t)
    for batch in (32, 64):
        t = Target(f"SCFS / DINO step time <= {SCFS_OVER_DINO:.2f}, default path, B={batch}", SCFS_OVER_DINO, False,
                   lambda v: f"{v:.2f}")
        t.measured = [(rec.date, s["step_ms"] / d["step_ms"], rec.name) for rec, s in scfs(DEFAULT_PATH, batch)
                      for _, d in rows("dino", DEFAULT_PATH, batch, rec=rec)]
        out.append(t)
    for batch in (32, 64):  # the published step pays 1.28-1.52 at its own head: ours with that head, for comparison
        t = Target(f"SCFS / DINO step time, default path with the published step's stage head (`{head}`), B={batch}",
                   None, False, lambda v: f"{v:.2f}")
        t.measured = [(rec.date, s["step_ms"] / d["step_ms"], rec.name)
                      for rec, s in scfs(DEFAULT_PATH, batch, PUBLISHED_HEAD)
                      for _, d in rows("dino", DEFAULT_PATH, batch, rec=rec)]
        out.append(t)
    for batch in (32, 64):
        t = Target(f"eager (`compile=false`) >= the published step in the same call, B={batch}", 1.0, True, times)
        t.measured = [(rec.date, r["img_per_s"] / r["published"]["img_per_s"], rec.name)
                      for rec, r in scfs(EAGER, batch)]
        out.append(t)
    ceiling = Target(f"share of the backbone-bound limit (about {CEILING_IMG_S:,.0f} img/s), default path, B=64",
                     None, True, pct)
    ceiling.measured = [(rec.date, r["img_per_s"] / CEILING_IMG_S, rec.name) for rec, r in scfs(DEFAULT_PATH, 64)]
    return [*out, ceiling]


def compile_source(name: str, row: dict[str, Any]) -> str:
    """A compile measurement's record, and whether its steps made the views as a run does (`compile_views`, the
    `imagenet` recipe; the rows say so from `5c6835f`): an older row of that recipe left the views' compile out."""
    return f"{name}, views' compile included" if row.get("views") else name


def with_host(source: str, host: dict[str, Any] | None) -> str:
    """A first-compile measurement's source with its host's Python yardstick (`scfs.bench.host`), where the record
    has one: a compile is mostly Python, so the same row reads tens of seconds apart on hosts of unequal CPUs."""
    tag = host_tag(host)
    return f"{source}, {tag}" if tag else source


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# Speed targets of the ImageNet recipe, {result['date']}", "",
             f"Commit `{result['commit']}`; `{result['command']}`. Every measurement of each target in the records "
             f"(`{result['records']}`), one per record and row, with its record's file name; the verdict is over the "
             "newest day's measurements (a target is met when each of them meets it), older days are the history. "
             "The step's targets count only rows timed beside the published step in the same call.", "",
             "| target | newest day's measurements | verdict | earlier days |", "|---|---|---|---|"]
    for t in result["targets"]:
        def cell(ms: list[list[Any]]) -> str:
            return "; ".join(f"{value} ({name}, {day})" for day, value, name in ms) or "–"
        lines.append(f"| {t['name']} | {cell(t['current'])} | {t['verdict']} | {cell(t['earlier'])} |")
    return "\n".join(lines) + "\n"


def run(records_dir: Path, out: Path, command: str) -> dict[str, Any]:
    """Read the records, write the table (`<out>.json`, `<out>.md`)."""
    rows = []
    for t in targets(records_dir):
        now = t.current()
        rows.append({"name": t.name, "verdict": t.verdict(),
                     "current": [(d, t.show(v), n) for d, v, n in now],
                     "earlier": [(d, t.show(v), n) for d, v, n in sorted(t.measured) if (d, v, n) not in now]})
    result = {"date": dt.date.today().isoformat(), "commit": source_commit(), "command": command,
              "records": str(records_dir), "targets": rows}
    save_record(result, out, markdown)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=Path("benchmarks/results"), help="the folder of JSON records")
    p.add_argument("--out", type=Path, default=None,
                   help="record stem (default: <records>/speed-targets-<date>; .json and .md are written)")
    args = p.parse_args(argv)
    if not args.records.is_dir():
        raise SystemExit(f"scfs.bench.targets: no folder {args.records}; pass --records <folder of JSON records>")
    out = args.out or args.records / f"speed-targets-{dt.date.today().isoformat()}"
    given = sys.argv[1:] if argv is None else argv
    result = run(args.records, out, " ".join(["python -m scfs.bench.targets", *given]))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

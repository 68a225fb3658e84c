"""`scfs.bench.targets`: one table of the speed targets from the records, verdicts over the newest day."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scfs.bench import targets as tg

REPO = Path(__file__).resolve().parents[2]


def _write(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data))


def _e2e(ratio: float, date: str, command: str = "python -m scfs.train +experiment=imagenet") -> dict:
    return {"meta": {"date": date}, "rows": [{"B": 64, "decode": "cpu", "command": command,
                                              "compare": {"ratio": ratio}}]}


def _step_row(method: str, setting: str, b: int, ms: float, published: float | None) -> dict:
    row = {"method": method, "setting": setting, "B": b, "step_ms": ms, "img_per_s": 1e3 * b / ms}
    if published is not None:
        row["published"] = {"img_per_s": published, "source": "same call"}
    return row


def _compile(date: str, rows: list[tuple[str, str, float]], device: str = "cuda") -> dict:
    return {"date": date, "device": device, "tiny": False,
            "table": [{"recipe": r, "setting": s, "first_s": v, "lost_s": v} for r, s, v in rows]}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    _write(d, "imagenet-e2e-h200-2026-01-01-a.json", _e2e(0.90, "2026-01-01"))
    _write(d, "imagenet-e2e-h200-2026-01-02-b.json", _e2e(0.97, "2026-01-02"))
    # a variant run (not the recipe as shipped) on the newest day: not a measurement of the target
    _write(d, "imagenet-e2e-h200-2026-01-03-c.json", _e2e(0.5, "2026-01-03", "... compile_views=false"))
    _write(d, "compile-h200-2026-01-02-x.json", _compile("2026-01-02", [("cifar10", "cold", 50.0),
                                                                        ("cifar10", "warm", 12.0)]))
    _write(d, "compile-h200-2026-01-02-y.json", _compile("2026-01-02", [("cifar10", "cold", 90.0),
                                                                        ("imagenet", "cold", 130.0),
                                                                        ("imagenet", "lean", 100.0),
                                                                        ("imagenet", "parallel-split", 55.0),
                                                                        ("imagenet", "parallel-backward", 106.0),
                                                                        ("imagenet", "parallel-backward-cudnn-warmup",
                                                                         98.0)]))
    _write(d, "compile-cpu-2026-01-05-z.json", _compile("2026-01-05", [("cifar10", "cold", 1.0)], device="cpu"))
    _write(d, "step-h200-2026-01-02-same-call.json", {
        "meta": {"suite": "resnet50", "date": "2026-01-02"}, "published_same_call": {"rows": []},
        "rows": [_step_row("scfs", "bf16_cl_graphs", 64, 64.0, 450.0), _step_row("dino", "bf16_cl_graphs", 64, 50.0,
                                                                                 630.0),
                 _step_row("scfs", "bf16_cl", 64, 100.0, 700.0)]})
    # a DINO row in another record (another machine) is not paired with that record's SCFS row
    _write(d, "step-h200-2026-01-02-other.json", {
        "meta": {"suite": "resnet50", "date": "2026-01-02"}, "published_same_call": {"rows": []},
        "rows": [_step_row("dino", "bf16_cl_graphs", 32, 10.0, 100.0)]})
    # without the published step in the same call: across machines, not counted
    _write(d, "step-h200-2026-01-04-alone.json", {"meta": {"suite": "resnet50", "date": "2026-01-04"},
                                                  "rows": [_step_row("scfs", "bf16_cl_graphs", 32, 1.0, None)]})
    (d / "step-h200-broken.json").write_text("{not json")
    return d


def _find(ts: list[tg.Target], *words: str) -> tg.Target:
    (hit,) = [t for t in ts if all(w in t.name for w in words)]
    return hit


def test_verdicts_over_the_newest_day(records: Path) -> None:
    ts = tg.targets(records)
    e2e = _find(ts, "end to end", "B=64")
    assert [v for _, v, _ in e2e.current()] == [0.97] and e2e.verdict() == "**met**"
    cold = _find(ts, "CIFAR-10", "first compile, empty cache, no helper, <=")
    assert sorted(v for _, v, _ in cold.current()) == [50.0, 90.0]  # the CPU record is not a GPU compile
    assert cold.verdict() == "**mixed**: met by 1 of 2, the others missed by 30.0 s"
    assert _find(ts, "ResNet-50", "first compile, empty cache, no helper, <=").verdict() == "**missed** by 70.0 s"
    assert _find(ts, "ResNet-50", "no helper, `compile_inductor=lean`, <=").verdict() == "**missed** by 40.0 s"
    assert _find(ts, "ResNet-50", "`compile_parallel=true` alone and `compile_inductor").verdict() == "not measured"
    assert _find(ts, "CIFAR-10", "as shipped (both helpers").verdict() == "not measured"
    # the recipes ship the cuDNN warm-up: its row is the recipe as shipped, the row without it is not
    assert _find(ts, "ResNet-50", "as shipped (both helpers").verdict() == "**missed** by 38.0 s"
    assert _find(ts, "ResNet-50", "both helpers, `compile_cudnn_warmup=false`, <=").verdict() == "**missed** by 46.0 s"
    assert _find(ts, "CIFAR-10", "second run").verdict() == "**met**"
    assert _find(ts, "CIFAR-10", "carried").verdict() == "not measured"
    assert _find(ts, "ResNet-50", "per_view_size`), `compile_cudnn_warmup=false`, <=").verdict() == "**met**"
    assert _find(ts, "ResNet-50", "per_view_size`), `compile_cudnn_warmup=false` and `compile_inductor") \
        .verdict() == "not measured"
    assert _find(ts, "ResNet-50", "no helper, `compile_student_graphs").verdict() == "not measured"


def test_a_compile_row_that_made_the_views_says_so(records: Path) -> None:
    """A compile row whose steps made the views as a run does (`views`, the `imagenet` recipe from `5c6835f`) is
    named with that; an older row without the views' compile is named as before."""
    data = _compile("2026-01-06", [("imagenet", "cold", 140.0)])
    data["table"][0]["views"] = "run"
    _write(records, "compile-h200-2026-01-06-v.json", data)
    cold = _find(tg.targets(records), "ResNet-50", "first compile, empty cache, no helper, <=")
    assert cold.current() == [("2026-01-06", 140.0, "compile-h200-2026-01-06-v.json, views' compile included")]
    assert ("2026-01-02", 130.0, "compile-h200-2026-01-02-y.json") in cold.measured


def test_a_first_compile_names_its_hosts_python_yardstick(records: Path) -> None:
    """A compile record and an end-to-end record that measured their host (`scfs.bench.host`) give its Python
    yardstick beside each first-compile measurement: the same row reads tens of seconds apart across hosts."""
    host = {"cpu": "Stand-in CPU", "cores": 16, "python_ms": 24.31, "us_per_op": 2.0, "op_device": "cpu"}
    data = _compile("2026-01-06", [("imagenet", "cold", 140.0)])
    data["host"] = host
    _write(records, "compile-h200-2026-01-06-h.json", data)
    e2e = {"meta": {"date": "2026-01-06", "host": host, "compile_cache": {"dir": "/c", "empty_at_start": True}},
           "rows": [{"B": 256, "decode": "cpu", "command": "c", "compile": {"compile_parallel": {
               "first_step_s": 70.0, "fx_cache": "0 hit / 5 miss"}}}]}
    _write(records, "imagenet-e2e-h100-2026-01-06-h.json", e2e)
    ts = tg.targets(records)
    cold = _find(ts, "ResNet-50", "first compile, empty cache, no helper, <=")
    assert cold.current() == [("2026-01-06", 140.0, "compile-h200-2026-01-06-h.json, host Python 24.3 ms")]
    assert ("2026-01-02", 130.0, "compile-h200-2026-01-02-y.json") in cold.measured  # no host: as before
    first = _find(ts, "the training command's own first step", "as shipped")
    assert first.current() == [("2026-01-06", 70.0, "imagenet-e2e-h100-2026-01-06-h.json, host Python 24.3 ms")]


def test_step_targets_only_from_same_call_rows(records: Path) -> None:
    ts = tg.targets(records)
    speed64 = _find(ts, "default path >=", "B=64")
    assert speed64.current()[0][1] == pytest.approx(1e3 * 64 / 64.0 / 450.0)
    assert speed64.verdict() == "**met**"
    # the B=32 row had no published step beside it
    assert _find(ts, "default path >=", "B=32").verdict() == "not measured"
    ratio = _find(ts, "SCFS / DINO step time <=", "B=64")
    assert ratio.current()[0][1] == pytest.approx(64.0 / 50.0)
    assert ratio.verdict() == "**missed** by 0.18"
    # no SCFS row in the DINO row's record
    assert _find(ts, "SCFS / DINO step time <=", "B=32").verdict() == "not measured"
    eager = _find(ts, "eager", "B=64")
    assert eager.current()[0][1] == pytest.approx(640.0 / 700.0) and eager.verdict() == "**missed** by 0.09x"
    assert _find(ts, "backbone-bound").verdict() == "reported"


def test_the_record_lists_the_history_and_the_cli_writes_both_files(records: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "speed-targets"
    assert tg.main(["--records", str(records), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    e2e = next(t for t in data["targets"] if "end to end" in t["name"])
    assert e2e["current"] == [["2026-01-02", "97.0 %", "imagenet-e2e-h200-2026-01-02-b.json"]]
    assert e2e["earlier"] == [["2026-01-01", "90.0 %", "imagenet-e2e-h200-2026-01-01-a.json"]]
    md = out.with_suffix(".md").read_text()
    assert "| 90.0 % (imagenet-e2e-h200-2026-01-01-a.json, 2026-01-01) |" in md
    assert md.count("\n| ") == len(data["targets"]) + 1  # the header and one line per target


def test_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no folder .*; pass --records"):
        tg.main(["--records", str(tmp_path / "nope")])


def test_the_committed_table_is_what_the_committed_records_give(tmp_path: Path) -> None:
    """The committed speed-targets record is regenerated whenever a record it reads is added: its table lines
    equal a fresh run's on the committed records."""
    committed = sorted((REPO / "benchmarks" / "results").glob("speed-targets-*.md"))
    assert committed, "no speed-targets record: run python -m scfs.bench.targets"
    fresh = tg.run(REPO / "benchmarks" / "results", tmp_path / "t", "test")
    table = [ln for ln in tg.markdown(fresh).splitlines() if ln.startswith("| ")]
    assert [ln for ln in committed[-1].read_text().splitlines() if ln.startswith("| ")] == table, \
        "run python -m scfs.bench.targets and commit its record"


def test_a_miss_that_tenths_would_round_away_reads_in_hundredths(tmp_path: Path) -> None:
    """60.05 s against a 60 s limit reads 60.05 s, missed by 0.05 s (in tenths: 60.0 s, missed by 0.0 s)."""
    d = tmp_path / "results"
    d.mkdir()
    _write(d, "compile-h200-2026-01-02-x.json", _compile("2026-01-02", [("cifar10", "cold", 60.05),
                                                                        ("imagenet", "cold", 71.23)]))
    ts = tg.targets(d)
    cifar = _find(ts, "CIFAR-10", "first compile, empty cache, no helper, <=")
    assert cifar.verdict() == "**missed** by 0.05 s" and cifar.show(60.05) == "60.05 s"
    assert _find(ts, "ResNet-50", "first compile, empty cache, no helper, <=").verdict() == "**missed** by 11.2 s"


def test_the_recipes_batch_and_the_commands_first_step_come_from_its_e2e_records(tmp_path: Path) -> None:
    """The end-to-end ratio at the recipe's batch and the real run's first step are read from the B=256 e2e rows
    of the recipe as shipped: a row with an `--override` and the B=64 rows are not measurements of them, and the B=64
    target takes no row with an `--override` either; a run whose compile cache was not empty is no first step's."""
    d = tmp_path / "results"
    d.mkdir()

    def e2e(date: str, ratio: float | None, first: float | None, b: int = 256, command: str = "bench.e2e") -> dict:
        row = {"B": b, "decode": "cpu", "command": "python -m scfs.train +experiment=imagenet",
               "compile": {"compile_parallel": {"first_step_s": first}}}
        if ratio is not None:
            row["compare"] = {"ratio": ratio}
        return {"meta": {"date": date, "command": command}, "rows": [row]}

    _write(d, "imagenet-e2e-h100-2026-01-01-a.json", e2e("2026-01-01", None, 93.2))
    _write(d, "imagenet-e2e-h100-2026-01-02-b.json", e2e("2026-01-02", 0.967, 69.0))
    _write(d, "imagenet-e2e-h100-2026-01-02-c.json", e2e("2026-01-02", 0.5, 300.0, command="--override compile=false"))
    _write(d, "imagenet-e2e-h100-2026-01-02-d.json", e2e("2026-01-02", 0.2, 40.0, b=64))
    _write(d, "imagenet-e2e-h100-2026-01-02-e.json",
           e2e("2026-01-02", 0.9, 30.0, b=64, command="--override compile_autotune_ms=5"))
    warm = e2e("2026-01-02", 0.97, 14.0)
    warm["meta"]["compile_cache"] = {"dir": "/c", "empty_at_start": False}  # a second run: not a cold first step
    _write(d, "imagenet-e2e-h100-2026-01-02-f.json", warm)
    older_warm = e2e("2026-01-02", None, 15.0)  # no cache state kept, but its student's forward came from the cache
    older_warm["rows"][0]["compile"]["compile_parallel"]["compiles"] = [{"graph": "student_forward",
                                                                         "inductor_cache": "hit"}]
    _write(d, "imagenet-e2e-h100-2026-01-02-g.json", older_warm)
    ts = tg.targets(d)
    at_batch = _find(ts, "end to end", "B=256")
    assert [v for _, v, _ in at_batch.current()] == [0.967, 0.97] and at_batch.verdict() == "**met** (all 2)"
    first = _find(ts, "the training command's own first step", "as shipped")
    assert [v for _, v, _ in first.current()] == [69.0] and first.verdict() == "**missed** by 9.0 s"
    assert [v for _, v, _ in first.measured] == [93.2, 69.0]
    assert [v for _, v, _ in _find(ts, "end to end", "B=64").measured] == [0.2]


def test_the_commands_first_step_with_the_short_run_choices_is_a_row_of_its_own(tmp_path: Path) -> None:
    """A cold B=256 e2e run with exactly the short-run choices as its `--override`s measures the short-run row, in
    either order; with another override beside them, at another batch or with a warm cache it measures nothing."""
    d = tmp_path / "results"
    d.mkdir()

    def e2e(date: str, first: float, command: str, b: int = 256, empty: bool = True) -> dict:
        row = {"B": b, "decode": "cpu", "command": "python -m scfs.train +experiment=imagenet",
               "compile": {"compile_parallel": {"first_step_s": first}}, "compare": {"ratio": 0.93}}
        return {"meta": {"date": date, "command": command, "compile_cache": {"empty_at_start": empty}},
                "rows": [row]}

    short = "--override compile_student_graphs=per_view_size --override compile_autotune_ms=5"
    swapped = "--override compile_autotune_ms=5 --override compile_student_graphs=per_view_size"
    _write(d, "imagenet-e2e-h100-2026-01-01-a.json", e2e("2026-01-01", 66.2, short))
    _write(d, "imagenet-e2e-h100-2026-01-02-b.json", e2e("2026-01-02", 74.1, "--fresh-cache " + short))
    _write(d, "imagenet-e2e-h100-2026-01-02-c.json", e2e("2026-01-02", 58.0, swapped))
    _write(d, "imagenet-e2e-h100-2026-01-02-d.json", e2e("2026-01-02", 10.0, short + " --override compile=false"))
    _write(d, "imagenet-e2e-h100-2026-01-02-e.json", e2e("2026-01-02", 11.0, short, b=64))
    _write(d, "imagenet-e2e-h100-2026-01-02-f.json", e2e("2026-01-02", 12.0, short, empty=False))
    _write(d, "imagenet-e2e-h100-2026-01-02-g.json", e2e("2026-01-02", 61.0, "--fresh-cache"))
    ts = tg.targets(d)
    quick = _find(ts, "the training command's own first step", "short-run choices")
    assert [v for _, v, _ in quick.measured] == [66.2, 74.1, 58.0]
    assert quick.verdict() == "**mixed**: met by 1 of 2, the others missed by 14.1 s"
    shipped = _find(ts, "the training command's own first step", "as shipped")
    assert [v for _, v, _ in shipped.measured] == [61.0]


def test_a_variant_counts_where_its_values_are_what_the_target_names(tmp_path: Path) -> None:
    """`--vary` rows: one whose values are the recipe's shipped ones is the default path; the published step's stage
    head (width 256, ReLU after the sum) is a target of its own; any other variant, or a record-level `--override`
    the recipe does not ship, is neither."""
    d = tmp_path / "results"
    d.mkdir()
    same_call = {"rows": []}
    shipped = "bf16_cl_graphs method.stage_branch_channels=null method.stage_final_relu=false"
    wide = "bf16_cl_graphs method.stage_branch_channels=256 method.stage_final_relu=false"
    published = "bf16_cl_graphs method.stage_branch_channels=256 method.stage_final_relu=true"
    _write(d, "step-h100-2026-02-01-heads.json", {
        "meta": {"suite": "resnet50", "date": "2026-02-01", "overrides": []}, "published_same_call": same_call,
        "rows": [_step_row("scfs", shipped, 64, 70.0, 400.0), _step_row("scfs", wide, 64, 75.0, 400.0),
                 _step_row("scfs", published, 64, 80.0, 400.0), _step_row("dino", "bf16_cl_graphs", 64, 56.0, 550.0)]})
    _write(d, "step-h100-2026-02-01-other-cache.json", {
        "meta": {"suite": "resnet50", "date": "2026-02-01", "overrides": ["compile_cache=/tmp/x"]},
        "published_same_call": same_call, "rows": [_step_row("scfs", "bf16_cl_graphs", 64, 1.0, 400.0)]})
    ts = tg.targets(d)
    default = _find(ts, "default path >=", "B=64")
    assert [(v, n) for _, v, n in default.current()] == [
        (pytest.approx(1e3 * 64 / 70.0 / 400.0), "step-h100-2026-02-01-heads.json")]
    head = _find(ts, "2.0x", "stage head", "B=64")
    assert [v for _, v, _ in head.current()] == [pytest.approx(1e3 * 64 / 80.0 / 400.0)]
    assert head.verdict() == "**met**" and _find(ts, "2.0x", "stage head", "B=32").verdict() == \
        "not measured"
    assert [v for _, v, _ in _find(ts, "SCFS / DINO step time <=", "B=64").current()] == [pytest.approx(70.0 / 56.0)]
    with_head = _find(ts, "SCFS / DINO", "stage head", "B=64")
    assert [v for _, v, _ in with_head.current()] == [pytest.approx(80.0 / 56.0)] and with_head.verdict() == "reported"


def test_a_rows_changes_are_its_variant_and_its_records_overrides() -> None:
    rec = tg.Record("r.json", "2026-02-01", {"meta": {"overrides": ["++method.stage_pooled_bn=false"]}})
    base, changed = tg.row_changes(rec, {"setting": "bf16_cl_graphs method.stage_branch_channels=null x={}"})
    assert base == "bf16_cl_graphs"
    assert changed == {"method.stage_branch_channels": None, "x": {}, "method.stage_pooled_bn": False}
    assert tg.runs_as("scfs", {"method.stage_branch_channels": None, "compile": True})
    assert not tg.runs_as("scfs", {"method.stage_pooled_bn": False})
    assert not tg.runs_as("scfs", {"no.such.key": 1})
    assert tg.runs_as("scfs", {"search": "soft"}) and not tg.runs_as("scfs", {"search": "none"})  # a config group
    assert tg.runs_as("scfs", {"method.stage_branch_channels": 256, "method.stage_final_relu": True},
                      tg.PUBLISHED_HEAD)
    assert not tg.runs_as("scfs", {"method.stage_branch_channels": 256}, tg.PUBLISHED_HEAD)  # no ReLU: not it


def test_a_compile_record_with_overrides_counts_only_in_a_row_of_its_own(tmp_path: Path) -> None:
    d = tmp_path / "results"
    d.mkdir()
    _write(d, "compile-h100-2026-03-01-a.json", _compile("2026-03-01", [("imagenet", "parallel-backward-cudnn-warmup",
                                                                         70.0)]))
    changed = _compile("2026-03-01", [("imagenet", "parallel-backward-cudnn-warmup", 58.0)])
    changed["command"] = "python -m scfs.bench.compile --recipe imagenet --override method.stage_pooled_bn=false"
    _write(d, "compile-h100-2026-03-01-b.json", changed)
    ts = tg.targets(d)
    shipped = _find(ts, "ResNet-50", "first compile, empty cache, as shipped (both helpers")
    assert [v for _, v, _ in shipped.current()] == [70.0] and shipped.verdict() == "**missed** by 10.0 s"
    own = _find(ts, "ResNet-50", "as shipped but `method.stage_pooled_bn=false`")
    assert [v for _, v, _ in own.current()] == [58.0] and own.verdict() == "**met**"

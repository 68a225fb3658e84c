"""Benchmark records -> tables and figures; no record (or a broken one) is not an error."""

import json

from scfs.viz.bench import bench_figure, bench_table, load_bench_results, markdown_table


def _record(path):
    rows = []
    for stage in ("layer2", "layer4"):
        for dtype in ("float32", "bfloat16"):
            for pass_ in ("fwd", "fwd+bwd"):
                rows.append({"stage": stage, "shape": "8x4x4", "B": 32, "dtype": dtype, "proj": 0, "pass_": pass_,
                             "floor_bytes": 1000, "floor_ms": 0.01, "impls": {
                                 "ref": {"ms": 0.5, "GBps": 2.0, "pct_copy": 10.0, "peak_MiB": 1.0, "correct": True},
                                 "cuda": {"ms": 0.1, "GBps": 10.0, "pct_copy": 50.0, "peak_MiB": 1.0, "correct": True},
                                 "triton": {"error": "RuntimeError: no GPU"}}})
    path.write_text(json.dumps({"meta": {"gpu": "Test GPU", "date": "2026-01-01", "copy_bw_TBps": 1.0, "n_crops": 8},
                                "rows": rows, "fast_p": {"cuda_fast_1_vs_ref": 1.0}}))


def test_no_records_is_an_empty_list(tmp_path):
    assert load_bench_results(tmp_path) == [] and load_bench_results(tmp_path / "missing") == []


def test_records_to_table_and_figure(tmp_path):
    _record(tmp_path / "search-test-2026-01-01.json")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    results = load_bench_results(tmp_path)
    assert len(results) == 1 and results[0]["meta"]["gpu"] == "Test GPU"
    rows = bench_table(results)
    assert len(rows) == 8 * 3 and {r["impl"] for r in rows} == {"ref", "cuda", "triton"}
    md = markdown_table(rows)
    assert "| Test GPU | layer2 | 32 | float32 | 0 | fwd | 0.500 (10%) |" in md and "err" in md
    fig = bench_figure(results[0])
    assert len(fig.axes) == 4  # (time, % copy) x (fwd, fwd+bwd)
    fig.savefig(tmp_path / "b.png")


def test_only_search_records_are_plotted_with_one_colour_per_backend(tmp_path):
    from matplotlib.colors import to_hex

    from scfs.viz.bench import IMPL_COLOURS

    _record(tmp_path / "search-a.json")
    # a training-step record and a loader record: rows without per-implementation results
    (tmp_path / "step-a.json").write_text(json.dumps({"rows": [{"method": "scfs", "B": 32, "ms": 90.0}]}))
    (tmp_path / "loader-a.json").write_text(json.dumps({"rows": [{"workers": 4, "img_s": 900.0}]}))
    results = load_bench_results(tmp_path)
    assert [r["path"].rsplit("/", 1)[-1] for r in results] == ["search-a.json"]
    fig = bench_figure(results[0])
    for ax in fig.axes:
        for bars, label in zip(ax.containers, [t.get_text() for t in fig.axes[0].get_legend().get_texts()]):
            assert to_hex(bars.patches[0].get_facecolor()) == IMPL_COLOURS[label]

"""The weighting-pass order option (scfs.search.cuda_backend.set_weighting) and its harness/benchmark plumbing,
without a GPU: option parsing and validation, the CUDA impls of the benchmark setting their order before each
call, and the benchmark's markdown table with both orders."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from scfs.bench import search as bench
from scfs.search import check, cuda_backend


@pytest.fixture
def restore_weighting():
    before = (cuda_backend.WEIGHTING, cuda_backend.WEIGHT_CHUNK_KIB, cuda_backend.WEIGHT_BLOCK_KIB)
    yield
    cuda_backend.set_weighting(before[0], chunk_kib=before[1], block_kib=before[2])


def test_default_is_tiled_and_set_weighting_validates(restore_weighting):
    if not os.environ.get("SCFS_SEARCH_WEIGHTING"):
        assert cuda_backend.weighting()["order"] == "tiled"
    cuda_backend.set_weighting("chunked", chunk_kib=1, block_kib=2)
    assert cuda_backend.weighting() == dict(order="chunked", chunk_kib=1.0, block_kib=2.0)
    cuda_backend.set_weighting(block_kib=4)  # None keeps the rest
    assert cuda_backend.weighting() == dict(order="chunked", chunk_kib=1.0, block_kib=4.0)
    with pytest.raises(ValueError, match="must be one of"):
        cuda_backend.set_weighting("diagonal")
    with pytest.raises(ValueError, match=">= 1 byte"):
        cuda_backend.set_weighting(chunk_kib=0)
    assert cuda_backend.weighting() == dict(order="chunked", chunk_kib=1.0, block_kib=4.0)  # unchanged on error
    assert "MEASURED" in cuda_backend.set_weighting.__doc__  # the docstring points at the GPU record


def test_check_weighting_context_restores(restore_weighting):
    cuda_backend.set_weighting("tiled", chunk_kib=64, block_kib=8)
    with check.weighting("chunked", 1.0, None):
        assert cuda_backend.weighting() == dict(order="chunked", chunk_kib=1.0, block_kib=8.0)
    assert cuda_backend.weighting() == dict(order="tiled", chunk_kib=64.0, block_kib=8.0)


def test_bitwise_difference():
    x = torch.tensor([1.0, float("nan"), -0.0])
    assert check.bitwise_difference(x, x.clone()) == ""
    assert "1 of 3" in check.bitwise_difference(x, torch.tensor([1.0, float("nan"), 0.0]))
    assert "layout" in check.bitwise_difference(x, x.double())


def test_environment_sets_the_option():
    code = "from scfs.search import cuda_backend as c; print(c.weighting())"
    env = dict(os.environ, SCFS_SEARCH_WEIGHTING="Chunked", SCFS_SEARCH_WEIGHT_CHUNK_KIB="512")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'order': 'chunked', 'chunk_kib': 512.0, 'block_kib': 8.0" in out.stdout
    env = dict(os.environ, SCFS_SEARCH_WEIGHT_BLOCK_KIB="lots")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "SCFS_SEARCH_WEIGHT_BLOCK_KIB must be a number of KiB" in out.stderr


@pytest.mark.parametrize("weighting", ["tiled", "chunked", "both"])
def test_bench_cuda_impls_set_their_order(monkeypatch, restore_weighting, weighting):
    seen = []

    def fake_search(feats, queries, *, weight=None, backend="auto"):
        seen.append((backend, cuda_backend.WEIGHTING))
        return SimpleNamespace(features=feats.repeat(queries.shape[0], 1, 1, 1))

    monkeypatch.setattr(bench, "feature_search", fake_search)
    feats, queries = torch.randn(2, 4, 3, 3), torch.randn(8, 2, 4)
    fns = bench.make_fns(feats, queries, None, backward=False, use_compile=False, weighting=weighting)
    want = {"tiled": ["cuda"], "chunked": ["cuda-chunked"], "both": ["cuda", "cuda-chunked"]}[weighting]
    assert [k for k in fns if k.startswith("cuda")] == want
    for name in [*want, *reversed(want)]:
        fns[name]()
        assert seen[-1] == ("cuda", bench.CUDA_IMPLS[name])


def _impl(ms: float, **extra) -> dict:
    return dict(ms=ms, GBps=1.0, pct_copy=50.0, peak_MiB=10.0, correct=True, graph_ms=ms, graph_pct_copy=50.0, **extra)


def test_bench_markdown_has_both_orders_side_by_side():
    impls = {k: _impl(1.0) for k in ("published", "ref", "triton")}
    impls["cuda"] = _impl(0.2, host_us=50.0, x_published=5.0, x_compile=None, x_ref_conv=None)
    impls["cuda-chunked"] = _impl(0.1, same_as_tiled=True)
    row = dict(stage="layer2", shape="512x28x28", B=32, dtype="float32", proj=0, pass_="fwd")
    row.update(floor_bytes=1, floor_ms=0.1)
    rows = [dict(row, impls=impls), dict(row, impls={k: v for k, v in impls.items() if k != "cuda-chunked"})]
    bad = dict(impls, **{"cuda-chunked": _impl(0.1, same_as_tiled=False)})
    rows.append(dict(row, impls=bad))
    meta = dict(gpu="X", date="d", torch="t", copy_bw_TBps=4.0, n_crops=8, timer="median")
    meta["weighting"] = dict(order="tiled", chunk_kib=4096.0, block_kib=8.0, impls=bench.cuda_impls("both"))
    result = dict(meta=meta, rows=rows, fast_p=bench.fast_p(rows))
    md = bench.markdown(result)
    table = [line for line in md.splitlines() if line.startswith("| layer2") or line.startswith("| stage")]
    assert len({line.count("|") for line in table}) == 1, "header and rows have different column counts"
    assert "cuda-chunked graph" in table[0] and "chunked x tiled" in table[0]
    assert "2.00 bitwise same" in table[1] and table[1].endswith("| yes |")
    assert table[3].endswith("| NO |") and "DIFFERENT" in table[3]
    assert "chunk 4096 KiB, block 8 KiB" in md
    assert "cuda-chunked_fast_1_vs_ref" in result["fast_p"]

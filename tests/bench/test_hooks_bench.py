"""The per-step hook benchmark runs on the CPU and prints its table (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import pytest

from scfs.bench import hooks


def test_hooks_benchmark_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = hooks.main(["--case", "16", "3", "8", "--case", "8", "5", "4", "--warmup", "2", "--calls", "5"])
    out = capsys.readouterr().out
    assert "| device | feature dim | classes | batch | autograd reference µs | OnlineLinearMonitor µs |" in out
    assert "| cpu | 16 | 3 | 8 |" in out and "| cpu | 8 | 5 | 4 |" in out
    assert [(r["dim"], r["classes"], r["batch"]) for r in rows] == [(16, 3, 8), (8, 5, 4)]
    assert all(r["reference_us"] > 0 and r["monitor_us"] > 0 for r in rows)
    assert all(r["monitor_kernels"] < r["reference_kernels"] for r in rows)

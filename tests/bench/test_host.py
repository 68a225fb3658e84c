"""`scfs.bench.host`: the host a benchmark ran on (CPU model, usable cores, two speed yardsticks) and the sentence
the records print about it."""

from __future__ import annotations

import json

import pytest

from scfs.bench import host as hs

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R)   Platinum 8480+
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_the_cpu_model_is_cpuinfos_first_model_name_and_unknown_without_one(monkeypatch):
    assert hs.cpu_model(CPUINFO) == "Intel(R) Xeon(R) Platinum 8480+"  # runs of spaces folded
    monkeypatch.setattr(hs.platform, "processor", lambda: "x86_64")
    assert hs.cpu_model("processor\t: 0\nmodel name\t:\n") == "x86_64"
    monkeypatch.setattr(hs.platform, "processor", lambda: "")
    assert hs.cpu_model("") == "unknown"


def test_the_python_yardstick_is_the_fastest_run_and_refuses_no_runs(monkeypatch):
    clock = iter([0.0, 0.030, 1.0, 1.020, 2.0, 2.050])  # three runs of 30, 20 and 50 ms
    monkeypatch.setattr(hs.time, "perf_counter", lambda: next(clock))
    calls = []
    monkeypatch.setattr(hs, "_python_work", lambda: calls.append(1))
    assert hs.python_ms(3) == pytest.approx(20.0)
    assert len(calls) == 5  # two warm-up runs, then the three timed
    with pytest.raises(ValueError, match="repeats=0 is invalid: give at least 1"):
        hs.python_ms(0)


def test_the_work_is_the_same_every_time():
    assert hs._python_work(500) == hs._python_work(500) > 0


def test_host_info_measures_this_host():
    info = hs.host_info("cpu")
    assert set(info) == {"cpu", "cores", "python_ms", "us_per_op", "op_device"}
    assert info["python_ms"] > 0 and info["us_per_op"] > 0 and info["op_device"] == "cpu" and info["cpu"]
    assert info["cores"] is None or info["cores"] >= 1


def test_the_phrase_names_the_cpu_and_both_yardsticks():
    host = {"cpu": "AMD EPYC 9654", "cores": 16, "python_ms": 18.04, "us_per_op": 2.41, "op_device": "cpu"}
    assert hs.host_phrase(host) == ("Host: AMD EPYC 9654, 16 usable cores; a fixed piece of Python in 18.0 ms and "
                                    "2.4 us to dispatch one tiny op on the cpu (`scfs.bench.host`: lower is "
                                    "faster; compare records by it).")
    assert hs.host_phrase({"cpu": "AMD EPYC 9654", "cores": None}) == "Host: AMD EPYC 9654."
    assert hs.host_phrase(None) == "" and hs.host_phrase({}) == ""
    assert hs.host_tag(host) == "host Python 18.0 ms" and hs.host_tag(None) == "" and hs.host_tag({"cpu": "x"}) == ""


def test_the_cli_prints_json_or_the_phrase(capsys):
    assert hs.main([]) == 0
    assert json.loads(capsys.readouterr().out)["op_device"] == "cpu"
    assert hs.main(["--phrase"]) == 0
    assert capsys.readouterr().out.startswith("Host: ")


def test_the_cli_asks_for_a_gpu_only_where_there_is_one(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hs.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m scfs.bench.host: error: --device cuda needs a CUDA GPU and this machine has none; "
                   "drop --device or use --device cpu"]

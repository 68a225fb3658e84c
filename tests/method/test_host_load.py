"""`scfs.training.host_load`: busy cores and runnable threads from /proc/stat, and the record's sentence for them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from scfs.training import host_load as hl

STAT = """cpu  {user} 10 {system} {idle} {iowait} 0 5 0 0 0
cpu0 1 0 1 1 0 0 0 0 0 0
cpu1 7 0 3 10 0 0 0 0 0 0
cpu2 100 0 0 0 0 0 0 0 0 0
intr 4895198 0 0
ctxt 5352383
procs_running {running}
procs_blocked 0
"""


def stat(user: int, system: int, idle: int, iowait: int, running: int) -> str:
    return STAT.format(user=user, system=system, idle=idle, iowait=iowait, running=running)


def test_busy_is_everything_but_idle_and_iowait() -> None:
    assert hl.read_stat(stat(100, 50, 800, 40, 3)) == (100 + 10 + 50 + 5, 100 + 10 + 50 + 800 + 40 + 5, 3, 3)
    assert hl.read_stat("cpu  1 2 3 4\n") is None  # no procs_running line
    assert hl.read_stat("procs_running 2\n") is None  # no cpu line


def test_only_the_processs_own_cpus_count_where_proc_stat_lists_them() -> None:
    """In a container /proc/stat is the host's: busy and total come from the lines of the CPUs this process may
    use; the all-CPU line where one of them is missing."""
    assert hl.read_stat(stat(100, 50, 800, 40, 3), {0, 1}) == (1 + 1 + 7 + 3, 3 + 20, 3, 3)
    assert hl.read_stat(stat(100, 50, 800, 40, 3), {0, 7})[:2] == (165, 1005)  # cpu7 is not there


def test_samples_become_busy_cores_and_oversubscription(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two intervals on a 4-core host: all cores busy with 9 runnable threads, then a quarter busy with 1."""
    monkeypatch.setattr(hl, "usable_cpus", lambda: {0, 1, 2, 3})
    reads = iter([hl.read_stat(stat(0, 0, 0, 0, 1)), hl.read_stat(stat(385, 0, 0, 0, 9)),
                  hl.read_stat(stat(485, 0, 300, 0, 1))])
    load = hl.HostLoad(interval_s=0.001)
    monkeypatch.setattr(load, "_read", lambda: next(reads, None))
    load._run()  # on this thread: three reads, two intervals, then the reads run out
    assert load.busy == [4.0, 1.0] and load.runnable == [9, 1]
    s = load.summary()
    assert s["cores"] == 4 and s["host_cpus"] == 3 and s["samples"] == 2 and s["busy_mean"] == 2.5
    assert s["busy_max"] == 4.0
    assert s["runnable_max"] == 9 and s["oversubscribed_share"] == 0.5
    phrase = hl.load_phrase(s)
    assert phrase.startswith("2.5 of 4 cores busy on average")
    assert "more runnable threads than the host has CPUs (3) in 50 % of 2 samples" in phrase
    assert "than cores in 50 % of 2" in hl.load_phrase({**s, "host_cpus": 4})
    assert hl.load_phrase(None) == "not sampled"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_the_real_host_is_sampled_on_a_thread_until_stopped() -> None:
    with hl.HostLoad(interval_s=0.02) as load:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:  # keep a core busy: the sampler must see at least that much
            pass
    s = load.summary()
    assert s is not None and s["cores"] == len(os.sched_getaffinity(0)) and s["samples"] >= 3
    assert s["host_cpus"] >= s["cores"]
    assert 0.0 <= s["busy_mean"] <= s["cores"] + 0.01 and s["runnable_max"] >= 1
    n = s["samples"]
    time.sleep(0.1)
    assert load.summary()["samples"] == n  # stopped: no sample after the block


def test_no_proc_stat_samples_nothing(tmp_path: Path) -> None:
    load = hl.HostLoad(interval_s=0.01, stat=tmp_path / "missing").start()
    time.sleep(0.05)
    assert load.stop() is None and load._thread is None

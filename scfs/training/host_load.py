"""How busy the host's CPUs were while something ran: busy cores and runnable threads, sampled from /proc/stat.

Why: a first compile is mostly single-threaded Python (dynamo, AOTAutograd, inductor's lowering, scheduling and
code generation) in each process, beside the compile workers' kernel builds, the compile helpers' own processes and
a cuDNN warm-up thread. When more threads want a core than there are cores, the compile on the first step's path
waits for a core, and the same setting reads tens of seconds apart across processes. Whether that happened is a
fact of the run, not a guess: /proc/stat gives the cores' busy time and the number of runnable threads
(`procs_running`), so a run (`compile_parallel`'s first step, `summary.json`) and the compile benchmark (each
row's first steps) can say how often the host was oversubscribed while they compiled.

Linux only (/proc/stat); elsewhere `HostLoad` samples nothing and its summary is None.
"""

from __future__ import annotations

import os
import statistics
import threading
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")


def usable_cpus() -> set[int] | None:
    """The CPUs this process may run on (its affinity: a container's cpuset, a `taskset`); None where the platform
    does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def read_stat(text: str, cpus: set[int] | None = None) -> tuple[int, int, int, int] | None:
    """(busy jiffies, total jiffies, runnable threads, the host's CPUs) from /proc/stat's text; None when it lacks
    them. Busy and total are summed over the `cpus` lines (`cpuN`) where each is there, else taken from the
    all-CPU line: in a container /proc/stat is the whole host's, and only the container's cores are the run's.
    Busy is everything but idle and iowait; guest time is already inside user and nice, so it is not counted
    again. Runnable threads are the host's (`procs_running`): /proc/stat does not split them by CPU."""
    per_cpu: dict[int, list[int]] = {}
    total_line = running = None
    for line in text.splitlines():
        if line.startswith("cpu "):
            total_line = [int(v) for v in line.split()[1:]]
        elif line.startswith("cpu") and line[3:4].isdigit():
            name, *values = line.split()
            per_cpu[int(name[3:])] = [int(v) for v in values]
        elif line.startswith("procs_running "):
            running = int(line.split()[1])
    if total_line is None or running is None or len(total_line) < 4:
        return None
    chosen = [per_cpu[c] for c in sorted(cpus)] if cpus and all(c in per_cpu for c in cpus) else [total_line]
    busy = total = 0
    for values in chosen:
        fields = values[:8]  # user nice system idle iowait irq softirq steal
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        busy, total = busy + sum(fields) - idle, total + sum(fields)
    return busy, total, running, len(per_cpu) or 1


class HostLoad:
    """Samples the host's load every `interval_s` on a daemon thread between `start()` and `stop()` (or as a
    context manager); `summary()` says what it saw. The thread reads one small file per sample, holding the
    GIL for tens of microseconds, so it does not itself load what it measures."""

    def __init__(self, interval_s: float = 0.25, stat: Path = PROC_STAT) -> None:
        self.interval_s, self.stat = interval_s, stat
        self.cpus = usable_cpus()
        self.cores = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        self.host_cpus = self.cores  # all the host's, as /proc/stat lists them (more than `cores` in a container)
        self.busy: list[float] = []  # busy cores per interval
        self.runnable: list[int] = []  # runnable threads at each sample, this one included
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> tuple[int, int, int, int] | None:
        try:
            return read_stat(self.stat.read_text(), self.cpus)
        except OSError:
            return None

    def _run(self) -> None:
        last = self._read()
        while last is not None and not self._stop.wait(self.interval_s):
            now = self._read()
            if now is None:
                return
            d_busy, d_total = now[0] - last[0], now[1] - last[1]
            if d_total > 0:
                self.busy.append(self.cores * d_busy / d_total)
                self.runnable.append(now[2])
                self.host_cpus = now[3]
            last = now

    def start(self) -> HostLoad:
        if self._thread is None and self._read() is not None:
            self._thread = threading.Thread(target=self._run, name="host-load", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> dict[str, Any] | None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return self.summary()

    def __enter__(self) -> HostLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any] | None:
        """{cores (this process's), host_cpus, samples, busy cores mean / p90 / max, the host's runnable threads
        mean / max, the share of samples with more runnable threads than the host has CPUs}; None without samples
        (not Linux, or stopped before the first)."""
        if not self.busy:
            return None
        deciles = statistics.quantiles(self.busy, n=10) if len(self.busy) > 1 else [self.busy[0]] * 9
        return {"cores": self.cores, "host_cpus": self.host_cpus, "samples": len(self.busy),
                "interval_s": self.interval_s,
                "busy_mean": round(statistics.fmean(self.busy), 2), "busy_p90": round(deciles[8], 2),
                "busy_max": round(max(self.busy), 2),
                "runnable_mean": round(statistics.fmean(self.runnable), 2), "runnable_max": max(self.runnable),
                "oversubscribed_share": round(sum(r > self.host_cpus for r in self.runnable) / len(self.runnable),
                                              3)}


def load_phrase(load: dict[str, Any] | None) -> str:
    """One record sentence for a `HostLoad.summary()`."""
    if not load:
        return "not sampled"
    host = load.get("host_cpus", load["cores"])
    return (f"{load['busy_mean']:.1f} of {load['cores']} cores busy on average (p90 {load['busy_p90']:.1f}), "
            f"{load['runnable_mean']:.1f} runnable threads (max {load['runnable_max']}), more runnable threads "
            f"than {'cores' if host == load['cores'] else f'the host has CPUs ({host})'} in "
            f"{100 * load['oversubscribed_share']:.0f} % of {load['samples']} samples")

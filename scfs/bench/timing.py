"""How the step benchmarks time a step (`scfs.bench.step`, `scfs.bench.compile`, `scfs.bench.published`): one
clock for every measurement of steps, so rows timed by different benchmarks compare."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class StepClock:
    """The step benchmarks' one measurement of steps (`measure`, `backbone_ceiling`, `scfs.bench.compile`).

    A mark at the start of every step and one after the last: a CUDA event on the GPU (queued behind the step's
    kernels, so the host never waits and the steps run back to back as in training), the host clock otherwise. A
    step's time is the gap between its mark and the next; the warm-up's (torch.compile's compile included) is the
    host's wall time from the first mark to the first timed step's."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[Any] = []
        self.walls: list[float] = []

    def mark(self) -> None:
        """A step boundary."""
        import torch

        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.events.append(ev)
        self.walls.append(time.perf_counter())

    def step_ms(self, warmup: int) -> list[float]:
        """Milliseconds of each step after the first `warmup` (one device synchronisation)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return [self.events[i].elapsed_time(self.events[i + 1]) for i in range(warmup, len(self.events) - 1)]
        return [1e3 * (self.walls[i + 1] - self.walls[i]) for i in range(warmup, len(self.walls) - 1)]

    def warmup_s(self, warmup: int) -> float:
        """Wall seconds of the first `warmup` steps."""
        return self.walls[warmup] - self.walls[0]


def time_steps(step: Callable[[int], Any], warmup: int, steps: int, cuda: bool,
               after_warmup: Callable[[], None] | None = None) -> tuple[StepClock, Any]:
    """`step(i)` for `warmup + steps` steps on a `StepClock`; returns the clock and the last step's result. The
    warm-up ends with the device synchronised (its wall time is then the work's, not the launches'), then
    `after_warmup` runs (outside every timed step: reading compile counters, say)."""

    def end_warmup() -> None:
        if cuda:
            import torch

            torch.cuda.synchronize()
        if after_warmup is not None:
            after_warmup()

    clock, out = StepClock(cuda), None
    for i in range(warmup + steps):
        if i == warmup:
            end_warmup()
        clock.mark()
        out = step(i)
    if steps == 0:
        end_warmup()
    clock.mark()
    return clock, out


def p10_p90(values: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentile of step times (nearest rank, no interpolation): the spread every step record
    gives beside its median."""
    s = sorted(values)
    return s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]

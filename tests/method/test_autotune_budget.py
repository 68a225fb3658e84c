"""`compile_autotune_ms`: each launch config's benchmark budget, reaching inductor's benchmarker, set at build."""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import compose_cfg
from torch._inductor.runtime import benchmarking

from scfs import autotune_budget
from scfs.config import ConfigError, validate_config


@pytest.fixture
def spy(monkeypatch):
    """The keywords each GPU benchmark of inductor's benchmarker receives, with the real benchmarker's signature
    kept (so `supported` reads it) and no GPU needed: the class's `benchmark_gpu` records and returns 1 ms."""
    calls: list[dict] = []
    cls = type(benchmarking.benchmarker)
    real = cls.benchmark_gpu

    def benchmark_gpu(self, _callable, *args, **kwargs):
        calls.append(kwargs)
        return 1.0

    benchmark_gpu.__signature__ = inspect.signature(real)
    monkeypatch.setattr(cls, "benchmark_gpu", benchmark_gpu)
    yield calls
    autotune_budget.use(None)


def autotuner_call() -> None:
    """The call `CachingAutotuner.bench` makes for each launch config of a CUDA kernel."""
    benchmarking.benchmarker.benchmark(fn=lambda: None, device="cuda", rep=40, is_vetted_benchmarking=True)


def test_the_budget_reaches_each_gpu_benchmark_and_use_none_puts_inductors_back(spy):
    autotuner_call()
    assert "max_benchmark_duration" not in spy[-1] and spy[-1]["rep"] == 40  # inductor's own: 25 ms by default
    assert autotune_budget.use(5) == 5.0 and autotune_budget.current() == 5.0
    autotuner_call()
    assert spy[-1]["max_benchmark_duration"] == 5.0 and spy[-1]["rep"] == 5.0
    assert autotune_budget.use(2.5) == 2.5  # a second use replaces the first, it does not wrap it
    autotuner_call()
    assert spy[-1]["max_benchmark_duration"] == 2.5
    assert "benchmark_gpu" in benchmarking.benchmarker.__dict__
    autotune_budget.use(None)
    assert autotune_budget.current() is None and "benchmark_gpu" not in benchmarking.benchmarker.__dict__
    autotuner_call()
    assert "max_benchmark_duration" not in spy[-1] and spy[-1]["rep"] == 40


def test_the_autotuners_benchmarker_is_the_one_use_sets():
    pytest.importorskip("triton")
    from torch._inductor.runtime import triton_heuristics

    assert triton_heuristics.benchmarker is benchmarking.benchmarker


def test_a_cpu_timing_passes_through_with_a_budget_set(spy):
    autotune_budget.use(5)
    ms = benchmarking.benchmarker.benchmark(fn=lambda: sum(range(50)), device="cpu")  # the real CPU timer
    assert ms >= 0 and spy == []
    x = torch.ones(3)
    assert benchmarking.benchmarker.benchmark(lambda t: t + 1, (x,)) >= 0  # the device inferred from the arguments


@pytest.mark.parametrize("bad", [0, -1, "5", True, [5]])
def test_a_budget_that_is_not_a_positive_number_is_one_line(bad):
    with pytest.raises(autotune_budget.AutotuneBudgetError) as err:
        autotune_budget.check(bad)
    assert len(str(err.value).splitlines()) == 1 and "positive number of milliseconds" in str(err.value)


@pytest.mark.parametrize("bad", ["0", "-3", "fast"])
def test_the_config_refuses_a_bad_budget_in_one_line(bad):
    with pytest.raises(ConfigError, match=r"config key compile_autotune_ms=\S+ is invalid: expected a positive "
                                          r"number of milliseconds") as err:
        validate_config(compose_cfg(["compile=true", f"compile_autotune_ms={bad}"]))
    assert "positive number of milliseconds" in str(err.value) and len(str(err.value).splitlines()) == 1
    validate_config(compose_cfg(["compile=true", "compile_autotune_ms=5"]))
    from scfs.bench import compile as bench

    validate_config(compose_cfg(["compile=true", *bench.QUICK_TUNE]))  # the compile benchmark's quick-tune row
    validate_config(compose_cfg(["compile=true", "compile_autotune_ms=null"]))


def test_a_torch_whose_benchmarker_takes_no_budget_is_refused(monkeypatch):
    class OldBenchmarker:
        def benchmark_gpu(self, _callable, warmup=25):
            return 1.0

        def benchmark(self, *args, **kwargs):
            return 1.0

    monkeypatch.setattr(benchmarking, "benchmarker", OldBenchmarker())
    assert not autotune_budget.supported()

    class NoTriton(OldBenchmarker):
        @property
        def triton_do_bench(self):
            raise NotImplementedError("requires Triton")

    assert not autotune_budget.supported(NoTriton())
    with pytest.raises(autotune_budget.AutotuneBudgetError, match="takes no per-config budget.*"
                                                                  "leave compile_autotune_ms=null"):
        autotune_budget.use(5)
    assert autotune_budget.use(None) is None


def test_build_sets_the_configs_budget_and_the_next_build_its_own(spy):
    from scfs.training.build import build

    build(compose_cfg(["compile=true", "compile_autotune_ms=5"]))
    assert autotune_budget.current() == 5.0
    build(compose_cfg(["compile=true"]))  # a second run in this process: inductor's own budget again
    assert autotune_budget.current() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_a_compiled_kernels_first_run_benchmarks_under_the_budget(monkeypatch, tmp_path):
    """On the GPU: a fresh compile of a reduction (several candidate launch configs) benchmarks each candidate
    through the wrapped benchmarker, every one with the budget."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cls = type(benchmarking.benchmarker)
    real = cls.benchmark_gpu
    budgets: list = []

    def recording(self, _callable, *args, **kwargs):
        budgets.append(kwargs.get("max_benchmark_duration"))
        return real(self, _callable, *args, **kwargs)

    monkeypatch.setattr(cls, "benchmark_gpu", recording)
    torch._dynamo.reset()
    try:
        autotune_budget.use(5)
        f = torch.compile(lambda x: (x.float().softmax(-1) * x).sum(-1))
        f(torch.randn(4096, 3000, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()
    finally:
        autotune_budget.use(None)
        torch._dynamo.reset()
    assert budgets and all(b == 5.0 for b in budgets)

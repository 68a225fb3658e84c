"""`compile_cudnn_warmup`: the student's backward convolutions listed on fake tensors and run once inside an
autograd backward, on a side thread, so that cuDNN's algorithm cache of the device's autograd thread holds them
before the run's first backward (`scfs.training.cudnn_warmup`)."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import pytest
import torch
from helpers import TINY_RESNET18, compose_cfg
from torch.utils._python_dispatch import TorchDispatchMode

from scfs.config import ConfigError, validate_config
from scfs.methods.networks import student_forward
from scfs.training import cudnn_warmup as cw
from scfs.training.plain_step import autocast_for, random_views


def _build(overrides: list[str]):
    from scfs.train import build

    torch.manual_seed(0)
    cfg = compose_cfg(overrides)
    return cfg, build(cfg)[1]


def layout(t: torch.Tensor) -> tuple[bool, bool]:
    """Which memory formats `t` is dense in (both for a map of 1x1 pixels, whose strides do not matter)."""
    return t.is_contiguous(), t.is_contiguous(memory_format=torch.channels_last)


def conv_key(x, w, stride, padding, dilation, transposed, groups, last) -> tuple:
    """A convolution as cuDNN's algorithm cache keys it: the sizes, the dtype, the memory formats of input and weight
    (`layout`), stride, padding, dilation, groups, and `last` (the gradients computed, or whether a bias is added)."""
    return (tuple(x.shape), tuple(w.shape), x.dtype, layout(x), layout(w), tuple(stride), tuple(padding),
            tuple(dilation), bool(transposed), int(groups), last)


class BackwardConvs(TorchDispatchMode):
    """Records each `aten.convolution_backward`'s key (`conv_key`, with the gradients computed); `ForwardConvs`
    each `aten.convolution`'s (with whether a bias is added)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[tuple] = set()
        self.count = 0

    def key(self, func, args) -> tuple | None:
        if func is not torch.ops.aten.convolution_backward.default:
            return None
        _, x, w, _, stride, padding, dilation, transposed, _, groups, mask = args
        return conv_key(x, w, stride, padding, dilation, transposed, groups, tuple(mask))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        key = self.key(func, args)
        if key is not None:
            self.keys.add(key)
            self.count += 1
        return func(*args, **(kwargs or {}))


class ForwardConvs(BackwardConvs):
    def key(self, func, args) -> tuple | None:
        if func is not torch.ops.aten.convolution.default:
            return None
        x, w, b, stride, padding, dilation, transposed, _, groups = args
        return conv_key(x, w, stride, padding, dilation, transposed, groups, b is not None)


def grad_leaves(out) -> list[torch.Tensor]:
    """The tensors with a gradient among a call's nested outputs."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]


def step_backward(model, cfg, device, fn=student_forward) -> None:
    """The step's student call on the run's views and a backward through every output that has a gradient."""
    g, loc = random_views(cfg, device, model.channels_last)
    with autocast_for(str(cfg.trainer.precision), torch.device(device).type):
        out = fn(model.student, g, loc, model.stages, model._local_heads)
    sum(t.float().sum() for t in grad_leaves(out)).backward()


@pytest.mark.parametrize("overrides", [
    [*TINY_RESNET18, "backbone.channels_last=true"],
    [*TINY_RESNET18, "backbone.channels_last=true", "trainer.precision=bf16-mixed"],
    ["backbone.channels_last=false"],
], ids=["resnet18-channels-last", "resnet18-bf16-autocast", "tiny-contiguous"])
def test_the_warmup_runs_every_backward_convolution_the_step_runs(overrides):
    """The calls listed on fake tensors, run by the warm-up, are the eager step's backward convolutions, key for
    key: sizes, dtype after autocast, memory format, parameters and the gradients computed."""
    cfg, model = _build(overrides)
    step = BackwardConvs()
    with step:
        step_backward(model, cfg, "cpu")
    model.zero_grad(set_to_none=True)
    calls = cw.conv_calls(model, cfg, "cpu")
    warm = BackwardConvs()
    with warm:
        seen = cw.run_backwards(calls, "cpu")
    assert seen["calls"] == len(calls) == warm.count == len(warm.keys)  # each distinct call once
    assert warm.keys == step.keys
    assert any(k[-1][0] is False for k in warm.keys)  # the stem's: no input gradient, as in the step
    if "trainer.precision=bf16-mixed" in overrides:
        assert torch.bfloat16 in {k[2] for k in warm.keys}


@pytest.mark.parametrize("overrides", [
    [*TINY_RESNET18, "backbone.channels_last=true", "trainer.precision=bf16-mixed"],
    ["backbone.channels_last=false"],
], ids=["resnet18-bf16-autocast", "tiny-contiguous"])
def test_the_forward_warmup_runs_every_forward_convolution_the_step_runs(overrides):
    """`run_forwards` calls each listed convolution once, and their keys are the eager step's forward convolutions'
    (sizes, dtype after autocast, memory format, parameters, bias), with no autograd graph left behind."""
    cfg, model = _build(overrides)
    step = ForwardConvs()
    g, loc = random_views(cfg, "cpu", model.channels_last)
    with step, autocast_for(str(cfg.trainer.precision), "cpu"):
        student_forward(model.student, g, loc, model.stages, model._local_heads)
    calls = cw.conv_calls(model, cfg, "cpu")
    warm = ForwardConvs()
    with warm:
        assert cw.run_forwards(calls, "cpu") == len(calls)
    assert warm.count == len(warm.keys) == len(calls)
    assert warm.keys == step.keys
    if "trainer.precision=bf16-mixed" in overrides:
        assert {k[2] for k in warm.keys} == {torch.bfloat16}


def test_a_biased_and_a_transposed_convolution_run_forward_as_called():
    """A call with a bias and a transposed one (neither in a ResNet) come out of `ConvCall.forward` as the module
    computes them."""
    torch.manual_seed(0)
    for conv, x in ((torch.nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=True), torch.zeros(2, 3, 9, 9)),
                    (torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                     torch.zeros(1, 4, 5, 5))):
        conv = conv.requires_grad_(False)
        rec = cw._recorder()
        with rec:
            want = conv(x)
        (call,) = rec.calls
        got = call.forward("cpu")
        assert got.shape == want.shape and got.stride() == want.stride() and call.bias
        assert torch.equal(got, torch.zeros_like(want))  # zeros in: zeros out, the bias zero too


def test_listing_the_convolutions_runs_nothing_on_the_model():
    """The listing runs the student on fakes: no weight, BatchNorm statistic or gradient of the model changes, and
    the model stays in train mode."""
    cfg, model = _build([*TINY_RESNET18, "backbone.channels_last=true"])
    before = {k: v.clone() for k, v in model.student.state_dict().items()}
    calls = cw.conv_calls(model, cfg, "cpu")
    assert calls and all(isinstance(c, cw.ConvCall) for c in calls)
    after = model.student.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.student.parameters())
    assert model.student.training


def test_the_backwards_run_inside_an_autograd_backward():
    """`run_backwards` calls the convolutions from a node's backward (on CUDA: the device's autograd thread, the one
    the run's backward uses; the GPU test below checks that thread), each once, and leaves no gradient behind."""
    cfg, model = _build([*TINY_RESNET18])
    calls = cw.conv_calls(model, cfg, "cpu")
    seen = cw.run_backwards(calls, "cpu")
    assert seen["in_backward"] is True and seen["calls"] == len(calls)
    assert all(p.grad is None for p in model.student.parameters())


def test_a_warmup_on_its_thread_reports_what_it_did(caplog):
    cfg, model = _build([*TINY_RESNET18])
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        warmup = cw.CudnnWarmup(model, cfg, "cpu").start()
        warmup.join(60)
    report = warmup.report()
    assert warmup.thread is not None and warmup.thread.name == "scfs-cudnn-warmup"
    assert report["convs"] == len(cw.conv_calls(model, cfg, "cpu")) > 0
    assert report["done_s"] is not None and report["done_s"] >= report["record_s"] >= 0
    assert "error" not in report
    assert f"for {report['convs']} convolutions chosen in" in caplog.text


def test_a_failed_warmup_says_so_in_one_line_and_leaves_the_run_alone(caplog):
    """A student the listing cannot run (here: no student at all) costs the run the warm-up, nothing else."""
    cfg, model = _build([*TINY_RESNET18])

    class NoStudent:
        stages, _local_heads, channels_last = model.stages, model._local_heads, False

    with caplog.at_level(logging.WARNING, logger=cw.__name__):
        warmup = cw.CudnnWarmup(NoStudent(), cfg, "cpu").start()
    assert warmup.thread is None and warmup.report()["convs"] == 0
    assert "AttributeError" in warmup.report()["error"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "the warm-up failed" in line and "benchmarks its backward's convolutions itself" in line


def test_the_forward_warmup_runs_on_the_calling_thread_before_the_side_thread(monkeypatch, caplog):
    """With `compile_cudnn_warmup_forward=true`: `start` runs the forwards on the calling thread (cuDNN's forward
    choices are that thread's), before the backward's thread exists (the two never benchmark side by side), and the
    report says how long they took; without it the report has no such entry and no forward runs."""
    seen: list[tuple] = []
    real = cw.run_forwards

    def spy(calls, device):
        seen.append((threading.current_thread().name, warmup.thread, len(calls)))
        return real(calls, device)

    monkeypatch.setattr(cw, "run_forwards", spy)
    cfg, model = _build([*TINY_RESNET18])
    warmup = cw.CudnnWarmup(model, cfg, "cpu")
    warmup.start().join(60)
    assert not seen and "forward_s" not in warmup.report()
    cfg.compile_cudnn_warmup_forward = True
    warmup = cw.CudnnWarmup(model, cfg, "cpu")
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        warmup.start().join(60)
    report = warmup.report()
    assert seen == [(threading.current_thread().name, None, report["convs"])]
    assert report["forward_s"] is not None and report["forward_s"] >= 0 and report["done_s"] is not None
    assert report["done_s"] >= report["record_s"] + report["forward_s"] - 0.02  # rounding of the three
    assert f"forward algorithms for {report['convs']} convolutions chosen in" in caplog.text


def test_a_failed_forward_warmup_says_so_in_one_line_and_starts_no_thread(monkeypatch, caplog):
    def fail(calls, device):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(cw, "run_forwards", fail)
    cfg, model = _build([*TINY_RESNET18, "compile_cudnn_warmup_forward=true"])
    with caplog.at_level(logging.WARNING, logger=cw.__name__):
        warmup = cw.CudnnWarmup(model, cfg, "cpu").start()
    assert warmup.thread is None and warmup.report()["forward_s"] is None
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert line == "compile_cudnn_warmup: the warm-up failed (RuntimeError: CUDA out of memory); the run " \
                   "benchmarks its convolutions itself"


@pytest.mark.parametrize("settings, cuda, benchmark, why", [
    ({}, True, True, None),
    ({"compile_cudnn_warmup": True}, True, True, None),
    ({"compile_cudnn_warmup": False}, True, True, "compile_cudnn_warmup=false"),
    ({"compile": False}, True, True, "compile=false"),
    ({"compile_background": True}, True, True, "compile_background=true"),
    ({}, False, True, "no CUDA device"),
    ({}, True, False, "trainer.benchmark=false"),
])
def test_auto_runs_where_a_compiled_step_benchmarks_cudnn_on_a_gpu(settings, cuda, benchmark, why):
    cfg = {"compile": True, "compile_cudnn_warmup": "auto", **settings}
    got = cw.warmup_off_reason(cfg, cuda, benchmark)
    assert got == why if why is None else why in got


@pytest.mark.parametrize("overrides, match", [
    (["compile=false"], "compile_cudnn_warmup=true is invalid with compile=false.*set compile=true"),
    (["compile=true", "compile_background=true"], "compile_cudnn_warmup=true is invalid with "
                                                  "compile_background=true"),
    (["compile=true", "trainer=cpu"], "compile_cudnn_warmup=true is invalid with trainer.accelerator=cpu.*"
                                      "trainer=gpu"),
    (["compile=true", "trainer=gpu", "trainer.benchmark=false"],
     "compile_cudnn_warmup=true is invalid with trainer.benchmark=false.*set trainer.benchmark=true"),
    (["compile=true", "compile_cudnn_warmup=maybe"], "compile_cudnn_warmup='maybe' is invalid.*true, false or auto"),
    (["compile=true", "compile_cudnn_warmup=false", "compile_cudnn_warmup_forward=true"],
     r"^config key compile_cudnn_warmup_forward=true is invalid with compile_cudnn_warmup=false: the forward's "
     r"benchmarks run with the warm-up; set compile_cudnn_warmup=auto \(or compile_cudnn_warmup_forward=false\)$"),
    (["compile=true", "compile_cudnn_warmup_forward=auto"], "compile_cudnn_warmup_forward='auto' is invalid.*true or "
                                                           "false"),
])
def test_true_refuses_what_leaves_nothing_to_warm_in_one_line(overrides, match):
    own = [o for o in overrides if o.startswith(("compile_cudnn_warmup=", "compile_cudnn_warmup_forward="))]
    cfg = compose_cfg(overrides if own else ["compile_cudnn_warmup=true", *overrides])
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg)


def test_the_shipped_configs_turn_it_on_where_it_applies_and_validate():
    """`auto` in every shipped config (a GPU record measured it: docs/RESULTS.md "Compile time"); a config
    validates with it, compiled or not."""
    from helpers import CONF
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        for recipe in ([], ["+experiment=cifar10"], ["+experiment=imagenet"], ["+experiment=imagenet_vit"]):
            assert compose(config_name="config", overrides=recipe).compile_cudnn_warmup == "auto", recipe
    for compiled in ("true", "false"):
        validate_config(compose_cfg([f"compile={compiled}"]))


def test_a_compiled_run_gets_the_callback_and_a_cpu_run_says_why_it_is_off(tmp_path, caplog):
    """The callback joins a compiled run (it is on by default; not one that turns it off, nor an eager run); on a
    CPU it starts nothing and says why, and the summary records that."""
    from types import SimpleNamespace

    from scfs.training.setup import make_callbacks

    cfg = compose_cfg(["compile=true", "compile_cudnn_warmup=auto"])
    dm = SimpleNamespace(train_set=object(), batch_size=16)
    callbacks, _, _ = make_callbacks(cfg, dm, tmp_path)
    (cb,) = [c for c in callbacks if isinstance(c, cw.CudnnWarmupCallback)]
    off, _, _ = make_callbacks(compose_cfg(["compile=true", "compile_cudnn_warmup=false"]), dm, tmp_path)
    assert not [c for c in off if isinstance(c, cw.CudnnWarmupCallback)]
    eager, _, _ = make_callbacks(compose_cfg(["compile=false", "compile_cudnn_warmup=auto"]), dm, tmp_path)
    assert not [c for c in eager if isinstance(c, cw.CudnnWarmupCallback)]
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        cb.on_train_start(None, SimpleNamespace(device=torch.device("cpu")))
    assert cb.warmup is None and cb.summary_entry() == {"off": "no CUDA device"}
    assert "compile_cudnn_warmup=auto: off here (no CUDA device)" in caplog.text


GPU = ["trainer.accelerator=gpu", "trainer.devices=1", "trainer.precision=bf16-mixed", "backbone.channels_last=true"]


def library_kernels(prof) -> Counter:
    """The CUDA kernels of a profile that are cuDNN's, cuBLAS's or CUTLASS's (what the GPU tests below count)."""
    return Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("triton", "Memcpy", "Memset")) and "at::native" not in e.name)


def on_a_thread_of_its_own(call) -> None:
    """`call()` on a new thread, waited for; its exception, if any, raised here."""
    failed: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as e:  # re-raised on the calling thread
            failed.append(e)

    thread = threading.Thread(target=target, name="compile-elsewhere")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def cold_and_warmed(measure, overrides: list[str], batches: tuple[int, int], done_key: str, prime=None):
    """`measure(model, cfg)` twice on a tiny ResNet-18 on the GPU without a warm-up (`cold`) and after one
    (`warmed`, its report's `done_key` set), each at its own batch size (sizes no other test benchmarked in this
    process): the first and second calls' kernel totals, the first's extra kernels, and the last model and cfg.
    `prime(model, cfg)`, where given, runs after the warm-up and before the first measured call."""
    counts, extra = {}, {}
    for name, batch in zip(("cold", "warmed"), batches, strict=True):
        cfg, model = _build([*TINY_RESNET18, *GPU, *overrides, f"batch_size={batch}"])
        model = model.cuda()
        if name == "warmed":
            warmup = cw.CudnnWarmup(model, cfg, "cuda").start()
            warmup.join(300)
            report = warmup.report()
            assert report[done_key] is not None and "error" not in report, report
        if prime is not None:
            prime(model, cfg)
        first, second = measure(model, cfg), measure(model, cfg)
        counts[name], extra[name] = (first.total(), second.total()), (first - second).most_common(3)
    return counts, extra, model, cfg


def assert_the_warmed_first_call_benchmarks_nothing(counts: dict, extra: dict, what: str) -> None:
    assert counts["cold"][0] > counts["cold"][1], counts  # the benchmarks show in a cold first call
    free, total = torch.cuda.mem_get_info()
    # cuDNN benchmarks again a chosen algorithm whose workspace it cannot allocate: a GPU shared with other work
    assert counts["warmed"][0] == counts["warmed"][1], f"{counts}; the warmed first {what}'s extra kernels " \
        f"{extra['warmed']}; GPU memory free now {free / 2**30:.1f} of {total / 2**30:.0f} GiB"


@pytest.mark.gpu
def test_gpu_the_compiled_backward_benchmarks_nothing_after_the_warmup(monkeypatch):
    """On a GPU, with cuDNN benchmarking: the first backward of the compiled student call launches more kernels than
    the second (cuDNN times its candidates) where no warm-up ran, and exactly as many where it did: the compiled
    backward's convolutions found every algorithm chosen. The warm-up's backward ran on autograd's device thread, not
    the calling one. Counted are cuDNN's, cuBLAS's and CUTLASS's kernels: not Triton's (triton_*: the first run's
    launch-config benchmarks), nor ATen's own templates (at::native: the cache flushes around them), nor the copies
    and fills (Memcpy, Memset: inductor benchmarks a kernel's launch configs on copies of its arguments, about 7,500
    device-to-device copies in a tiny ResNet-18's first compiled backward on an H100 when inductor's cache has not
    tuned its kernels yet)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    fn = torch.compile(student_forward, dynamic=False)

    def backward_kernels(model, cfg) -> Counter:
        model.zero_grad(set_to_none=True)  # both backwards assign, neither accumulates
        g, loc = random_views(cfg, "cuda", True)
        with autocast_for(str(cfg.trainer.precision), "cuda"):
            out = fn(model.student, g, loc, model.stages, model._local_heads)
        loss = sum(t.float().sum() for t in grad_leaves(out))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss.backward()
            torch.cuda.synchronize()
        return library_kernels(prof)

    counts, extra, model, cfg = cold_and_warmed(backward_kernels, [], (12, 10), "done_s")
    assert_the_warmed_first_call_benchmarks_nothing(counts, extra, "backward")
    seen = cw.run_backwards(cw.conv_calls(model, cfg, "cuda")[:1], "cuda")
    assert seen["autograd_thread"] != threading.current_thread().name
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_the_compiled_forward_benchmarks_nothing_after_the_forward_warmup(monkeypatch):
    """On a GPU, with cuDNN benchmarking: the compiled student call's first forward on this thread launches more
    cuDNN, cuBLAS and CUTLASS kernels than its second where no warm-up ran (cuDNN times its candidates), and exactly
    as many where `compile_cudnn_warmup_forward` ran on this thread first: the compiled forward's convolutions found
    every algorithm chosen.

    The compile and the first run of its kernels happen before, on a thread of their own: with an empty inductor
    cache the compile times cuBLAS matmuls of its own (whether padding a matmul pays), launches no warm-up can
    spare, and the first run tunes the Triton kernels' launch configs. The compiled code serves every thread;
    cuDNN's choices made on that thread do not."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    fn = torch.compile(student_forward, dynamic=False)

    def forward(model, cfg) -> None:
        g, loc = random_views(cfg, "cuda", True)
        with autocast_for(str(cfg.trainer.precision), "cuda"):
            fn(model.student, g, loc, model.stages, model._local_heads)
        torch.cuda.synchronize()

    def forward_kernels(model, cfg) -> Counter:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            forward(model, cfg)
        return library_kernels(prof)

    def compile_elsewhere(model, cfg) -> None:
        on_a_thread_of_its_own(lambda: forward(model, cfg))

    counts, extra, _, _ = cold_and_warmed(forward_kernels, ["compile_cudnn_warmup_forward=true"], (11, 13),
                                          "forward_s", prime=compile_elsewhere)
    assert_the_warmed_first_call_benchmarks_nothing(counts, extra, "forward")
    torch._dynamo.reset()


def test_a_compiled_student_is_listed_without_compiling():
    """With `compile=true` the student's backbone or its blocks are compiled in place: the listing runs them as
    plain modules, so it traces nothing and finds the same convolutions."""
    from torch._dynamo.utils import counters

    plain_cfg, plain = _build([*TINY_RESNET18])
    for scope in ("model", "blocks"):
        cfg, model = _build([*TINY_RESNET18, "compile=true", f"compile_scope={scope}"])
        torch._dynamo.reset()
        counters.clear()
        calls = cw.conv_calls(model, cfg, "cpu")
        assert counters["stats"]["unique_graphs"] == 0 and not counters["frames"], scope
        assert calls == cw.conv_calls(plain, plain_cfg, "cpu")


@pytest.mark.parametrize("overrides", [
    ["method=dino", *TINY_RESNET18],
    ["backbone=vit_micro", "search.stages=[block1,last]"],
], ids=["dino", "vit"])
def test_dino_and_a_vit_list_their_convolutions_too(overrides):
    """The listing runs each method's and backbone's own student call: DINO's (no stage heads), a ViT's (the patch
    embedding, with a bias and an input that needs no gradient, and the stage heads' convolutions)."""
    from helpers import CONF, TINY
    from hydra import compose, initialize_config_dir

    from scfs.train import build

    tiny = [o for o in TINY if not o.startswith("backbone.")] if "backbone=vit_micro" in overrides else TINY
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*tiny, *overrides])
    torch.manual_seed(0)
    model = build(cfg)[1]
    step = BackwardConvs()
    with step:
        step_backward(model, cfg, "cpu")
    warm = BackwardConvs()
    with warm:
        cw.run_backwards(cw.conv_calls(model, cfg, "cpu"), "cpu")
    assert warm.keys == step.keys and warm.keys
    if "backbone=vit_micro" in overrides:
        assert (False, True, True) in {k[-1] for k in warm.keys}  # the patch embedding: a bias, no input gradient


@pytest.mark.parametrize("forward", [False, True], ids=["backward", "forward-too"])
def test_a_run_starts_the_warmup_when_training_starts_and_its_summary_says_what_it_did(tmp_path, shapes_root,
                                                                                       monkeypatch, eager_backend,
                                                                                       forward):
    """Through `scfs.train.run` (two compiled steps, dynamo's eager backend): the callback starts the warm-up when
    training starts, before the first step and after Lightning has made the loader's iterator (so the forward's
    benchmarks overlap the first batch's production), and `summary.json` records it. On the CPU the device
    condition is stood in for (there is no cuDNN here): the warm-up itself runs as on a GPU, on the CPU's
    tensors."""
    import json

    from scfs.train import run

    started: list[tuple[int, bool]] = []
    real_hook = cw.CudnnWarmupCallback.on_train_start

    def on_train_start(self, trainer, pl_module):
        started.append((pl_module.global_step, trainer.fit_loop._data_fetcher.iterator is not None))
        return real_hook(self, trainer, pl_module)

    monkeypatch.setattr(cw, "warmup_off_reason", lambda cfg, cuda, benchmark: None)
    monkeypatch.setattr(cw.CudnnWarmupCallback, "on_train_start", on_train_start)
    cfg = compose_cfg([*TINY_RESNET18, "compile=true", "compile_cudnn_warmup=auto",
                       f"compile_cudnn_warmup_forward={str(forward).lower()}"], data_root=shapes_root)
    summary = run(cfg, tmp_path)
    assert summary["steps"] == 2 and started == [(0, True)]
    entry = json.loads((tmp_path / "summary.json").read_text())["compile_cudnn_warmup"]
    assert entry["convs"] > 0 and entry["done_s"] is not None and "error" not in entry
    assert ("forward_s" in entry) is forward and (not forward or entry["forward_s"] >= 0)

"""cuDNN's convolution algorithms benchmarked before the first step needs them (`compile_cudnn_warmup`).

With `trainer.benchmark=true` (the GPU trainers) cuDNN times its candidate algorithms for a convolution the first time
a shape of it runs, and keeps the fastest. On one H200 those benchmarks cost the first steps of a cold compiled run
about 9 s (CIFAR-10) and 7 s (ResNet-50), forward and backward together (docs/RESULTS.md "Compile time"), after
minutes in which the GPU waited for the compiler. This module has the GPU benchmark the backward's convolutions during
that wait, and optionally the forward's while the loader makes the first batch.

torch keeps the chosen algorithms per thread (ATen's cuDNN convolutions cache them `thread_local`), so no other thread
can choose for the main thread's forward. The backward is another matter: autograd runs the backward of every CUDA
node on the device's one worker thread, whichever thread called `backward()`. So a node of our own whose backward
calls `aten.convolution_backward` on the recorded shapes fills the cache the run's first backward then reads.

1. `conv_calls` lists the student's convolutions as the step calls them: `student_forward` once on fake tensors of
   the run's views (`FakeTensorMode`: no memory, no kernel), under the run's autocast, recorded below autocast (the
   dtypes a convolution runs in) with the strides and the gradients it needs. The copy it runs is in eval mode: the
   convolutions are the same, and a SyncBatchNorm does not synchronise.
2. With `compile_cudnn_warmup_forward=true`, `CudnnWarmup.start` then runs each call's forward (`aten.convolution`)
   on the calling thread, the only one whose choices the run's forward reads, and waits for them, so the two
   warm-ups never time their candidates side by side on the GPU. The callback calls `start` when training starts,
   after Lightning has started the loader's workers (its `setup_data` creates their iterator): the forward's
   benchmarks take the time the main thread would spend waiting for the first batch (about 2 s at the ImageNet
   recipe's batch on an H100), not time after the first forward's compile. What they take beyond that wait moves
   from the first run to before it. Off by default: at the ImageNet recipe's batch on an H100 it took about 0.8 s
   off a 68-73 s first step (docs/RESULTS.md "Compile time").
3. `CudnnWarmup.start` runs one autograd node on a side thread and stream; its backward, on the device's worker
   thread, calls `aten.convolution_backward` for each call on zero tensors of those shapes, strides and dtypes:
   cuDNN's cache key (sizes, memory format, dtype, padding, stride, dilation, groups, pointer alignment) is the one
   the compiled backward's calls make.

Without the second step, the forward's convolutions are benchmarked by the run's first forward. A call the warm-up
has not reached when the run needs it is benchmarked by the run, as without it, and the warm-up then finds it cached.
An algorithm whose workspace the run's call cannot allocate is benchmarked again (ATen drops the cached choice), so on
a GPU whose memory other processes hold the warm-up may save less. A warm-up that fails logs one line and leaves the
run as it was. The GPU tests `tests/method/test_cudnn_warmup.py::test_gpu_*` check that the run's compiled backward,
and its forward after the second step, launch no benchmark after it.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


def warmup_off_reason(cfg: Any, cuda: bool, benchmark: bool) -> str | None:
    """Why `compile_cudnn_warmup` (auto or true) does not run for `cfg` on this device (None: it runs). It pays off
    where a compiled step's first backward comes after a long compile, on a CUDA device whose cuDNN benchmarks its
    algorithms (`benchmark`: `torch.backends.cudnn.benchmark`, which the Trainer sets from `trainer.benchmark`)."""
    reasons = [(cfg.get("compile_cudnn_warmup", False) is False, "compile_cudnn_warmup=false"),
               (not cfg.get("compile", False), "compile=false: the first backward comes at once"),
               (bool(cfg.get("compile_background", False)),
                "compile_background=true: its eager steps benchmark the algorithms from the first step"),
               (not cuda, "no CUDA device"),
               (not benchmark, "cuDNN's heuristics choose the algorithms (trainer.benchmark=false)")]
    return next((why for off, why in reasons if off), None)


def cudnn_benchmarks() -> bool:
    """Whether this process's CUDA convolutions benchmark cuDNN's algorithms."""
    from torch.backends import cudnn

    return bool(cudnn.enabled and cudnn.benchmark and cudnn.is_available())


@dataclass(frozen=True)
class ConvCall:
    """One convolution of the step as cuDNN's algorithm cache sees it, and the gradients its backward computes."""

    input_shape: tuple[int, ...]
    input_stride: tuple[int, ...]
    weight_shape: tuple[int, ...]
    weight_stride: tuple[int, ...]
    dtype: torch.dtype
    bias: bool
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    output_shape: tuple[int, ...]
    output_stride: tuple[int, ...]
    needs: tuple[bool, bool, bool]  # the gradients of input, weight and bias the backward computes

    @classmethod
    def of(cls, args: tuple[Any, ...], out: torch.Tensor) -> ConvCall:
        """From the arguments and result of `aten.convolution.default`."""
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = args
        return cls(tuple(x.shape), tuple(x.stride()), tuple(w.shape), tuple(w.stride()), x.dtype, b is not None,
                   tuple(stride), tuple(padding), tuple(dilation), bool(transposed), tuple(output_padding),
                   int(groups), tuple(out.shape), tuple(out.stride()),
                   (bool(x.requires_grad), bool(w.requires_grad), bool(b is not None and b.requires_grad)))

    def _zeros(self, shape: tuple[int, ...], stride: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=self.dtype, device=device).zero_()

    def _bias_sizes(self) -> list[int] | None:
        return [self.weight_shape[1 if self.transposed else 0] * (self.groups if self.transposed else 1)] \
            if self.bias else None

    def forward(self, device: torch.device | str) -> torch.Tensor:
        """Run this call's forward once on zeros (what a step's forward calls for it); its output."""
        bias_sizes = self._bias_sizes()
        bias = None if bias_sizes is None else torch.zeros(bias_sizes, dtype=self.dtype, device=device)
        return torch.ops.aten.convolution.default(
            self._zeros(self.input_shape, self.input_stride, device),
            self._zeros(self.weight_shape, self.weight_stride, device), bias, list(self.stride), list(self.padding),
            list(self.dilation), self.transposed, list(self.output_padding), self.groups)

    def backward(self, device: torch.device | str) -> tuple[torch.Tensor | None, ...]:
        """Run this call's backward once on zeros (what a step's backward calls for it); its gradients."""

        grad_out = self._zeros(self.output_shape, self.output_stride, device)
        x = self._zeros(self.input_shape, self.input_stride, device)
        w = self._zeros(self.weight_shape, self.weight_stride, device)
        return torch.ops.aten.convolution_backward.default(
            grad_out, x, w, self._bias_sizes(), list(self.stride), list(self.padding), list(self.dilation),
            self.transposed, list(self.output_padding), self.groups, list(self.needs))


def _recorder() -> Any:
    """A dispatch mode that records each `aten.convolution` below it (autocast has cast the inputs by then)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ConvRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: dict[ConvCall, None] = {}  # in call order, once each

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.convolution.default and len(args) == 9:
                self.calls.setdefault(ConvCall.of(args, out), None)
            return out

    return ConvRecorder()


def conv_calls(model: Any, cfg: Any, device: torch.device | str) -> list[ConvCall]:
    """The distinct convolutions of `model`'s step-time student call (`student_forward`) on the run's views, in call
    order (module docstring, 1.). `model` is the method module on its device; nothing runs on that device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scfs.methods.networks import student_forward
    from scfs.training.plain_step import random_views, step_autocast

    device = torch.device(device)
    recorder = _recorder()
    # the backbones and blocks compiled in place (`nn.Module.compile`) run as plain modules here: nothing is traced
    with torch.compiler.set_stance("force_eager"), FakeTensorMode():
        # the copy's tensors are fakes of the student's, so it copies no weight (the memo maps each tensor)
        memo: dict[int, Any] = {}
        for p in model.student.parameters():
            fake = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device)
            memo[id(p)] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
        for b in model.student.buffers():
            memo[id(b)] = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device=b.device)
        student = copy.deepcopy(model.student, memo).eval()
        g, loc = random_views(cfg, device, bool(getattr(model, "channels_last", False)))
        with step_autocast(cfg, device), recorder:
            student_forward(student, g, loc, model.stages, model._local_heads)
    return list(recorder.calls)


def run_forwards(calls: list[ConvCall], device: torch.device | str) -> int:
    """Each call's forward, once, on the calling thread and its current stream, without autograd; waits for the
    device, so that what runs after it times nothing beside them. Returns how many ran."""
    device = torch.device(device)
    with torch.no_grad():
        for call in calls:
            call.forward(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return len(calls)


class _BackwardsOnTheDeviceThread(torch.autograd.Function):
    """An identity whose backward runs `work()`: autograd calls it on the worker thread of the seed's device."""

    @staticmethod
    def forward(ctx: Any, seed: torch.Tensor, work: Any) -> torch.Tensor:
        ctx.work = work
        return seed.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.work()
        return grad, None


def run_backwards(calls: list[ConvCall], device: torch.device | str) -> dict[str, Any]:
    """Each call's backward, once, inside one autograd backward whose node sits on `device`: on a CUDA device, on
    its autograd worker thread. Returns what ran where: `calls` run, `autograd_thread` (the thread's name)."""
    device = torch.device(device)
    seen: dict[str, Any] = {"calls": 0}

    def work() -> None:
        seen["autograd_thread"] = threading.current_thread().name
        seen["in_backward"] = torch._C._current_graph_task_id() != -1
        for call in calls:
            call.backward(device)
            seen["calls"] += 1

    seed = torch.zeros((), device=device, requires_grad=True)
    _BackwardsOnTheDeviceThread.apply(seed, work).backward()
    return seen


class CudnnWarmup:
    """One warm-up of a run's convolutions (module docstring). `start()` lists them on the calling thread (under a
    second for ResNet-50), with `compile_cudnn_warmup_forward` runs their forwards there too, starts the side
    thread of their backwards and returns; `report()` says how far it got."""

    def __init__(self, model: Any, cfg: Any, device: torch.device | str) -> None:
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self.forward = bool(cfg.get("compile_cudnn_warmup_forward", False))
        self.calls: list[ConvCall] = []
        self.thread: threading.Thread | None = None
        self.t0 = self.record_s = self.forward_s = self.done_s = None
        self.error: str | None = None

    def start(self) -> CudnnWarmup:
        self.t0 = time.monotonic()
        try:
            self.calls = conv_calls(self.model, self.cfg, self.device)
        except Exception as err:  # noqa: BLE001 - a warm-up lost, the run as without it
            self._failed(err)
            return self
        self.record_s = time.monotonic() - self.t0
        if self.forward:
            try:
                run_forwards(self.calls, self.device)
            except Exception as err:  # noqa: BLE001 - as above; the backward's warm-up is lost with it
                self._failed(err)
                return self
            self.forward_s = time.monotonic() - self.t0 - self.record_s
            log.info("compile_cudnn_warmup_forward: cuDNN's forward algorithms for %d convolutions chosen in %.1f s "
                     "on the run's thread", len(self.calls), self.forward_s)
        self.thread = threading.Thread(target=self._run, name="scfs-cudnn-warmup", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            with torch.cuda.stream(stream):  # None: the current stream (and no CUDA needed)
                run_backwards(self.calls, self.device)
            if stream is not None:
                stream.synchronize()
        except Exception as err:  # noqa: BLE001 - as in `start`
            self._failed(err)
            return
        self.done_s = time.monotonic() - self.t0
        log.info("compile_cudnn_warmup: cuDNN's backward algorithms for %d convolutions chosen in %.1f s beside the "
                 "compile", len(self.calls), self.done_s)

    def _failed(self, err: BaseException) -> None:
        self.error = f"{type(err).__name__}: {err}"
        which = "convolutions" if self.forward and self.forward_s is None else "backward's convolutions"
        log.warning("compile_cudnn_warmup: the warm-up failed (%s); the run benchmarks its %s itself", self.error,
                    which)

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def report(self) -> dict[str, Any]:
        """`convs`, `record_s` (listing them), `forward_s` (their forwards on the calling thread, with
        `compile_cudnn_warmup_forward`), `done_s` (seconds from the start to the last benchmark; None while it
        runs), `error`."""
        def secs(v: float | None) -> float | None:
            return None if v is None else round(v, 2)

        out: dict[str, Any] = {"convs": len(self.calls), "record_s": secs(self.record_s),
                               "done_s": secs(self.done_s)}
        if self.forward:
            out["forward_s"] = secs(self.forward_s)
        if self.error:
            out["error"] = self.error
        return out


class CudnnWarmupCallback(L.Callback):
    """Starts the warm-up when training starts (the model on its device, the Trainer's cuDNN flags set), on every
    rank; `summary_entry()` is what `summary.json` records under `compile_cudnn_warmup`."""

    summary_key = "compile_cudnn_warmup"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.warmup: CudnnWarmup | None = None
        self.off: str | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.off = warmup_off_reason(self.cfg, pl_module.device.type == "cuda", cudnn_benchmarks())
        if self.off is not None:
            log.info("compile_cudnn_warmup=%s: off here (%s)", self.cfg.get("compile_cudnn_warmup"), self.off)
            return
        self.warmup = CudnnWarmup(pl_module, self.cfg, pl_module.device).start()

    def summary_entry(self) -> dict[str, Any]:
        return self.warmup.report() if self.warmup is not None else {"off": self.off}

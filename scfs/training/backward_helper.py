"""Compiling only the student's backward graph, for a helper process beside the run (`compile_parallel_backward`).

With `compile_parallel` the run still compiles the student's call itself, one graph after the other: its forward
at the first step, its backward at the first backward (docs/RESULTS.md "Compile time"). A second helper process
compiles that backward graph meanwhile into the shared on-disk cache, and the run's first backward loads it.

The backward graph's cache key holds the shapes and strides of the tensors the forward saves for it, and inductor's
*compiled* forward decides those strides: a forward run uncompiled, or a guess, gives keys the run never looks up.
So the helper traces the student's call as the run does (dynamo and AOTAutograd, the run's compile mode) under a
backend that

* lowers the forward graph with inductor and stops before its kernels are generated, then reports the strides its
  outputs got, as a compiled forward reports them, and turns CUDA graphs off where the compiled forward would
  (`lower_forward`; the flag is in the backward's key too);
* compiles the backward graph as inductor does, at once with the forward call
  (functorch's `force_non_lazy_backward_lowering`), so its entry lands under the key the run's backward asks for;
* stops the call instead of running it (`CompiledNotRun`), so the helper holds no activation.

This rests on torch internals (inductor's `compile_fx_inner`, `GraphLowering.compile_to_module`,
`MockFXGraphCacheOutput`, `TracingContext.output_strides`). The slow test
`test_the_runs_student_backward_loads_the_backward_helpers_entry` checks on every torch the project installs that
the run's backward finds the helper's entry, and `scripts/compile_probes.py backward-helper` does so on a GPU's
settings. A helper that fails leaves the run as it is without one: it compiles its backward itself.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NoReturn

import torch


class CompiledNotRun(Exception):
    """Raised by the helper's forward in place of running it, once the call's graphs are compiled."""


def stop_before_running(inputs: Any) -> NoReturn:
    """The helper's forward: the call ends here, before any kernel runs."""
    raise CompiledNotRun


def lower_forward(gm: Any, example_inputs: Any, kw: dict[str, Any]) -> Any:
    """Lower a copy of the forward graph with inductor, stop before its kernels are generated, and leave what the
    backward's compile reads as inductor's compiled forward would: the strides its outputs got
    (`TracingContext.output_strides`; AOTAutograd gives the backward's saved tensors those strides) and the CUDA-graph
    flag it shares with the backward (`kw["cudagraphs"]`, off where `forward_disables_cudagraphs`); both are part of
    the backward's cache key. Returns inductor's lowered graph (`GraphLowering`). A forward already in the cache (the
    run wrote it first) comes back compiled instead, which sets both itself, and None is returned."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.graph import GraphLowering

    lowered: list[Any] = []
    original = GraphLowering.compile_to_module

    def stop(self: Any) -> Any:
        lowered.append(self)
        raise RuntimeError("lowered only")

    GraphLowering.compile_to_module = stop
    cached = None
    try:
        cached = compile_fx_inner(copy.deepcopy(gm), example_inputs, **kw)
    except Exception:  # noqa: BLE001 - the stop above, however inductor wraps it
        if not lowered:
            raise
    finally:
        GraphLowering.compile_to_module = original
    context = torch._guards.TracingContext.try_get()
    if not lowered:
        if context is not None and context.output_strides is not None:
            strides = getattr(cached, "output_strides", None) or []
            context.output_strides.extend(None if st is None else tuple(int(x) for x in st) for st in strides)
        return None
    if context is not None and context.output_strides is not None:
        for out in lowered[0].graph_outputs:
            has = hasattr(out, "has_tensor_output") and out.has_tensor_output()
            context.output_strides.append(tuple(int(x) for x in out.get_layout().stride) if has else None)
    flag = kw.get("cudagraphs")
    if flag and forward_disables_cudagraphs(lowered[0], example_inputs):
        from torch._inductor.utils import BoxedBool

        BoxedBool.disable(flag)
    return lowered[0]


def forward_disables_cudagraphs(lowered: Any, example_inputs: Any) -> bool:
    """Whether inductor's compiled forward would turn CUDA graphs off for this call, by the checks it makes after
    the lowering (`fx_codegen_and_compile`, `CompiledFxGraph`): a reason found while lowering, an op CUDA graphs
    cannot capture, nodes on the CPU or on several devices, inputs that are not tensors or whose memory overlaps.
    The forward then switches off the CUDA-graph flag it shares with its backward, and the flag is part of the
    backward's cache key, so the helper must switch it off too. A check this torch lacks counts as passed."""
    from torch._inductor import config

    if lowered.disable_cudagraphs_reason:
        return True
    if not config.graph_partition:
        try:
            from torch._inductor.utils import get_first_incompatible_cudagraph_node
        except ImportError:
            pass
        else:
            if get_first_incompatible_cudagraph_node(lowered.module) is not None:
                return True
    try:
        from torch._inductor.cudagraph_utils import check_lowering_disable_cudagraph
    except ImportError:
        pass
    else:
        if check_lowering_disable_cudagraph(lowered.device_node_mapping):
            return True
    try:
        from torch._inductor.output_code import complex_memory_overlap
    except ImportError:
        pass
    else:
        if any(complex_memory_overlap(t) for t in example_inputs if isinstance(t, torch.Tensor)):
            return True
    return not all(isinstance(t, (torch.Tensor, torch.SymInt, torch.Generator)) for t in example_inputs)


def mark_forward_device(kw: dict[str, Any], device: str) -> None:
    """Set what a compiled CUDA forward sets before its backward compiles: the forward's device index, which the
    backward's compile options (and so its cache key) carry."""
    boxed = kw.get("boxed_forward_device_index")
    if boxed is not None and str(device).startswith("cuda"):
        boxed.set(torch.cuda.current_device())


def inductor_patches(mode: str | None) -> dict[str, Any]:
    """The inductor options `torch.compile(mode=mode)` passes to inductor (e.g. CUDA graphs for reduce-overhead):
    part of both graphs' cache keys, so the helper compiles under the run's."""
    return dict(torch._TorchCompileInductorWrapper(mode, None, False).config)


def backward_only_backend(mode: str | None, device: str) -> Callable[[Any, Any], Any]:
    """A dynamo backend that compiles only the backward graph of a call, as `torch.compile(mode=mode)` would, and
    stops the call before it runs (module docstring)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.output_code import MockFXGraphCacheOutput

    def inner(gm: Any, example_inputs: Any, **kw: Any) -> Any:
        if kw.get("is_backward"):
            return compile_fx_inner(gm, example_inputs, **kw)
        mark_forward_device(kw, device)
        lower_forward(gm, example_inputs, kw)
        return MockFXGraphCacheOutput(stop_before_running)

    patches = inductor_patches(mode)

    def backend(gm: Any, example_inputs: Any) -> Any:
        return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)

    return backend


def call_until_compiled(fn: Callable[..., Any], *inputs: Any) -> None:
    """Call `fn`, a call compiled with `backward_only_backend`, under the options that make its backward compile
    with the forward call and keep AOTAutograd's cache out (an entry with this backend's forward must never reach
    the run). Returns once both graphs are compiled; raises what else went wrong."""
    import torch._functorch.config as functorch_config

    try:
        with functorch_config.patch(enable_autograd_cache=False, force_non_lazy_backward_lowering=True):
            fn(*inputs)
    except CompiledNotRun:
        return
    except Exception as err:
        if isinstance(err.__cause__, CompiledNotRun) or "CompiledNotRun" in repr(err):
            return
        raise
    raise RuntimeError("the call ran: it was not compiled with backward_only_backend")


def compile_student_backward(model: Any, cfg: Any, device: str, graph: str = "call") -> None:
    """Compile a backward graph of `model`'s step-time student call on random views of the run's sizes
    (`random_views`), under the run's autocast and compile mode, into this process's cache folder. `graph`: "call",
    the whole call (`student_forward`, one graph); "global" or "local", that view batch's graph of the call per view
    size (`student_view_features`, as `SelfDistillation.split_student_call` calls it)."""
    from scfs.methods.networks import student_forward, student_view_features
    from scfs.training.plain_step import random_views, step_autocast

    if graph not in ("call", "global", "local"):
        raise ValueError(f"graph={graph!r}: allowed are call, global, local")
    g, loc = random_views(cfg, device, model.channels_last)
    if graph == "local" and loc is None:
        raise RuntimeError("the local views' backward needs local views (crops.n_local > 0)")
    cast = step_autocast(cfg, device)
    mode = None if model.compile_mode == "default" else model.compile_mode
    backend = backward_only_backend(mode, device)
    if graph == "call":
        fn, args = student_forward, (model.student, g, loc, model.stages, model._local_heads)
    elif graph == "global":
        fn, args = student_view_features, (model.student, g, model.stages, True)
    else:
        fn, args = student_view_features, (model.student, loc, model.stages, model._local_heads)
    with cast:
        call_until_compiled(torch.compile(fn, backend=backend, dynamic=False), *args)

"""A compile child's process: it compiles the run's graphs into the cache the run builds them from.

The child of `compile_background` and each helper of `compile_parallel` are one of these; the run's side is
`scfs.training.background_compile` (its callbacks and gates) and `scfs.training.compile_helpers` (the files both
sides read and write, the command lines, the early start).

Each is `python -m scfs.training.helper_entry <config.yaml> <status.json> --device <device> [flags]`
(`helper_command`), which times its imports and calls `main` here: it builds the run's method from the run's
resolved config on the run's device (`helper_model`), compiles its part of the step (the whole step; the teacher's
call and the losses; the student's backward; the local views' graph and the heads'), so that every graph lands in
the cache folder it shares with the run, and writes a status file atomically when it ends (`ok`, seconds, cache
hits and misses, the `key_settings` it compiled under), which is what every rank of the run reads. A helper that
`scfs.train` starts before its set-up (`--wait-go`) builds the model, then waits for the run's go file and compiles
under the settings and the final config it names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from scfs.training.compile_helpers import (
    BACKWARD_PART,
    HEADS_PART,
    LOCAL_BACKWARD_PART,
    LOCAL_PART,
    PARENT_PID_ENV,
    PARTS,
    ROLES,
    STARTUP_MARKS,
    VIEWS_PART,
    asked_path,
    go_path,
    helper_command,
    launch,
    part_path,
    read_status,
    ready_path,
    since_spawn,
    started_path,
    wait_for_part,
    write_status,
)
from scfs.training.compile_metrics import compile_phase_seconds
from scfs.training.plain_step import cache_counts, make_step, make_views, make_views_ahead

log = logging.getLogger("scfs.train")


def child_command(cfg_path: Path, status_path: Path, device: str, steps: int = 2, helper: bool = False,
                  backward: bool = False, local: bool = False) -> list[str]:
    """The child's command line (`helper_command`: `main` of this module), with this process's `key_settings`."""
    return [*helper_command(cfg_path, status_path, device, steps, helper, backward, local=local),
            "--settings", json.dumps(key_settings())]


def role_child_command(role: str, status_path: Path, device: str) -> list[str]:
    """The command line of the helper of `role` (`ROLES`), with this process's `key_settings` (`child_command`)."""
    return child_command(status_path.with_suffix(".yaml"), status_path, device, ROLES[role].steps,
                         **ROLES[role].command_flags())


def key_settings() -> dict[str, Any]:
    """This process's settings that are part of inductor's and AOTAutograd's cache keys and that a user or a
    library sets process-wide: the matmul precision (`torch.set_float32_matmul_precision("high")`, as Lightning
    suggests) and deterministic algorithms (`trainer.deterministic`). The child takes them (`apply_key_settings`):
    compiled under a fresh process's defaults, none of its entries would be the run's."""
    matmul = torch.backends.cuda.matmul
    out: dict[str, Any] = {"deterministic": torch.are_deterministic_algorithms_enabled(),
                           "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                           "fp16_reduction": matmul.allow_fp16_reduced_precision_reduction,
                           "bf16_reduction": matmul.allow_bf16_reduced_precision_reduction}
    if hasattr(matmul, "fp32_precision"):
        out["fp32_precision"] = matmul.fp32_precision
    else:  # a torch before the fp32_precision setting
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return out


def apply_key_settings(settings: dict[str, Any]) -> None:
    """Set the run's `key_settings` in this (the child's) process."""
    matmul = torch.backends.cuda.matmul
    if "fp32_precision" in settings and hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = settings["fp32_precision"]
    if "float32_matmul_precision" in settings:
        torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    if "fp16_reduction" in settings:
        matmul.allow_fp16_reduced_precision_reduction = settings["fp16_reduction"]
    if "bf16_reduction" in settings:
        matmul.allow_bf16_reduced_precision_reduction = settings["bf16_reduction"]
    if "deterministic" in settings:
        torch.use_deterministic_algorithms(bool(settings["deterministic"]),
                                           warn_only=bool(settings.get("deterministic_warn_only", False)))


def start_child(cfg: DictConfig, batch_size: int, status_path: Path, device: str, steps: int = 2,
                helper: bool = False, command: list[str] | Callable[[], list[str]] | None = None,
                backward: bool = False) -> subprocess.Popen:
    """The child on `device` (`launch`). `command` (or what it makes, once the child's files are cleared) replaces
    its command line (`child_command`)."""
    cfg_path = status_path.with_suffix(".yaml")
    return launch(cfg, batch_size, status_path,
                  command or (lambda: child_command(cfg_path, status_path, device, steps, helper, backward)))


def part_marker(path_of: Callable[[Path, str], Path], status_path: Path,
                parts: tuple[str, ...] = PARTS) -> Callable[[str], None]:
    """`marker(part)` writes the file `path_of(status_path, part)` (`part_path`, `started_path`) for each of `parts`
    (the method's gate asks for other parts too)."""

    def marker(part: str) -> None:
        if part in parts:
            write_status(path_of(status_path, part), {"ok": True})

    return marker


def compile_in_child(cfg_path: Path, status_path: Path, device: str, steps: int,
                     helper: bool = False, backward: bool = False, wait_go: bool = False,
                     local: bool = False) -> dict[str, Any]:
    """Build the run's method from `cfg_path`, compiled, and run `steps` steps on `device`: every graph of the
    step lands in the cache folder this process inherited (TORCHINDUCTOR_CACHE_DIR). Writes the status file (with
    the `key_settings` it compiled under).
    `helper` (`compile_parallel`): the student's call eager, so this process compiles only the teacher's call and
    the losses, and says when each is done (`part_path`) while the run compiles the student's.
    `backward` (`compile_parallel_backward`): no step at all; this process compiles the backward graph of the
    student's call only (`scfs.training.backward_helper`), and says when it begins and when it is written
    (`BACKWARD_PART`); with the student's call per view size (`compile_student_graphs=per_view_size`), that of its
    global views' graph.
    `local` (`compile_student_graphs=per_view_size`): no step; this process compiles the forward graph of the
    student's local views (`LOCAL_PART`) and then the heads' graph (`HEADS_PART`), or with `backward` the local
    views' graph's backward (`LOCAL_BACKWARD_PART`).
    `wait_go` (started early, `scfs.training.compile_helpers.start_early_helpers`): build the model, then wait for
    the run's go (`wait_for_go`) and compile under the settings and the final config it names; the status says
    when the model was ready and when the go came (`early`), and where its start-up went (seconds from its spawn:
    `entry_s`, `torch_s`, `lightning_s` from `scfs.training.helper_entry`; `imported_s` this function reached, its
    modules imported; `cuda_s` CUDA started on a GPU; `built_s` the model built; `on_device_s` on the device;
    `views_s` its random views made, `make_views_ahead`)."""
    t0 = time.perf_counter()
    early: dict[str, Any] = {**STARTUP_MARKS, "imported_s": since_spawn()} if wait_go else {}
    try:
        def build_on_device(cfg: DictConfig) -> Any:
            built = helper_model(cfg, device)
            if wait_go and "built_s" not in early:
                early["built_s"] = since_spawn()
            return built

        cfg = OmegaConf.load(cfg_path)
        if device.startswith("cuda:"):
            torch.cuda.set_device(torch.device(device))  # CUDA's start on this device: the context made
            if wait_go:
                early["cuda_s"] = since_spawn()
        model = build_on_device(cfg)
        if wait_go:
            early["on_device_s"] = since_spawn()
            if not (backward or local):  # one helper builds them: the others would only wait on the build's lock
                early["kernels_s"] = prebuild_search_kernels(model, device)
            make_views_ahead(cfg, device, model.channels_last)
            early["views_s"] = since_spawn()
            early["ready_s"] = since_spawn()
            write_status(ready_path(status_path), {"ready_s": early["ready_s"]})
            go = wait_for_go(status_path)
            early["go_s"] = since_spawn()
            if go is None:
                raise RuntimeError("the run ended before it gave the go")
            apply_key_settings(go.get("settings") or {})
            final = OmegaConf.load(go["config"])
            early["rebuilt"] = OmegaConf.to_container(final) != OmegaConf.to_container(cfg)
            if early["rebuilt"]:  # the run's set-up changed the config the helper was started with
                cfg, model = final, build_on_device(final)
            t0 = time.perf_counter()
        if backward:
            status = _compile_backward_only(model, cfg, device, status_path, local)
        elif local:
            status = _compile_local_graphs(model, cfg, device, status_path)
        else:
            status = _run_steps(model, cfg, device, steps, helper, status_path)
        status = {"ok": True, "seconds": round(time.perf_counter() - t0, 1), **status, **cache_counts(),
                  "settings": key_settings(), **({"early": early} if early else {}), "phases": phases()}
        if device.startswith("cuda"):  # what the child took of the run's GPU
            status["peak_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except Exception as err:  # reported to the run, which then compiles in-process
        status = {"ok": False, "seconds": round(time.perf_counter() - t0, 1),
                  "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300],
                  "settings": key_settings(), **({"early": early} if early else {})}
        log.exception("background compile failed")
    write_status(status_path, status)
    return status


def helper_model(cfg: DictConfig, device: str) -> Any:
    """The run's method, made and initialised on `device` (`build`'s `model_device`), in training mode: a helper
    compiles the run's graphs, which take the run's shapes, dtypes and strides and none of its values."""
    from scfs.training.build import build

    torch.manual_seed(int(cfg.seed))
    return build(cfg, model_device=device)[1].to(device).train()


def phases() -> dict[str, float]:
    """This helper's compile timers (`compile_phase_seconds`, those of 1 ms or more): where its compile went, which
    the run's report and the compile benchmark show beside the run's own."""
    return {k: round(v, 3) for k, v in compile_phase_seconds().items() if v >= 0.001}


GO_TIMEOUT_S = 24 * 3600.0  # an early helper's longest wait for the go (the run's set-up: data, kNN at init)


def prebuild_search_kernels(model: Any, device: str) -> float | None:
    """Build the fused search kernels' CUDA extension now, while the run sets up, if its first step would build
    it: a fresh machine compiles it once (cached in torch's extensions folder afterwards), and the step's choice
    of search backend (`SelfDistillation.prepare_loss`) waits for that build in the run and in the helper alike.
    The seconds it took; None where the method uses no fused search, on the CPU, or when the build fails (the run
    then meets the failure itself, and reports it as it always has)."""
    search = getattr(model, "search_cfg", None) or {}
    if not device.startswith("cuda") or getattr(model, "local_target", None) != "search" \
            or search.get("backend", "auto") not in ("auto", "cuda"):
        return None
    from scfs.search import cuda_backend

    t0 = time.perf_counter()
    try:
        cuda_backend.extension()
    except RuntimeError as err:
        log.info("the search kernels did not build here (%s); the run builds or skips them itself", err)
        return None
    return round(time.perf_counter() - t0, 1)


def wait_for_go(status_path: Path, timeout_s: float = GO_TIMEOUT_S, poll_s: float = 0.02) -> dict[str, Any] | None:
    """The run's go (`go_path`), or None once the process that started this one is gone (the run ended or was
    killed before fit: its helpers must not outlive it) or `timeout_s` passed. The run is the one `child_env`
    named (`PARENT_PID_ENV`), so a run killed during the helper's own start-up counts as gone too: this process's
    parent at the time of the call would by then be whichever process adopted it."""
    parent, t0 = int(os.environ.get(PARENT_PID_ENV) or os.getppid()), time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        go = read_status(go_path(status_path))
        if go is not None:
            return go
        if os.getppid() != parent:
            return None
        time.sleep(poll_s)
    return None


def _run_steps(model: Any, cfg: DictConfig, device: str, steps: int, helper: bool,
               status_path: Path) -> dict[str, Any]:
    """`compile_in_child`'s steps (the whole step, or a `compile_parallel` helper's parts); their status."""
    if model.batch_aug is not None and model.compile_views and not helper:
        make_views(model, cfg, device, steps)
    # a helper's two files per part: begun (at the method's gate, before the part's call) and compiled
    done = part_marker(part_path, status_path) if helper else None
    if helper:
        model.compile_gate = part_marker(started_path, status_path)
    step = make_step(model, cfg, device, model.configure_optimizers(), eager_student=helper, done=done)
    for i in range(steps):
        loss = step(i)
    if helper and model.makes_compiled_views:  # the views the run hands over (`hand_views_to_helper`), after the parts
        views = (VIEWS_PART,)
        part_marker(started_path, status_path, views)(VIEWS_PART)
        make_views(model, cfg, device, 1)  # compiled, and its kernels' launch configs chosen, on the host
        part_marker(part_path, status_path, views)(VIEWS_PART)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"steps": steps, "loss": float(loss)}


def _compile_backward_only(model: Any, cfg: DictConfig, device: str, status_path: Path,
                           local: bool = False) -> dict[str, Any]:
    """`compile_in_child` with `backward`: a backward graph of the student's call into the cache (the whole call's;
    with the call per view size the global views' graph's, or with `local` the local views'), begun and written
    files around it; the seconds it took."""
    from scfs.training.backward_helper import compile_student_backward

    part = LOCAL_BACKWARD_PART if local else BACKWARD_PART
    graph = "local" if local else "global" if model.compile_student_graphs == "per_view_size" else "call"
    part_marker(started_path, status_path, (part,))(part)
    t0 = time.perf_counter()
    compile_student_backward(model, cfg, device, graph)
    part_marker(part_path, status_path, (part,))(part)
    return {"steps": 0, "backward_s": round(time.perf_counter() - t0, 1), "graph": graph}


# How long the local views' helper waits, once its forward is compiled, for the local backward's helper to write
# that graph's backward: a run asking for the local views' graph meanwhile stops the wait (`runs_local_backward`),
# and past a few seconds it would lose more than the AOTAutograd entry saves it (building the graph from the
# inductor entry alone took about 9 s on an H100, from AOTAutograd's about 4 s).
LOCAL_BACKWARD_WAIT_S = 5.0


def runs_local_backward(status_path: Path, timeout_s: float = LOCAL_BACKWARD_WAIT_S) -> bool:
    """Whether the local views' helper writing `status_path` runs the backward through its graph before it says the
    graph is written: only where the local backward's helper beside it has written that backward
    (`LOCAL_BACKWARD_PART`), now or within `timeout_s`, and the run has not asked for the local views' graph yet
    (`asked_path`). A run that asks is waiting: building the graph from the inductor entry at once loses it less
    than waiting out the backward run (the backward's build and first-run benchmarks: seconds on an H100) for
    AOTAutograd's entry. False at once where the other helper has not begun that part (no such helper:
    `compile_parallel_backward` off, or it failed early), has ended without it, or the run has asked."""
    other = status_path.with_name(ROLES["local_backward"].status_file)
    if other == status_path:
        return False
    asked = asked_path(status_path, LOCAL_PART)
    # its final status file written means it ended
    wait_for_part(other, LOCAL_BACKWARD_PART, lambda: other.exists() or asked.exists(), timeout_s,
                  other.with_suffix(".log"), "going on without the local views' backward run")
    return part_path(other, LOCAL_BACKWARD_PART).exists() and not asked.exists()


def _compile_local_graphs(model: Any, cfg: DictConfig, device: str, status_path: Path) -> dict[str, Any]:
    """`compile_in_child` with `local` alone: the forward graph of the student's local views
    (`SelfDistillation.split_student_call`) compiled and run once as the run calls it (its compiled function, the
    run's autocast, weights that require grad), then the heads' graph (`_compile_heads`), begun and written files
    around each; the seconds each took. The local views' backward is not compiled here: the local backward's
    helper does that beside it. Once it has written it (`runs_local_backward`), this process runs the backward
    through the local views' graph too, which builds that backward from its entry and so completes AOTAutograd's
    entry of the graph (AOTAutograd writes it only once the backward is compiled, and then for both directions):
    the run then builds the graph, forward and backward, from that one entry instead of tracing and partitioning
    it again around the inductor entries (`local_backward_run` in the status says whether it ran)."""
    from scfs.training.plain_step import random_views, step_autocast

    if model.compile_student_graphs != "per_view_size":
        raise RuntimeError("the local views' helper needs compile_student_graphs=per_view_size")
    g, loc = random_views(cfg, device, model.channels_last)
    if loc is None:
        raise RuntimeError("the local views' helper needs local views (crops.n_local > 0)")
    part_marker(started_path, status_path, (LOCAL_PART,))(LOCAL_PART)
    t0 = time.perf_counter()
    with step_autocast(cfg, device):
        out = model._features_fn(model.student, loc, model.stages, model._local_heads)
    # the heads' inputs, cut from this graph and copied out of its memory: with CUDA graphs, the backward below ends
    # the graph's step, and the next compiled call (the heads') may overwrite the graph's outputs
    f_l = owned_copies(out)
    forward_s = round(time.perf_counter() - t0, 1)
    backward_run = runs_local_backward(status_path)
    if backward_run:
        backward_through(out)
        model.student.zero_grad(set_to_none=True)
    del out  # its activations: the run needs the GPU's memory for its own first step
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    part_marker(part_path, status_path, (LOCAL_PART,))(LOCAL_PART)
    local_s = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    part_marker(started_path, status_path, (HEADS_PART,))(HEADS_PART)
    _compile_heads(model, cfg, device, g, f_l)
    part_marker(part_path, status_path, (HEADS_PART,))(HEADS_PART)
    # local_s - local_forward_s: the wait for the local backward's entry, and the backward run where it ran
    return {"steps": 0, "local_s": local_s, "local_forward_s": forward_s,
            "heads_s": round(time.perf_counter() - t0, 1), "local_backward_run": backward_run}


def owned_copies(tree: Any) -> Any:
    """Each tensor of `tree` (a pytree) copied into memory of its own, with the same shape, strides, dtype and
    `requires_grad` (so a graph compiled on the copies has the originals' cache key), each a leaf cut from the
    original's autograd graph as `helper_student_outputs` cuts it: what a helper passes from one compiled graph's
    outputs to another graph once the first may be overwritten."""
    from torch.utils._pytree import tree_map_only

    def copy(t: torch.Tensor) -> torch.Tensor:
        own = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return own.copy_(t.detach()).requires_grad_(t.requires_grad)

    return tree_map_only(torch.Tensor, copy, tree)


def backward_through(out: Any) -> None:
    """One backward through every output tensor of `out` (a pytree) that requires grad, each summed: what a helper
    runs so that a compiled graph's backward is built (and its cache entries written) as the run's first backward
    builds it."""
    from torch.utils._pytree import tree_leaves

    grads = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    torch.autograd.backward([t.float().sum() for t in grads])


def _compile_heads(model: Any, cfg: DictConfig, device: str, g: torch.Tensor, f_l: dict[str, Any]) -> None:
    """The heads' graph of the student's call per view size (`student_head_outputs`), compiled, run forward and
    backward once, so its AOTAutograd entry (forward and backward) and its kernels' launch configs land in the
    cache: the run then builds both graphs from the cache instead of compiling them after its local views' graph.
    Its inputs are the run's: the local views' features from this process's compiled graph (`f_l`) and the global
    views' from the same code run eagerly (inductor keeps a compiled graph's output strides equal to eager's), each
    cut from its graph as a leaf that requires grad where the run's input does (`helper_student_outputs`; the eager
    forward keeps no activations, `discard_saved_tensors`), so the backward runs through the heads alone. The eager
    forward runs under `force_eager`: the backbone is also compiled in place (`SelfDistillation._compile`), and
    calling it would otherwise compile the global views' whole backbone here, a graph as large as the local views'
    that the run never asks for, before the heads'."""
    from scfs.methods.base import discard_saved_tensors, helper_student_outputs
    from scfs.methods.networks import student_view_features
    from scfs.training.plain_step import step_autocast

    with step_autocast(cfg, device), discard_saved_tensors(), torch.compiler.set_stance("force_eager"):
        f_g = helper_student_outputs(student_view_features(model.student, g, model.stages, True))
    with step_autocast(cfg, device):
        out = model._heads_fn(model.student, f_g, f_l, model.stages)
    backward_through(out)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("status", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=2, help="steps run (the first builds every graph; the second "
                   "checks the built step runs)")
    p.add_argument("--helper", action="store_true", help="compile the teacher's call and the losses only "
                   "(compile_parallel)")
    p.add_argument("--backward", action="store_true", help="compile the student's backward graph only "
                   "(compile_parallel_backward)")
    p.add_argument("--local", action="store_true", help="compile the student's local views' graph and its heads' "
                   "graph, or with --backward the local views' graph's backward (compile_student_graphs=per_view_size)")
    p.add_argument("--settings", default=None, help="the run's process-wide settings that are part of the cache "
                   "keys, as JSON (key_settings)")
    p.add_argument("--wait-go", action="store_true", help="build the model, then wait for the run's go file with "
                   "its settings and final config (started before the run's set-up)")
    args = p.parse_args(argv)
    if args.settings:
        apply_key_settings(json.loads(args.settings))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not (args.helper or args.backward or args.local):
        with contextlib.suppress(OSError):
            os.nice(5)  # compile_background: the training process keeps the host first, its eager steps are
            # host-bound too; a compile_parallel helper's compile is on the first step's path, as the run's is
    status = compile_in_child(args.config, args.status, args.device, args.steps, args.helper, args.backward,
                              args.wait_go, args.local)
    return 0 if status["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Two ways to compile the student's step faster that a CPU can rule in or out before a GPU window is spent.

The student's call compiles a backbone twice, once per view size (global, local), forward and backward. Two
shortcuts suggest themselves, and each is probed here on a timm ResNet in fresh processes with empty caches:

* `views`: compile one backbone graph with symbolic sizes that serves both view sizes, against the shipped
  static graph with both view sizes in it and against one static graph per view size. A symbolic graph is
  traced and lowered once, but its kernels carry index arithmetic in symbols; whether that is cheaper to build
  is what the probe measures.
* `backward-helper`: a helper process compiles only the backward graph into the shared cache (its forward runs
  the traced graph uncompiled), so that the run, compiling its forward meanwhile, would load its backward from
  the cache. The backward's cache key holds the strides of the tensors the forward saves, which inductor's
  compiled forward decides: `--lowered-strides` has the helper lower its forward (no kernels) to learn them (and
  whether the compiled forward would turn CUDA graphs off, a flag the key holds too),
  `--compile-only` has it compile the backward with the forward call and run nothing (both together are what
  `compile_parallel_backward`'s helper does: `scfs.training.backward_helper`). The probe reports whether the run's
  backward finds the helper's entry, and if not, the first lines of inductor's cache key where the two differ.

    python scripts/compile_probes.py views --out /tmp/views.md
    python scripts/compile_probes.py backward-helper --channels-last --lowered-strides --compile-only

Each mode runs in its own process with its own cache folder, one after another, so the numbers are cold compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `--recipe` imports scfs; a machine may run the script without scfs installed
    sys.path.insert(0, str(ROOT))

VIEW_MODES = ("one-graph", "static", "dynamic")
SHOWN = 4  # differing lines of the backward's cache key shown in the table's note


def _net_and_views(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The backbone and its two view batches; `--channels-last` puts all three in channels_last, as the GPU
    recipes run them (`backbone.channels_last`)."""
    import timm
    import torch

    torch.manual_seed(0)
    net = timm.create_model(args.arch, num_classes=0)
    g = torch.randn(2 * args.batch, 3, args.size, args.size)
    loc = torch.randn(args.local * args.batch, 3, args.size // 2, args.size // 2)
    if args.channels_last:
        fmt = torch.channels_last
        net, g, loc = net.to(memory_format=fmt), g.contiguous(memory_format=fmt), loc.contiguous(memory_format=fmt)
    return net.to(args.device), g.to(args.device), loc.to(args.device)


def _backbone_calls(net: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """The backbone as the probes call it: on both view batches in one call, and on one batch; each returns a
    scalar of its features."""

    def one(x: Any) -> Any:
        with _autocast(args):
            return net(x).float().square().mean()

    def both(g: Any, loc: Any) -> Any:
        return one(g) + one(loc)

    return both, one


def _compile_kw(args: argparse.Namespace) -> dict[str, Any]:
    return {"dynamic": False, **({"mode": args.mode} if args.mode != "default" else {})}


def _autocast(args: argparse.Namespace) -> Any:
    import torch

    return torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16)


def _now(args: argparse.Namespace) -> float:
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _recompile_reasons() -> list[str]:
    """Collects dynamo's recompile messages (why a second graph was compiled) into the returned list."""
    import logging

    import torch

    reasons: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reasons.append(record.getMessage())

    torch._logging.set_logs(recompiles=True)
    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    logger.addHandler(Keep())
    logger.propagate = False
    return reasons


def _child_views(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One cold compile of the student's backbone on both view sizes, forward and backward, then a steady step."""
    import torch
    from torch._dynamo.utils import counters

    net, g, loc = _net_and_views(args)
    reasons = _recompile_reasons()
    both, one = _backbone_calls(net, args)

    if mode == "one-graph":
        fn = torch.compile(both, **_compile_kw(args))
        step = lambda: fn(g, loc)  # noqa: E731
    else:
        fn1 = torch.compile(one, **_compile_kw(args))
        if mode == "dynamic":  # every size symbolic, so one graph serves both view batches
            for x in (g, loc):
                for dim in (0, 2, 3):
                    torch._dynamo.mark_dynamic(x, dim)
        step = lambda: fn1(g) + fn1(loc)  # noqa: E731
    t0 = _now(args)
    loss = step()
    t1 = _now(args)
    loss.backward()
    t2 = _now(args)
    for _ in range(2):
        net.zero_grad()
        step().backward()
    t3 = _now(args)
    for _ in range(args.steps):
        net.zero_grad()
        step().backward()
    t4 = _now(args)
    return {"mode": mode, "forward_s": t1 - t0, "backward_s": t2 - t1, "first_s": t2 - t0,
            "steady_ms": (t4 - t3) / args.steps * 1e3, "graphs": int(counters["stats"]["unique_graphs"]),
            "loss": float(loss), "recompiles": [" ".join(r.split()) for r in reasons]}


def _channels_last_if_ambiguous(t: Any) -> Any:
    """A 4-D tensor that is both contiguous and channels_last-contiguous (its size-1 dimensions let either
    stride order describe it) with channels_last's strides, anything else as it is: the guess `--canonical-strides`
    tests, that a channels_last graph's compiled forward gives every such tensor that order."""
    import torch

    if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_contiguous():
        return t
    if not t.is_contiguous(memory_format=torch.channels_last):
        return t
    n, c, h, w = t.shape
    cl = (h * w * c, 1, w * c, c)
    if tuple(t.stride()) == cl:
        return t
    mode = getattr(t, "fake_mode", None)
    with mode if mode is not None else torch._C._DisableTorchDispatch():
        return torch.empty_strided(t.shape, cl, dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)


def _first_line(err: Exception) -> str:
    """An error as the table reports it: its type and the first line of its message."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def _call_until_compiled(fn: Any, *inputs: Any) -> str:
    """`backward_helper.call_until_compiled`, an error's first line returned as `_backward` returns it."""
    from scfs.training.backward_helper import call_until_compiled

    try:
        call_until_compiled(fn, *inputs)
    except Exception as err:  # noqa: BLE001 - reported in the table
        return _first_line(err)
    return ""


def _backward(loss: Any) -> str:
    """`loss.backward()`; an error's first line instead of raising, so the probe still reports the cache key: a
    helper's backward can fail after its compile wrote the entry (its uncompiled forward saved tensors with other
    strides than the compiled backward expects)."""
    try:
        loss.backward()
    except Exception as err:  # noqa: BLE001 - reported in the table, the run is what counts
        return _first_line(err)
    return ""


def _backbone_pair(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The timm backbone on both view batches, as one call returning a scalar."""
    net, g, loc = _net_and_views(args)
    return _backbone_calls(net, args)[0], g, loc


def _recipe_student(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The project's student call (`scfs.methods.networks.student_forward`: backbone, DINO head and stage heads on
    both view batches) of `--recipe`, on its views' shapes, memory format and precision, as one call returning a
    scalar of all its outputs with a gradient."""
    import torch
    import torch.utils._pytree as pytree

    from scfs.bench.compile import compose
    from scfs.methods.networks import student_forward
    from scfs.train import build
    from scfs.training.plain_step import autocast_for, random_views

    cfg = compose(args.recipe, args.device, args.tiny, "model", False, [])
    torch.manual_seed(int(cfg.seed))
    _, model = build(cfg)
    model = model.to(args.device).train()
    g, loc = random_views(cfg, args.device, model.channels_last)
    cast = autocast_for(str(cfg.trainer.precision), args.device)

    def call(g: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        with cast:
            out = student_forward(model.student, g, loc, model.stages, model._local_heads)
        grads = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        return sum(t.float().square().mean() for t in grads)

    return call, g, loc


def _child_backward(role: str, args: argparse.Namespace) -> dict[str, Any]:
    """`helper`: compile only the backward into the cache; `run`: compile as torch.compile does by default."""
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.codecache as codecache
    from torch._dynamo.utils import counters

    keys: list[list[str]] = []
    original = codecache.compiled_fx_graph_hash

    def recording_hash(*a: Any, **k: Any) -> Any:
        key, lines = original(*a, **k)
        keys.append([key, *lines])
        return key, lines

    codecache.compiled_fx_graph_hash = recording_hash
    both, g, loc = _recipe_student(args) if args.recipe else _backbone_pair(args)

    if role == "helper":
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner
        from torch._inductor.output_code import MockFXGraphCacheOutput

        from scfs.training import backward_helper as bh

        def inner(gm: Any, example_inputs: Any, **kw: Any) -> Any:
            if kw.get("is_backward"):
                if args.canonical_strides:
                    example_inputs = [_channels_last_if_ambiguous(t) for t in example_inputs]
                return compile_fx_inner(gm, example_inputs, **kw)
            bh.mark_forward_device(kw, args.device)
            if args.lowered_strides:  # the strides, and CUDA graphs off where the compiled forward turns them off
                bh.lower_forward(gm, example_inputs, kw)
            if args.compile_only:
                return MockFXGraphCacheOutput(bh.stop_before_running)
            return MockFXGraphCacheOutput(lambda inputs: gm(*inputs))  # the forward runs the traced graph

        patches = bh.inductor_patches(None if args.mode == "default" else args.mode)

        def backend(gm: Any, example_inputs: Any) -> Any:
            return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)

        # no cache entry with an uncompiled forward; --compile-only: the backward compiled with the forward call
        patch = {"enable_autograd_cache": False, "force_non_lazy_backward_lowering": args.compile_only}
        with functorch_config.patch(**patch):
            fn = torch.compile(both, backend=backend, **{k: v for k, v in _compile_kw(args).items() if k != "mode"})
            t0 = _now(args)
            if args.compile_only:  # nothing runs: the call stops once both graphs are compiled
                error, loss = _call_until_compiled(fn, g, loc), torch.tensor(float("nan"))
                t1 = _now(args)
            else:
                loss = fn(g, loc)
                t1 = _now(args)
                error = _backward(loss)
    else:
        fn = torch.compile(both, **_compile_kw(args))
        t0 = _now(args)
        loss = fn(g, loc)
        t1 = _now(args)
        error = _backward(loss)
    t2 = _now(args)
    backward_key = keys[-1]
    return {"role": role, "forward_s": t1 - t0, "backward_s": t2 - t1, "loss": float(loss), "error": error,
            "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]), "backward_key": backward_key}


def _spawn(kind: str, mode: str, cache: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    cmd = [sys.executable, __file__, "_child", kind, mode, *_child_options(args.argv)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"compile_probes: the {kind} child '{mode}' failed (exit {out.returncode}):\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _child_options(argv: list[str]) -> list[str]:
    """The probe's command line as its children take it: the options without the probe's name and `--out`."""
    opts, skip = [], False
    for a in argv[1:]:
        if skip or a.startswith("--out="):
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        opts.append(a)
    return opts


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                         cwd=Path(__file__).resolve().parent)
    return out.stdout.strip() or "unknown"


def _command(args: argparse.Namespace) -> str:
    return " ".join(["python scripts/compile_probes.py", *args.argv])


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def _setup(args: argparse.Namespace) -> str:
    import torch

    if args.recipe:
        return (f"commit `{_commit()}`, the student call of `{args.recipe}`{' (tiny)' if args.tiny else ''} on its "
                f"views, memory format and precision, compile mode {args.mode}, {_device_name(args.device)}, "
                f"torch {torch.__version__}, {os.cpu_count()} cores; each row a fresh process with an empty cache "
                "folder")
    return (f"commit `{_commit()}`, timm `{args.arch}`, global views {2 * args.batch}x3x{args.size}x{args.size}, "
            f"local views {args.local * args.batch}x3x{args.size // 2}x{args.size // 2}"
            f"{', channels_last' if args.channels_last else ''}{', bf16 autocast' if args.bf16 else ''}, "
            f"compile mode {args.mode}, {_device_name(args.device)}, torch {torch.__version__}, "
            f"{os.cpu_count()} cores; each row a fresh process with an empty cache folder")


def views(args: argparse.Namespace) -> str:
    rows = [_spawn("views", mode, tempfile.mkdtemp(prefix="probe-views-"), args) for mode in VIEW_MODES]
    lines = ["# Compile probe: one graph with symbolic view sizes against static graphs", "",
             f"`{_command(args)}` ({_setup(args)}).", "",
             "| mode | graphs | first forward s | first backward s | first step s | steady step ms | loss |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['graphs']} | {r['forward_s']:.1f} | {r['backward_s']:.1f} | "
                     f"{r['first_s']:.1f} | {r['steady_ms']:.1f} | {r['loss']:.5f} |")
    lines += ["", "one-graph: both view sizes in one static graph (the shipped student call); static: one static "
              "graph per view size; dynamic: one graph with every size symbolic (its backward compiles with "
              "its forward)."]
    for r in rows:
        for reason in r["recompiles"]:
            lines += ["", f"{r['mode']}: a second graph was compiled: {reason[:400]}"]
    return "\n".join(lines) + "\n"


def backward_helper(args: argparse.Namespace) -> str:
    cache = tempfile.mkdtemp(prefix="probe-backward-")
    helper = _spawn("backward", "helper", cache, args)
    run = _spawn("backward", "run", cache, args)
    hk, rk = helper["backward_key"], run["backward_key"]
    # a line's own hash leads it ("[hash] name: value"); a value printed with a memory address differs in text only
    differ = [(a, b) for a, b in zip(hk[1:], rk[1:], strict=False) if a.split("]", 1)[0] != b.split("]", 1)[0]]
    lines = ["# Compile probe: a helper that compiles only the backward graph", "",
             f"`{_command(args)}` ({_setup(args)}; the run after the helper, on "
             "the helper's cache folder).", "",
             "| process | first forward s | first backward s | inductor cache hit / miss | loss |",
             "|---|---:|---:|---|---:|"]
    for r in (helper, run):
        lines.append(f"| {r['role']} | {r['forward_s']:.1f} | {r['backward_s']:.1f} | "
                     f"{r['fxgraph_cache_hit']} / {r['fxgraph_cache_miss']} | {r['loss']:.5f} |")
    lines.append("")
    if args.compile_only:
        lines += ["The helper ran with `--compile-only`: its forward column is the whole call's compile (the backward "
                  "compiled with the forward), and nothing ran, so it has no loss.", ""]
    for r in (helper, run):
        if r.get("error"):
            lines += [f"The {r['role']}'s backward raised after its compile: {r['error']}", ""]
    if hk[0] == rk[0]:
        lines.append("The run's backward graph has the helper's cache key.")
    else:
        inputs = sum(a.split("] ", 1)[-1].startswith("example_inputs[") for a, _ in differ)
        lines.append(f"The run's backward graph has another cache key than the helper's: {len(differ)} of "
                     f"{len(rk) - 1} lines of inductor's key details differ ({inputs} of them the graph's example "
                     f"inputs); the first {min(len(differ), SHOWN)}:")
        for a, b in differ[:SHOWN]:
            lines += ["", f"    helper: {a[:240]}", f"    run:    {b[:240]}"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("probe", choices=("views", "backward-helper", "_child"))
    p.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--arch", default="resnet18", help="timm backbone (default resnet18)")
    p.add_argument("--size", type=int, default=96, help="global view side; local views are half of it")
    p.add_argument("--batch", type=int, default=4, help="images; 2 global and --local local views each")
    p.add_argument("--local", type=int, default=6, help="local views per image (default 6, as the CIFAR-10 recipe)")
    p.add_argument("--steps", type=int, default=5, help="timed steady steps, after the first step and two more")
    p.add_argument("--channels-last", action="store_true", help="backbone and views in channels_last")
    p.add_argument("--canonical-strides", action="store_true",
                   help="backward-helper: give the helper's saved tensors whose size-1 dimensions allow both stride "
                        "orders channels_last's strides before its backward compiles")
    p.add_argument("--lowered-strides", action="store_true",
                   help="backward-helper: the helper lowers its forward with inductor (no kernels) to learn the "
                        "strides of the tensors it saves for the backward")
    p.add_argument("--compile-only", action="store_true",
                   help="backward-helper: the helper compiles the backward with its forward call and runs nothing "
                        "(no activations on the device)")
    p.add_argument("--recipe", help="backward-helper: the project's student call of this recipe (cifar10, imagenet, "
                                     "default) instead of a bare timm backbone")
    p.add_argument("--tiny", action="store_true", help="with --recipe: the compile benchmark's tiny network")
    p.add_argument("--bf16", action="store_true", help="the backbone under bf16 autocast, as the GPU recipes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--mode", choices=("default", "reduce-overhead"), default="default",
                   help="torch.compile mode (reduce-overhead: CUDA graphs, as the GPU recipes)")
    p.add_argument("--out", type=Path, help="write the markdown table here too")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.probe == "_child":
        kind, mode = args.child
        result = _child_views(mode, args) if kind == "views" else _child_backward(mode, args)
        print(json.dumps(result))
        return
    text = views(args) if args.probe == "views" else backward_helper(args)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()

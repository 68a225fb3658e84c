"""What a checkpoint write costs the training loop: a stand-in step loop on the device, with one write of a
checkpoint-sized state handed over at a fixed step, each way the project can write it, and the finite check each
save makes first.

    python -m scfs.bench.checkpoint_writes                  # one GPU: a 900 MB state in 902 tensors (the recipe's)
    python -m scfs.bench.checkpoint_writes --device cpu --mb 8 --steps 20 --repeats 1    # a check of the bench itself

Rows, interleaved round by round so that a drift of the machine falls on all of them alike:
- `none`: the loop alone, the baseline;
- `training thread`: `AtomicCheckpointIO` on the loop's thread (`checkpoint.background_writes=false`);
- `background, default stream`: a device snapshot written by `torch.save` on a background thread, which copies
  each tensor to the host with a blocking copy on the default stream, the one the loop's kernels run on;
- `background, own stream`: `BackgroundCheckpointIO` as shipped (the snapshot goes to pinned host memory on a
  stream of the writer's own before `torch.save` sees it);
- `finite check, one by one` and `finite check, as shipped`: no write, only the NaN/Inf check every save makes on
  the loop's thread before anything else: tensor by tensor (a host sync each on a GPU), and `check_finite`'s
  fused screen (one sync per device). Their "write ended" is the check's end.

The loop's step is `--matmuls` bf16 matmuls and one host sync (a logged loss); its time is taken with CUDA events
from the first step's start to the last step's end (host clock on the CPU), so a write that holds the loop's thread,
or its kernels, shows as extra milliseconds over `none`. `--steps` must outlast the write (the record says whether
each write ended inside the loop).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scfs.bench.records import provenance, record_stem, save_record, source_commit
from scfs.models.checkpoint_io import AtomicCheckpointIO, BackgroundCheckpointIO, atomic_torch_save, device_snapshot
from scfs.reliability import check_finite, checked_tensors, non_finite_tensors

MODES = ("none", "training thread", "background, default stream", "background, own stream",
         "finite check, one by one", "finite check, as shipped")


def make_state(mb: float, tensors: int, device: torch.device, seed: int = 0) -> dict[str, Any]:
    """A Lightning-shaped checkpoint of about `mb` MB in `tensors` fp32 tensors on `device`."""
    g = torch.Generator().manual_seed(seed)
    each = max(int(mb * 2**20 / 4 / tensors), 1)
    weights = {f"w{i}": torch.randn(each, generator=g).to(device) for i in range(tensors)}
    return {"state_dict": weights, "global_step": 1}


class _DefaultStreamWriter:
    """The background write without the writer's own stream: a device snapshot on the loop's thread, then
    `torch.save` of it on one background thread (whose copies to the host run on the default stream)."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.ended_at = 0.0

    def save(self, state: dict[str, Any], path: Path) -> None:
        snapshot = device_snapshot(state)

        def write() -> None:
            atomic_torch_save(snapshot, path)
            self.ended_at = time.perf_counter()

        self.thread = threading.Thread(target=write)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()


class _ProjectWriter:
    """The project's own CheckpointIO: `BackgroundCheckpointIO` (as shipped on a GPU) or `AtomicCheckpointIO` (on
    the loop's thread); the write's end is the writer thread's record of it, or the save call's return."""

    def __init__(self, background: bool) -> None:
        self.io = BackgroundCheckpointIO() if background else AtomicCheckpointIO()
        self.ended_at = 0.0

    def save(self, state: dict[str, Any], path: Path) -> None:
        self.io.save_checkpoint(state, path)
        self.ended_at = time.perf_counter()

    def wait(self) -> None:
        if isinstance(self.io, BackgroundCheckpointIO):
            self.io.wait()
            self.io.teardown()
            self.ended_at = float(self.io.write_spans[-1][1] or 0.0)


class _CheckOnly:
    """No write: only the finite check a save makes on the loop's thread, `check(state)`."""

    def __init__(self, check: Callable[[dict[str, Any]], list[str]]) -> None:
        self.check = check
        self.ended_at = 0.0

    def save(self, state: dict[str, Any], path: Path) -> None:
        if self.check(state):
            raise FloatingPointError("the benchmark's state holds NaN or Inf")
        self.ended_at = time.perf_counter()

    def wait(self) -> None:
        pass


WRITERS: dict[str, Callable[[], Any]] = {
    "training thread": lambda: _ProjectWriter(background=False),
    "background, default stream": _DefaultStreamWriter,
    "background, own stream": lambda: _ProjectWriter(background=True),
    "finite check, one by one": lambda: _CheckOnly(lambda state: non_finite_tensors(checked_tensors(state))),
    "finite check, as shipped": lambda: _CheckOnly(check_finite),
}


def run_loop(mode: str, state: dict[str, Any], path: Path, device: torch.device, steps: int, at: int,
             matmuls: int, size: int) -> dict[str, float]:
    """One loop of `steps` steps with `mode`'s write handed over at step `at`: the loop's milliseconds, the save
    call's on the loop's thread, when the write ended (seconds after the save call) and whether that was before
    the loop's end."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    writer = WRITERS[mode]() if mode != "none" else None
    start = torch.cuda.Event(enable_timing=True) if cuda else None
    end = torch.cuda.Event(enable_timing=True) if cuda else None
    save_ms = 0.0
    saved_at = 0.0
    if cuda:
        torch.cuda.synchronize()
        start.record()
    t0 = time.perf_counter()
    for i in range(steps):
        if writer is not None and i == at:
            saved_at = time.perf_counter()
            writer.save(state, path)
            save_ms = 1e3 * (time.perf_counter() - saved_at)
        x = a
        for _ in range(matmuls):
            x = (x @ b) * (1.0 / size**0.5)
        x.float().mean().item()  # the step's host sync (a logged loss)
    if cuda:
        end.record()
        torch.cuda.synchronize()
    loop_end = time.perf_counter()
    loop_ms = start.elapsed_time(end) if cuda else 1e3 * (loop_end - t0)
    write_s = 0.0
    if writer is not None:
        writer.wait()
        write_s = writer.ended_at - saved_at
    return {"loop_ms": loop_ms, "save_call_ms": save_ms, "write_done_s": write_s,
            "inside": writer is None or saved_at + write_s <= loop_end}


def measure(device: torch.device, mb: float, tensors: int, steps: int, at: int, matmuls: int, size: int,
            repeats: int, folder: Path) -> dict[str, Any]:
    state = make_state(mb, tensors, device)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    run_loop("none", state, folder / "warm.ckpt", device, max(steps // 4, 2), at, matmuls, size)  # warm-up
    for _ in range(repeats):
        for mode in MODES:
            runs[mode].append(run_loop(mode, state, folder / "last.ckpt", device, steps, at, matmuls, size))
    base = statistics.median(r["loop_ms"] for r in runs["none"])
    rows = []
    for mode in MODES:
        loops = [r["loop_ms"] for r in runs[mode]]
        rows.append({"mode": mode, "loop_ms": statistics.median(loops), "loop_min_ms": min(loops),
                     "loop_max_ms": max(loops),
                     "extra_ms": statistics.median(loops) - base,
                     "save_call_ms": statistics.median(r["save_call_ms"] for r in runs[mode]),
                     "write_done_s": statistics.median(r["write_done_s"] for r in runs[mode]),
                     "inside": all(r["inside"] for r in runs[mode]), "runs": runs[mode]})
    return {"rows": rows, "state_mb": sum(t.numel() * 4 for t in state["state_dict"].values()) / 2**20}


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [f"# What a checkpoint write costs the training loop: {m['gpu']}, {m['date']}", "",
             f"{provenance(m['commit'], m['command'])} torch {m['torch']}. A {result['state_mb']:,.0f} MB state in "
             f"{m['tensors']} fp32 tensors, handed over at step {m['at']} of a loop of {m['steps']} steps "
             f"({m['matmuls']} matmuls of {m['size']}x{m['size']} and one host sync each); median over "
             f"{m['repeats']} loops per row, the rows interleaved; written to {m['folder_kind']}.", "",
             "| write | loop ms (min-max) | extra ms over none | the save call on the loop's thread, ms | "
             "write ended, s after the call | ended inside the loop |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['mode']} | {r['loop_ms']:.1f} ({r['loop_min_ms']:.1f}-{r['loop_max_ms']:.1f}) | "
                     f"{r['extra_ms']:+.1f} | {r['save_call_ms']:.1f} | {r['write_done_s']:.2f} | "
                     f"{'yes' if r['inside'] else 'no: raise --steps'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--mb", type=float, default=900.0, help="the state's size in MB")
    p.add_argument("--tensors", type=int, default=902,
                   help="how many tensors hold it (the ResNet-50 recipe's checkpoint: 902 float tensors)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--at", type=int, default=5, help="the step whose start hands the write over")
    p.add_argument("--matmuls", type=int, default=12)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if not 0 <= args.at < args.steps:
        print(f"--at {args.at} is outside the loop's {args.steps} steps: pick 0 <= --at < --steps", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda, but no CUDA GPU is visible: run on a GPU machine or pass --device cpu", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = measure(device, args.mb, args.tensors, args.steps, args.at, args.matmuls, args.size,
                         args.repeats, Path(tmp))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result["meta"] = {"gpu": name, "date": time.strftime("%Y-%m-%d"), "commit": source_commit(),
                      "command": "python -m scfs.bench.checkpoint_writes " + " ".join(argv or sys.argv[1:]),
                      "torch": torch.__version__, "tensors": args.tensors, "steps": args.steps, "at": args.at,
                      "matmuls": args.matmuls, "size": args.size, "repeats": args.repeats,
                      "folder_kind": f"a temporary folder under {args.dir or tempfile.gettempdir()}"}
    stem = record_stem(Path(args.out), "checkpoint-writes", name, result["meta"]["date"], result["meta"]["commit"])
    print(save_record(result, stem, markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

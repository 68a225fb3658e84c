"""DDP equivalence: 2 CPU processes (gloo) x batch B train exactly like 1 process x batch 2B.

Same global permutation sharded per rank, views drawn for the global batch and sliced per rank, gradients
averaged by DDP, DINO centre all-reduced, EMA of identical weights, lr scaled by the global batch. BatchNorm
statistics are per device unless SyncBatchNorm is on, and torch's SyncBatchNorm runs on CUDA only, so the CPU
test uses a BatchNorm-free network: the tiny backbone and the stage heads' residual branches with `groupnorm1`
(per-sample statistics) and DINO heads without BN, and compares every weight and buffer. The GPU variant
(marked `gpu`, needs 2 GPUs) keeps every BatchNorm with `sync_bn=true` and compares everything too.

Tolerance: the two runs differ only in float summation order (gradient all-reduce, per-rank means, conv
batching), so losses and weights agree to ~1e-6 relative after 4 SGD steps; asserted at rtol=atol=1e-4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parent / "ddp_worker.py"
COMMON = ["method.head_bn=false", "method.bottleneck_bn=false", "method.freeze_last_layer_epochs=1",
          "trainer.max_epochs=2", "trainer.limit_train_batches=2", "++data.n_train=64"]


def _run(out: Path, data: Path, overrides: list[str], timeout: int = 240) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SCFS_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(WORKER), "--out", str(out), "--data", str(data), *overrides],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _compare(tmp_path: Path, extra: list[str], ddp: list[str], b: int) -> None:
    data = tmp_path / "data"
    _run(tmp_path / "single", data, [*COMMON, *extra, f"batch_size={2 * b}"])
    _run(tmp_path / "ddp", data, [*COMMON, *extra, *ddp, f"batch_size={b}"])
    one = torch.load(tmp_path / "single" / "rank0.pt", weights_only=True)
    r0 = torch.load(tmp_path / "ddp" / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "ddp" / "rank1.pt", weights_only=True)
    assert one["world"] == 1 and r0["world"] == 2
    assert len(one["losses"]) == len(r0["losses"]) == 4  # 2 epochs x 2 steps
    # each rank trained on its half of every global batch: labels of rank 0 then rank 1 = the single batch
    for s, a, c in zip(one["labels"], r0["labels"], r1["labels"]):
        assert torch.equal(s, torch.cat([a, c]))
    # the global loss is the mean of the per-rank losses (equal shards)
    torch.testing.assert_close((r0["losses"] + r1["losses"]) / 2, one["losses"], rtol=1e-4, atol=1e-4)
    assert one["state"].keys() == r0["state"].keys()
    for k, v in one["state"].items():
        if v.is_floating_point():
            torch.testing.assert_close(r0["state"][k], v, rtol=1e-4, atol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
            torch.testing.assert_close(r1["state"][k], r0["state"][k], rtol=0, atol=0)  # ranks stay identical


def test_ddp_two_cpu_processes_match_one_process_with_the_global_batch(tmp_path: Path) -> None:
    _compare(tmp_path, ["+backbone.norm_layer=groupnorm1", "method.stage_norm=groupnorm1", "trainer.accelerator=cpu"],
             ["+trainer.strategy=ddp", "trainer.devices=2"], b=8)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_ddp_two_gpus_sync_bn_match_one_gpu(tmp_path: Path) -> None:
    gpu = ["trainer.accelerator=gpu", "trainer.precision=32-true", "sync_bn=true"]
    _compare(tmp_path, gpu + ["trainer.devices=1"], ["+trainer.strategy=ddp", "trainer.devices=2"], b=8)


def _worker_run(out: Path, data: Path, overrides: list[str], crash_at: int = -1) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SCFS_THREADS": "1"}
    return subprocess.run([sys.executable, str(WORKER), "--run", "--crash-at", str(crash_at), "--out", str(out),
                           "--data", str(data), *overrides], capture_output=True, text=True, timeout=300, env=env,
                          cwd=out.parent)


@pytest.mark.parametrize("writes", ["false", "true"], ids=["writes-on-the-training-thread", "background-writes"])
def test_ddp_crash_mid_epoch_then_resume_is_exact(tmp_path: Path, writes: str) -> None:
    """2 CPU processes (gloo) through `scfs.train.run`, last.ckpt after every step: a crash one step into epoch 1,
    then `resume=`, ends with exactly the weights, optimizer state and step of the uninterrupted 2-process run
    (same world size, so the same reduction order: rtol=0). Checks that the checkpoint carries what every rank
    needs (sampler position of the global batch, RNG of the shared view draws, DINO centre, EMA teacher), and
    that rank 0's background writes (`checkpoint.background_writes=true`) end before a crashed run exits."""
    from helpers import assert_same_tensors

    from scfs.models.checkpoint import safe_load

    data = tmp_path / "data"
    common = [*COMMON, "trainer.accelerator=cpu", "+trainer.strategy=ddp", "trainer.devices=2", "batch_size=8",
              "checkpoint.every_n_train_steps=1", "trainer.deterministic=true", "eval.knn_at_start=false",
              "logger=csv", f"checkpoint.background_writes={writes}"]
    ref = _worker_run(tmp_path / "ref", data, common)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-5000:]
    crashed = _worker_run(tmp_path / "crashed", data, common, crash_at=3)  # steps 0-1 epoch 0, 2-3 epoch 1
    assert crashed.returncode != 0 and "simulated crash at step 3" in crashed.stdout + crashed.stderr
    last = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    assert safe_load(last)["global_step"] == 3
    resumed = _worker_run(tmp_path / "resumed", data, [*common, f"resume={last}"])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-5000:]
    a = safe_load(tmp_path / "ref" / "checkpoints" / "last.ckpt")
    b = safe_load(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"]) and a["global_step"] == 4
    assert_same_tensors(a["state_dict"], b["state_dict"], "state_dict")
    assert_same_tensors(a["optimizer_states"], b["optimizer_states"], "optimizer_states")


def test_ddp_ranks_switch_to_the_compiled_step_at_the_same_step(tmp_path: Path) -> None:
    """`compile_background=true` on 2 CPU processes (gloo) through `scfs.train.run`: rank 0 starts the (stand-in)
    child, which writes its ok status once rank 0 has ended step 2; the ranks read the shared status file at
    their own pace but agree (one collective per check), so both switch at the same step, after step 2."""
    import json

    data = tmp_path / "data"
    common = [*COMMON, "trainer.max_epochs=3", "trainer.accelerator=cpu", "+trainer.strategy=ddp", "trainer.devices=2",
              "batch_size=8", "eval.knn_at_start=false", "logger=csv", "compile=true", "compile_background=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SCFS_THREADS": "1"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(WORKER), "--run", "--background-go-at", "2", "--out", str(out),
                           "--data", str(data), *common], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (json.loads((out / f"compiled-rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1, (r0, r1)
    assert len(r0["compiled"]) == 6 and not any(r0["compiled"][:3]) and r0["compiled"][-1], r0
    assert r0["switched_at"] in (3, 4, 5)


@pytest.mark.parametrize("helper", ["ok", "fail"])
def test_ddp_ranks_pass_the_parallel_compile_gate_together(tmp_path: Path, helper: str) -> None:
    """`compile_parallel=true` on 2 CPU processes (gloo): rank 0 starts the (stand-in) helper; both ranks' first step
    waits at the gate for the teacher's and the losses' parts. A helper that writes them lets both ranks on; one that
    dies without a file is written as a failed status by rank 0, and rank 1, which has no process to watch, learns
    of it from that file instead of waiting out its bound (900 s)."""
    import json

    data = tmp_path / "data"
    common = [*COMMON, "trainer.max_epochs=1", "trainer.accelerator=cpu", "+trainer.strategy=ddp", "trainer.devices=2",
              "batch_size=8", "eval.knn_at_start=false", "logger=csv", "compile=true", "compile_parallel=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "SCFS_THREADS": "1"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(WORKER), "--run", "--parallel-helper", helper, "--out", str(out),
                           "--data", str(data), *common], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    reports = [json.loads((out / f"parallel-rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert set(report["waited_s"]) == {"teacher", "loss"} and max(report["waited_s"].values()) < 120, reports
        assert report["first_step_s"] > 0, reports
    status = json.loads((out / "background_compile.json").read_text())
    assert status["ok"] is (helper == "ok"), status
    if helper == "fail":
        assert "ended with status 1 and no status file" in status["error"], status
        assert not (out / "background_compile.teacher").exists()

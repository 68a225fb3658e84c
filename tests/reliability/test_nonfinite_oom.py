"""NaN/Inf stops the run naming the step and the offending term, with the last good checkpoint kept (and never
a NaN one written); CUDA out of memory says which batch size to try."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg

import scfs.methods.base as module_mod
from scfs.methods.base import SelfDistillation
from scfs.methods.scfs import SCFS
from scfs.models.checkpoint import safe_load
from scfs.models.checkpoint_io import NonFiniteCheckpointError
from scfs.reliability import BatchTooLargeError, check_finite
from scfs.train import run

EVERY_STEP = ["checkpoint.every_n_train_steps=1", "trainer.limit_train_batches=3", "eval.knn_at_start=false"]


def _last(tmp_path) -> dict:
    ckpt = safe_load(tmp_path / "checkpoints" / "last.ckpt")
    assert not check_finite(ckpt)
    return ckpt


def test_nan_loss_term_stops_naming_step_and_term_and_keeps_last_good(tmp_path, shapes_root, monkeypatch):
    original = SCFS._local_target

    def nan_at_step_2(self, stage, *args, **kwargs):
        out = original(self, stage, *args, **kwargs)
        return out * float("nan") if self.global_step == 2 and stage == "layer3" else out

    monkeypatch.setattr(SCFS, "_local_target", nan_at_step_2)
    with pytest.raises(FloatingPointError) as info:
        run(compose_cfg(EVERY_STEP, data_root=shapes_root), tmp_path)
    msg = str(info.value)
    assert "non-finite loss at step 2" in msg and "loss/layer3_local" in msg and "loss/layer2_local" not in msg
    assert f"Last good checkpoint: {tmp_path / 'checkpoints' / 'last.ckpt'}" in msg
    assert _last(tmp_path)["global_step"] == 2


def test_nan_weights_are_never_checkpointed(tmp_path, shapes_root, monkeypatch):
    """Weights that turn NaN with a finite loss: the checkpoint of that step is refused, the previous one kept."""
    original = module_mod.ema_update
    calls = []

    def poison_after_second_step(teacher, student, momentum):
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                next(student.parameters()).view(-1)[0] = float("nan")
        return original(teacher, student, momentum)

    monkeypatch.setattr(module_mod, "ema_update", poison_after_second_step)
    with pytest.raises(NonFiniteCheckpointError, match=r"global_step 2: non-finite values in state_dict\.student"):
        run(compose_cfg(EVERY_STEP, data_root=shapes_root), tmp_path)
    assert _last(tmp_path)["global_step"] == 1


class _NanGrad(torch.autograd.Function):
    """Identity forward (finite loss), NaN backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def test_nan_gradient_stops_before_the_weights_change(tmp_path, shapes_root, monkeypatch):
    original = SelfDistillation.training_step

    def nan_grad_at_step_1(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        if self.global_step == 1:
            loss = loss + 0.0 * _NanGrad.apply(next(self.student.parameters())).sum()
        return loss

    monkeypatch.setattr(SelfDistillation, "training_step", nan_grad_at_step_1)
    with pytest.raises(FloatingPointError, match=r"non-finite gradient at step 1 .*the loss was finite"):
        run(compose_cfg(EVERY_STEP, data_root=shapes_root), tmp_path)
    assert _last(tmp_path)["global_step"] == 1


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   torch.AcceleratorError("CUDA error: out of memory")],
                         ids=["allocator", "cuda-runtime"])
def test_cuda_out_of_memory_names_the_batch_size_to_try(tmp_path, shapes_root, monkeypatch, error):
    """The caching allocator's out-of-memory, and a CUDA runtime call's (cuBLAS' or cuDNN's own allocation, raised
    as `torch.AcceleratorError`), both name the batch size to try."""
    def oom(self, batch, batch_idx):
        raise error

    monkeypatch.setattr(SelfDistillation, "training_step", oom)
    with pytest.raises(BatchTooLargeError, match=r"batch_size=16 per device.*try batch_size=8") as info:
        run(compose_cfg(EVERY_STEP, data_root=shapes_root), tmp_path)
    assert info.value.__cause__ is error


def test_another_cuda_runtime_error_is_not_called_out_of_memory(tmp_path, shapes_root, monkeypatch):
    def crash(self, batch, batch_idx):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(SelfDistillation, "training_step", crash)
    with pytest.raises(torch.AcceleratorError, match="illegal memory access"):
        run(compose_cfg(EVERY_STEP, data_root=shapes_root), tmp_path)

"""`optim.fused` and gradient clipping: the choice rule, and the whole precision x fused x clipping x optimizer
matrix trained through Lightning's real precision plugins (torch's fused SGD/AdamW run on the CPU too, so a fused
step is really built and clipped here; the equal-weights check of fused and foreach steps is in tests/test_train.py
and below)."""

from __future__ import annotations

import itertools

import pytest
import torch

from scfs.config import ConfigError, validate_config
from scfs.optim import FusedOptimizerError, clip_gradients_, use_fused_optimizer
from tests.helpers import compose_cfg


@pytest.mark.parametrize(("want", "name", "fp16", "clip", "fused"), [
    ("auto", "sgd", False, 3.0, False),   # the foreach step: the fused one measured no faster on an H200
    ("auto", "adamw", True, 0.0, False),
    (True, "sgd", False, 3.0, True),      # bf16/fp32 + clipping: clipped by the module, fused step kept
    (True, "adamw", True, 0.0, True),     # fp16 without clipping: the scaler hands the fused step its scale
    (False, "sgd", False, 0.0, False),
])
def test_fused_choice(want, name, fp16, clip, fused):
    assert use_fused_optimizer(want, name, fp16, clip) is fused


@pytest.mark.parametrize(("name", "fp16", "fix"), [("sgd", True, "trainer.gradient_clip_val=0"),
                                                   ("lars", False, "optim.fused=auto")])
def test_impossible_fused_step_names_the_fix(name, fp16, fix):
    with pytest.raises(FusedOptimizerError, match=fix):
        use_fused_optimizer(True, name, fp16, 3.0)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_module_clipping_equals_torch_clipping(algorithm):
    """`clip_gradients_` (used instead of Lightning's plugin) = torch's clipping over the same parameters."""
    g = torch.Generator().manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = 10 * torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    clip_gradients_(a, 0.5, algorithm)
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(b, 0.5)
        assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in a])) == pytest.approx(0.5, rel=1e-5)
    else:
        torch.nn.utils.clip_grad_value_(b, 0.5)
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)


PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
CELLS = list(itertools.product(PRECISIONS, ("auto", "true", "false"), (0.0, 3.0), ("sgd", "adamw", "lars")))


def _trainer(cfg, precision: str, max_steps: int = 2):
    """The Trainer `scfs.train` builds, minus its callbacks and logger. 16-mixed: Lightning would replace it by
    bf16 on the CPU, so its GradScaler plugin is given explicitly (torch's CPU fp16 autocast and scaler)."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    from scfs.train import trainer_kwargs

    kw = trainer_kwargs(cfg)
    plugins = []
    if precision == "16-mixed":
        kw.pop("precision")
        plugins = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]
    kw.update(max_steps=max_steps, limit_train_batches=2, logger=False, enable_checkpointing=False)
    return L.Trainer(**kw, plugins=plugins)


@pytest.mark.parametrize(("precision", "fused", "clip", "optim"), CELLS,
                         ids=[f"{p}-fused_{f}-clip{c:g}-{o}" for p, f, c, o in CELLS])
def test_precision_fused_clip_optimizer_matrix(precision, fused, clip, optim, shapes_root):
    """Every cell trains two steps or stops at start-up with one line naming optim.fused; none reaches Lightning's
    'does not allow for gradient clipping' error (bf16 + fused + clipping did, on the GPU)."""
    from scfs.train import build

    cfg = compose_cfg([f"optim={optim}", f"trainer.precision={precision}", f"++optim.fused={fused}",
                       f"trainer.gradient_clip_val={clip}", "eval.knn_at_start=false",
                       "batch_size=8", "crops.n_local=2"], data_root=shapes_root)
    fp16_clipped = precision == "16-mixed" and clip > 0
    if fused == "true" and (optim == "lars" or fp16_clipped):
        with pytest.raises(ConfigError) as err:
            validate_config(cfg)
        assert "\n" not in str(err.value) and "optim.fused" in str(err.value)
        return
    dm, model = build(cfg)
    before = {k: v.clone() for k, v in model.student.state_dict().items()}
    trainer = _trainer(cfg, precision)
    trainer.fit(model, dm)
    assert trainer.global_step == 2
    opt = trainer.optimizers[0]
    expect_fused = fused == "true"
    assert bool(opt.param_groups[0].get("fused")) is expect_fused
    after = model.student.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert any(not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point())


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_fused_step_through_the_last_layer_unfreezing(optim, shapes_root):
    """The last layer gets its first gradient an epoch after the rest (freeze_last_layer_epochs=1, as the GPU
    recipes): fused SGD then meets a group whose momentum buffers exist only in part (torch raises 'expected Tensor
    ... got NoneType' there; seen on an H200). Fused SGD must train the same weights as the foreach step through
    it; fused AdamW must train on (its per-element normalisation turns rounding differences of the near-zero
    gradients of biases under BatchNorm into lr-sized ones, so only SGD is compared weight by weight)."""
    from scfs.train import build

    states = {}
    for fused in ("true", "false"):
        cfg = compose_cfg([f"optim={optim}", f"++optim.fused={fused}", "method.freeze_last_layer_epochs=1",
                           "trainer.max_epochs=2", "batch_size=8", "crops.n_local=2", "trainer.deterministic=true"],
                          data_root=shapes_root)
        torch.manual_seed(0)  # the same initial weights for both (scfs.train.run seeds the same way)
        dm, model = build(cfg)
        init = {k: v.clone() for k, v in model.student.state_dict().items() if "last_layer" in k}
        trainer = _trainer(cfg, "32-true", max_steps=-1)
        trainer.fit(model, dm)
        assert trainer.global_step == 4
        assert bool(trainer.optimizers[0].param_groups[0].get("fused")) is (fused == "true")
        states[fused] = {k: v.clone() for k, v in model.student.state_dict().items()}
        assert any(not torch.equal(v, states[fused][k]) for k, v in init.items())  # it trained after unfreezing
        assert all(torch.isfinite(v).all() for v in states[fused].values() if v.is_floating_point())
    if optim == "sgd":
        for k, v in states["false"].items():
            torch.testing.assert_close(states["true"][k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-3, 10.0])  # under the limit (no clipping) and over it
def test_one_group_clip_is_torchs_foreach_clip(dtype: torch.dtype, scale: float) -> None:
    """`clip_grad_norm_one_group_` leaves out only a no-op cast: the clipped gradients equal torch's, bit for bit."""
    from scfs.optim import clip_grad_norm_one_group_

    g = torch.Generator().manual_seed(0)
    grads = [(torch.randn(shape, generator=g) * scale).to(dtype) for shape in [(7, 3), (5,), (2, 4, 4)]]
    params = [torch.zeros_like(x, requires_grad=True) for x in grads]
    for p, x in zip(params, grads):
        p.grad = x.clone()
    torch.nn.utils.clip_grad_norm_(params, 1.5, foreach=True)
    ours = [x.clone() for x in grads]
    clip_grad_norm_one_group_(ours, 1.5)
    for p, x in zip(params, ours):
        assert torch.equal(p.grad, x)
    assert any(not torch.equal(a, b) for a, b in zip(grads, ours)) == (scale > 1)

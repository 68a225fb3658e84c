"""`compile_scope=blocks`: each repeated backbone block compiled in place, numerically the eager network."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.config as dynamo_config
from helpers import compose_cfg
from torch import nn

from scfs.methods.networks import repeated_blocks, student_forward, teacher_forward


def _build(overrides: list[str]):
    from scfs.train import build

    torch.manual_seed(0)
    return build(compose_cfg(overrides))[1]


def test_blocks_scope_compiles_every_repeated_block_and_the_losses_only(monkeypatch):
    """The student's and the teacher's blocks (all of them, nothing else) are compiled in place with the run's
    mode; the losses stay one graph; the step's calls and the backbones are not compiled as wholes."""
    import scfs.methods.base as module_mod

    compiled: list[tuple[nn.Module, dict]] = []
    fns: list[str] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: compiled.append((self, kw)))
    monkeypatch.setattr(module_mod.torch, "compile", lambda fn, **kw: fns.append(fn.__name__) or fn)
    model = _build(["compile=true", "compile_scope=blocks", "compile_mode=reduce-overhead"])
    want = [b for net in (model.student, model.teacher) for b in repeated_blocks(net["backbone"])]
    assert len(want) == 2 * 4  # the tiny ResNet: one block per stage
    assert [id(m) for m, _ in compiled] == [id(b) for b in want]
    assert all(kw == {"dynamic": False, "mode": "reduce-overhead"} for _, kw in compiled)
    assert fns == ["step_losses"]
    assert model._student_fn is student_forward and model._teacher_fn is teacher_forward


def test_repeated_blocks_of_a_resnet_and_a_vit():
    from scfs.models.backbone import make_backbone

    r18 = make_backbone("resnet18", stages=("layer4",), cifar_stem=True)
    assert len(repeated_blocks(r18)) == 8 and all(type(b).__name__ == "BasicBlock" for b in repeated_blocks(r18))
    vit = make_backbone("vit_tiny_patch16_224", stages=("last",), arch="vit", img_size=32, patch_size=8, depth=3)
    assert [type(b).__name__ for b in repeated_blocks(vit)] == ["Block"] * 3


def test_unknown_scope_is_refused():
    from scfs.config import ConfigError
    from scfs.train import build

    with pytest.raises(ConfigError, match="compile_scope"):
        build(compose_cfg(["compile=true", "compile_scope=layers"]))


def _step(model, g, loc):
    st = student_forward(model.student, g, loc, model.stages, model._local_heads)
    with torch.no_grad():
        te = teacher_forward(model.teacher, g, model.stages)
    loss = st["logits"].square().mean() + sum(v.square().mean() for v in st["stage_global"].values())
    loss = loss + sum(v.square().mean() for v in st["stage_local"].values())
    loss.backward()
    return st, te


def _compare(backend: str, monkeypatch, rtol: float, atol: float) -> None:
    """The blocks-compiled student and teacher give the eager outputs and weight gradients on both view sizes, and
    every block call is compiled (dynamo's graph limit made a hard failure, so no block falls back to eager)."""
    if backend != "inductor":
        compile_ = nn.Module.compile
        monkeypatch.setattr(nn.Module, "compile", lambda self, **kw: compile_(self, **{**kw, "backend": backend}))
    eager = _build([])
    torch._dynamo.reset()
    compiled = _build(["compile=true", "compile_scope=blocks"])
    g, loc = torch.randn(8, 3, 32, 32), torch.randn(8, 3, 16, 16)
    from torch._dynamo.utils import counters

    counters.clear()
    with dynamo_config.patch(fail_on_recompile_limit_hit=True):
        st_e, te_e = _step(eager, g, loc)
        st_c, te_c = _step(compiled, g, loc)
    # 4 block structures x (student global, student local, teacher global)
    assert counters["stats"]["unique_graphs"] == 4 * 3
    for k in ("pooled_global", "logits"):
        torch.testing.assert_close(st_c[k], st_e[k], rtol=rtol, atol=atol, msg=k)
    for s in compiled.stages:
        torch.testing.assert_close(st_c["stage_global"][s], st_e["stage_global"][s], rtol=rtol, atol=atol)
        torch.testing.assert_close(te_c["maps"][s], te_e["maps"][s], rtol=rtol, atol=atol)
    torch.testing.assert_close(te_c["logits"], te_e["logits"], rtol=rtol, atol=atol)
    n = 0
    for (name, p), q in zip(eager.student.named_parameters(), compiled.student.parameters()):
        if p.grad is not None:
            n += 1
            torch.testing.assert_close(q.grad, p.grad, rtol=10 * rtol, atol=10 * atol, msg=name)
    assert n > 20
    torch._dynamo.reset()


def test_blocks_scope_matches_eager_aot_eager(monkeypatch):
    """The wiring (every block compiled, forward and backward through the compiled blocks) without inductor's
    kernels: seconds."""
    _compare("aot_eager", monkeypatch, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_blocks_scope_matches_eager_inductor(monkeypatch):
    """The same with inductor's generated kernels (float32: fused kernels reorder sums)."""
    _compare("inductor", monkeypatch, rtol=1e-4, atol=1e-5)

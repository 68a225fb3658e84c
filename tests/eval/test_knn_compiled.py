"""The kNN pass of a compiled run (`compile=true`) reuses the training graphs' module without compiling graphs of
its own, and gives the eager module's features."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from helpers import compile_with_backend, compose_cfg
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

from scfs.eval.features import extract_pooled
from scfs.eval.knn import evaluate_backbone_knn


def _build(overrides: list[str]):
    from scfs.train import build

    torch.manual_seed(0)
    return build(compose_cfg(overrides))[1]


def _train_step(model, g: torch.Tensor, loc: torch.Tensor) -> None:
    """The step's two network calls through the model's (compiled or eager) step functions."""
    st = model._student_fn(model.student, g, loc, model.stages, model._local_heads)
    st["logits"].square().mean().backward()
    with torch.no_grad():
        model._teacher_fn(model.teacher, g, model.stages)


def _compiles() -> tuple[int, int]:
    """(frames dynamo has tried to compile, graphs it produced): both grow with any new compile."""
    return counters["frames"]["total"], counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_knn_pass_of_a_compiled_model_compiles_nothing(scope, monkeypatch):
    """After a compiled training step, the kNN pass (BN in eval mode, the evaluation batch size and a partial last
    batch: each a guard miss of the training graphs) adds no compiled frame or graph; its features are the eager
    model's; and compilation is back on afterwards."""
    compile_with_backend(monkeypatch, "aot_eager")
    eager = _build([])
    torch._dynamo.reset()
    compiled = _build(["compile=true", f"compile_scope={scope}"])
    g, loc = torch.randn(8, 3, 32, 32), torch.randn(8, 3, 16, 16)
    counters.clear()
    _train_step(eager, g, loc)
    _train_step(compiled, g, loc)
    after_step = _compiles()
    assert after_step[1] > 0  # the step did run compiled

    ds = TensorDataset(torch.randn(22, 3, 32, 32), torch.arange(22) % 3)
    bank, query = DataLoader(ds, batch_size=6), DataLoader(ds, batch_size=6)  # batches of 6, 6, 6 and 4
    acc = evaluate_backbone_knn(compiled.backbone("teacher"), bank, query, [5])
    feats, labels = extract_pooled(compiled.backbone("teacher"), bank, l2=True)
    assert _compiles() == after_step
    assert acc == evaluate_backbone_knn(eager.backbone("teacher"), bank, query, [5])
    ref, ref_labels = extract_pooled(eager.backbone("teacher"), bank, l2=True)
    torch.testing.assert_close(feats, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(labels, ref_labels) and compiled.backbone("teacher").training

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert _compiles()[0] == after_step[0] + 1  # the pass left the compiler's stance as it found it
    torch._dynamo.reset()

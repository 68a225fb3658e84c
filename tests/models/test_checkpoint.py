"""Checkpoint formats: published SCFS/DINO layouts, torchvision/timm state dicts, refusal of pickled code,
clear mismatch errors."""

import argparse
import os

import pytest
import timm
import torch
import torchvision

from scfs.models import Backbone
from scfs.models.backbone import load_backbone, load_state_dict_file
from scfs.models.checkpoint import (
    CheckpointMismatchError,
    NotACheckpointError,
    UnsafeCheckpointError,
    normalize_keys,
    safe_load,
)

TINY = {"name": "resnet18", "layers": [1, 1, 1, 1], "channels": [8, 16, 16, 32]}


def _tiny_timm_resnet() -> torch.nn.Module:
    torch.manual_seed(1)
    return timm.create_model("resnet18", layers=[1, 1, 1, 1], channels=[8, 16, 16, 32], num_classes=7)


def _assert_same_body(backbone: Backbone, reference: dict[str, torch.Tensor]) -> None:
    body = backbone.body.state_dict()
    for k, v in body.items():
        torch.testing.assert_close(v, reference[k], rtol=0, atol=0, msg=k)


def test_published_teacher_student_format_loads(tmp_path):
    """{"teacher": {"module.backbone.conv1.weight": ...}, "student": {...}, "args": Namespace} as DINO saves it."""
    net = _tiny_timm_resnet()
    sd = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    teacher = {f"module.backbone.{k}": v for k, v in sd.items()}
    teacher["module.head.mlp.0.weight"] = torch.randn(4, 32)  # DINO head: not part of the backbone
    student = {f"module.backbone.{k}": torch.zeros_like(v) for k, v in sd.items()}
    path = tmp_path / "dino_checkpoint.pth"
    torch.save({"teacher": teacher, "student": student, "epoch": 100, "args": argparse.Namespace(arch="resnet50")},
               path)
    _assert_same_body(load_backbone(path, "teacher", TINY), sd)
    assert all(float(v.abs().sum()) == 0 for k, v in load_backbone(path, "student", TINY).body.state_dict().items()
               if k.endswith("weight"))


def test_torchextractor_wrapped_keys_load(tmp_path):
    net = _tiny_timm_resnet()
    sd = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    path = tmp_path / "scfs_published.pth"
    torch.save({"teacher": {f"module.backbone._model.{k}": v for k, v in sd.items()},
                "student": {f"module.backbone.model.{k}": v for k, v in sd.items()}}, path)
    _assert_same_body(load_backbone(path, "teacher", TINY), sd)
    _assert_same_body(load_backbone(path, "student", TINY), sd)


def test_plain_torchvision_state_dict_drops_fc(tmp_path):
    tv = torchvision.models.resnet18(num_classes=5)
    path = tmp_path / "resnet18_tv.pth"
    torch.save(tv.state_dict(), path)
    b = load_backbone(path, backbone_cfg={"name": "resnet18"})
    _assert_same_body(b, tv.state_dict())
    x = torch.randn(2, 3, 64, 64)
    tv.eval()
    trunk = torch.nn.Sequential(*list(tv.children())[:-2])
    torch.testing.assert_close(b.pooled(x), trunk(x).mean((2, 3)))


def test_pretrained_path_of_backbone_uses_the_loader(tmp_path):
    net = _tiny_timm_resnet()
    path = tmp_path / "timm.pth"
    torch.save({"state_dict": net.state_dict()}, path)
    b = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 16, 16, 32), pretrained_path=path)
    _assert_same_body(b, net.state_dict())
    other = Backbone("resnet18", stages=("layer4",), layers=(1, 1, 1, 1), channels=(8, 16, 16, 32))
    load_state_dict_file(other, path)
    _assert_same_body(other, net.state_dict())


class _RunsCode:
    """Pickles as a call of os.mkdir: loading this file with weights_only=False would create `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pickled_code_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"conv1.weight": torch.zeros(1)}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as err:
        safe_load(path)
    assert str(path) in str(err.value) and "code" in str(err.value) and "mkdir" in str(err.value)
    with pytest.raises(UnsafeCheckpointError):
        load_backbone(path, backbone_cfg=TINY)
    assert not marker.exists()


def test_mismatched_checkpoint_lists_keys(tmp_path):
    net = _tiny_timm_resnet()
    sd = {k: v for k, v in net.state_dict().items() if not k.startswith("layer4.")}
    sd["extra.weight"] = torch.zeros(3)
    path = tmp_path / "partial.pth"
    torch.save(sd, path)
    with pytest.raises(CheckpointMismatchError) as err:
        load_backbone(path, backbone_cfg=TINY)
    msg = str(err.value)
    assert "missing keys: " in msg and "layer4.0.bn1.bias" in msg and "unexpected keys: 1 (extra.weight)" in msg
    n_missing = sum(1 for k in net.state_dict() if k.startswith("layer4.") and not k.endswith("num_batches_tracked"))
    assert f"missing keys: {n_missing} (" in msg and ", ...)" in msg  # first few shown, with the count
    assert msg.index("check backbone.name") < msg.index("missing keys")  # the fix before the long key lists
    with pytest.raises(CheckpointMismatchError, match="shape mismatches"):  # a ResNet-18 is not a tiny one
        load_backbone(path, backbone_cfg={"name": "resnet18", "layers": [1, 1, 1, 1]})


def test_normalize_keys_strips_wrappers_and_heads():
    t = torch.zeros(1)
    out = normalize_keys({"module.backbone.body.conv1.weight": t, "module.head.last_layer.weight": t,
                          "fc.bias": t, "_model.layer1.0.bn1.bias": t})
    assert set(out) == {"conv1.weight", "layer1.0.bn1.bias"}


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        safe_load(tmp_path / "nope.ckpt")


def test_folder_is_named_as_a_folder_with_the_checkpoint_inside_suggested(tmp_path):
    """A run folder passed as ckpt= used to be reported as "does not exist"."""
    (tmp_path / "checkpoints").mkdir()
    torch.save({"w": torch.zeros(1)}, tmp_path / "checkpoints" / "last.ckpt")
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a checkpoint file.*checkpoints/last\.ckpt"):
        safe_load(tmp_path)


def test_non_checkpoint_file_is_not_called_unsafe(tmp_path):
    path = tmp_path / "notes.pth"
    path.write_text("# not a checkpoint\n")
    with pytest.raises(NotACheckpointError, match="not a readable PyTorch checkpoint"):
        safe_load(path)


def test_eval_rebuild_ignores_the_runs_pretrained_init(tmp_path):
    """A run started from `backbone.pretrained_path` stores that path in its config; evaluating its checkpoint
    elsewhere (file gone) must not try to read the init, whose weights the checkpoint replaces anyway."""
    from scfs.models.backbone import build_backbone

    b = build_backbone({"name": "resnet18", "layers": [1, 1, 1, 1], "channels": [8, 16, 16, 32],
                        "pretrained_path": str(tmp_path / "gone.pth")})
    assert b.embed_dim == 32

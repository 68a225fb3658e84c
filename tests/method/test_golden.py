"""Golden training steps: 5 CPU steps of `method=scfs` and `method=dino` on a fixed, fully explicit config and
synthetic images must give the losses and weights recorded before the methods became classes (bit for bit on the
processor model and CPU capability they were recorded on; within float32 rounding on another, whose kernels may sum
in another order).

Re-record only for an intended change of the numbers: `python tests/method/test_golden.py --record`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden"
STEPS = 5
EXPLICIT = [  # every key that shapes the numbers, so a changed default elsewhere does not move them
    "backbone.name=resnet18", "backbone.cifar_stem=true", "backbone.stem_stride=2", "backbone.layers=[1,1,1,1]",
    "backbone.channels=[8,16,16,32]", "backbone.channels_last=false", "++backbone.zero_init_last=false",
    "method.out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16", "method.head_layers=3",
    "method.head_bn=true", "method.bottleneck_bn=true", "method.norm_last_layer=true",
    "method.freeze_last_layer_epochs=0", "++method.stage_out_dim=32", "++method.stage_hidden_dim=16",
    "++method.stage_bottleneck_dim=8", "++method.stage_weight=0.5", "++method.stage_final_relu=false",
    "++method.stage_norm=batchnorm", "++method.stage_pooled_bn=true", "method.student_temp=0.1",
    "method.teacher_temp=0.04", "method.warmup_teacher_temp=0.04", "method.warmup_teacher_temp_epochs=0",
    "method.center_momentum=0.9", "method.momentum_teacher=0.99",
    "search=soft", "search.stages=[layer2,layer3,layer4]", "search.backend=reference",
    "crops.global_size=32", "crops.local_size=16", "crops.n_local=2", "crops.global_scale=[0.4,1.0]",
    "crops.local_scale=[0.1,0.4]", "crops.flip_p=0.5", "crops.jitter=[0.4,0.4,0.4,0.1]", "crops.jitter_p=0.8",
    "crops.gray_p=0.2", "crops.blur_p=[1.0,0.1,0.5]", "crops.solarize_p=0.2",
    "optim=sgd", "optim.lr=0.3", "optim.momentum=0.9", "optim.weight_decay=1e-4", "optim.weight_decay_end=1e-4",
    "optim.min_lr=0.0", "optim.warmup_epochs=0", "optim.fused=false", "optim.scale_lr=true",
    "batch_size=8", "seed=0", "data.batch_aug=true", "trainer.precision=32-true", "trainer.gradient_clip_val=3.0",
    "trainer.max_epochs=1", "trainer.deterministic=true",
]


def train_golden(method: str, explicit: list[str] = EXPLICIT) -> dict:
    """Losses per step and a digest of every tensor of the state after STEPS steps (module built as train does)."""
    import lightning as L

    from scfs.train import build
    from tests.helpers import compose_cfg, train_losses

    torch.set_num_threads(1)  # one summation order on any machine with the same CPU capability
    cfg = compose_cfg([*explicit, f"method={method}", *(_method_keys(explicit))])
    L.seed_everything(0, verbose=False)
    _, model = build(cfg)
    losses = train_losses(model, cfg, STEPS)
    state = model.state_dict()
    return {"losses": losses, "capability": torch.backends.cpu.get_cpu_capability(), "cpu": _cpu_model(),
            "tensors": {k: {"sha256": hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest(),
                            "sum": float(v.double().sum()), "abs_sum": float(v.double().abs().sum()),
                            "numel": v.numel()}
                        for k, v in state.items() if v.is_floating_point()}}


def _cpu_model() -> str:
    """The processor's model name: two machines of one CPU capability (say AVX512) can still pick different
    oneDNN kernels and sum in another order, so bit-for-bit holds only on the same model."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def _method_keys(explicit: list[str] = EXPLICIT) -> list[str]:
    return [k for k in explicit if k.lstrip("+").startswith("method.")]  # again after `method=`, which resets it


def assert_matches_golden(got: dict, want: dict, drift_per_element: float = 0.0) -> None:
    """Same tensors; bit for bit on the processor the record was made on, within float32 rounding elsewhere.

    `drift_per_element`: how far one element may move from the record on another processor when rounding
    differences are amplified by the optimiser (Adam normalises each gradient element, so an element whose
    gradient is rounding noise still moves by up to the learning rate a step, in either direction): the abs-sum
    tolerance of a tensor grows by numel x this. The losses are held to float32 rounding either way."""
    assert set(got["tensors"]) == set(want["tensors"]), set(got["tensors"]) ^ set(want["tensors"])
    if got["capability"] == want["capability"] and got["cpu"] == want.get("cpu"):
        assert got["losses"] == want["losses"]
        diff = [k for k, v in want["tensors"].items() if got["tensors"][k]["sha256"] != v["sha256"]]
        assert not diff, f"{len(diff)} tensors differ bit-wise from the golden record, e.g. {diff[:5]}"
    else:
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
        for k, v in want["tensors"].items():
            slack = 1e-5 + drift_per_element * got["tensors"][k]["numel"]
            assert got["tensors"][k]["abs_sum"] == pytest.approx(v["abs_sum"], rel=1e-4, abs=slack), k


@pytest.mark.parametrize("method", ["scfs", "dino"])
def test_five_steps_match_the_golden_record(method):
    assert_matches_golden(train_golden(method), json.loads((GOLDEN / f"{method}.json").read_text()))


if __name__ == "__main__" and "--record" in sys.argv:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    GOLDEN.mkdir(exist_ok=True)
    for m in ("scfs", "dino"):
        rec = train_golden(m)
        (GOLDEN / f"{m}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(m, rec["losses"], len(rec["tensors"]), "tensors")

"""`optim.fused`: when the optimizer's fused kernels are used (the equal-weights check is in tests/test_train.py)."""

import pytest

from scfs.method.module import use_fused_optimizer


@pytest.mark.parametrize(("want", "on_cuda", "fp16", "clip", "fused"), [
    ("auto", True, False, 3.0, True),    # trainer=gpu: bf16 + clipping
    ("auto", True, True, 3.0, False),    # +experiment=imagenet: fp16 loss scaling + clipping, Lightning refuses fused
    ("auto", True, True, 0.0, True),     # fp16 without clipping: the scaler hands the fused step its scale
    ("auto", False, False, 3.0, False),  # CPU: the foreach path of the CPU records
    (True, False, False, 3.0, True),
    (False, True, False, 0.0, False),
])
def test_fused_choice(want, on_cuda, fp16, clip, fused):
    assert use_fused_optimizer(want, on_cuda, fp16, clip) is fused


def test_fused_with_fp16_clipping_names_the_fix():
    with pytest.raises(ValueError, match="optim.fused=auto"):
        use_fused_optimizer(True, True, True, 3.0)

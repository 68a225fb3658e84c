"""Golden training steps on a ViT: 5 CPU steps of `method=scfs` and `method=dino` on the micro ViT (2 blocks, width
64, patch 8, drop path 0.1) with DINO's ViT optimisation (AdamW, weight decay 0.04 -> 0.4 without decay on norms,
biases, position embedding and CLS token, clipping 3.0) must give the recorded losses and weights, as the CNN's
golden steps do (tests/method/test_golden.py, whose recorder and rules this reuses).

Re-record only for an intended change of the numbers: `python tests/method/test_golden_vit.py --record`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.method.test_golden import EXPLICIT, GOLDEN, STEPS, assert_matches_golden, train_golden  # noqa: E402

# the CNN keys of the tests' tiny backbone removed, the ViT's set; the optimiser is the ViT recipe's
VIT_EXPLICIT = [
    *[k for k in EXPLICIT if not k.lstrip("+").startswith(("backbone.", "optim", "search.stages"))],
    "~backbone.cifar_stem", "~backbone.stem_stride", "~backbone.layers", "~backbone.channels",
    "~backbone.zero_init_last", "++backbone.arch=vit", "backbone.name=vit_tiny_patch16_224", "++backbone.patch_size=8",
    "++backbone.img_size=32", "++backbone.embed_dim=64", "++backbone.depth=2", "++backbone.num_heads=2",
    "++backbone.drop_path_rate=0.1", "++backbone.init_values=null", "backbone.channels_last=false",
    "search.stages=[block1,last]",
    "optim=adamw", "optim.lr=5e-4", "optim.betas=[0.9,0.999]", "optim.weight_decay=0.04",
    "optim.weight_decay_end=0.4", "optim.min_lr=1e-6", "optim.warmup_epochs=0", "optim.fused=false",
    "optim.scale_lr=true",
]


def _record(method: str) -> dict:
    return json.loads((GOLDEN / f"vit_{method}.json").read_text())


@pytest.mark.parametrize("method", ["scfs", "dino"])
def test_five_vit_steps_match_the_golden_record(method):
    want = _record(method)
    got = train_golden(method, VIT_EXPLICIT)
    assert any(".blocks.1.attn.qkv.weight" in k for k in got["tensors"])  # it is the ViT that trained
    # AdamW at lr 5e-4 x 8 / 256: two processors' runs can drift apart by up to 2 x lr an element a step
    assert_matches_golden(got, want, drift_per_element=2 * STEPS * 5e-4 * 8 / 256)

if __name__ == "__main__" and "--record" in sys.argv:
    for m in ("scfs", "dino"):
        rec = train_golden(m, VIT_EXPLICIT)
        (GOLDEN / f"vit_{m}.json").write_text(json.dumps(rec, indent=1) + "\n")
        print(m, rec["losses"], len(rec["tensors"]), "tensors")

"""DINO's attention maps: the recomputed last-block attention is the one timm's fused block applies, the CLS maps
lie on the patch grid, and `docs_figures attention` draws them beside the search for random init, a published DINO
ViT file and our own ViT checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from scfs.models.backbone import build_backbone
from scfs.workbench.docs_figures import main

MICRO = {"arch": "vit", "name": "vit_tiny_patch16_224", "patch_size": 8, "img_size": 32, "embed_dim": 64, "depth": 2,
         "num_heads": 2}


def _micro(seed: int = 0):
    torch.manual_seed(seed)
    return build_backbone(MICRO).eval()


@pytest.mark.parametrize("reg_tokens", [0, 2])
def test_recomputed_attention_is_what_the_last_block_applies(reg_tokens):
    """attention @ v through the block's projection = timm's (fused) attention output of the last block; the
    weights are a distribution over the tokens (CLS and register tokens first)."""
    torch.manual_seed(0)
    net = build_backbone({**MICRO, "reg_tokens": reg_tokens}).eval()
    x = torch.randn(2, 3, 40, 32)
    a = net.last_self_attention(x)
    body = net.body
    t = body.norm_pre(body._pos_embed(body.patch_embed(x)))
    for blk in body.blocks[:-1]:
        t = blk(t)
    last = body.blocks[-1]
    y = last.norm1(t)
    attn = last.attn
    b, n, c = y.shape
    v = attn.qkv(y).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
    mine = attn.proj((a @ v).transpose(1, 2).reshape(b, n, c))
    with torch.no_grad():
        torch.testing.assert_close(mine, attn(y), rtol=1e-5, atol=1e-5)
    assert a.shape == (2, 2, n, n) and n == 1 + reg_tokens + 5 * 4
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, n))
    maps = net.cls_attention(x)
    assert maps.shape == (2, 2, 5, 4)
    torch.testing.assert_close(maps.flatten(2), a[:, :, 0, 1 + reg_tokens:])


def _photos(tmp_path, n: int = 2):
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (48 + 8 * i, 40, 3), dtype=np.uint8)).save(folder / f"p{i}.jpg")
    return folder


def test_attention_figure_on_random_init(tmp_path):
    folder = _photos(tmp_path)
    out = main(["attention", "random", "--backbone", "vit_micro", "--folder", str(folder), "--size", "32",
                "--out", str(tmp_path / "a.png")])
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape[0] > 200 and img.shape[1] > 400 and img.std() > 10


def test_attention_figure_on_a_published_dino_vit_file(tmp_path):
    net = _micro(seed=3)
    path = tmp_path / "dino_deitsmall16_pretrain_full_checkpoint.pth"
    torch.save({"teacher": {f"backbone.{k}": v for k, v in net.body.state_dict().items()},
                "student": {f"module.backbone.{k}": v for k, v in net.body.state_dict().items()}, "epoch": 1}, path)
    out = main(["attention", str(path), "--backbone", "vit_micro", "--folder", str(_photos(tmp_path)), "--size", "32",
                "--out", str(tmp_path / "a.png")])
    assert out.is_file()


def test_attention_of_a_cnn_checkpoint_is_one_clear_line(tmp_path):
    import torchvision

    path = tmp_path / "resnet50.pth"
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    with pytest.raises(SystemExit, match="not a ViT"):
        main(["attention", str(path), "--backbone", "resnet50", "--folder", str(_photos(tmp_path)), "--size", "32"])


def test_attention_figure_of_our_vit_checkpoint(tmp_path, shapes_root):
    """A ViT trained here (2 steps): its checkpoint carries its config, no --backbone needed."""
    from scfs.train import run
    from tests.method.test_vit_methods import vit_cfg

    run(vit_cfg(["method=scfs"], shapes_root), tmp_path / "run")
    out = main(["attention", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "--folder",
                str(_photos(tmp_path)), "--size", "32", "--n-images", "1", "--out", str(tmp_path / "a.png")])
    assert out.is_file()


def test_attention_of_a_multirun_draws_each_methods_first_teacher(tmp_path, capsys):
    """--multirun: one figure per method of a finished study, from its first job's teacher; a study that has not
    finished, or a checkpoint and a folder at once, is one parser error."""
    import json

    net = _micro(seed=3)
    sweep = tmp_path / "multirun"
    for job, method in enumerate(("scfs", "dino", "scfs")):
        (sweep / str(job)).mkdir(parents=True)
        ckpt = tmp_path / f"{method}{job}.pth"
        torch.save({"teacher": {f"backbone.{k}": v for k, v in net.body.state_dict().items()}}, ckpt)
        (sweep / str(job) / "summary.json").write_text(json.dumps({"method": method, "checkpoint": str(ckpt)}))
    photos = str(_photos(tmp_path))
    main(["attention", "--multirun", str(sweep), "--backbone", "vit_micro", "--folder", photos, "--size", "32",
          "--n-images", "1", "--out", str(tmp_path / "att.png")])
    printed = capsys.readouterr().out.split()
    assert printed[:2] == [str(tmp_path / "att-scfs.png"), str(tmp_path / "att-dino.png")]
    assert (tmp_path / "att-scfs.png").is_file() and (tmp_path / "att-dino.png").is_file()
    (sweep / "3").mkdir()
    (sweep / "3" / "summary.json").write_text(json.dumps({"method": "dino", "stopped_by_chunk_budget": True}))
    with pytest.raises(SystemExit):
        main(["attention", "--multirun", str(sweep), "--folder", photos])
    assert "did not finish" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["attention", "random", "--multirun", str(sweep), "--folder", photos])
    assert "pass one of the two" in capsys.readouterr().err

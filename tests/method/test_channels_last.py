"""`backbone.channels_last=true` puts the networks' conv weights in the views' layout (not only the views): a
conv whose weight is in another layout than its input converts it, and its gradient back, on every call. The
training numbers stay those of the contiguous weights, to float32 rounding."""

from __future__ import annotations

import copy

import lightning as L
import torch
from helpers import TINY_RESNET18, compose_cfg, train_losses

from scfs.train import build


def _conv_weights(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p for k, p in net.named_parameters() if p.ndim == 4}


def test_channels_last_networks_train_as_contiguous_ones():
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    cfg_cl = compose_cfg([*TINY_RESNET18, "backbone.channels_last=true", "method=scfs"])
    _, cl = build(cfg_cl)
    for net in (cl.student, cl.teacher):
        weights = _conv_weights(net)
        assert weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights.values())
    cfg_plain = compose_cfg([*TINY_RESNET18, "backbone.channels_last=false", "method=scfs"])
    _, plain = build(cfg_plain)
    plain.load_state_dict(copy.deepcopy(cl.state_dict()))  # the same weights, in the contiguous layout
    assert all(w.is_contiguous() for w in _conv_weights(plain.student).values())
    plain.channels_last = True  # the same views (channels_last inputs): only the weights' layout differs

    want, got = train_losses(plain, cfg_plain, 3), train_losses(cl, cfg_cl, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for k, v in plain.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(cl.state_dict()[k], v, rtol=1e-3, atol=1e-5, msg=k)
    for net in (cl.student, cl.teacher):  # the optimizer step and the EMA keep the layout
        assert all(w.is_contiguous(memory_format=torch.channels_last) for w in _conv_weights(net).values())

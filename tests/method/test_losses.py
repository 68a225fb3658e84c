import math

import torch

from scfs.methods.losses import DINOLoss, sharpened_cross_entropy


def test_dino_loss_hand_computed_two_views():
    """2 images, 2 global views, 3 classes: compare with the formula written out by hand."""
    loss_fn = DINOLoss(3, student_temp=1.0, center_momentum=0.5)
    loss_fn.center.copy_(torch.tensor([[0.5, 0.0, -0.5]]))
    t = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # view-major (2 views x 2)
    s = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 3.0]])
    loss = loss_fn(s, t, teacher_temp=0.5)

    def softmax(v):
        e = [math.exp(x) for x in v]
        return [x / sum(e) for x in e]

    c = [0.5, 0.0, -0.5]
    expect = 0.0
    for iq, v in ((0, 1), (1, 0)):
        for b in range(2):
            tp = softmax([(t[iq * 2 + b][k].item() - c[k]) / 0.5 for k in range(3)])
            sp = softmax([s[v * 2 + b][k].item() for k in range(3)])
            expect += -sum(tp[k] * math.log(sp[k]) for k in range(3)) / 2
    assert abs(loss.item() - expect / 2) < 1e-6
    # centre update: 0.5 * old + 0.5 * batch mean of the teacher outputs
    torch.testing.assert_close(loss_fn.center, 0.5 * torch.tensor([[0.5, 0.0, -0.5]]) + 0.5 * t.mean(0, keepdim=True))


def test_dino_loss_is_log_k_when_everything_is_uniform():
    loss_fn = DINOLoss(64)
    loss = loss_fn(torch.zeros(8 * 4, 64), torch.zeros(2 * 4, 64), teacher_temp=0.04)
    assert abs(loss.item() - math.log(64)) < 1e-5


def test_sharpened_cross_entropy_is_not_centred_and_matches_formula():
    torch.manual_seed(0)
    s, t = torch.randn(5, 7), torch.randn(5, 7)
    expect = -(torch.softmax(t / 0.2, -1) * torch.log_softmax(s / 0.1, -1)).sum(-1).mean()
    torch.testing.assert_close(sharpened_cross_entropy(s, t, 0.2, 0.1), expect)

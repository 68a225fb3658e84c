import math

import pytest
import torch

from scfs.methods.ema import ema_update
from scfs.methods.schedules import cosine, linear_warmup


def test_ema_update_formula_and_buffers_untouched():
    torch.manual_seed(0)
    s, t = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    s.weight.data.normal_()
    t.running_mean.fill_(5.0)
    before = t.weight.detach().clone()
    ema_update(t, s, 0.9)
    torch.testing.assert_close(t.weight, 0.9 * before + 0.1 * s.weight)
    assert torch.all(t.running_mean == 5.0)


def test_ema_momentum_one_freezes_teacher():
    s, t = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = t.weight.detach().clone()
    ema_update(t, s, 1.0)
    assert torch.equal(t.weight, before)


def test_cosine_schedule_endpoints_and_warmup():
    assert cosine(0, 100, 1.0, 0.0, warmup_steps=10) == 0.0
    assert cosine(10, 100, 1.0, 0.0, warmup_steps=10) == pytest.approx(1.0)
    assert cosine(100, 100, 1.0, 0.1, warmup_steps=10) == pytest.approx(0.1)
    assert cosine(55, 100, 1.0, 0.0, warmup_steps=10) == pytest.approx(0.5)
    assert cosine(0, 100, 0.996, 1.0) == pytest.approx(0.996)


def test_teacher_temperature_warmup():
    assert linear_warmup(0, 30, 0.04, 0.07) == pytest.approx(0.04)
    assert linear_warmup(15, 30, 0.04, 0.07) == pytest.approx(0.055)
    assert linear_warmup(31, 30, 0.04, 0.07) == 0.07
    assert not math.isnan(linear_warmup(0, 0, 0.04, 0.07))

"""A head whose softmax has a single output makes the DINO loss identically zero: refused at start-up."""

from __future__ import annotations

import pytest
from helpers import compose_cfg

from scfs.config import ConfigError, validate_config


@pytest.mark.parametrize("key", ["method.out_dim", "method.stage_out_dim"])
def test_single_output_head_is_a_config_error(key):
    expected = rf"config key {key}=1 is invalid: expected an integer >= 2 .*identically zero"
    with pytest.raises(ConfigError, match=expected):
        validate_config(compose_cfg([f"{key}=1"]))
    validate_config(compose_cfg([f"{key}=2"]))  # the smallest head that can learn anything


def test_dino_recipe_checks_its_head_too():
    with pytest.raises(ConfigError, match="method.out_dim=1"):
        validate_config(compose_cfg(["method=dino", "method.out_dim=1"]))

"""Methods are classes registered by config name; a new one needs no edit outside its own file and config."""

from __future__ import annotations

import pytest
from helpers import compose_cfg

from scfs.config import ConfigError
from scfs.methods import method_class, methods, register
from scfs.methods.base import SelfDistillation
from scfs.methods.dino import DINO
from scfs.methods.scfs import SCFS


def test_registry_knows_both_methods_and_scfs_extends_dino():
    known = methods()
    assert known["dino"] is DINO and known["scfs"] is SCFS
    assert issubclass(SCFS, DINO) and issubclass(DINO, SelfDistillation)


def test_unknown_method_is_one_config_line_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        method_class("byol")
    assert "\n" not in str(err.value) and "method.name='byol'" in str(err.value) and "dino, scfs" in str(err.value)


def test_build_picks_the_class_of_the_config(shapes_root):
    from scfs.train import build

    for name, cls in (("scfs", SCFS), ("dino", DINO)):
        _, model = build(compose_cfg([f"method={name}"], data_root=shapes_root))
        assert type(model) is cls and model.method_name == name
    dino = build(compose_cfg(["method=dino"], data_root=shapes_root))[1]
    assert len(dino.student["stage_heads"]) == 0 and not hasattr(dino, "stage_losses")


def test_a_new_method_registers_itself():
    @register("test-only-method")
    class Plain(DINO):
        pass

    try:
        assert method_class("test-only-method") is Plain
        with pytest.raises(ValueError, match="registered twice"):
            register("test-only-method")(type("Other", (DINO,), {}))
    finally:
        from scfs.methods import registry

        registry._METHODS.pop("test-only-method")

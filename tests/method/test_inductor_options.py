"""`compile_inductor`: inductor's options from the config, checked against this torch, set at build."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
import torch._inductor.config as inductor_config
from helpers import compose_cfg
from omegaconf import OmegaConf

from scfs import inductor_options
from scfs.config import ConfigError, validate_config


@pytest.fixture
def restore_inductor():
    """Inductor's config as it was before the test (the options are process-wide)."""
    saved = inductor_config.get_config_copy()
    yield
    inductor_config.load_config(saved)


def test_nested_options_flatten_to_inductors_dotted_names():
    assert inductor_options.flatten({"triton": {"autotune_pointwise": False}, "size_asserts": False}) == {
        "triton.autotune_pointwise": False, "size_asserts": False}
    assert inductor_options.flatten(None) == {}


def test_apply_sets_the_options_and_returns_what_they_replaced(restore_inductor):
    was = inductor_config.triton.autotune_pointwise
    before = inductor_options.apply({"triton": {"autotune_pointwise": not was}})
    assert before == {"triton.autotune_pointwise": was} and inductor_config.triton.autotune_pointwise is (not was)
    with pytest.raises(KeyError, match="compile_inductor.triton.no_such_thing"):
        inductor_options.apply({"triton.no_such_thing": 1})
    assert inductor_options.unknown({"triton": {"autotune_pointwise": 1, "nope": 2}, "nope2": 3}) == [
        "triton.nope", "nope2"]


def test_an_unknown_option_or_a_non_mapping_is_one_line():
    with pytest.raises(ConfigError, match=r"compile_inductor\.no_such_option is not an option of "
                                          r"torch\._inductor\.config in torch .*; remove it"):
        validate_config(compose_cfg(["compile=true", "+compile_inductor.no_such_option=1"]))
    with pytest.raises(ConfigError, match="compile_inductor=3 is invalid: it must be a preset"):
        validate_config(compose_cfg(["compile=true", "compile_inductor=3"]))
    with pytest.raises(ConfigError, match=r"compile_inductor='fast' is invalid: it must be a preset \(lean\) or a "
                                          "mapping"):
        validate_config(compose_cfg(["compile=true", "compile_inductor=fast"]))
    listed = compose_cfg(["compile=true"])
    OmegaConf.update(listed, "compile_inductor", [1], merge=False)  # a config made in code: no Hydra merge rules
    with pytest.raises(ConfigError, match=r"compile_inductor=\[1\] is invalid"):
        validate_config(listed)
    validate_config(compose_cfg(["compile=true", "compile_inductor=lean"]))
    validate_config(compose_cfg(["compile=true", "+compile_inductor.triton.autotune_pointwise=false"]))


def test_a_preset_is_its_options_and_an_unknown_preset_is_refused(restore_inductor):
    assert inductor_options.resolve("lean") == inductor_options.PRESETS["lean"]
    assert inductor_options.unknown("lean") == []  # options this torch has
    inductor_config.triton.autotune_pointwise = True
    inductor_config.loop_ordering_after_fusion = True
    inductor_options.apply("lean")
    assert inductor_config.triton.autotune_pointwise is False and inductor_config.loop_ordering_after_fusion is False
    with pytest.raises(KeyError, match="compile_inductor=fast: no such preset"):
        inductor_options.resolve("fast")


def test_each_use_puts_back_what_the_previous_one_set(restore_inductor):
    inductor_config.triton.autotune_pointwise = True
    inductor_config.loop_ordering_after_fusion = True
    assert inductor_options.use("lean") == inductor_options.PRESETS["lean"]
    assert inductor_config.triton.autotune_pointwise is False
    inductor_options.use({"loop_ordering_after_fusion": False})  # the next run: only its own option
    assert inductor_config.triton.autotune_pointwise is True and inductor_config.loop_ordering_after_fusion is False
    inductor_options.use(None)
    assert inductor_config.loop_ordering_after_fusion is True


def test_build_sets_the_configs_options(restore_inductor):
    from scfs.training.build import build

    inductor_config.loop_ordering_after_fusion = True
    build(compose_cfg(["compile=true", "+compile_inductor.loop_ordering_after_fusion=false"]))
    assert inductor_config.loop_ordering_after_fusion is False
    build(compose_cfg(["compile=true"]))  # a second run in this process: inductor's defaults again
    assert inductor_config.loop_ordering_after_fusion is True


def test_the_lean_compile_row_passes_its_options_to_the_rows_process(monkeypatch, tmp_path):
    from scfs.bench import compile as bench

    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return SimpleNamespace(returncode=0, stdout=json.dumps({"first_s": 1.0}), stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = SimpleNamespace(device="cpu", first=1, steady=1, tiny=True, override=["seed=1"])
    bench.run_row(args, "default", "lean", tmp_path / "lean", "model", extra=bench.LEAN)
    overrides = [seen["cmd"][i + 1] for i, a in enumerate(seen["cmd"]) if a == "--override"]
    assert overrides == ["seed=1", *bench.LEAN, "compile_parallel=false", "compile_parallel_backward=false",
                         "compile_cudnn_warmup=false"]
    validate_config(compose_cfg(["compile=true", *bench.LEAN]))  # options this torch has

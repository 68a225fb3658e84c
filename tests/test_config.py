"""Every experiment composes; every invalid value fails at start-up with one line naming key, value, allowed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CONF, compose_cfg
from hydra import compose, initialize_config_dir

from scfs.config import ConfigError, validate_config

EXPERIMENTS = sorted(p.stem for p in (Path(CONF) / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes(experiment):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}"])
    assert cfg.method.name in ("scfs", "dino")
    assert cfg.crops.n_local >= 1
    every = int(cfg.get("finite_check_every_n_steps", 1))
    if every > 1:  # the NaN check's host sync falls on a logging step (which syncs anyway), not on a step of its own
        assert every % int(cfg.trainer.log_every_n_steps) == 0, (every, cfg.trainer.log_every_n_steps)


def test_imagenet_experiment_is_the_published_recipe():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=imagenet"])
    assert cfg.backbone.name == "resnet50" and cfg.batch_size == 256
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.weight_decay) == ("sgd", 0.1, 0.0048, 1e-4)
    assert (cfg.method.warmup_teacher_temp, cfg.method.teacher_temp, cfg.method.warmup_teacher_temp_epochs) == (
        0.04, 0.07, 50)
    assert (cfg.crops.global_size, cfg.crops.local_size, cfg.crops.n_local) == (224, 96, 8)
    assert list(cfg.crops.global_scale) == [0.25, 1.0] and list(cfg.crops.local_scale) == [0.05, 0.25]
    assert cfg.trainer.max_epochs == 200 and "mixed" in cfg.trainer.precision
    # the CPU default's start-up aids are switched back off: published head, last layer frozen for 1 epoch
    assert (cfg.method.head_bn, cfg.method.bottleneck_bn, cfg.method.freeze_last_layer_epochs) == (False, False, 1)
    assert cfg.method.momentum_teacher == 0.996 and list(cfg.crops.jitter) == [0.4, 0.4, 0.2, 0.1]


def test_default_config_is_valid():
    validate_config(compose_cfg())


BAD = [
    ("search.stages=[layer5]", "search.stages"),
    ("search.stages=[]", "search.stages"),
    ("search.weighting=magic", "search.weighting"),
    ("search.local_target=roi_align", "search.local_target"),
    ("search.weighting=roi", "search.weighting"),
    ("search.backend=opencl", "search.backend"),
    ("search.topk=1.5", "search.topk"),
    ("search.temperature=0", "search.temperature"),
    ("search.centre=yes", "search.centre"),
    ("search.centre=1", "search.centre"),
    ("crops.n_local=0", "crops.n_local"),
    ("crops.n_local=-1", "crops.n_local"),
    ("crops.global_scale=[0.0,1.0]", "crops.global_scale"),
    ("crops.local_scale=[0.2,1.5]", "crops.local_scale"),
    ("crops.global_scale=[0.8,0.2]", "crops.global_scale"),
    ("crops.global_size=0", "crops.global_size"),
    ("method.teacher_temp=0", "method.teacher_temp"),
    ("method.student_temp=-0.1", "method.student_temp"),
    ("method.warmup_teacher_temp=0", "method.warmup_teacher_temp"),
    ("method.momentum_teacher=1.5", "method.momentum_teacher"),
    ("method.out_dim=0", "method.out_dim"),
    ("optim.name=rmsprop", "optim.name"),
    ("optim.lr=0", "optim.lr"),
    ("optim.weight_decay=-1", "optim.weight_decay"),
    ("optim.fused=sometimes", "optim.fused"),
    ("optim.fused=true trainer.precision=16-mixed trainer.gradient_clip_val=3", "optim.fused"),
    ("batch_size=0", "batch_size"),
    ("+global_batch_size=7 trainer.devices=2", "global_batch_size"),
    ("data=folder data.root=/definitely/not/here", "data.root"),
    ("data=cifar10 data.root=/definitely/not/here", "data.root"),
    ("data=folder data.root=/tmp data.decode=tpu", "data.decode"),
    ("+data.decode=gpu", "data.decode"),  # shapes: generated arrays, no files to decode
    ("data=folder data.root=/tmp data.decode=gpu data.batch_aug=true", "data.decode"),
    ("data.image_size=4", "data.image_size"),
    ("trainer.max_epochs=0", "trainer.max_epochs"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
    ("compile_mode=turbo", "compile_mode"),
    ("compile_scope=layers", "compile_scope"),
    ("compile_artifacts=''", "compile_artifacts"),
    ("method.stage_norm=layernorm", "method.stage_norm"),
    ("method.stage_pooled_bn=maybe", "method.stage_pooled_bn"),
    ("method.stage_branch_channels=0", "method.stage_branch_channels"),
    ("method.stage_branch_channels=wide", "method.stage_branch_channels"),
]


@pytest.mark.parametrize(("override", "key"), BAD, ids=[b[1] + ":" + b[0] for b in BAD])
def test_invalid_values_name_key_value_and_allowed(override, key):
    cfg = compose_cfg(override.split())
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert key in msg and ("expected" in msg or "invalid" in msg)
    assert "\n" not in msg


def test_presets_set_weighting_and_local_target():
    want = {"soft": ("soft", "search"), "hard": ("hard", "search"), "softmax": ("softmax", "search"),
            "roi": ("soft", "roi"), "none": ("soft", "none")}
    for preset, (weighting, target) in want.items():
        cfg = compose_cfg([f"search={preset}"])
        validate_config(cfg)
        assert (cfg.search.weighting, cfg.search.local_target) == (weighting, target)
        assert "mode" not in cfg.search


def test_retired_search_mode_is_refused_naming_the_new_keys():
    cfg = compose_cfg(["+search.mode=hard"])
    with pytest.raises(ConfigError, match="search.weighting .* search.local_target") as err:
        validate_config(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override", ["search.mode=hard", "+search.mode=roi"])
def test_retired_search_mode_on_the_command_line_is_one_line(override):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "scfs.train", override], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "search.mode no longer exists" in lines[0] and "search.weighting" in lines[0]


def test_old_checkpoints_single_mode_key_still_reads():
    from scfs.names import search_label, search_settings

    assert search_settings({"mode": "hard"}) == ("hard", "search")
    assert search_settings({"mode": "roi"}) == ("soft", "roi")
    assert search_settings({"weighting": "softmax", "local_target": "none"}) == ("softmax", "none")
    assert search_label({"weighting": "softmax", "local_target": "search"}) == "softmax"
    assert search_label({"weighting": "soft", "local_target": "roi"}) == "roi"


def test_centred_search_is_off_by_default_and_named_in_labels():
    """Every preset keeps the published raw cosine; `search.centre=true` composes, validates and is named."""
    from scfs.names import search_label

    for preset in ("soft", "hard", "softmax", "roi", "none"):
        assert compose_cfg([f"search={preset}"]).search.centre is False
    cfg = compose_cfg(["search.centre=true"])
    validate_config(cfg)
    assert search_label(cfg.search) == "soft-centred"
    assert search_label(compose_cfg(["search=hard", "search.centre=true"]).search) == "hard-centred"
    assert search_label({"weighting": "soft", "local_target": "search"}) == "soft"  # checkpoints without the key


def test_missing_cifar_root_names_the_prepare_command():
    cfg = compose_cfg(["data=cifar10", "data.root=/nope"])
    with pytest.raises(ConfigError, match="scfs.data.prepare cifar10"):
        validate_config(cfg)


def test_unknown_experiment_is_a_hydra_error():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="experiment"):
        compose_cfg(["+experiment=does_not_exist"])


def test_cifar10_experiment_is_the_tuned_recipe_for_both_methods():
    """README "CIFAR-10": one recipe for both methods; BN in the head MLPs since the 2026-11-30 tuning."""
    for method in ("scfs", "dino"):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=["+experiment=cifar10", f"method={method}"])
        assert cfg.method.name == method and cfg.batch_size == 512
        assert cfg.backbone.name == "resnet18" and cfg.backbone.cifar_stem
        assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay) == ("sgd", 0.12, 5e-4)
        assert (cfg.method.head_bn, cfg.method.out_dim, cfg.method.teacher_temp) == (True, 4096, 0.04)
        assert cfg.data.batch_aug and cfg.data.on_device


def test_shapes_long_is_the_cpu_default_longer_at_64_px():
    """+experiment=shapes_long (and its CPU smoke) inherit the default's data, crop scales and start-up aids, and
    the smoke trains the GPU recipe's data, crops and method; ShapesSpec(image_size=64) is that data (the spec
    to generate once before SCFS and DINO run side by side on one GPU)."""
    from omegaconf import OmegaConf

    from scfs.data.shapes import ShapesSpec

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        base, long, smoke = (compose(config_name="config", overrides=o) for o in (
            [], ["+experiment=shapes_long"], ["+experiment=shapes_long_cpu"]))
    for key in ("data.max_objects", "data.clutter", "data.object_scale", "data.n_train", "data.n_val",
                "crops.global_scale", "crops.local_scale", "crops.n_local", "method", "search", "optim"):
        assert OmegaConf.select(long, key) == OmegaConf.select(base, key), key
    assert (long.data.image_size, long.crops.global_size, long.crops.local_size) == (64, 64, 32)
    assert long.backbone.name == "resnet18" and long.backbone.cifar_stem and "layers" not in long.backbone
    assert (long.trainer.accelerator, long.trainer.precision, long.batch_size) == ("gpu", "bf16-mixed", 128)
    assert long.trainer.max_time and long.eval.knn_every_n_epochs > 0
    assert smoke.data == long.data and smoke.crops == long.crops and smoke.method == long.method
    assert smoke.backbone == base.backbone and smoke.trainer.accelerator == "cpu"
    assert smoke.trainer.max_epochs * smoke.trainer.limit_train_batches <= 20  # a smoke: minutes on 2 cores
    spec = ShapesSpec(image_size=64)
    assert (spec.max_objects, spec.clutter, list(spec.object_scale), spec.n_train, spec.n_val, spec.seed) == (
        long.data.max_objects, long.data.clutter, list(long.data.object_scale), long.data.n_train, long.data.n_val,
        long.data.seed)


def test_check_accelerator_names_the_key_and_the_fix(monkeypatch):
    """A GPU recipe on a machine without (enough) GPUs: one line before any work, not Lightning's
    "No supported gpu backend found!" from inside the Trainer."""
    import torch

    from scfs.config import check_accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_accelerator({"accelerator": "cpu", "devices": 3})  # CPU processes (gloo DDP) are fine
    with pytest.raises(ConfigError, match=r"accelerator=gpu is invalid: torch sees no CUDA GPU.*accelerator=cpu"):
        check_accelerator({"accelerator": "gpu"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_accelerator({"accelerator": "gpu", "devices": 1})
    with pytest.raises(ConfigError, match=r"trainer.devices=3 is invalid: torch sees 1 CUDA GPU"):
        check_accelerator({"accelerator": "cuda", "devices": 3})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    check_accelerator({"accelerator": "gpu", "precision": "bf16-mixed"})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    check_accelerator({"accelerator": "gpu", "precision": "16-mixed"})
    with pytest.raises(ConfigError, match=r"trainer.precision=bf16-mixed is invalid: .*no native bfloat16.*16-mixed"):
        check_accelerator({"accelerator": "gpu", "precision": "bf16-mixed"})


@pytest.mark.parametrize("trainer", ["cpu", "ddp"])
def test_gradient_accumulation_is_a_trainer_key(trainer):
    """`trainer.accumulate_grad_batches` (a factor of the global batch, README) is set without `+` and reaches the
    Trainer; backbone.pretrained_path likewise exists in every backbone config."""
    from scfs.train import trainer_kwargs

    cfg = compose_cfg([f"trainer={trainer}", "trainer.accumulate_grad_batches=4"])
    assert trainer_kwargs(cfg)["accumulate_grad_batches"] == 4
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        for b in ("tiny", "resnet18", "resnet18_cifar", "resnet50"):
            assert compose(config_name="config", overrides=[f"backbone={b}"]).backbone.pretrained_path is None


def test_gpu_trainers_use_the_cudnn_autotuner():
    """trainer=gpu and trainer=ddp turn on cudnn.benchmark (fixed view shapes; the published DINO code sets it);
    the CPU trainer leaves Lightning's default."""
    from scfs.train import trainer_kwargs

    for trainer in ("gpu", "ddp"):
        assert trainer_kwargs(compose_cfg([f"trainer={trainer}"]))["benchmark"] is True
    assert "benchmark" not in trainer_kwargs(compose_cfg(["trainer=cpu"]))


def test_gpu_recipes_ship_the_compiled_path():
    """`+experiment=imagenet` and `cifar10` run the fastest correct path as shipped (torch.compile + CUDA graphs),
    with no flag to know; the CPU default stays eager (a compile would cost more than its 3 minutes)."""
    for exp in ("imagenet", "cifar10"):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"+experiment={exp}"])
        assert (cfg.compile, cfg.compile_mode) == (True, "reduce-overhead"), exp
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        assert compose(config_name="config").compile is False


def test_imagenet_recipe_fuses_its_views_and_says_how_to_leave_inductor():
    """The ImageNet recipe makes its views on the GPU and ships them compiled (`compile_views`, measured end to end);
    moving that recipe to the cudagraphs backend names the one extra key to set, and the CIFAR recipe, whose views
    the workers make, leaves it off."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        imagenet = compose(config_name="config", overrides=["+experiment=imagenet"])
        cifar = compose(config_name="config", overrides=["+experiment=cifar10"])
        graphs = compose(config_name="config", overrides=["+experiment=imagenet", "compile_backend=cudagraphs",
                                                          "compile_mode=default"])
    assert imagenet.compile_views is True and imagenet.data.colour_on_device is True
    assert cifar.compile_views is False
    with pytest.raises(ConfigError, match="compile_views=true is invalid with compile_backend=cudagraphs.*"
                                          "set compile_views=false"):
        validate_config(graphs)


def test_compile_cache_points_torch_at_the_configured_folder(tmp_path, monkeypatch, caplog):
    """`compile_cache` becomes TORCHINDUCTOR_CACHE_DIR (a user's own setting wins), and the run says in one line
    why its first steps wait, and whether the cache already holds compiled graphs."""
    import logging

    from omegaconf import OmegaConf

    from scfs.training.setup import prepare_compile_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cfg = OmegaConf.create({"compile": True, "compile_mode": "reduce-overhead", "compile_cache": str(tmp_path / "c")})
    with caplog.at_level(logging.INFO, logger="scfs.train"):
        assert prepare_compile_cache(cfg) == tmp_path / "c"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c")
    assert "nothing cached yet" in caplog.text and "a few minutes this time" in caplog.text
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "fxgraph").mkdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scfs.train"):
        prepare_compile_cache(cfg)
    assert "reusing the compiled graphs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scfs.train"):  # no kernels to cache: the wait is the tracing alone
        prepare_compile_cache(OmegaConf.merge(cfg, {"compile_mode": "default", "compile_backend": "cudagraphs"}))
    assert "no kernels generated" in caplog.text and "reusing" not in caplog.text
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert prepare_compile_cache(cfg) == tmp_path / "mine"
    assert prepare_compile_cache(OmegaConf.create({"compile": False})) is None


def test_compile_cache_is_not_lost_to_the_folder_importing_lightning_sets(tmp_path):
    """Importing Lightning writes inductor's default folder into TORCHINDUCTOR_CACHE_DIR; a run imports it before
    choosing its cache, so that value is nobody's choice: `compile_cache` still names the folder (in a fresh
    process, as the training command runs), and `compile_cache=null` keeps torch's own."""
    script = f"""
import os
assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
import lightning  # noqa: F401
from omegaconf import OmegaConf
from scfs.training.compile_helpers import choose_compile_cache, torch_default_cache_dir
assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == torch_default_cache_dir(), "Lightning no longer sets it"
print(choose_compile_cache(OmegaConf.create({{"compile_cache": None}})))
print(choose_compile_cache(OmegaConf.create({{"compile_cache": {str(tmp_path / "c")!r}}})))
print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
"""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:3] == ["None", str(tmp_path / "c"), str(tmp_path / "c")]


def test_the_cache_is_chosen_without_importing_torch(tmp_path):
    """The early compile helpers start before the run imports torch, and they take the cache folder it chose: a
    user's own TORCHINDUCTOR_CACHE_DIR is taken, and one holding torch's own folder (inherited from a process that
    imported Lightning) gives way to `compile_cache`, both without importing torch."""
    script = """
import os, sys
from omegaconf import OmegaConf
from scfs.training.compile_helpers import choose_compile_cache
print(choose_compile_cache(OmegaConf.create({"compile_cache": "/elsewhere"})), "torch" in sys.modules)
"""
    from scfs.training.compile_helpers import torch_default_cache_dir

    for value, chosen in ((str(tmp_path / "mine"), str(tmp_path / "mine")), (torch_default_cache_dir(), "/elsewhere")):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": value}
        res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.split() == [chosen, "False"]


def test_torchs_default_cache_folder_is_worked_out_as_torch_does():
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from scfs.training.compile_helpers import torch_default_cache_dir

    assert torch_default_cache_dir() == os.path.abspath(default_cache_dir())

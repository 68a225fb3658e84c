"""The CUDA driver's view of the GPUs (`scfs.cuda_driver`), which lets a run's accelerator check pass without
importing torch, and the check that falls back to torch wherever the driver does not show enough."""

import pytest

from scfs.config import ConfigError, check_accelerator, driver_shows_enough
from scfs.cuda_driver import DRIVER_LIBRARIES, cuda_driver_devices


class FakeDriver:
    """A CUDA driver library as ctypes calls it: each entry point takes `byref` arguments and returns a status."""

    def __init__(self, caps, fail=None, status=100):
        self.caps, self.fail, self.status = caps, fail, status

    def _ret(self, name):
        return self.status if name == self.fail else 0

    def cuInit(self, flags):
        return self._ret("cuInit")

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.caps)
        return self._ret("cuDeviceGetCount")

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = 10 + ordinal  # a handle is not the ordinal
        return self._ret("cuDeviceGet")

    def cuDeviceGetAttribute(self, value, attribute, device):
        value._obj.value = self.caps[device.value - 10][{75: 0, 76: 1}[attribute]]
        return self._ret("cuDeviceGetAttribute")


def loader_of(lib, available=DRIVER_LIBRARIES[:1]):
    asked = []

    def load(name):
        asked.append(name)
        if name not in available:
            raise OSError(f"{name}: cannot open shared object file")
        return lib

    load.asked = asked
    return load


def test_the_driver_lists_each_gpus_compute_capability_in_its_order():
    load = loader_of(FakeDriver([(9, 0), (8, 6), (7, 5)]), available=("libcuda.so",))
    assert cuda_driver_devices(load) == [(9, 0), (8, 6), (7, 5)]
    assert load.asked == ["libcuda.so.1", "libcuda.so"]
    assert cuda_driver_devices(loader_of(FakeDriver([]))) == []


@pytest.mark.parametrize("fail", ["cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute"])
def test_a_driver_call_that_fails_means_the_driver_cannot_say(fail):
    assert cuda_driver_devices(loader_of(FakeDriver([(9, 0)], fail=fail))) is None


def test_no_driver_library_or_one_without_the_entry_points_means_the_driver_cannot_say():
    assert cuda_driver_devices(loader_of(None, available=())) is None
    assert cuda_driver_devices(loader_of(object())) is None


def test_this_machines_driver_agrees_with_torch():
    """What the real driver says here: where torch sees GPUs, the same count and compute capabilities; elsewhere
    nothing, or what a driver shows to a torch that cannot use it (a CPU build, a driver older than torch's CUDA):
    capabilities, which the run's second check, torch's, then refuses."""
    import torch

    caps = cuda_driver_devices()
    if torch.cuda.is_available():
        assert caps == [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    else:
        assert caps is None or all(isinstance(c, tuple) and len(c) == 2 and c[0] >= 1 for c in caps), caps


@pytest.mark.gpu
def test_the_driver_sees_the_gpus_torch_sees_on_the_gpu():
    """The same on a GPU host, where it is the case that counts: the run's check passes on the driver's word."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    test_this_machines_driver_agrees_with_torch()
    trainer = {"accelerator": "gpu", "devices": torch.cuda.device_count(), "precision": "bf16-mixed"}
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    assert driver_shows_enough(trainer, cuda_driver_devices()) is native_bf16


@pytest.mark.parametrize("trainer, caps, enough", [
    ({"accelerator": "gpu"}, [(9, 0)], True),
    ({"accelerator": "gpu"}, [], False),
    ({"accelerator": "gpu"}, None, False),
    ({"accelerator": "gpu", "devices": 2}, [(9, 0)], False),
    ({"accelerator": "gpu", "devices": 2}, [(9, 0), (9, 0)], True),
    ({"accelerator": "gpu", "devices": -1}, [(9, 0)], True),
    ({"accelerator": "gpu", "devices": [0, 1]}, [(9, 0)], True),  # a list is torch's to judge, as without the driver
    ({"accelerator": "gpu", "precision": "bf16-mixed"}, [(8, 0)], True),
    ({"accelerator": "gpu", "precision": "bf16-mixed"}, [(7, 5), (9, 0)], False),
    ({"accelerator": "gpu", "precision": "16-mixed"}, [(7, 5)], True),
])
def test_the_driver_shows_enough_only_where_each_of_torchs_checks_would_pass(trainer, caps, enough):
    assert driver_shows_enough(trainer, caps) is enough


def test_the_driver_first_check_passes_without_torch_or_gives_torchs_answer(monkeypatch):
    """Where the driver shows enough, torch is not asked (its view here says no GPU at all); otherwise torch's
    answer and its one line, exactly as without `driver_first`."""
    import torch

    import scfs.cuda_driver as driver

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(driver, "cuda_driver_devices", lambda: [(9, 0)])
    check_accelerator({"accelerator": "gpu", "precision": "bf16-mixed"}, driver_first=True)
    with pytest.raises(ConfigError, match=r"accelerator=gpu is invalid: torch sees no CUDA GPU"):
        check_accelerator({"accelerator": "gpu", "precision": "bf16-mixed"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"trainer.devices=2 is invalid: torch sees 1 CUDA GPU"):
        check_accelerator({"accelerator": "gpu", "devices": 2}, driver_first=True)
    monkeypatch.setattr(driver, "cuda_driver_devices", lambda: None)
    with pytest.raises(ConfigError, match=r"trainer.devices=2 is invalid: torch sees 1 CUDA GPU"):
        check_accelerator({"accelerator": "gpu", "devices": 2}, driver_first=True)



def test_a_run_the_driver_let_through_gets_torchs_line_before_it_builds_anything(monkeypatch, tmp_path):
    """A driver that shows a GPU torch cannot use (one older than torch's CUDA, say): the run still stops at one
    line naming the key and the fix, torch's, before its data and model are built."""
    import torch
    from helpers import compose_cfg

    import scfs.cuda_driver as driver
    import scfs.train as train

    monkeypatch.setattr(driver, "cuda_driver_devices", lambda: [(9, 0)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def build(*args, **kwargs):
        raise AssertionError("built the data and the model")

    monkeypatch.setattr(train, "build_for_training", build)
    cfg = compose_cfg(["trainer.accelerator=gpu", "trainer.precision=bf16-mixed"])
    with pytest.raises(ConfigError, match=r"accelerator=gpu is invalid: torch sees no CUDA GPU.*accelerator=cpu"):
        train.run(cfg, tmp_path / "run")

"""The GPUs the CUDA driver shows this process, asked without importing torch.

Why: a run checks its accelerator before it starts its compile helpers, and torch's import alone takes 3-4 s on a
GPU host. The driver's own library (`libcuda`, loaded with ctypes) answers the same question, how many GPUs and of
which compute capability, in milliseconds, so the helpers start that much sooner. The driver applies
`CUDA_VISIBLE_DEVICES` as torch's CUDA runtime does.

The answer is only ever used to let a run through early: where the driver cannot say (no driver library, an
error, an AMD GPU under ROCm), or says too few GPUs, the caller asks torch as before, whose view is the one a run
trains with.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def load_driver(loader: Callable[[str], Any] = ctypes.CDLL) -> Any | None:
    """The CUDA driver's library, or None where this machine has none."""
    for name in DRIVER_LIBRARIES:
        try:
            return loader(name)
        except OSError:
            continue
    return None


def cuda_driver_devices(loader: Callable[[str], Any] = ctypes.CDLL) -> list[tuple[int, int]] | None:
    """The compute capability `(major, minor)` of each GPU the CUDA driver shows this process, in its order
    (an empty list: a driver with no GPU), or None where the driver cannot say: no driver library, or any call
    that fails. Initialises the driver (`cuInit`), which torch's own GPU count does too; it makes no context."""
    lib = load_driver(loader)
    if lib is None:
        return None
    try:
        if lib.cuInit(0) != 0:
            return None
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return None
        caps: list[tuple[int, int]] = []
        for ordinal in range(count.value):
            device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
            if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                return None
            for value, attribute in ((major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                     (minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)):
                if lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0:
                    return None
            caps.append((major.value, minor.value))
    except (AttributeError, OSError):  # a library without these entry points is not a CUDA driver
        return None
    return caps

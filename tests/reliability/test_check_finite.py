"""`check_finite`'s fused screen names exactly the tensors the one-by-one check names, on fresh random
checkpoints of every dtype a run saves (NaN, +Inf and -Inf anywhere; large finite values whose norm overflows;
empty and integer tensors), and on a GPU it waits for the device once, not once per tensor."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from scfs.reliability import check_finite, checked_tensors, non_finite_tensors

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64, torch.int64)
BAD = (float("nan"), float("inf"), float("-inf"))
# finite, but the square of each overflows the dtype's range: the screen's norm is Inf, the tensor is fine
HUGE = {torch.float32: 3e30, torch.bfloat16: 3e30, torch.float16: 6e4, torch.float64: 1e300}


def random_checkpoint(seed: int, device: str = "cpu") -> tuple[dict, list[str]]:
    """A Lightning-shaped checkpoint of random tensors, some poisoned, and the names that hold NaN/Inf, in the
    checkpoint's order."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    bad: list[str] = []

    def tensor(name: str) -> torch.Tensor:
        dtype = rng.choice(DTYPES)
        shape = [rng.choice([0, 1, 3, 17, 64]) for _ in range(rng.randint(0, 3))]
        if dtype == torch.int64:
            return torch.randint(-5, 5, shape, generator=g).to(device)
        t = torch.randn(shape, generator=g, dtype=torch.complex64 if dtype.is_complex else torch.float32)
        t = t.to(dtype)
        if t.numel() and rng.random() < 0.3:
            t.view(-1)[rng.randrange(t.numel())] = rng.choice(BAD)
            bad.append(name)
        elif t.numel() and dtype in HUGE and rng.random() < 0.3:
            t.view(-1)[: rng.randint(1, t.numel())] = HUGE[dtype]
        return t.to(device)

    state = {f"student.w{i}": tensor(f"state_dict.student.w{i}") for i in range(rng.randint(1, 30))}
    momentum = {i: {"momentum_buffer": tensor(f"optimizer_states.0.state.{i}.momentum_buffer")}
                for i in range(rng.randint(0, 10))}
    ckpt = {"state_dict": state, "optimizer_states": [{"state": momentum, "param_groups": [{"lr": 0.1}]}],
            "callbacks": {"ModelCheckpoint": {"kth_value": torch.tensor(float("inf"))}}, "global_step": seed}
    return ckpt, bad


@pytest.mark.parametrize("seed", range(40))
def test_the_screen_names_what_the_one_by_one_check_names(seed: int) -> None:
    ckpt, bad = random_checkpoint(seed)
    everything = len(checked_tensors(ckpt))
    assert check_finite(ckpt, limit=everything) == bad
    assert non_finite_tensors(checked_tensors(ckpt), limit=everything) == bad
    assert check_finite(ckpt) == bad[:8]  # the first `limit`, in the checkpoint's order


def test_a_large_finite_tensor_is_not_named_and_the_bookkeeping_is_not_looked_at() -> None:
    ckpt = {"state_dict": {"big": torch.full((4,), 3e30), "half": torch.full((8,), 6e4, dtype=torch.float16),
                           "nan": torch.tensor([1.0, float("nan")])},
            "optimizer_states": [], "callbacks": {"kth_value": torch.tensor(float("inf"))}}
    assert check_finite(ckpt) == ["state_dict.nan"]
    assert check_finite({"a": [torch.ones(2), torch.tensor([float("-inf")])]}) == ["a.1"]
    assert check_finite({"state_dict": {}}) == []


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(8))
def test_on_a_gpu_the_screen_names_what_the_one_by_one_check_names(seed: int) -> None:
    ckpt, bad = random_checkpoint(seed, device="cuda")
    everything = len(checked_tensors(ckpt))
    assert check_finite(ckpt, limit=everything) == bad
    assert non_finite_tensors(checked_tensors(ckpt), limit=everything) == bad


def _syncs(fn) -> tuple[object, int]:
    """`fn()`'s result and how many times it made the host wait for the GPU (CUDA's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e8))  # the device still busy, as after a step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return out, sum(1 for w in caught if "called a synchronizing CUDA operation" in str(w.message))


@pytest.mark.gpu
def test_on_a_gpu_the_check_waits_for_the_device_once_plus_once_per_flagged_tensor() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    state = {f"w{i}": torch.randn(64, 64, device="cuda", generator=g).to(torch.bfloat16 if i % 3 else torch.float32)
             for i in range(200)}
    ckpt = {"state_dict": state, "optimizer_states": []}
    names, syncs = _syncs(lambda: check_finite(ckpt))
    assert names == [] and syncs == 1
    state["w5"][3, 4] = float("nan")
    state["w150"][0, 0] = float("inf")
    names, syncs = _syncs(lambda: check_finite(ckpt))
    assert names == ["state_dict.w5", "state_dict.w150"] and syncs == 3
    _, one_by_one = _syncs(lambda: non_finite_tensors(checked_tensors(ckpt)))
    assert one_by_one == 200  # what the screen saves: a wait per tensor

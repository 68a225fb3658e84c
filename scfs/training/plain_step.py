"""The method's training step driven without Lightning, on random views of the recipe's sizes.

Two kinds of process run the step outside a `Trainer`: the child that compiles the step beside a run
(`scfs.training.compile_child`), whose graphs and cache keys must be the run's, and the compile and FLOP
benchmarks (`scfs.bench.compile`, `scfs.bench.flops`), which time or count what a run's step does. Both take the step
from here, so there is one copy of what `training_step` runs between the views and the optimizer; the cache counters
say what such a step built or found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


def autocast_for(precision: str, device: str) -> contextlib.AbstractContextManager:
    """The autocast Lightning's `trainer.precision` puts around a training step (none for full precision)."""
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def step_autocast(cfg: Any, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The autocast of a run of `cfg` around its step on `device` (`autocast_for` with the run's precision)."""
    return autocast_for(str(cfg.trainer.precision), torch.device(device).type)


def views_key(cfg: Any, device: str | torch.device, channels_last: bool) -> tuple[Any, ...]:
    """What `random_views` makes its views from: the recipe's sizes, the device and the memory format."""
    return (int(cfg.batch_size), int(cfg.crops.n_local), int(cfg.crops.global_size), int(cfg.crops.local_size),
            str(torch.device(device)), bool(channels_last))


# `make_views_ahead`'s one pair of views, under its `views_key`, until a `random_views` call of that key takes it
_AHEAD: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}


def _new_random_views(cfg: Any, device: str | torch.device,
                      channels_last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, n_local = int(cfg.batch_size), int(cfg.crops.n_local)
    gen = torch.Generator(device="cpu").manual_seed(1)
    cl = torch.channels_last if channels_last else torch.contiguous_format
    views = [torch.randn(b, 3, s, s, generator=gen).to(device)
             for s in [int(cfg.crops.global_size)] * 2 + [int(cfg.crops.local_size)] * n_local]
    g = torch.cat(views[:2]).contiguous(memory_format=cl)
    loc = torch.cat(views[2:]).contiguous(memory_format=cl) if n_local else None
    return g, loc


def make_views_ahead(cfg: Any, device: str | torch.device, channels_last: bool) -> None:
    """Make the next `random_views` call's views now. A compile helper does this while it waits for the run's go:
    at ImageNet's sizes the views are about 134 million seeded normal samples drawn on the host, seconds of CPU
    that would otherwise lie between the go and the helper's compile, while the run and the other helpers compile."""
    _AHEAD.clear()
    _AHEAD[views_key(cfg, device, channels_last)] = _new_random_views(cfg, device, channels_last)


def random_views(cfg: Any, device: str | torch.device = "cpu",
                 channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random views of the recipe's sizes, as a step takes them: the two global views of `cfg.batch_size` images
    as one float32 batch, the local views as another (None without local views), seeded, in the model's memory
    format. The compiled graphs depend on these shapes, dtypes and strides only, so they are the run's graphs.
    Views made ahead for the same sizes (`make_views_ahead`) are handed out once instead of made again; views made
    ahead for other sizes are dropped."""
    ahead = _AHEAD.pop(views_key(cfg, device, channels_last), None)
    _AHEAD.clear()
    return ahead if ahead is not None else _new_random_views(cfg, device, channels_last)


def make_step(model: Any, cfg: Any, device: str, opt: torch.optim.Optimizer, eager_student: bool = False,
              done: Callable[[str], None] | None = None) -> Callable[[int], torch.Tensor]:
    """The method's training step without Lightning, on `random_views`: the student and teacher calls, the
    losses with the flags a run passes (step 0 a logging step), backward, optimizer step and EMA. Returns
    `step(i) -> loss`. Between the views and the backward it is the method's `views_to_loss`, which
    `training_step` runs too, and so it builds the run's graphs.

    `eager_student`: the student's call runs eager (`force_eager`) and cut off from the losses' backward, so only
    the teacher's call and the losses are compiled and no student activation is kept (`compile_parallel`'s
    helper; `SelfDistillation.views_to_loss`); `done(part)` is told when the teacher's call ("teacher") and the
    losses' forward and backward ("loss") have run, i.e. when their cache entries are written."""
    from scfs.methods.ema import ema_update

    b, n_local = int(cfg.batch_size), int(cfg.crops.n_local)
    g, loc = random_views(cfg, device, model.channels_last)
    cast = step_autocast(cfg, device)

    def step(i: int) -> torch.Tensor:
        with cast:
            loss, _, _ = model.views_to_loss(g, loc, b, n_local, 0.04, i == 0, eager_student=eager_student, done=done)
        model.before_backward()
        loss.backward()
        if done is not None:
            done("loss")
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema_update(model.teacher, model.student, 0.996)
        return loss.detach()

    return step


def random_crops(cfg: Any, device: str, gen: torch.Generator) -> list[torch.Tensor]:
    """Random uint8 (B,3,s,s) crops of every view slot of the recipe, as `data.colour_on_device`'s workers hand
    them over."""
    b, n_local = int(cfg.batch_size), int(cfg.crops.n_local)
    sizes = [int(cfg.crops.global_size)] * 2 + [int(cfg.crops.local_size)] * n_local
    return [torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, device=device, generator=gen) for s in sizes]


def make_views(model: Any, cfg: Any, device: str, times: int) -> None:
    """`compile_views`: the views' compiled per-pixel ops, run `times` times on random uint8 crops of the recipe's
    sizes (`BatchMultiCrop.colour`; the run's `forward` from whole images ends in the same graphs: one float
    (n*B,3,s,s) stack per view size), outside autocast as Lightning makes a batch's views."""
    gen = torch.Generator(device=device).manual_seed(0)
    crops = random_crops(cfg, device, gen)
    for _ in range(times):
        model.batch_aug.colour(crops, generator=gen)


def with_views(step: Callable[[int], torch.Tensor], model: Any, cfg: Any,
               device: str) -> Callable[[int], torch.Tensor]:
    """`step`, each call preceded by a batch's views made as a run makes them on the device: the method's
    `on_after_batch_transfer` on random uint8 crops (`random_crops`), so the compile of the views' graphs
    (`compile_views`) and their hand-over to a helper (`hand_views_to_helper`) happen where a run's do. The
    views themselves are dropped: the step keeps its fixed `random_views`."""
    crops = random_crops(cfg, device, torch.Generator(device=device).manual_seed(0))

    def step_with_views(i: int) -> torch.Tensor:
        model.on_after_batch_transfer({"views": crops}, 0)
        return step(i)

    return step_with_views


CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
                  ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"))


def cache_counters() -> tuple[int, ...]:
    """This process's inductor and AOTAutograd cache hits and misses so far (`CACHE_COUNTERS`)."""
    from torch._dynamo.utils import counters

    return tuple(int(counters[group][name]) for group, name in CACHE_COUNTERS)


def cache_deltas(since: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The cache hits and misses since `since` (a `cache_counters()`; this process's whole life when None), in
    `CACHE_COUNTERS`' order."""
    now = cache_counters()
    return tuple(n - b for n, b in zip(now, since or (0,) * len(now)))


def cache_counts(since: tuple[int, ...] | None = None, deltas: tuple[int, ...] | None = None) -> dict[str, str]:
    """The cache hits and misses since `since` (or `deltas`, a `cache_deltas()` already read), as the records
    print them."""
    fh, fm, ah, am = deltas if deltas is not None else cache_deltas(since)
    return {"fx_cache": f"{fh} hit / {fm} miss", "aot_cache": f"{ah} hit / {am} miss"}

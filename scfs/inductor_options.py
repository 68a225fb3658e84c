"""`compile_inductor`: inductor's own options for the compiled step, set from the config.

Some of inductor's defaults spend compile time to win step time: it benchmarks several launch configs of each
pointwise kernel at its first run (`triton.autotune_pointwise`), it reorders loops after fusion
(`loop_ordering_after_fusion`). A short run or a notebook may want the other side of that trade; a long run keeps
the defaults. `torch._inductor.config` is process-wide, so the options are set when the method is built
(`scfs.training.build.build`): the run, the child that compiles beside it and the compile benchmark then compile
under the same options, which are part of inductor's cache keys.

Nested keys name inductor's sub-configs: `compile_inductor.triton.autotune_pointwise=false` sets
`torch._inductor.config.triton.autotune_pointwise`. A preset's name stands for its options: `compile_inductor=lean`
(`PRESETS`).

Each build sets its run's options only: what the previous build set is put back first (`use`), so a second run in
the same process (a notebook, a sweep's in-process jobs) does not compile under the first run's options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# named option sets: `lean` turns off the defaults that spend compile time to win step time (the launch-config
# benchmarks of pointwise kernels, loop reordering after fusion); the compile benchmark's `lean` row measures both
# sides of that trade
PRESETS: dict[str, dict[str, Any]] = {
    "lean": {"triton.autotune_pointwise": False, "loop_ordering_after_fusion": False},
}

# what the options of the last `use` replaced, to put back at the next
_replaced: dict[str, Any] = {}


def flatten(options: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """`{"triton": {"autotune_pointwise": False}}` -> `{"triton.autotune_pointwise": False}`."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def resolve(options: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """A preset's name or a mapping of options -> the options by dotted name."""
    if isinstance(options, str):
        if options not in PRESETS:
            raise KeyError(f"compile_inductor={options}: no such preset (presets: {', '.join(sorted(PRESETS))})")
        return dict(PRESETS[options])
    return flatten(options)


def _owner(name: str) -> tuple[Any, str] | None:
    """The config object that holds `name` and the attribute's last part; None when torch has no such option."""
    import torch._inductor.config as config

    *parents, leaf = name.split(".")
    obj: Any = config
    for part in parents:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return (obj, leaf) if hasattr(obj, leaf) else None


def unknown(options: Mapping[str, Any] | str | None) -> list[str]:
    """The options (dotted) that this torch's inductor does not have."""
    return [name for name in resolve(options) if _owner(name) is None]


def apply(options: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Set each option on `torch._inductor.config`; returns the values they replaced (to restore them)."""
    before: dict[str, Any] = {}
    for name, value in resolve(options).items():
        found = _owner(name)
        if found is None:
            raise KeyError(f"compile_inductor.{name}: torch._inductor.config has no such option")
        obj, leaf = found
        before[name] = getattr(obj, leaf)
        setattr(obj, leaf, value)
    return before


def use(options: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """A run's options and only them: put back what the previous `use` replaced, then `apply` these. Returns the
    options set, by dotted name."""
    global _replaced
    apply(_replaced)
    _replaced = {}
    _replaced = apply(options)
    return resolve(options)

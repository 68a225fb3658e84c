"""`compile_inductor`: inductor's own options for the compiled step, set from the config.

Some of inductor's defaults spend compile time to win step time: it benchmarks several launch configs of each
pointwise kernel at its first run (`triton.autotune_pointwise`), it reorders loops after fusion
(`loop_ordering_after_fusion`). A short run or a notebook may want the other side of that trade; a long run keeps
the defaults. `torch._inductor.config` is process-wide, so the options are set when the method is built
(`scfs.training.build.build`): the run, the child that compiles beside it and the compile benchmark then compile
under the same options, which are part of inductor's cache keys.

Nested keys name inductor's sub-configs: `compile_inductor.triton.autotune_pointwise=false` sets
`torch._inductor.config.triton.autotune_pointwise`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def unknown(options: Mapping[str, Any] | None) -> list[str]:
    """The options (dotted) that this torch's inductor does not have."""
    return [name for name in flatten(options) if _owner(name) is None]


def apply(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Set each option on `torch._inductor.config`; returns the values they replaced (to restore them)."""
    before: dict[str, Any] = {}
    for name, value in flatten(options).items():
        found = _owner(name)
        if found is None:
            raise KeyError(f"compile_inductor.{name}: torch._inductor.config has no such option")
        obj, leaf = found
        before[name] = getattr(obj, leaf)
        setattr(obj, leaf, value)
    return before

"""Methods by their config name (`method.name`).

A method is a `SelfDistillation` subclass in its own module of `scfs.methods`, decorated with `@register(name)`,
plus `conf/method/<name>.yaml`; `method_class` imports the package's modules itself, so nothing else is edited.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

_METHODS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if _METHODS.get(name, cls) is not cls:
            raise ValueError(f"method name {name!r} is registered twice: {_METHODS[name].__name__} and {cls.__name__}")
        _METHODS[name] = cls
        cls.method_name = name
        return cls

    return deco


def _discover() -> None:
    """Import every module next to this one: their `@register` decorators fill the table."""
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{mod.name}")


def methods() -> dict[str, type]:
    """Every registered method, by name."""
    _discover()
    return dict(_METHODS)


def method_class(name: str) -> Any:
    """The class registered as `name`; an unknown name is a config error listing the known ones."""
    known = methods()
    if name not in known:
        from scfs.config import ConfigError

        raise ConfigError(f"config key method.name={name!r} is invalid: expected one of {', '.join(sorted(known))} "
                          "(a method is a class registered with @register in a module of scfs/methods/)")
    return known[name]

"""Self-distillation methods: a shared base (`SelfDistillation`), one class per method registered by config name
(`DINO`, `SCFS(DINO)`), and their parts (networks, losses, EMA, schedules)."""

from scfs.methods.registry import method_class, methods, register

__all__ = ["method_class", "methods", "register"]

"""The package's import graph, function-local imports included: no import cycle beyond the known ones (a ratchet:
a new cycle fails here; fixing a known one means deleting it from KNOWN_*)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SCFS = Path(__file__).resolve().parent.parent / "scfs"

# None known: the layers go workbench -> train/training -> viz -> eval -> models/data, and models.backbone builds
# and loads Backbones on top of models.checkpoint's file formats. A cycle that cannot be cut goes here, with why.
KNOWN_MODULE_CYCLES: list[set[str]] = []
KNOWN_PACKAGE_CYCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for p in SCFS.rglob("*.py"):
        parts = p.relative_to(SCFS.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> scfs modules it imports anywhere in its body (`from pkg import mod` counts as pkg.mod)."""
    mods = _modules()

    def owner(name: str) -> str:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if t.startswith("scfs") and owner(t) != mod:
                    graph[mod].add(owner(t))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def _packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    first = lambda m: ".".join(m.split(".")[:2])  # noqa: E731 - scfs.<first level>
    out: dict[str, set[str]] = defaultdict(set)
    for m, ts in graph.items():
        out[first(m)] |= {first(t) for t in ts if first(t) != first(m)}
    return out


def test_the_walker_sees_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    graph = import_graph()
    assert "scfs.methods.base" in graph["scfs.methods.scfs"] or "scfs.methods.dino" in graph["scfs.methods.scfs"]
    assert "scfs.cli" in graph["scfs.eval.common"]  # a function-local import counts


def test_no_module_cycles_beyond_the_known_ones():
    new = [c for c in cycles(import_graph()) if c not in KNOWN_MODULE_CYCLES]
    assert not new, f"new import cycles between modules: {new}"


def test_no_package_cycles_beyond_the_known_ones():
    new = [c for c in cycles(_packages(import_graph())) if not any(c <= k for k in KNOWN_PACKAGE_CYCLES)]
    assert not new, f"new import cycles between first-level packages: {new}"


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by their base name (rootdir-relative `sys.path` entries, no packages), so two
    `test_x.py` in different folders collide and one of them is never collected."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = defaultdict(list)
    for p in tests.rglob("test_*.py"):
        seen[p.name].append(str(p.relative_to(tests)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"test modules with the same name (rename one of each): {clashes}"

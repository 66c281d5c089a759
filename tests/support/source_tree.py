"""kforge's source as the house rules read it (tests/house/): every module's text, its parsed tree (parsed once
per test session: no rule changes a tree) and the import graph between modules. Nothing is imported."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

from locations import REPO

KFORGE = REPO / "kforge"
parse = functools.lru_cache(maxsize=None)(ast.parse)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(KFORGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, str]:
    """Module name -> source text, for every module of kforge."""
    return {module_name(p): p.read_text() for p in KFORGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the kforge modules it imports anywhere in its body (`from pkg import sub` counts as `pkg.sub`;
    a module's own parent packages are always loaded first and are left out)."""
    files = {module_name(p): p for p in KFORGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        for node in ast.walk(parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kforge":
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files]
                targets = subs or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "kforge"]
            graph[name].update(t for t in targets if t in files and not name.startswith(t + "."))
    return graph

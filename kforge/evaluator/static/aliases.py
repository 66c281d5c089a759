"""The local names of a candidate that stand for a module or a library object: those its imports bind
(`tl` -> `triton.language`, `jit` -> `triton.jit`) and plain renames of them at any depth (`t = torch`,
`F = torch.nn.functional`). The static check resolves a name through these, so `t.frombuffer = f` is the
patch of `torch.frombuffer` it is, whatever the name."""

from __future__ import annotations

import ast


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted path it stands for."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    renames = [(t.id, _dotted(n.value)) for n in ast.walk(tree)
               if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and n.value is not None
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
    while True:  # a rename of a rename: until nothing new resolves
        added = False
        for name, source in renames:
            head, _, rest = source.partition(".")
            if name not in aliases and head in aliases:
                aliases[name] = f"{aliases[head]}.{rest}" if rest else aliases[head]
                added = True
        if not added:
            return aliases

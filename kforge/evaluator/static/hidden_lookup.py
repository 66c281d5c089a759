"""Attribute lookups that no `.name` in the source spells: the static check's complement for them.

`f.__closure__` is an Attribute node the static check bans; the same lookup hides in a class pattern
(`case object(__closure__=cells)`: the name is a keyword of the pattern, no node of its own) and in
`functools.update_wrapper(holder, f, assigned=(name,))`, which copies `f.<name>` for a name chosen at
run time (`dataclasses.fields(H)[0].name` spells a dunder without writing it), after which a positional
class pattern on the holder reads it back. Neither is needed by any kernel. The same wrappers write too:
`functools.update_wrapper(torch, h)` ends in `torch.__dict__.update(h.__dict__)`, a store into a library's
module that no attribute assignment spells (and no frozen module sees), so a wrapper that resolves to an
imported name (a module or anything of a library's) is refused as well; an ordinary decorator's
`@functools.wraps(f)` on a function of the candidate's stays fine.
"""

from __future__ import annotations

import ast
from typing import Callable

_WRAPPERS = {"functools.update_wrapper": 2, "functools.wraps": 1}  # positional arguments before `assigned`


def hidden_lookups(tree: ast.Module, resolve: Callable[[ast.AST], str], hidden: Callable[[str], bool]
                   ) -> list[tuple[str, ast.AST]]:
    """(what, node) for each such lookup; `hidden(name)` says whether an attribute name is banned."""
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchClass):
            for name in node.kwd_attrs:
                if hidden(name):
                    found.append((f"the attribute `{name}` in a class pattern", node))
        elif isinstance(node, ast.Call) and resolve(node.func) in _WRAPPERS:
            fixed = _WRAPPERS[resolve(node.func)]
            if len(node.args) > fixed or any(k.arg in ("assigned", "updated") or k.arg is None for k in node.keywords):
                found.append((f"`{resolve(node.func)}` with the attribute names it copies", node))
            elif resolve(node.func) == "functools.update_wrapper" and node.args and resolve(node.args[0]):
                found.append(("`functools.update_wrapper` into a library's object (it writes its attributes)", node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and node.args
              and resolve(node.func.func) == "functools.wraps" and resolve(node.args[0])):
            found.append(("`functools.wraps` applied to a library's object (it writes its attributes)", node))
    return found

"""Which string constants of a candidate are C/C++/CUDA source for the compiler, and nothing else.

The static check bans dunder names inside strings, because text reaches attributes through many
consumers (`"{0.__globals__}".format(f)`, a class's `__match_args__`, `functools.update_wrapper`'s
`assigned=`). CUDA source is full of such names (`__global__`, `__restrict__`, `__syncthreads`,
`__expf`). Text that only ever reaches `torch.utils.cpp_extension.load_inline` is native code, which
can reach any Python object anyway (the threat model's in-process layers cannot contain it), so the
ban gains nothing there. A constant counts as compiler text only when every path from it leads into a
load_inline argument: written inline, or through names that are read nowhere else, joined by `+`,
f-strings, `.replace` and `.join`. A name read anywhere else, a home-made `load_inline`, or any other
expression around the text (a walrus, a call) leaves the constant to the ordinary ban.
"""

from __future__ import annotations

import ast
from typing import Callable

LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
# Every other way to compile and load native code, banned in source by any path (static_check.py). A build
# at import (`triton.runtime.build.compile_module_from_src`, which Triton itself imports in every child)
# runs before the lock-down, its library's threads never meet the interpreter again, and the audit hook sees
# only the library's frame asking. An honest Triton kernel needs none of them (triton.jit compiles its own
# kernels); a CUDA kernel needs only load_inline, which the harness sends to a build child of its own.
NATIVE_BUILDS = ("triton.runtime.build", "triton.backends", "triton.tools", "triton.knobs.build",
                 "torch.utils.cpp_extension", "torch.utils.benchmark", "numpy.f2py", "numpy.distutils",
                 "numpy.testing", "distutils", "setuptools", "sysconfig")


def native_builds_allowed(extension: bool) -> frozenset[str]:
    """The paths under NATIVE_BUILDS a backend may use: a CUDA extension's module and its load_inline."""
    return frozenset({LOAD_INLINE.rpartition(".")[0], LOAD_INLINE}) if extension else frozenset()
_TEXT_METHODS = ("replace", "join")  # text -> text; the arguments are text too


def _text_parts(node: ast.AST, consts: set[int], names: set[int]) -> None:
    """Walk an expression that only builds text: record its string constants and the names it reads.
    Anything outside that grammar is not descended into (its constants stay under the ordinary ban)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            consts.add(id(node))
    elif isinstance(node, ast.JoinedStr):  # an f-string's literal parts; its {values} are ordinary code
        for part in node.values:
            _text_parts(part, consts, names)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        names.add(id(node))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        _text_parts(node.left, consts, names)
        _text_parts(node.right, consts, names)
    elif isinstance(node, (ast.List, ast.Tuple)):
        for elt in node.elts:
            _text_parts(elt, consts, names)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _TEXT_METHODS \
            and not node.keywords:
        _text_parts(node.func.value, consts, names)
        for arg in node.args:
            _text_parts(arg, consts, names)


def _class_body_names(tree: ast.Module) -> set[str]:
    """Names bound directly in a class body: they are attributes (a dataclass field's default, an Enum
    member's value), reachable without reading the name."""
    names: set[str] = set()
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        todo = list(cls.body)
        while todo:
            stmt = todo.pop()
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
                continue
            for sub in ast.iter_child_nodes(stmt):
                if isinstance(sub, ast.stmt):
                    todo.append(sub)
                elif isinstance(sub, ast.expr):
                    names.update(n.id for n in ast.walk(sub)
                                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def compiler_text(tree: ast.Module, resolve: Callable[[ast.AST], str]) -> set[int]:
    """ids of the string constants that reach nothing but load_inline (see the module docstring).
    `resolve` maps a call's function to its full path through the module's imports ('' if none)."""
    stores: dict[str, list[ast.AST | None]] = {}  # name -> the values bound to it (None: bound otherwise)
    loads: dict[str, list[int]] = {}
    other_refs = _class_body_names(tree)  # names also reachable otherwise: attributes, text, class members
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            single = len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            for tgt in node.targets:
                for sub in ast.walk(tgt):
                    if isinstance(sub, ast.Name):
                        stores.setdefault(sub.id, []).append(node.value if single else None)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            ok = node.value is not None and (isinstance(node, ast.AnnAssign) or isinstance(node.op, ast.Add))
            stores.setdefault(node.target.id, []).append(node.value if ok else None)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.setdefault(node.id, []).append(id(node))
            else:
                stores.setdefault(node.id, [])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.setdefault(node.name, []).append(None)
        elif isinstance(node, ast.arg):
            stores.setdefault(node.arg, []).append(None)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            other_refs.update(node.names)
        elif isinstance(node, ast.Attribute):
            other_refs.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            other_refs.add(node.value)
    # Store-context Names were counted above only to know the name is bound; the binding statements
    # themselves (Assign/AnnAssign/AugAssign) recorded their values. Any other binding (for, with, walrus,
    # del, except-as, match) leaves a name with no recorded value for that binding: refuse it. An import
    # binds no text; `load_inline` itself must be bound by nothing but its import.
    for node in ast.walk(tree):
        for sub in _other_bindings(node):
            stores.setdefault(sub, []).append(None)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and resolve(n.func) == LOAD_INLINE
             and _head(n.func) not in stores]  # not a home-made load_inline, nor a rebound module name
    roots = [a for c in calls for a in [*c.args, *(k.value for k in c.keywords)]]
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    candidates = {n for n, vals in stores.items() if vals and None not in vals and n not in other_refs | imported}
    reached: set[str] = set()
    while True:
        consts: set[int] = set()
        reads: set[int] = set()
        for root in roots + [v for n in reached for v in stores[n]]:
            _text_parts(root, consts, reads)  # type: ignore[arg-type]
        grown = {n for n in candidates if loads.get(n) and all(i in reads for i in loads[n])}
        if grown == reached:
            return consts
        reached = grown


def _head(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _other_bindings(node: ast.AST) -> list[str]:
    """Names bound by anything but an assignment or an import: for/with/walrus/del/except/match targets."""
    targets: list[ast.AST] = []
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        targets.append(node.target)
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets.extend(i.optional_vars for i in node.items if i.optional_vars is not None)
    elif isinstance(node, ast.NamedExpr):
        targets.append(node.target)
    elif isinstance(node, ast.Delete):
        targets.extend(node.targets)
    elif isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]

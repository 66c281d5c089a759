"""How much of a kernel module's structure a candidate has: the reward's ``format`` component.

A readable ``<KERNEL>`` block alone is not worth anything: ``<KERNEL>x</KERNEL>`` or the prompt's own
skeleton (whose ``def kernel(...)`` does not parse) would otherwise earn the whole format reward, and a
run would learn tags instead of kernels. The structure is what the evaluator's static check verifies,
found through its own parser and import resolution (``kforge.evaluator.static.static_check``), in three parts:

1. a ``class ModelNew`` with a ``forward`` method;
2. a kernel of the file: a function decorated with Triton's own ``@triton.jit`` (backend ``triton``), or
   a name bound to ``load_inline(...)`` (backend ``cuda``);
3. ``forward`` launches that kernel, directly or through module-level functions or ModelNew methods it calls:
   ``kernel[grid](...)`` for Triton, ``ext.fn(...)`` for a CUDA extension.

The score is the share of the parts present (0, 1/3, 2/3, 1), and 0 for code that does not parse or
that the static check refuses for any other reason (a banned import, ``exec``...): such code never runs.
Part 3 counts only with parts 1 and 2. Only a full structure (1.0) is a module that can compute anything
with a kernel; the partial shares give a model that cannot yet write one a gradient toward it.
"""

from __future__ import annotations

import ast

from kforge.evaluator.static.static_check import check_source, parse
from kforge.kernel_backends import EXTENSION_KERNEL, KERNEL_BACKENDS

# The static check's errors that are missing structure (graded here) rather than a refusal.
_STRUCTURE_ERRORS = ("no `class ModelNew` defined", *(b.missing_kernel for b in KERNEL_BACKENDS.values()))


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _methods(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """ModelNew's methods by name (the last class of that name wins, as at import)."""
    methods: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
    return methods


def _extensions(tree: ast.Module) -> set[str]:
    """Module-level names bound to ``load_inline(...)`` (or ``cpp_extension.load(...)``)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            leaf = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if leaf in ("load_inline", "load"):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _launches(body: ast.AST, kernels: set[str], extensions: set[str]) -> bool:
    for node in ast.walk(body):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in kernels:
            return True  # kernel[grid](...)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in extensions:
            return True  # ext.fn(...)
    return False


def _called_names(body: ast.AST) -> set[str]:
    """``f`` for ``f(...)`` and ``self.f`` for ``self.f(...)``."""
    names = set()
    for n in ast.walk(body):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            names.add(n.func.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "self":
            names.add(f"self.{n.func.attr}")
    return names


def forward_launches(tree: ast.Module, kernels: set[str], extensions: set[str]) -> bool:
    """ModelNew.forward launches one of the kernels itself, or through module-level functions or ModelNew
    methods it calls (followed to any depth)."""
    methods = _methods(tree)
    callees = {**_functions(tree), **{f"self.{k}": v for k, v in methods.items()}}
    seen: set[str] = set()
    todo: list[ast.AST] = [methods["forward"]] if "forward" in methods else []
    while todo:
        body = todo.pop()
        if _launches(body, kernels, extensions):
            return True
        for name in _called_names(body) - seen - kernels:
            seen.add(name)
            if name in callees:
                todo.append(callees[name])
    return False


def structure_score(code: str | None, backend: str = "triton") -> float:
    """Share of the kernel structure present in ``code`` (see the module docstring); 0 for None."""
    if not code or not code.strip():
        return 0.0
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return 0.0
    report = check_source(code, "", backend)
    if any(not e.startswith(_STRUCTURE_ERRORS) for e in report.errors):
        return 0.0
    kind = KERNEL_BACKENDS[backend].kernel if backend in KERNEL_BACKENDS else None
    kernels = {k for k in report.kernels if k != EXTENSION_KERNEL} if kind == "jit" else set()
    extensions = _extensions(tree) if kind == "extension" else set()
    has_forward = "forward" in _methods(tree)
    has_kernel = bool(kernels or extensions)
    launched = has_forward and has_kernel and forward_launches(tree, kernels, extensions)
    return (float(has_forward) + float(has_kernel) + float(launched)) / 3.0

"""Answers given to more than one problem in a step: templates, which earn no shaping credit.

A module whose kernel computes something fixed (``2 * x + 1`` on its first input) has the whole structure
the format reward grades and compiles on every problem, so format and compile credit would pay it
everywhere without it solving anything: the cheapest answer to learn. An incorrect answer whose code was
also the answer to another problem of the same step is such a template; ``kforge.credit.rewards`` takes
its shaping credit away (format, compile, partial credit and thinking 0, length at its floor). A correct
answer keeps its reward wherever it is given (two problems can share a solution). A response without
code is compared by its text, whitespace collapsed.

Two answers are the same when their syntax trees are, with the code's own names (arguments, definitions,
assignments, import aliases) renumbered in order of first appearance and docstrings dropped: a renamed or
reformatted copy is caught, a template whose constants or statements change from problem to problem is not.
"""

from __future__ import annotations

import ast
import hashlib
from collections import defaultdict

from kforge.evaluator.static.static_check import parse
from kforge.policy.records import Trajectory, Turn


def _bound(tree: ast.AST) -> set[str]:
    """Names the code binds itself (arguments, definitions, assignments, import aliases): renaming them
    changes nothing; a builtin or an attribute (``max``, ``tl.maximum``) is what the code does and stays."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


class _Canonical(ast.NodeTransformer):
    """The code's own names renumbered by first appearance; docstrings and annotations dropped."""

    def __init__(self, bound: set[str]) -> None:
        self.bound = bound
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"n{len(self.names)}") if name in self.bound else name

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node

    def visit_alias(self, node: ast.alias) -> ast.AST:
        node.asname = self._name(node.asname or node.name.split(".")[0])
        return node

    def _body(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        if hasattr(node, "name"):
            node.name = self._name(node.name)
        return self.generic_visit(node)

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _body


def fingerprint(code: str | None) -> str | None:
    """A digest of the code's canonical syntax tree; None for no code or code that does not parse."""
    if not code or not code.strip():
        return None
    try:
        tree = parse(code)  # under the pool's parse lock: it parses from its worker threads meanwhile
    except (SyntaxError, ValueError, RecursionError):
        return None
    try:
        canonical = ast.dump(_Canonical(_bound(tree)).visit(tree), annotate_fields=False, include_attributes=False)
    except RecursionError:
        return None
    return hashlib.sha256(canonical.encode()).hexdigest()


def answer_print(turn: Turn) -> str | None:
    """The fingerprint of a turn's code, or without code that parses of its whitespace-collapsed text (a fixed
    non-answer repeated across problems is a template too, and would otherwise earn the length
    tie-breaker's best score everywhere); None for an empty response."""
    code = turn.candidate.code if turn.candidate is not None else None
    tree = fingerprint(code)
    if tree is not None:
        return tree
    text = " ".join((code if code and code.strip() else turn.response_text or "").split())
    return "text:" + hashlib.sha256(text.encode()).hexdigest() if text else None


def repeated_answers(trajectories: list[Trajectory]) -> set[int]:
    """``id()`` of every incorrect turn whose answer (by fingerprint) was also given to another problem."""
    problems: dict[str, set[str]] = defaultdict(set)
    prints: dict[int, str] = {}
    for trajectory in trajectories:
        for turn in trajectory.turns:
            fp = answer_print(turn)
            if fp is not None:
                prints[id(turn)] = fp
                problems[fp].add(trajectory.problem_key)
    return {
        id(turn)
        for trajectory in trajectories
        for turn in trajectory.turns
        if id(turn) in prints and len(problems[prints[id(turn)]]) > 1
        and not (turn.verdict is not None and turn.verdict.correct)
    }


def template_stats(trajectories: list[Trajectory], repeated: set[int]) -> dict[str, float]:
    """Turns answered with a template, and groups (problem, turn index) that collapsed onto one: every
    member gave the same template."""
    groups: dict[tuple[str, int], list[Turn]] = defaultdict(list)
    for trajectory in trajectories:
        for turn in trajectory.turns:
            groups[(trajectory.problem_key, turn.index)].append(turn)
    collapsed = sum(
        1 for turns in groups.values()
        if all(id(t) in repeated for t in turns) and len({answer_print(t) for t in turns}) == 1
    )
    turns = sum(len(turns) for turns in groups.values())
    return {"template_turns": float(len(repeated)), "template_share": len(repeated) / turns if turns else 0.0,
            "template_collapsed_groups": float(collapsed)}

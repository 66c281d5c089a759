"""Expression trees of the elementwise family: the primitives, a seeded random draw, and the structure key
that decides what "a structure never seen in training" means.

A tree's leaves are the inputs `x`, `y`, `z`; its inner nodes are primitives. Every primitive keeps a finite
input finite (no division, log or sqrt; exp only of a bounded value), so no reference can hold inf or NaN.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import permutations
from typing import Callable

VARS = ("x", "y", "z")
REDUCTIONS = ("sum", "amax")  # over the last dimension, at the root only


@dataclass(frozen=True)
class Node:
    op: str  # an input name for a leaf, else a primitive of OPS
    args: tuple["Node", ...] = ()
    consts: tuple[float, ...] = ()

    @property
    def is_leaf(self) -> bool:
        return not self.args


def _grid(rng: random.Random, low: int, high: int, scale: int) -> float:
    """A constant drawn from a coarse grid (k / scale for low <= k <= high, never 0): short, exact text."""
    k = 0
    while k == 0:
        k = rng.randint(low, high)
    return k / scale


@dataclass(frozen=True)
class Op:
    arity: int
    commutative: bool = False
    # Draws the node's constants; none for most primitives.
    consts: Callable[[random.Random], tuple[float, ...]] = field(default=lambda rng: ())
    min_depth: int = 1  # exp needs a bounded child, itself a node: depth 2


OPS: dict[str, Op] = {
    "sigmoid": Op(1),
    "exp": Op(1, min_depth=2),
    "abs": Op(1),
    "sin": Op(1),
    "cos": Op(1),
    "relu": Op(1),
    "clamp": Op(1, consts=lambda rng: (_grid(rng, -15, -1, 10), _grid(rng, 1, 15, 10))),
    "leaky": Op(1, consts=lambda rng: (_grid(rng, 1, 6, 20),)),
    "scale": Op(1, consts=lambda rng: (_grid(rng, -8, 8, 4),)),
    "shift": Op(1, consts=lambda rng: (_grid(rng, -8, 8, 4),)),
    "add": Op(2, commutative=True),
    "sub": Op(2),
    "mul": Op(2, commutative=True),
    "maximum": Op(2, commutative=True),
    "minimum": Op(2, commutative=True),
}
# What exp may be applied to: each is bounded whatever its argument (sigmoid in (0, 1), sin and cos in
# [-1, 1], clamp in [lo, hi]).
BOUNDED = ("sigmoid", "sin", "cos", "clamp")
LEAF_SHARE = 0.3  # below the root, the chance that a node with depth left is an input instead of a primitive


def draw_tree(rng: random.Random, depth: int, n_inputs: int) -> Node:
    """A random tree of at most `depth` primitives on any path, its root a primitive, over the first
    `n_inputs` of x, y, z."""
    return _op(rng, depth, VARS[:n_inputs], tuple(OPS))


def _tree(rng: random.Random, depth: int, names: tuple[str, ...]) -> Node:
    if depth == 0 or rng.random() < LEAF_SHARE:
        return Node(rng.choice(names))
    return _op(rng, depth, names, tuple(OPS))


def _op(rng: random.Random, depth: int, names: tuple[str, ...], choices: tuple[str, ...]) -> Node:
    name = rng.choice([n for n in choices if OPS[n].min_depth <= depth])
    if name == "exp":
        return Node(name, (_op(rng, depth - 1, names, BOUNDED),))
    args = tuple(_tree(rng, depth - 1, names) for _ in range(OPS[name].arity))
    return Node(name, args, OPS[name].consts(rng))


def degenerate(node: Node) -> bool:
    """A binary node whose two sides are the same tree (x - x, maximum(v, v)): zero or one side, not a
    problem worth a kernel."""
    if node.is_leaf:
        return False
    if len(node.args) == 2 and node.args[0] == node.args[1]:
        return True
    return any(degenerate(a) for a in node.args)


def inputs_used(node: Node) -> set[str]:
    return {node.op} if node.is_leaf else set().union(*(inputs_used(a) for a in node.args))


def primitives(node: Node) -> set[str]:
    return set() if node.is_leaf else {node.op}.union(*(primitives(a) for a in node.args))


def _shape(node: Node, rename: dict[str, str]) -> str:
    if node.is_leaf:
        return rename[node.op]
    parts = [_shape(a, rename) for a in node.args]
    if OPS[node.op].commutative:
        parts.sort()
    return f"{node.op}({','.join(parts)})"


def structure_key(node: Node, n_inputs: int, reduce: str | None) -> str:
    """The tree with its constants blanked and the arguments of commutative primitives sorted, the smallest
    such text over every renaming of the inputs (add(x, sin(y)) and add(y, sin(x)) are one structure), with
    the input count and the root reduction: `sum|2|add(sin(y),x)`."""
    names = VARS[:n_inputs]
    best = min(_shape(node, dict(zip(names, perm))) for perm in permutations(names))
    return f"{reduce or 'none'}|{n_inputs}|{best}"


def _num(c: float) -> str:
    return f"{c:g}" if "e" not in f"{c:g}" else repr(c)


def torch_text(node: Node) -> str:
    """The tree as one torch expression over x, y, z."""
    if node.is_leaf:
        return node.op
    a = [torch_text(arg) for arg in node.args]
    c = [_num(v) for v in node.consts]
    op = node.op
    if op in ("sigmoid", "exp", "abs", "sin", "cos", "relu", "maximum", "minimum"):
        return f"torch.{op}({', '.join(a)})"
    if op == "clamp":
        return f"torch.clamp({a[0]}, min={c[0]}, max={c[1]})"
    if op == "leaky":
        return f"torch.where({a[0]} > 0, {a[0]}, {c[0]} * {a[0]})"
    if op == "scale":
        return f"({c[0]} * {a[0]})"
    if op == "shift":
        v = node.consts[0]
        return f"({a[0]} + {c[0]})" if v > 0 else f"({a[0]} - {_num(-v)})"
    return f"({a[0]} {dict(add='+', sub='-', mul='*')[op]} {a[1]})"


def triton_lines(node: Node) -> tuple[list[str], str]:
    """The tree as Triton statements, one temporary per primitive (`t0 = tl.sin(x)`), and the name holding
    the result."""
    lines: list[str] = []

    def emit(n: Node) -> str:
        if n.is_leaf:
            return n.op
        a = [emit(arg) for arg in n.args]
        c = [_num(v) for v in n.consts]
        op = n.op
        if op in ("sigmoid", "exp", "abs", "sin", "cos", "maximum", "minimum"):
            text = f"tl.{op}({', '.join(a)})"
        elif op == "relu":
            text = f"tl.maximum({a[0]}, 0.0)"
        elif op == "clamp":
            text = f"tl.minimum(tl.maximum({a[0]}, {c[0]}), {c[1]})"
        elif op == "leaky":
            text = f"tl.where({a[0]} > 0, {a[0]}, {c[0]} * {a[0]})"
        elif op == "scale":
            text = f"{c[0]} * {a[0]}"
        elif op == "shift":
            text = f"{a[0]} + {c[0]}" if n.consts[0] > 0 else f"{a[0]} - {_num(-n.consts[0])}"
        else:
            text = f"{a[0]} {dict(add='+', sub='-', mul='*')[op]} {a[1]}"
        name = f"t{len(lines)}"
        lines.append(f"{name} = {text}")
        return name

    return lines, emit(node)

"""The elementwise family drawn from its knobs: distinct structures for training, then held-out structures
never seen in training and made only of primitives training has, each turned into a problem row (reference,
solution, split), the train split's sft pairs and the manifest. Pure: the same knobs give the same text."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

from kforge.errors import UserError
from kforge.problems.generate import expr, render

FAMILIES = ("elementwise",)
MAX_DEPTH = 6
MANIFEST_KIND = "kforge problems generate"  # marks a folder this command wrote (and may write again)


class GenerateError(UserError):
    """Knobs that cannot give the family asked for; one line for the user."""


@dataclass(frozen=True)
class Knobs:
    family: str = "elementwise"
    train: int = 256
    heldout: int = 64
    depth: int = 3
    inputs: int = 3  # at most this many of x, y, z; each problem draws its count from 1..inputs
    reduce_share: float = 0.25
    seed: int = 0
    rows: int = 16
    cols: int = 4096
    level: int = 1


@dataclass(frozen=True)
class Drawn:
    tree: expr.Node
    n_inputs: int
    reduce: str | None
    key: str  # the structure key

    @property
    def primitives(self) -> set[str]:
        return expr.primitives(self.tree) | ({self.reduce} if self.reduce else set())


def check_knobs(k: Knobs) -> None:
    """One line naming the first knob that cannot work."""
    if k.family not in FAMILIES:
        raise GenerateError(f"--family {k.family!r}: the only family is {', '.join(FAMILIES)}")
    for name, value, low in (("--train", k.train, 1), ("--heldout", k.heldout, 1), ("--depth", k.depth, 1),
                             ("--inputs", k.inputs, 1), ("--rows", k.rows, 1), ("--cols", k.cols, 1),
                             ("--level", k.level, 1), ("--seed", k.seed, 0)):
        if value < low:
            raise GenerateError(f"{name} {value}: give an integer >= {low}")
    if k.depth > MAX_DEPTH:
        raise GenerateError(f"--depth {k.depth}: at most {MAX_DEPTH} (a deeper expression is not an elementwise warm-up)")
    if k.inputs > len(expr.VARS):
        raise GenerateError(f"--inputs {k.inputs}: at most {len(expr.VARS)} ({', '.join(expr.VARS)})")
    if not 0.0 <= k.reduce_share <= 1.0:
        raise GenerateError(f"--reduce-share {k.reduce_share}: give a share between 0 and 1")


def _draw_one(rng: random.Random, k: Knobs) -> Drawn | None:
    n_inputs = rng.randint(1, k.inputs)
    tree = expr.draw_tree(rng, k.depth, n_inputs)
    reduce = rng.choice(expr.REDUCTIONS) if rng.random() < k.reduce_share else None
    if expr.degenerate(tree) or len(expr.inputs_used(tree)) < n_inputs:
        return None  # every input it is given is used, and no x - x
    return Drawn(tree, n_inputs, reduce, expr.structure_key(tree, n_inputs, reduce))


def draw(k: Knobs) -> tuple[list[Drawn], list[Drawn]]:
    """(train, held out): distinct structures; a held-out one is never a training one and uses only
    primitives (reductions included) that some training problem uses."""
    check_knobs(k)
    rng = random.Random(k.seed)
    budget = 200 * (k.train + k.heldout) + 5000  # draws before the knobs are judged too narrow
    seen: set[str] = set()
    train: list[Drawn] = []
    heldout: list[Drawn] = []
    covered: set[str] = set()  # the training problems' primitives, once training is full
    for _ in range(budget):
        d = _draw_one(rng, k)
        if d is None or d.key in seen:
            continue
        if len(train) < k.train:
            train.append(d)
            covered |= d.primitives
        elif d.primitives <= covered:
            heldout.append(d)
        else:
            continue
        seen.add(d.key)
        if len(heldout) == k.heldout:
            return train, heldout
    raise GenerateError(
        f"--depth {k.depth} --inputs {k.inputs} --reduce-share {k.reduce_share:g} gave {len(train)} training and "
        f"{len(heldout)} held-out distinct structures (held-out ones of primitives training has) in {budget} draws, "
        f"{k.train} + {k.heldout} needed: raise --depth or --inputs, or ask for fewer problems")


@dataclass(frozen=True)
class Curriculum:
    rows: list[dict]  # problems.jsonl: every problem, its split on its row
    pairs: list[dict]  # sft_pairs.jsonl: the train split's solutions, as `kforge sft --data` reads them
    manifest: dict  # curriculum.json

    def texts(self) -> dict[str, str]:
        """File name -> text; sorted keys and no date or path, so the same knobs give the same bytes."""
        return {
            "curriculum.json": json.dumps(self.manifest, indent=1, sort_keys=True) + "\n",
            "problems.jsonl": "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows),
            "sft_pairs.jsonl": "".join(json.dumps(p, sort_keys=True) + "\n" for p in self.pairs),
        }


def build(k: Knobs) -> Curriculum:
    """The family's problems (reference, solution, split), the train split's pairs and the manifest: each
    problem key's split and structure, the knobs and the seed."""
    train, heldout = draw(k)
    drawn = [(d, "train") for d in train] + [(d, "test") for d in heldout]
    order = list(range(len(drawn)))
    random.Random(f"ids|{k.seed}").shuffle(order)  # a key says nothing of its split
    rows, pairs, listed = [], [], []
    for problem_id, index in sorted((pid + 1, i) for pid, i in enumerate(order)):
        d, split = drawn[index]
        name = f"{problem_id}_ew_{hashlib.sha256(d.key.encode()).hexdigest()[:8]}"
        solution = render.solution(d.tree, d.n_inputs, d.reduce)
        rows.append({"level": k.level, "problem_id": problem_id, "name": name, "split": split, "solution": solution,
                     "code": render.reference(d.tree, d.n_inputs, d.reduce, k.rows, k.cols)})
        key = f"{k.level}/{problem_id}"
        if split == "train":
            pairs.append({"problem": key, "code": solution})
        listed.append({"key": key, "name": name, "split": split, "structure": d.key, "inputs": d.n_inputs,
                       "reduce": d.reduce, "primitives": sorted(d.primitives),
                       "expression": render.expression(d.tree, d.reduce)})
    manifest = {
        "kind": MANIFEST_KIND, "version": 1, "knobs": asdict(k),
        "counts": {"train": len(train), "test": len(heldout)},
        "primitives": {"train": sorted(set().union(*(d.primitives for d in train))),
                       "test": sorted(set().union(*(d.primitives for d in heldout)))},
        "problems": listed,
    }
    return Curriculum(rows, pairs, manifest)

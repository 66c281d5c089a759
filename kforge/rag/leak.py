"""The leak guard: keep solutions of the problems we evaluate on out of the example index.

The Sakana archive (and any scraped corpus) holds kernels for KernelBench problems themselves. An index
that shows the model a solution of a test problem turns evaluation into copying, so before embedding,
every entry is checked against the protected problems and dropped when it

- solves the same problem (same source and LEVEL/ID, as the built-in suite's own solutions do),
- has the same task name once the numeric prefix and punctuation are gone ("19_ReLU" ~ "relu"), or
- has the same PyTorch code up to sizes, comments and docstrings (a copy with other tensor shapes), or
- has PyTorch code whose normalised-token Jaccard similarity to the problem's reference reaches the
  threshold (0.95 by default: KernelBench's templated level-1 problems, ReLU against Sigmoid, score
  about 0.90, so a lower threshold would also drop neighbours that are not leaks).

Code similarity cannot tell a copy from a sibling problem that differs in one call (the three
transposed-matmul problems of KernelBench level 1 have the same token set), so the guard errs on the
side of dropping: a lost neighbour costs little, a leaked answer spoils the evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from kforge.problems.record import Problem
from kforge.rag.text import bare_name, code_tokens, jaccard, structure_hash

if TYPE_CHECKING:
    from kforge.config.schema import DatasetConfig
    from kforge.rag.corpus import CorpusEntry

DEFAULT_LEAK_THRESHOLD = 0.95


@dataclass(frozen=True)
class Leak:
    entry_name: str
    entry_source: str
    problem_key: str
    problem_name: str
    reason: str  # "key" | "name" | "code"
    similarity: float


@dataclass
class LeakReport:
    protected: list[str] = field(default_factory=list)  # LEVEL/ID keys of the protected problems
    threshold: float = DEFAULT_LEAK_THRESHOLD
    leaks: list[Leak] = field(default_factory=list)

    @property
    def dropped(self) -> int:
        return len(self.leaks)

    def by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for leak in self.leaks:
            counts[leak.reason] = counts.get(leak.reason, 0) + 1
        return counts


class LeakGuard:
    """Drops corpus entries that match any of `problems` by key, task name or code similarity."""

    def __init__(self, problems: Sequence[Problem], threshold: float = DEFAULT_LEAK_THRESHOLD) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"leak threshold {threshold} is outside (0, 1]: give e.g. 0.95")
        self.problems = list(problems)
        self.threshold = threshold
        self._keys = {(p.source, p.key): p for p in self.problems}
        self._names: dict[str, Problem] = {}
        for p in self.problems:
            name = bare_name(p.name)
            if name:
                self._names.setdefault(name, p)
        self._structures = {structure_hash(p.code): p for p in self.problems}
        self._tokens = [(p, code_tokens(p.code)) for p in self.problems]

    def match(self, entry: "CorpusEntry") -> Leak | None:
        """The first protected problem `entry` gives away, or None."""
        if entry.problem_key is not None:
            hit = self._keys.get((entry.source, entry.problem_key))
            if hit is not None:
                return self._leak(entry, hit, "key", 1.0)
        hit = self._names.get(bare_name(entry.name))
        if hit is not None:
            return self._leak(entry, hit, "name", 1.0)
        hit = self._structures.get(entry.structure_hash)
        if hit is not None:
            return self._leak(entry, hit, "code", 1.0)
        tokens = entry.pytorch_tokens
        n = len(tokens)
        best: tuple[float, Problem | None] = (0.0, None)
        for problem, ptokens in self._tokens:
            m = len(ptokens)
            # Jaccard can be no larger than min/max of the set sizes: skip pairs that cannot reach it.
            if not n or not m or min(n, m) < self.threshold * max(n, m):
                continue
            score = jaccard(tokens, ptokens)
            if score >= self.threshold and score > best[0]:
                best = (score, problem)
        if best[1] is not None:
            return self._leak(entry, best[1], "code", best[0])
        return None

    def filter(self, entries: Iterable["CorpusEntry"]) -> tuple[list["CorpusEntry"], LeakReport]:
        report = LeakReport(protected=[p.key for p in self.problems], threshold=self.threshold)
        kept = []
        for entry in entries:
            leak = self.match(entry)
            if leak is None:
                kept.append(entry)
            else:
                report.leaks.append(leak)
        return kept, report

    @staticmethod
    def _leak(entry: "CorpusEntry", problem: Problem, reason: str, similarity: float) -> Leak:
        return Leak(entry.name, entry.source, problem.key, problem.name, reason, round(similarity, 4))


@dataclass
class Protection:
    """What an index build's leak guard protects, and whose held-out set that is: the manifest records the
    latter for `kforge train` to check against its own."""

    problems: list[Problem]
    held_out_of: dict[str, object]


def protection(preset: str, dataset: "DatasetConfig", sources: Sequence[str] | None = None) -> Protection:
    """Every problem of each of `sources` (problem sources), else the test split of `dataset`, the config of
    `preset`: the held-out problems a run of that preset is measured on."""
    from kforge.problems import ProblemSourceError, load_problems
    from kforge.rag.errors import RagError

    try:
        if sources:
            found: dict[tuple[str, str], Problem] = {}
            for source in sources:
                for p in load_problems(source):
                    found[(p.source, p.key)] = p
            return Protection(list(found.values()), {"sources": list(sources)})
        return Protection(protected_test_split(dataset), {"preset": preset, "source": dataset.source, "split": "test"})
    except ProblemSourceError as exc:
        raise RagError(f"leak guard: {exc} (or pass --protect SOURCE, or --no-leak-guard)") from None


def protected_test_split(dataset: "DatasetConfig") -> list[Problem]:
    """The test split of a run's problems (same source, levels, ids, seed and fraction as training uses):
    what the leak guard protects unless told otherwise."""
    from kforge.problems import problems_from_config, split_problems

    problems = problems_from_config(dataset)
    return split_problems(problems, dataset.test_fraction, dataset.seed)[1]

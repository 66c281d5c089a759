"""Readers of the places problems come from: the built-in suite, a .jsonl file, a KernelBench folder, or
Hugging Face. `kforge.problems.selection.load_problems(source)` is the one entry point and picks the reader;
this module imports no other problem module (KernelBench's locator builds on it). A source is one of:

- ``builtin``: the small suite under ``kforge/problems/builtin`` (each with a reference Triton solution);
- ``kernelbench``: KernelBench, found through ``KERNELBENCH_ROOT``, an installed ``kernelbench`` package or
  the cache that ``kforge problems fetch kernelbench`` fills (order and details in ``kernelbench.py``);
- ``hf`` (or ``hf:<dataset>``): the ``ScalingIntelligence/KernelBench`` dataset, through the optional
  ``datasets`` package and the internet;
- a path: a ``.jsonl`` file of ``{level, problem_id, name, code}`` rows (optionally ``solution``, and
  ``split``: train or test, which then decides the train/test split instead of ``dataset.test_fraction``), or a
  KernelBench checkout folder
  (``<root>/KernelBench/levelN/*.py`` or ``<root>/levelN/*.py``);
- the prefixed forms that `Problem.source` records (``jsonl:<path>``, ``kernelbench:<root>``), so a
  problem's source string loads it again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from kforge.errors import UserError
from kforge.jsonl import iter_objects, read_text
from kforge.problems.record import Problem

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"
HF_DATASET = "ScalingIntelligence/KernelBench"
HF_LEVELS = (1, 2, 3, 4)
KERNELBENCH_ENV = "KERNELBENCH_ROOT"

_LEVEL_DIR = re.compile(r"^level(\d+)$")
# KernelBench names a problem file "<id>_<Name>.py"; the id is the number before the first underscore.
_PROBLEM_FILE = re.compile(r"^(\d+)_\S+\.py$")
_REQUIRED_FIELDS = ("level", "problem_id", "name", "code")
SPLITS = ("train", "test")  # the splits a row may declare

_OTHER_WAYS = (
    "get the problems another way: a .jsonl file of {level, problem_id, name, code} rows, or a KernelBench "
    "checkout (git clone https://github.com/ScalingIntelligence/KernelBench) passed as the source or "
    f"through {KERNELBENCH_ENV} with source=kernelbench, or `kforge problems fetch kernelbench --via git`"
)


class ProblemSourceError(UserError):
    """A problem source that cannot be read; the message is one line saying what, where and what to do."""


def builtin_problems() -> list[Problem]:
    """The built-in suite (levels 1 and 2), each with its reference Triton solution filled in."""
    problems = _load_levels(BUILTIN_ROOT, None, source="builtin", with_solutions=True)
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


def load_jsonl(path: Path) -> list[Problem]:
    """Problems from a .jsonl file whose rows carry level, problem_id, name and code."""
    if not path.is_file():
        raise ProblemSourceError(f"problem file {path} does not exist: give the path of a .jsonl file")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for where, lineno, row in iter_objects(path, ProblemSourceError, "a JSON object with level, problem_id, name, code"):
        problem = _problem_from_row(row, source=f"jsonl:{path}", where=where)
        if problem.key in seen:
            raise ProblemSourceError(f"{where}: problem {problem.key} already defined on line {seen[problem.key]}")
        seen[problem.key] = lineno
        problems.append(problem)
    if not problems:
        raise ProblemSourceError(f"problem file {path} has no rows: expected one JSON object per line")
    return problems


def load_kernelbench_folder(root: Path, levels: set[int] | None = None) -> list[Problem]:
    """Problems from a KernelBench checkout: `<root>/KernelBench/levelN/*.py` or `<root>/levelN/*.py`."""
    if not root.is_dir():
        raise ProblemSourceError(f"KernelBench folder {root} does not exist: give the root of a KernelBench checkout")
    base = root / "KernelBench" if level_dirs(root / "KernelBench") else root
    if not level_dirs(base):
        raise ProblemSourceError(
            f"no levelN folders in {root}: expected {root}/KernelBench/levelN/*.py or {root}/levelN/*.py"
        )
    problems = _load_levels(base, levels, source=f"kernelbench:{root.resolve()}", with_solutions=False)
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


def load_hf(dataset: str = HF_DATASET, levels: set[int] | None = None, revision: str | None = None) -> list[Problem]:
    """Problems from the Hugging Face dataset (splits level_1..level_4); needs `datasets` and the internet.

    `revision` pins the dataset's commit (what `kforge problems fetch` records)."""
    try:
        import datasets  # optional: kforge never depends on it
    except ImportError:
        raise ProblemSourceError(
            f"source hf needs the `datasets` package (pip install datasets) and internet access; {_OTHER_WAYS}"
        ) from None
    problems: list[Problem] = []
    for level in sorted(levels) if levels is not None else HF_LEVELS:
        split = f"level_{level}"
        try:
            pin = {"revision": revision} if revision else {}
            rows: Iterable[dict[str, Any]] = datasets.load_dataset(dataset, split=split, **pin)
        except Exception as exc:  # offline, unknown split, hub error: all end the same way for the user
            reason = _first_line(exc)
            raise ProblemSourceError(
                f"could not load {dataset} split {split} from Hugging Face ({type(exc).__name__}: {reason}); "
                f"{_OTHER_WAYS}"
            ) from None
        for index, row in enumerate(rows):
            problems.append(_problem_from_row(row, source=f"hf:{dataset}", where=f"{dataset}[{split}][{index}]"))
    return problems


def _load_levels(base: Path, levels: set[int] | None, source: str, with_solutions: bool) -> list[Problem]:
    """Read `<base>/levelN/<id>_<Name>.py`; with_solutions also reads `<base>/levelN/solutions/<same name>`."""
    problems: list[Problem] = []
    for level, folder in level_dirs(base):
        if levels is not None and level not in levels:
            continue
        by_id: dict[int, Path] = {}
        for path in sorted(folder.glob("*.py")):
            match = _PROBLEM_FILE.match(path.name)
            if match is None:
                continue  # __init__.py, helpers: not problems
            problem_id = int(match.group(1))
            if problem_id in by_id:
                raise ProblemSourceError(
                    f"{path}: problem id {problem_id} of level {level} also used by {by_id[problem_id].name}"
                )
            by_id[problem_id] = path
            solution_path = folder / "solutions" / path.name
            want = "a problem source holds KernelBench-format .py files"
            solution = (read_text(solution_path, ProblemSourceError, "solution", want)
                        if with_solutions and solution_path.is_file() else None)
            problems.append(
                Problem(
                    level=level,
                    problem_id=problem_id,
                    name=path.stem,
                    code=read_text(path, ProblemSourceError, "problem file", want),
                    source=source,
                    solution=solution,
                )
            )
    return problems


def level_dirs(base: Path) -> list[tuple[int, Path]]:
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        match = _LEVEL_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def _problem_from_row(row: object, source: str, where: str) -> Problem:
    if not isinstance(row, dict):
        raise ProblemSourceError(f"{where}: expected a JSON object with {', '.join(_REQUIRED_FIELDS)}")
    missing = [name for name in _REQUIRED_FIELDS if row.get(name) is None]
    if missing:
        needed = ", ".join(_REQUIRED_FIELDS)
        raise ProblemSourceError(f"{where}: missing {', '.join(missing)} (each row needs {needed})")
    try:
        level, problem_id = int(row["level"]), int(row["problem_id"])
    except (TypeError, ValueError):
        raise ProblemSourceError(f"{where}: level and problem_id must be integers") from None
    if not isinstance(row["code"], str) or not row["code"].strip():
        raise ProblemSourceError(f"{where}: code must be a non-empty string")
    solution = row.get("solution")
    split = row.get("split")
    if split is not None and split not in SPLITS:
        raise ProblemSourceError(f"{where}: split {split!r}: a row's split is train or test (or absent)")
    return Problem(
        level=level,
        problem_id=problem_id,
        name=str(row["name"]),
        code=row["code"],
        source=source,
        solution=solution if isinstance(solution, str) else None,
        split=split,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"

"""Where problems come from: the built-in suite, a .jsonl file, a KernelBench checkout, or Hugging Face.

`load_problems(source)` is the one entry point. A source is one of:

- ``builtin``: the small suite under ``kforge/problems/builtin`` (each with a reference Triton solution);
- ``kernelbench``: KernelBench, found through ``KERNELBENCH_ROOT``, an installed ``kernelbench`` package or
  the cache that ``kforge problems fetch kernelbench`` fills (order and details in ``kernelbench.py``);
- ``hf`` (or ``hf:<dataset>``): the ``ScalingIntelligence/KernelBench`` dataset, through the optional
  ``datasets`` package and the internet;
- a path: a ``.jsonl`` file of ``{level, problem_id, name, code}`` rows, or a KernelBench checkout folder
  (``<root>/KernelBench/levelN/*.py`` or ``<root>/levelN/*.py``);
- the prefixed forms that `Problem.source` records (``jsonl:<path>``, ``kernelbench:<root>``), so a
  problem's source string loads it again.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable

from kforge.jsonl import iter_objects
from kforge.problems.record import Problem

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"
HF_DATASET = "ScalingIntelligence/KernelBench"
HF_LEVELS = (1, 2, 3, 4)
KERNELBENCH_ENV = "KERNELBENCH_ROOT"

_LEVEL_DIR = re.compile(r"^level(\d+)$")
# KernelBench names a problem file "<id>_<Name>.py"; the id is the number before the first underscore.
_PROBLEM_FILE = re.compile(r"^(\d+)_\S+\.py$")
_REQUIRED_FIELDS = ("level", "problem_id", "name", "code")

_OTHER_WAYS = (
    "get the problems another way: a .jsonl file of {level, problem_id, name, code} rows, or a KernelBench "
    "checkout (git clone https://github.com/ScalingIntelligence/KernelBench) passed as the source or "
    f"through {KERNELBENCH_ENV} with source=kernelbench, or `kforge problems fetch kernelbench --via git`"
)


class ProblemSourceError(ValueError):
    """A problem source that cannot be read; the message is one line saying what, where and what to do."""


def load_problems(source: str, levels: list[int] | None = None) -> list[Problem]:
    """Every problem `source` provides at `levels` (all levels when None or empty), sorted by (level, id)."""
    wanted = _check_levels(levels)
    spec = (source or "").strip()
    if not spec:
        raise ProblemSourceError("empty problem source: use builtin, kernelbench, hf, a .jsonl file or a folder")
    kind, _, arg = spec.partition(":")
    kind = kind.lower()
    if spec.lower() == "builtin":
        problems = builtin_problems()
    elif spec.lower() == "kernelbench":
        from kforge.problems.kernelbench import locate  # it builds on this module

        problems = load_kernelbench_folder(locate().path, wanted)
    elif kind == "kernelbench" and arg:
        problems = load_kernelbench_folder(Path(arg).expanduser(), wanted)
    elif spec.lower() == "hf":
        problems = load_hf(HF_DATASET, wanted)
    elif kind == "hf" and arg:
        problems = load_hf(arg, wanted)
    elif kind == "jsonl" and arg:
        problems = load_jsonl(Path(arg).expanduser())
    else:
        problems = _load_path(Path(spec).expanduser(), wanted)
    if wanted is not None:
        problems = [p for p in problems if p.level in wanted]
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


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


def _load_path(path: Path, levels: set[int] | None) -> list[Problem]:
    if path.suffix == ".jsonl":
        return load_jsonl(path)
    if path.is_dir():
        return load_kernelbench_folder(path, levels)
    if path.exists():
        raise ProblemSourceError(f"problem source {path} is a file but not .jsonl: give a .jsonl file or a folder")
    raise ProblemSourceError(
        f"unknown problem source {str(path)!r}: use builtin, kernelbench (with {KERNELBENCH_ENV} set), hf, "
        "a .jsonl file or a KernelBench checkout folder"
    )


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
            solution = solution_path.read_text(encoding="utf-8") if with_solutions and solution_path.is_file() else None
            problems.append(
                Problem(
                    level=level,
                    problem_id=problem_id,
                    name=path.stem,
                    code=path.read_text(encoding="utf-8"),
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


def _problem_from_row(row: Any, source: str, where: str) -> Problem:
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
    return Problem(
        level=level,
        problem_id=problem_id,
        name=str(row["name"]),
        code=row["code"],
        source=source,
        solution=solution if isinstance(solution, str) else None,
    )


def _check_levels(levels: list[int] | None) -> set[int] | None:
    # An empty list means no filter, as None does: "no level named" is not "no problems wanted".
    if not levels:
        return None
    wanted = set()
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, int) or level < 1:
            raise ProblemSourceError(f"bad level {level!r}: levels are positive integers (1, 2, ...)")
        wanted.add(level)
    return wanted


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"

"""Loading problems from a source spec, choosing from them (by id range or name, one by spec), and the
train/test split."""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from kforge.problems.kernelbench import locate
from kforge.problems.record import Problem
from kforge.problems.sources import (
    HF_DATASET,
    KERNELBENCH_ENV,
    ProblemSourceError,
    builtin_problems,
    load_hf,
    load_jsonl,
    load_kernelbench_folder,
)

if TYPE_CHECKING:
    from kforge.config.schema import DatasetConfig

_KEY = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


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


def select_problems(
    problems: Sequence[Problem],
    start: int | None = None,
    end: int | None = None,
    names: Iterable[str] = (),
) -> list[Problem]:
    """The problems with start <= problem_id <= end (both inclusive, either open) that also match `names`.

    A name is a LEVEL/ID key ("1/19"), an id ("19": every level's problem 19), or a name or name prefix,
    with or without the id, in any case ("19_ReLU", "19_re", "relu"). A name that matches nothing is an
    error, so typos surface.
    Order follows `problems`.
    """
    if start is not None and end is not None and start > end:
        raise ProblemSourceError(f"start_problem {start} is after end_problem {end}: give start <= end")
    chosen = [
        p for p in problems if (start is None or p.problem_id >= start) and (end is None or p.problem_id <= end)
    ]
    tokens = [t.strip() for t in names if t and t.strip()]
    if not tokens:
        return chosen
    keep: set[str] = set()
    for token in tokens:
        hits = [p for p in chosen if _matches(p, token)]
        if not hits:
            raise ProblemSourceError(f"no problem matches {token!r}{_range_note(start, end)}{_suggest(token, chosen)}")
        keep.update(p.key for p in hits)
    return [p for p in chosen if p.key in keep]


def find_problem(problems: Sequence[Problem], spec: str) -> Problem:
    """One problem by "LEVEL/ID", full name, or the name without its id ("relu"), case-insensitive."""
    text = spec.strip()
    key = _KEY.match(text)
    if key:
        wanted = f"{int(key.group(1))}/{int(key.group(2))}"
        for p in problems:
            if p.key == wanted:
                return p
        raise ProblemSourceError(f"no problem {wanted} among {_describe(problems)}{_suggest(text, problems)}")
    lowered = text.lower()
    for rule in (
        lambda p: p.name.lower() == lowered,
        lambda p: _bare_name(p) == lowered,
        lambda p: lowered.isdigit() and p.problem_id == int(lowered),
    ):
        hits = [p for p in problems if rule(p)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            listed = ", ".join(f"{p.key} ({p.name})" for p in hits[:6])
            raise ProblemSourceError(f"{text!r} names several problems: {listed}; give LEVEL/ID instead")
    raise ProblemSourceError(f"no problem named {text!r} among {_describe(problems)}{_suggest(text, problems)}")


def split_problems(problems: Sequence[Problem], test_fraction: float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, test): each problem's place comes from a hash of (seed, key), never from the input order.

    The test set holds round(n * test_fraction) problems (at least one when the fraction is positive and
    there are two or more problems; never all of them). Both lists come back sorted by (level, id).
    Problems whose source declares their split (a `split` on each row) keep it: fraction and seed are unused.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ProblemSourceError(f"test_fraction {test_fraction} is outside [0, 1): give e.g. 0.1")
    declared = [p for p in problems if p.split is not None]
    if declared:
        return _declared_split(problems, len(declared))
    unique: dict[str, Problem] = {}
    for p in problems:
        if p.key in unique:
            raise ProblemSourceError(
                f"problem key {p.key} appears twice ({unique[p.key].name}, {p.name}): "
                "a split needs distinct LEVEL/ID keys"
            )
        unique[p.key] = p
    ranked = sorted(unique.values(), key=lambda p: _split_rank(seed, p))
    n = len(ranked)
    n_test = 0
    if test_fraction > 0 and n >= 2:
        n_test = min(n - 1, max(1, round(n * test_fraction)))
    test_keys = {p.key for p in ranked[:n_test]}
    ordered = sorted(unique.values(), key=lambda p: (p.level, p.problem_id))
    return [p for p in ordered if p.key not in test_keys], [p for p in ordered if p.key in test_keys]


def _declared_split(problems: Sequence[Problem], n_declared: int) -> tuple[list[Problem], list[Problem]]:
    """(train, test) as the rows say; a source that declares the split of some problems must declare all."""
    if n_declared < len(problems):
        bare = next(p for p in problems if p.split is None)
        raise ProblemSourceError(
            f"problem {bare.key} ({bare.name}) has no split while {n_declared} others declare theirs: "
            "give every row of the source a split (train or test), or none")
    ordered = sorted(problems, key=lambda p: (p.level, p.problem_id))
    return [p for p in ordered if p.split == "train"], [p for p in ordered if p.split == "test"]


def problems_from_config(dataset_cfg: "DatasetConfig") -> list[Problem]:
    """The problems a run's `dataset` section names: source, level(s), id range and explicit names."""
    problems = load_problems(dataset_cfg.source, list(dataset_cfg.level) or None)
    selected = select_problems(
        problems, dataset_cfg.start_problem, dataset_cfg.end_problem, list(dataset_cfg.problems)
    )
    if not selected:
        raise ProblemSourceError(
            f"no problems in source {dataset_cfg.source!r} at level {list(dataset_cfg.level)}"
            f"{_range_note(dataset_cfg.start_problem, dataset_cfg.end_problem)}: check dataset.source, "
            f"dataset.level and the id range (kforge problems ls --source {dataset_cfg.source})"
        )
    return selected


def training_keys(dataset_cfg: "DatasetConfig") -> set[str]:
    """The LEVEL/ID keys a run with this `dataset` section trains on (its split, exactly as `kforge train`
    draws it); every other problem is held out from that run."""
    train, _ = split_problems(problems_from_config(dataset_cfg), dataset_cfg.test_fraction, dataset_cfg.seed)
    return {p.key for p in train}


def _split_rank(seed: int, problem: Problem) -> str:
    # sha256 rather than hash(): Python salts str hashes per process, and splits must survive restarts.
    return hashlib.sha256(f"{seed}|{problem.key}".encode()).hexdigest()


def _bare_name(problem: Problem) -> str:
    """The name without its "<id>_" prefix, lower-cased: "19_ReLU" -> "relu"."""
    head, sep, tail = problem.name.partition("_")
    return (tail if sep and head.isdigit() else problem.name).lower()


def _matches(problem: Problem, token: str) -> bool:
    key = _KEY.match(token)
    if key:
        return problem.key == f"{int(key.group(1))}/{int(key.group(2))}"
    lowered = token.lower()
    if lowered.isdigit():
        return problem.problem_id == int(lowered)
    return problem.name.lower().startswith(lowered) or _bare_name(problem).startswith(lowered)


def _suggest(text: str, problems: Sequence[Problem]) -> str:
    choices = {p.name.lower(): p for p in problems}
    choices.update({_bare_name(p): p for p in problems})
    choices.update({p.key: p for p in problems})
    close = difflib.get_close_matches(text.lower(), list(choices), n=3, cutoff=0.5)
    named = list(dict.fromkeys(f"{choices[c].key} ({choices[c].name})" for c in close))
    if named:
        return f"; close matches: {', '.join(named)}"
    return "; list them with `kforge problems ls`"


def _describe(problems: Sequence[Problem]) -> str:
    sources = sorted({p.source for p in problems})
    where = f" from {sources[0]}" if len(sources) == 1 else ""
    return f"{len(problems)} problems{where}"


def _range_note(start: int | None, end: int | None) -> str:
    if start is None and end is None:
        return ""
    return f" with ids in [{'' if start is None else start}, {'' if end is None else end}]"

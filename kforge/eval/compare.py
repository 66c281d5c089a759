"""`kforge eval compare A.json B.json`: two results files side by side, on the problems both hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kforge.eval.report import is_speed_key, outcomes_from_samples, speed_measured, summarize
from kforge.eval.results import read_results


@dataclass
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    rows: list[tuple[str, str, Any, Any, float | None]] = field(default_factory=list)


def compare_files(path_a: str, path_b: str, all_problems: bool = False) -> Comparison:
    a, b = read_results(path_a), read_results(path_b)  # a ResultsFileError says what is wrong with a file
    cmp = Comparison(a, b)
    if a.get("baseline", {}).get("label") != b.get("baseline", {}).get("label"):
        cmp.notes.append("A and B use different baselines or GPUs, so their speedups are not comparable")
    sa, sb = a["summary"], b["summary"]
    keys_a, keys_b = _problems(a), _problems(b)
    if keys_a is not None and keys_b is not None and keys_a != keys_b:
        common = keys_a & keys_b
        if all_problems:
            cmp.notes.append(f"A has {len(keys_a)} problems and B {len(keys_b)}, {len(common)} in common: "
                             "compared as they are (--all-problems)")
        else:
            cmp.notes.append(f"A has {len(keys_a)} problems and B {len(keys_b)}: comparing the {len(common)} "
                             "problems both hold (--all-problems compares the files' own summaries)")
            sa, sb = _summary_of(a, common), _summary_of(b, common)
    cmp.rows = rows(sa, sb)
    return cmp


def _problems(doc: dict[str, Any]) -> set[str] | None:
    samples = doc.get("samples")
    return {s["problem_key"] for s in samples if isinstance(s, dict) and "problem_key" in s} if samples else None


def _summary_of(doc: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return summarize(outcomes_from_samples(s for s in doc["samples"] if s.get("problem_key") in keys))


def rows(sa: dict[str, Any], sb: dict[str, Any]) -> list[tuple[str, str, Any, Any, float | None]]:
    """(group, metric, A, B, B - A) for every summary entry either side has."""
    out = []
    for group in sorted(set(sa) | set(sb), key=lambda g: (g != "overall", g)):
        ga, gb = sa.get(group, {}), sb.get(group, {})
        for key in sorted(set(ga) | set(gb)):
            # A speed number of a side where nothing was timed is no number: `-`, and no difference.
            va, vb = (g.get(key) if speed_measured(g) or not is_speed_key(key) else None for g in (ga, gb))
            num = isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool)
            out.append((group, key, va, vb, (vb - va) if num else None))
    return out

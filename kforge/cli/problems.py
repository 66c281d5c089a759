"""`kforge problems ls|show`: the problems a source provides, and one problem's code."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.syntax import Syntax
from rich.table import Table

from kforge.problems import ProblemSourceError, find_problem, load_problems
from kforge.problems.record import Problem
from kforge.ui.console import console, fail

app = typer.Typer(no_args_is_help=True)

SourceOpt = typer.Option(
    "builtin",
    "--source",
    "-s",
    help="builtin | kernelbench (KERNELBENCH_ROOT) | hf | a .jsonl file | a KernelBench folder",
)


def _load(source: str, levels: list[int] | None) -> list[Problem]:
    try:
        return load_problems(source, levels)
    except ProblemSourceError as exc:
        raise fail(str(exc)) from None


@app.command("ls")
def ls(
    level: Optional[list[int]] = typer.Option(None, "--level", "-l", help="only this level (repeat for several)"),
    source: str = SourceOpt,
    as_json: bool = typer.Option(False, "--json", help="one JSON list on stdout instead of a table"),
) -> None:
    """List the problems of a source: key, name, level, lines of code, and whether a reference solution exists."""
    problems = _load(source, level)
    if as_json:
        rows = [
            {
                "key": p.key,
                "level": p.level,
                "problem_id": p.problem_id,
                "name": p.name,
                "lines": _lines(p.code),
                "has_solution": p.solution is not None,
                "source": p.source,
            }
            for p in problems
        ]
        # Plain print: meant for pipes and files, so no Rich markup or wrapping.
        print(json.dumps(rows, indent=2))
        return
    if not problems:
        levels = ", ".join(map(str, level or []))
        console.print(f"no problems in source {source!r}" + (f" at level {levels}" if levels else ""))
        return
    table = Table(title=f"problems from {source} ({len(problems)})")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("name")
    table.add_column("level", justify="right")
    table.add_column("lines", justify="right")
    table.add_column("solution", justify="center")
    for p in problems:
        table.add_row(p.key, p.name, str(p.level), str(_lines(p.code)), "yes" if p.solution else "-")
    console.print(table)


@app.command("show")
def show(
    spec: str = typer.Argument(..., help='"LEVEL/ID" (e.g. 1/3) or a name (e.g. 3_ReLU or relu)'),
    source: str = SourceOpt,
    solution: bool = typer.Option(False, "--solution", help="show the reference Triton solution instead"),
) -> None:
    """Print one problem's code (or its reference solution), syntax-highlighted on a terminal."""
    problems = _load(source, None)
    try:
        problem = find_problem(problems, spec)
    except ProblemSourceError as exc:
        raise fail(str(exc)) from None
    code = problem.code
    if solution:
        if problem.solution is None:
            raise fail(
                f"problem {problem.key} ({problem.name}) from {source} has no reference solution; "
                "only the builtin suite carries them (--source builtin)"
            )
        code = problem.solution
    if console.is_terminal:
        title = f"{problem.key} {problem.name}" + (" (reference solution)" if solution else "")
        console.rule(title)
        console.print(Syntax(code, "python", line_numbers=True, word_wrap=False))
    else:
        # Piped: the bare source, so `kforge problems show 1/3 > problem.py` gives a runnable file.
        console.out(code.rstrip("\n"), highlight=False)


def _lines(code: str) -> int:
    return len(code.splitlines())

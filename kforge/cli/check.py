"""`kforge check` (owned by the evaluator)."""

import typer

from kforge.ui.console import not_built


def check(candidate: str = typer.Argument(..., help="kernel file")) -> None:
    raise not_built("kforge check")

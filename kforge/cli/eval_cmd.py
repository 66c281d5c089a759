"""`kforge eval`."""

import typer

from kforge.ui.console import not_built


def evaluate(target: str = typer.Argument(..., help="run folder, checkpoint or model")) -> None:
    raise not_built("kforge eval")

"""`kforge train`."""

import typer

from kforge.ui.console import not_built


def train(preset: str = typer.Option("default", help="preset name")) -> None:
    raise not_built("kforge train")

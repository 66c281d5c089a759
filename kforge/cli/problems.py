"""`kforge problems ls|show`."""

import typer

from kforge.ui.console import not_built

app = typer.Typer(no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    raise not_built("kforge problems ls")

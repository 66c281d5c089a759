"""`kforge config show`."""

import typer

from kforge.ui.console import not_built

app = typer.Typer(no_args_is_help=True)


@app.command("show")
def show() -> None:
    raise not_built("kforge config show")

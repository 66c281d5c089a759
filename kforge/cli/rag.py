"""`kforge rag build|query`."""

import typer

from kforge.ui.console import not_built

app = typer.Typer(no_args_is_help=True)


@app.command("build")
def build() -> None:
    raise not_built("kforge rag build")

"""The one place that decides how kforge prints: Rich on a terminal, plain lines otherwise."""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console
from rich.logging import RichHandler

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print one clear line on stderr and return the Exit to raise (bad input: exit 2)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def not_built(what: str) -> "typer.Exit":
    return fail(f"{what} is not available in this version of kforge yet")


def setup_logging(level: str = "INFO") -> None:
    """Rich log lines on a terminal; plain timestamped lines when piped (CI, log files)."""
    root = logging.getLogger("kforge")
    root.setLevel(level)
    root.handlers.clear()
    if err_console.is_terminal:
        handler: logging.Handler = RichHandler(console=err_console, show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)

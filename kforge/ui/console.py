"""The one place that decides how kforge prints: Rich on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Iterator

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.file_proxy import FileProxy
from rich.logging import RichHandler
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress

# Off a terminal (a pipe, a log file, CI) Rich would cut every line at 80 columns: model names and paths
# in tables lost their ends. There the width is only a bound that nothing real reaches.
PLAIN_WIDTH = 1000


def _console(stderr: bool = False) -> Console:
    # markup=False: what kforge prints is text, not Rich markup. Names, paths and fixes hold brackets
    # (`pip install 'kforge[gpu]'`, a run named `lr[red]`) that markup would eat; styles are given as
    # `Text(..., style=...)` (or an explicit markup=True with the text escaped).
    probe = Console(stderr=stderr, markup=False)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=PLAIN_WIDTH, markup=False)


def quiet_libraries() -> None:
    """Off a terminal, the progress bars and advisory warnings of the model libraries are noise in a log."""
    if sys.stdout.isatty():
        return
    for name, value in (("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"), ("TQDM_DISABLE", "1")):
        os.environ.setdefault(name, value)


console = _console()
err_console = _console(stderr=True)


def progress_bar(remaining: bool = False, transient: bool = False, unit: str = "") -> Progress:
    """A command's Rich progress: what it does, a bar, done/total (of `unit`: `0/24 problems`) and the time taken
    (and left, with `remaining`); drawn on a terminal only (off one, the commands print plain progress lines of
    their own)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn()]
    if unit:
        columns.append(TextColumn(unit, markup=False))
    columns.append(TimeElapsedColumn())
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, disable=not console.is_terminal, transient=transient)


def rule(title: str) -> None:
    """A titled separator: Rich's rule on a terminal; off one a short line, not PLAIN_WIDTH columns of dashes."""
    if console.is_terminal:
        console.rule(title)
    else:
        console.print(f"--- {title} ---", highlight=False, soft_wrap=True)


def print_fields(title: str, rows: list[tuple[str, str | Text]], style: str = "") -> None:
    """Labelled values: a panel on a terminal; off one `title` and `key: value` lines (a panel there would be
    padded to PLAIN_WIDTH columns)."""
    if console.is_terminal:
        from rich.panel import Panel
        from rich.table import Table

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for key, value in rows:
            grid.add_row(key, value)
        console.print(Panel(grid, title=Text(title), border_style=style or "none"))
        return
    console.print(title, highlight=False, soft_wrap=True)
    for key, value in rows:
        console.print(f"{key}: {value.plain if isinstance(value, Text) else value}", highlight=False, soft_wrap=True)


def columns_that_fit(cells: dict[str, list[str]], width: int, by_value: tuple[str, ...], always: int = 2) -> dict[str, int]:
    """The columns of a boxed table (header -> its cells) to show at `width`, each with its width in cells (a
    wide character takes two): the first `always` of `by_value` whatever the width, then the others in that
    order while they fit whole, given back in the table's own order. A narrow terminal loses its least useful
    columns instead of breaking every cell mid-word. The first of `by_value` (a name) is the one column that
    may be narrower than its cells, when the ones kept always leave it less: `break_at_separators` lays
    those out, where Rich would cut them with "…" or crop the table at the terminal's edge."""
    need = {name: max(cell_len(c) for c in [name, *cells[name]]) for name in cells}
    kept = list(by_value[:always])
    used = 1 + sum(need[name] + 3 for name in kept)  # the left edge; each column its text, a space either side, its right edge
    for name in by_value[always:]:
        if used + need[name] + 3 <= width:
            kept.append(name)
            used += need[name] + 3
    widths = {name: need[name] for name in kept}
    if used > width:
        widths[by_value[0]] = max(cell_len(by_value[0]), need[by_value[0]] - (used - width))
    return {name: widths[name] for name in cells if name in widths}


def break_at_separators(text: str, width: int) -> str:
    """`text` in lines of at most `width` cells, each ending after the last '-', '_', '.' or '/' that fits, so
    that a long run name reads in its own parts (`drkernel-qwen3-8b-` / `lr1e-5`); only a part longer than
    `width` alone is cut inside."""
    lines = []
    while cell_len(text) > width:
        fits = used = 0
        for char in text:
            used += cell_len(char)
            if used > width:
                break
            fits += 1
        fits = max(fits, 1)  # one character wider than the column still moves on
        cut = max(text.rfind(sep, 0, fits) for sep in "-_./") + 1 or fits
        lines.append(text[:cut])
        text = text[cut:]
    return "\n".join([*lines, text])


def fail(message: str, code: int = 2) -> "typer.Exit":
    """Print one clear line on stderr and return the Exit to raise (bad input: exit 2). The message is text,
    not markup: a setting like lora.target_modules=[q_proj] is printed as given."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
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


def _writes_to_terminal(handler: logging.Handler) -> bool:
    if isinstance(handler, RichHandler):
        return handler.console.is_terminal
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = handler.stream
    if isinstance(stream, FileProxy):  # already printed through a console
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


@contextlib.contextmanager
def logs_above(console: Console) -> Iterator[None]:
    """While a Live view on `console` owns the terminal, every log handler that writes to the terminal (ours
    on the stderr console, a library's StreamHandler bound to the terminal before the view began) prints
    through `console` instead, so Rich puts its lines above the view. Written past the view, a line moves
    the cursor from where the view's next frame starts: the frame above stays on screen and the line is
    drawn over. Handlers writing to files (the run's log) are left alone."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]
    undo: list[tuple[logging.Handler, str, object]] = []
    for lg in loggers:
        for handler in list(lg.handlers):
            if not _writes_to_terminal(handler):
                continue
            if isinstance(handler, RichHandler):
                if handler.console is not console:
                    undo.append((handler, "console", handler.console))
                    handler.console = console
            else:
                assert isinstance(handler, logging.StreamHandler)
                undo.append((handler, "stream", handler.stream))
                handler.setStream(FileProxy(console, handler.stream))
    try:
        yield
    finally:
        for handler, attr, old in reversed(undo):
            if attr == "console":
                handler.console = old  # type: ignore[attr-defined]
            else:
                handler.flush()
                handler.setStream(old)  # type: ignore[attr-defined]

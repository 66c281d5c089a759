"""`kforge doctor`: check what a run needs on this machine, with the fix for each problem."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, load_config
from kforge.ui.console import console

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
PLAIN_COLUMNS = 100  # off a terminal: one check per line, wrapped at this width


def plain_lines(results, width: int = PLAIN_COLUMNS) -> list[str]:
    """Off a terminal (a pipe, a log): `status  check: detail` and an indented `fix:` line, wrapped at `width`
    columns with continuation lines indented, instead of a table padded to the console's plain width. A word longer
    than a line (a deep path) stays whole on a line of its own, so it can still be copied from the log."""
    out: list[str] = []
    wrap = dict(width=width, subsequent_indent=" " * 6, break_long_words=False, break_on_hyphens=False)
    for r in results:
        out += textwrap.wrap(f"{r.status:<4}  {r.check}: {r.detail}", **wrap)
        if r.fix:
            out += textwrap.wrap(f"fix: {r.fix}", initial_indent=" " * 6, **wrap)
    return out


def doctor(
    overrides: Optional[list[str]] = OverridesArg,
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", help="where run folders go (default: log.runs_dir)"),
    as_json: bool = typer.Option(False, "--json", help="a JSON list of {check, status, detail, fix} for scripts"),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="as `train --allow-cpu`: a config that wants a GPU "
                                   "may start on the CPU (placement.allow_cpu=true)"),
) -> None:
    """Packages, GPUs, CUDA/nvcc, a Triton kernel, sandbox layers, model, problems, RAG index and disk.

    Exit code 0 when a run of this config can start (warnings allowed), 1 when a check fails. `kforge train`
    runs the same pre-flight rows (folders, disk, GPUs, W&B, RAG index, model) before it makes a run folder.
    """
    from kforge.ops.doctor import can_start, run_checks

    extra = list(overrides or []) + (["placement.allow_cpu=true"] if allow_cpu else [])
    cfg = load_config(preset or "default", config, extra).config
    results = run_checks(cfg, runs_dir)
    if as_json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
        if not can_start(results):
            raise typer.Exit(1)
        return
    if console.is_terminal:
        table = Table(title=f"kforge doctor: preset {cfg.preset or '-'}", show_lines=False)
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for r in results:
            table.add_row(r.check, Text(r.status, style=STYLE[r.status]), r.detail, r.fix)
        console.print(table)
    else:
        console.print(f"kforge doctor: preset {cfg.preset or '-'}", highlight=False, soft_wrap=True)
        for line in plain_lines(results):
            console.print(line, highlight=False, soft_wrap=True)
    fails = sum(r.status == "fail" for r in results)
    warns = sum(r.status == "warn" for r in results)
    if fails:
        console.print(Text("not ready", style="bold red") + f": {fails} check(s) failed, {warns} warning(s)")
    else:
        console.print(Text("ready", style="green") + f": a run of this config can start ({warns} warning(s))")
    if not can_start(results):
        raise typer.Exit(1)

"""`kforge runs`: the run folders on disk."""

from __future__ import annotations

import datetime as dt
import json
from typing import Optional

import typer
from rich.table import Table

from kforge.runs.folder import find_run, list_runs
from kforge.ui.console import console, fail

app = typer.Typer(no_args_is_help=True)

RunsDirOpt = typer.Option("runs", "--runs-dir", help="folder holding the run folders")
STATUS_STYLE = {"running": "green", "finished": "blue", "failed": "red", "crashed": "red", "stopped": "yellow"}


def _fmt_time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _fmt_num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@app.command("ls")
def ls(runs_dir: str = RunsDirOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Name, status, start time, steps, best reward, fast_1 and last checkpoint of every run."""
    rows = [run.summary() for run in list_runs(runs_dir)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"no runs under {runs_dir}/ (start one with `kforge train --preset tiny`)")
        return
    table = Table(title=f"runs in {runs_dir}/")
    for col in ("name", "status", "started", "steps", "best reward", "fast_1", "last checkpoint"):
        table.add_column(col)
    for r in rows:
        style = STATUS_STYLE.get(r["status"], "")
        table.add_row(
            r["name"],
            f"[{style}]{r['status']}[/]" if style else r["status"],
            _fmt_time(r["started"]),
            str(r["steps"]),
            _fmt_num(r["best_reward"]),
            _fmt_num(r["fast_1"]),
            r["last_checkpoint"] or "-",
        )
    console.print(table)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    plot: bool = typer.Option(False, "--plot", help="write PNG plots of reward, correctness and speedup"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """One run in detail: status, config origin, latest metrics, checkpoints."""
    try:
        run = find_run(name, runs_dir)
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    summary = run.summary()
    metrics = run.metrics()
    last = metrics[-1] if metrics else {}
    if as_json:
        print(json.dumps({"summary": summary, "last_metrics": last, "checkpoints": run.checkpoints()}, indent=2))
    else:
        table = Table(title=f"run {run.name}", show_header=False)
        table.add_column("key", style="cyan")
        table.add_column("value")
        for key, value in summary.items():
            table.add_row(key, _fmt_time(value) if key == "started" else str(value))
        for key in sorted(last):
            if isinstance(last[key], (int, float)):
                table.add_row(f"last {key}", f"{last[key]:.4g}")
        console.print(table)
    if plot:
        from kforge.train.plots import write_plots

        paths = write_plots(run)
        for p in paths:
            console.print(f"wrote {p}")

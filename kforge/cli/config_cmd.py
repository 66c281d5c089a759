"""`kforge config show`: the fully resolved config and the layer that set each value."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, load_config
from kforge.config.loader import flatten, key_description, preset_names, to_yaml
from kforge.ui.console import console

app = typer.Typer(no_args_is_help=True)


@app.command("show")
def show(
    overrides: Optional[list[str]] = OverridesArg,
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    as_yaml: bool = typer.Option(False, "--yaml", help="print a YAML file that --config accepts back"),
    explain: bool = typer.Option(False, "--explain", "-e", help="add what each key means (its description)"),
) -> None:
    """Print the resolved config; each value with the layer that set it (default, preset, --config, env, command line)."""
    preset = preset or "default"  # what `kforge train` and `kforge doctor` run without --preset
    resolved = load_config(preset, config, overrides)
    if as_yaml:
        # Plain print: the output is meant to be redirected into a file.
        print(to_yaml(resolved.config), end="")
        return
    table = Table(title=f"kforge config (preset: {preset})", show_lines=False)
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value")
    table.add_column("from", style="dim")
    if explain:
        table.add_column("meaning", overflow="fold")
    for key, value in flatten(resolved.config.model_dump(mode="json")).items():
        origin = resolved.origin(key)
        style = "" if origin == "default" else "bold"
        table.add_row(key, Text(repr(value), style=style), origin, *([key_description(key)] if explain else []))
    console.print(table)


@app.command("presets")
def presets() -> None:
    """List the presets kforge ships."""
    for name in preset_names():
        console.print(name)

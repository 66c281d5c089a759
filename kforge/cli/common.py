"""Options and helpers shared by several commands, and the one place where a UserError becomes output."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from kforge.config.loader import ResolvedConfig, resolve
from kforge.errors import UserError
from kforge.ui.console import fail

if TYPE_CHECKING:
    import click


def _preset_help() -> str:
    from kforge.config.loader import preset_names

    return f"preset name (presets/NAME.yaml): {', '.join(preset_names())}; default: default"


def _named(preset: Optional[str]) -> Optional[str]:
    """--preset "" would silently mean `default` (commands read a missing preset so): refused instead."""
    if preset is not None and not preset.strip():
        raise typer.BadParameter("is empty: name a preset, or leave --preset out for `default`")
    return preset


PresetOpt = typer.Option(None, "--preset", "-p", help=_preset_help(), callback=_named)
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML file layered over the preset")
OverridesArg = typer.Argument(None, help="key.sub=value overrides, e.g. dataset.batch_size=8", show_default=False)


def load_config(preset: Optional[str], config: Optional[Path], overrides: Optional[list[str]]) -> ResolvedConfig:
    """Resolve all layers (a ConfigError is the user's one line)."""
    return resolve(preset, config, overrides or [])


def ask_the_hub_once() -> None:
    """Ask the Hugging Face hub once, before anything loads from it, as `train`'s pre-flight does: when it
    cannot be reached the command reads the local cache only (HF_HUB_OFFLINE=1), so what is not cached is one
    line at once instead of after each load retried the hub five times (24-27 s)."""
    from kforge.problems.hub import offline_unless_reachable

    offline_unless_reachable()


def _said_once(invoke: Callable[[click.Context], object], ctx: click.Context) -> object:
    """Run a command; a UserError raised anywhere below it reaches the user here, once, as it was written:
    one line on stderr and exit 2. Commands do not catch and re-word them on the way up."""
    try:
        return invoke(ctx)
    except UserError as exc:
        raise fail(str(exc)) from None


def summary(command: click.Command) -> str:
    """A command's one-line summary for a list of commands: its short help, else its help's first paragraph,
    whole (click cut it at the terminal's width minus the names, with "...")."""
    text = command.short_help or inspect.cleandoc(command.help or "").split("\n\n")[0]
    return " ".join(text.split())


class Commands(TyperGroup):
    """The `kforge` command tree and its groups (`typer.Typer(cls=Commands)`, `add_typer(..., cls=Commands)`):
    every subcommand runs through `_said_once`, also when the app is run without `main()` (as the tests run
    it); plain `--help` lists each command with its whole summary, wrapped."""

    def invoke(self, ctx: click.Context) -> object:
        return _said_once(super().invoke, ctx)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, summary(cmd)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class Command(TyperCommand):
    """A Typer app of one command (`kforge eval compare`): the same as `Commands`."""

    def invoke(self, ctx: click.Context) -> object:
        return _said_once(super().invoke, ctx)

"""Options and helpers shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kforge.config.loader import ConfigError, ResolvedConfig, resolve
from kforge.ui.console import fail

def _preset_help() -> str:
    from kforge.config.loader import preset_names

    return f"preset name (presets/NAME.yaml): {', '.join(preset_names())}; default: default"


PresetOpt = typer.Option(None, "--preset", "-p", help=_preset_help())
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML file layered over the preset")
OverridesArg = typer.Argument(None, help="key.sub=value overrides, e.g. dataset.batch_size=8", show_default=False)


def load_config(preset: Optional[str], config: Optional[Path], overrides: Optional[list[str]]) -> ResolvedConfig:
    """Resolve all layers or exit 2 with the one-line reason."""
    try:
        return resolve(preset, config, overrides or [])
    except ConfigError as exc:
        raise fail(str(exc)) from None

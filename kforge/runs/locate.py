"""Finding a run's adapter: a run (its newest checkpoint or a given step), a checkpoint folder, or an
adapter folder. `kforge export` and `kforge eval` both ask here; the layout itself is `RunFolder`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kforge.errors import UserError
from kforge.runs.checkpoints import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    ADAPTER_WEIGHTS_BIN,
    CHECKPOINTS_DIR,
    CKPT_PREFIX,
    checkpoint_damage,
    checkpoint_step,
)
from kforge.runs.folder import CONFIG_FILE, STATUS_FILE, RunFolder, find_run

if TYPE_CHECKING:
    from kforge.config.loader import ResolvedConfig
    from kforge.config.schema import KforgeConfig

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "LocateError", "Located", "find_adapter", "locate"]


class LocateError(UserError):
    """Nothing exportable where the user pointed; the message is one line saying what to give instead."""


@dataclass
class Located:
    adapter_dir: Path
    run: RunFolder | None = None
    checkpoint_dir: Path | None = None
    step: int | None = None
    skipped: list[str] = field(default_factory=list)  # newer checkpoints that cannot be used, each naming its file


def find_adapter(folder: Path) -> Path:
    """The adapter folder inside a checkpoint: the shallowest one holding adapter_config.json and weights.

    Temporary folders of an interrupted write (names starting with '.') are ignored; a `NAME.old` twin
    left by a crash between two renames is used only when nothing else is there.
    """
    found = [p.parent for p in folder.rglob(ADAPTER_CONFIG)
             if not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    found = [p for p in found if (p / ADAPTER_WEIGHTS).is_file() or (p / ADAPTER_WEIGHTS_BIN).is_file()]
    if not found:
        raise LocateError(f"{folder}: no {ADAPTER_CONFIG} with adapter weights in it or its subfolders; "
                          "give a run, a checkpoint folder (runs/NAME/checkpoints/step_N) or an adapter folder")
    fresh = [p for p in found if not any(part.endswith(".old") for part in p.relative_to(folder).parts)]
    return min(fresh or found, key=lambda p: (len(p.relative_to(folder).parts), str(p)))


def is_run(folder: Path) -> bool:
    return (folder / STATUS_FILE).is_file() or ((folder / CONFIG_FILE).is_file() and (folder / CHECKPOINTS_DIR).is_dir())


def enclosing_run(folder: Path) -> RunFolder | None:
    for parent in [folder, *folder.parents]:
        if is_run(parent):
            return RunFolder(parent)
    return None


def is_run_or_adapter(spec: str, runs_dir: str | Path) -> bool:
    """Does `spec` name something here (a run, a checkpoint or an adapter folder), not a base model id?"""
    path = Path(spec)
    if is_run(path) or is_run(Path(runs_dir) / spec):
        return True
    return path.is_dir() and any(path.rglob(ADAPTER_CONFIG))


# What a run's config.yaml is called in what its errors say: never --config, an option the user did not give.
RUN_CONFIG = "the run's config"


def no_run_config(run: RunFolder) -> str | None:
    """What is wrong with a run folder that has no config.yaml, the run's model, data and context length: one
    clause, which each command that refuses such a folder (eval, train --resume) ends with what to do."""
    if run.config_path.is_file():
        return None
    return f"no {CONFIG_FILE} in {run.path}: not a kforge run, or a damaged one"


def resolve_run_config(run: RunFolder, overrides: list[str] | tuple[str, ...] = (),
                       environ: dict[str, str] | None = None) -> "ResolvedConfig":
    """The run's config.yaml with the KFORGE_* environment (`environ`, os.environ by default) and `overrides`
    on top; a damaged file (not YAML, an unknown key, a bad value) is said as the run's config, naming it."""
    from kforge.config.loader import resolve

    return resolve(None, run.config_path, overrides, environ=environ, config_name=RUN_CONFIG)


def load_run_config(run: RunFolder) -> "KforgeConfig":
    """The run's own resolved config, exactly as written (no KFORGE_* environment layered on top); a ConfigError
    names the file and what is wrong in it."""
    return resolve_run_config(run, environ={}).config


def locate(spec: str, runs_dir: str | Path = "runs", step: int | None = None) -> Located:
    """A run (name or folder: its last checkpoint, or `step`), a checkpoint folder, or an adapter folder."""
    path = Path(spec)
    if path.is_dir() and not is_run(path):
        if step is not None:
            raise LocateError(f"--step picks a checkpoint of a run; {path} is already a checkpoint or adapter folder")
        run = enclosing_run(path.resolve())
        ckpt = path
        for parent in [path.resolve(), *path.resolve().parents]:
            if parent.name.startswith(CKPT_PREFIX) and parent.parent.name == CHECKPOINTS_DIR:
                ckpt = parent
                break
        why = checkpoint_damage(ckpt)
        if why:
            raise LocateError(f"{why}" + (f"; {run.usable_steps_line()} (of run {run.path})" if run else ""))
        skipped = []
    else:
        run = find_run(spec, runs_dir)  # RunNotFound says what is there instead
        ckpt = run.checkpoint(step)
        skipped = run.damaged_checkpoints() if step is None else []
    adapter = find_adapter(ckpt)
    return Located(adapter, run, ckpt if ckpt != adapter else None, checkpoint_step(ckpt), skipped)

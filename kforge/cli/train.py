"""`kforge train`: start or resume a run."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import typer

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, load_config
from kforge.config.loader import ConfigError, resolve, to_yaml
from kforge.runs.folder import RunFolder, find_run
from kforge.ui.console import console, fail, setup_logging

log = logging.getLogger("kforge.train")


def train(
    overrides: Optional[list[str]] = OverridesArg,
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    resume: Optional[str] = typer.Option(None, "--resume", help="run folder (or name) to continue from its last checkpoint"),
    name: Optional[str] = typer.Option(None, "--name", help="run folder name (default: PRESET-YYYYmmdd-HHMMSS)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="stop after N steps"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="placement, e.g. 'rollout=0 learner=1 eval=2,3'"),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", help="where run folders live (log.runs_dir)"),
    plain: bool = typer.Option(False, "--plain", help="plain status lines even on a terminal"),
) -> None:
    """GRPO/LoRA training: rollouts, sandboxed evaluation, learner updates, live dashboard, run folder."""
    from kforge.train.placement import PlacementError, parse_gpus_option, plan_placement

    extra = list(overrides or [])
    if max_steps is not None:
        extra.append(f"max_steps={max_steps}")
    if name is not None:
        extra.append(f"log.run_name={name}")
    if runs_dir is not None:
        extra.append(f"log.runs_dir={runs_dir}")

    if resume:
        try:
            run = find_run(resume, runs_dir or "runs")
        except FileNotFoundError as exc:
            raise fail(str(exc)) from None
        try:
            resolved = resolve(None, run.config_path, extra)
        except ConfigError as exc:
            raise fail(str(exc)) from None
        cfg = resolved.config
        if run.effective_status() == "running":
            raise fail(f"run {run.name} is still running (pid {run.read_status().get('pid')}); stop it first")
    else:
        resolved = load_config(preset or "default", config, extra)
        cfg = resolved.config
        run_name = cfg.log.run_name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
        cfg.log.run_name = run_name
        try:
            run = RunFolder.create(cfg.log.runs_dir, run_name, to_yaml(cfg))
        except FileExistsError as exc:
            raise fail(str(exc)) from None

    setup_logging()
    file_handler = logging.FileHandler(run.log_path)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("kforge").addHandler(file_handler)

    try:
        placement = {k: v for k, v in cfg.placement.model_dump().items() if v}
        placement.update(parse_gpus_option(gpus) if gpus else {})
        plan = plan_placement(None, placement)
    except PlacementError as exc:
        run.set_status("failed", error=str(exc))
        raise fail(str(exc)) from None
    console.print(plan.describe(), highlight=False, soft_wrap=True)
    status = _run(cfg, run, plan, resume=bool(resume), plain=plain)
    console.print(f"run {run.name}: {status} at step {run.summary()['steps']} -> {run.path}", highlight=False)
    if status == "failed":
        error = run.read_status().get("error")
        if error:
            console.print(f"reason: {error.splitlines()[0]}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _run(cfg, run: RunFolder, plan, resume: bool, plain: bool) -> str:
    from kforge.train.build import SetupError, build_trainer
    from kforge.ui.dashboard import Dashboard

    trainer = None
    try:
        trainer = build_trainer(cfg, run, plan, resume)
        with Dashboard(console, run.name, trainer.total_steps, plan.describe(), live=False if plain else None) as dash:
            trainer.dashboard = dash
            status = trainer.run_blocking()
    except SetupError as exc:
        run.set_status("failed", error=str(exc))
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        status = "stopped"
    except Exception as exc:
        log.exception("run failed")
        if run.read_status().get("status") != "failed":
            run.set_status("failed", error=f"{type(exc).__name__}: {exc}"[:500])
        status = "failed"
    finally:
        if trainer is not None:
            trainer.parts.close()
    try:
        from kforge.train.plots import write_plots

        write_plots(run)
    except ImportError:
        log.info("matplotlib not installed: no PNG plots (pip install 'kforge[plots]')")
    return status

"""`kforge train`: start or resume a run."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import typer

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, load_config
from kforge.config.loader import ConfigError, config_changes, resolve, to_yaml
from kforge.modelio import fit_context
from kforge.runs.folder import CHECKPOINTS_FILE, METRICS_FILE, RunFolder, drop_torn_line, find_run
from kforge.space import UnwritableFolder, check_writable, write_failure
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
    dry_run: bool = typer.Option(False, "--dry-run", help="print the GPU plan and why, then exit (nothing is started)"),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="start a config that wants a GPU on a machine without "
                                   "one (placement.allow_cpu=true): nothing is timed, a 7B model takes days"),
) -> None:
    """GRPO/LoRA training: rollouts, sandboxed evaluation, learner updates, live dashboard, run folder."""
    from kforge.train.placement import PlacementError, memory_for, parse_gpus_option, plan_placement

    if name is not None and not name.strip():
        raise fail("--name is empty: give the run folder a name, or leave --name out for PRESET-DATE-TIME")
    extra = list(overrides or [])
    if max_steps is not None:
        extra.append(f"max_steps={max_steps}")
    if name is not None:
        extra.append(f"log.run_name={name}")
    if runs_dir is not None:
        extra.append(f"log.runs_dir={runs_dir}")
    if allow_cpu:
        extra.append("placement.allow_cpu=true")

    try:
        placement = parse_gpus_option(gpus) if gpus else {}
    except PlacementError as exc:  # before any folder is made: a typo leaves nothing behind
        raise fail(str(exc)) from None
    if resume and (preset or config):
        flag = "--preset" if preset else "--config"
        raise fail(f"--resume continues {resume} with its own config.yaml; drop {flag} (change single settings "
                   "with key=value, recorded in the run's config_history.jsonl), or start a new run with --name")
    changes: dict = {}
    if resume:
        run, resolved, changes = _resume_target(resume, runs_dir, extra)
    else:
        resolved = load_config(preset or "default", config, extra)
    cfg = resolved.config
    try:  # before any folder is made: a typo leaves nothing behind
        plan = plan_placement(None, {**cfg.placement.chosen(), **placement}, memory_for(cfg))
    except PlacementError as exc:
        raise fail(str(exc)) from None
    if dry_run:
        console.print(plan.explain(), highlight=False, markup=False, soft_wrap=True)
        return
    # The pre-flight asks the hub once and reads a cached model offline when it cannot be reached, so it goes
    # before anything else reads the model's config (fitting the context would retry the hub first).
    _preflight(cfg, run.path.parent if resume else cfg.log.runs_dir)
    resolved = fit_context(resolved, lambda line: console.print(line, highlight=False, soft_wrap=True))
    if not resume and not resolved.config.log.run_name:
        # A preset given as a file path names the run by its file name alone: a run name is one folder name.
        stem = Path(resolved.config.preset).stem if resolved.config.preset else "run"
        name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        resolved = resolved.derive("generated run name", {"log": {"run_name": name}})
    cfg = resolved.config
    if not resume:
        try:
            run = RunFolder.create(cfg.log.runs_dir, cfg.log.run_name, to_yaml(cfg))
        except (FileExistsError, ValueError) as exc:
            raise fail(str(exc)) from None
    before = run.read_status()
    config_before = run.config_path.read_text() if changes else None

    setup_logging()
    file_handler = logging.FileHandler(run.log_path)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("kforge").addHandler(file_handler)
    if changes:
        _record_changes(run, cfg, changes, before.get("step") or run.summary()["steps"])
    console.print(plan.explain(), highlight=False, markup=False, soft_wrap=True)
    try:
        status = _run(cfg, run, plan, resume=bool(resume), plain=plain)
    finally:
        if resume and before.get("status") == "finished" and run.read_status().get("status") == "failed":
            # A failed attempt to extend a finished run does not make the finished run a failed one, nor
            # leave the settings it tried as the run's.
            run.write_status(before)
            if config_before is not None:
                run.record_config(config_before, {"event": "undone", "why": "extending the finished run failed"})
    console.print(f"run {run.name}: {status} at step {run.summary()['steps']} -> {run.path}", highlight=False)
    if status == "failed":
        error = run.read_status().get("error") if before.get("status") != "finished" else None
        if error:
            console.print(f"reason: {error.splitlines()[0]}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if status == "stopped" and _interrupted(run):
        raise typer.Exit(130)


def _resume_target(spec: str, runs_dir: Optional[str], extra: list[str]):
    """The run to continue, its config and what the command changes in it (key -> from, to, by); a finished
    run with nothing new to do ends here (exit 0), whatever the overrides, and nothing in it is written."""
    try:
        run = find_run(spec, runs_dir or "runs")
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    try:
        written = resolve(None, run.config_path, [], environ={}).config
        resolved = resolve(None, run.config_path, extra)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    status = run.effective_status()
    if status == "running":
        raise fail(f"run {run.name} is still running (pid {run.read_status().get('pid')}); stop it first")
    done = run.read_status().get("step") or run.summary()["steps"]
    if status == "finished" and _nothing_to_do(resolved.config, done):
        console.print(f"run {run.name} is finished at step {done}; nothing to resume. To train it further: "
                      f"kforge train --resume {run.name} --max-steps {done + max(1, done)}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(0)
    try:
        check_writable(run.path, "run folder")
    except UnwritableFolder as exc:
        raise fail(str(exc)) from None
    for line in run.damaged_checkpoints():
        console.print(f"warning: {line}; resuming from an earlier checkpoint", highlight=False, soft_wrap=True)
    for name in (METRICS_FILE, CHECKPOINTS_FILE):
        kept = drop_torn_line(run.path / name)
        if kept:
            console.print(f"{name} ended in a torn line (a crash mid-write); dropped it, a copy is in {kept}",
                          highlight=False, soft_wrap=True)
    return run, resolved, config_changes(written, resolved)


def _nothing_to_do(cfg, done: int) -> bool:
    """Does the config plan no step past `done`? (When the problems cannot be read, only max_steps can say.)"""
    from kforge.train.build import SetupError, planned_steps

    try:
        return planned_steps(cfg) <= done
    except SetupError:
        return cfg.max_steps is not None and cfg.max_steps <= done


def _record_changes(run: RunFolder, cfg, changes: dict, step: int) -> None:
    """Settings a resume changes are the run's from then on: recorded with the step they start after, then
    config.yaml rewritten, and each one logged."""
    run.record_config(to_yaml(cfg), {"event": "resume", "after_step": step, "changes": changes})
    for key, change in changes.items():
        log.info("resume after step %d changes %s: %r -> %r (from %s)", step, key, change["from"], change["to"],
                 change["by"])


def _preflight(cfg, runs_dir) -> None:
    """`kforge doctor`'s pre-flight rows, before any folder is made or model loaded: the first failure is
    the one line the user gets; warnings are said and the run goes on."""
    from kforge.modelio import is_hub_id
    from kforge.ops.doctor_base import gpu_reasons
    from kforge.ops.preflight import preflight
    from kforge.problems.hub import offline_unless_reachable

    rows = preflight(cfg, runs_dir)
    fails = [r for r in rows if r.status == "fail"]
    if fails:
        more = f" ({len(fails) - 1} more: `kforge doctor` lists them)" if len(fails) > 1 else ""
        raise fail(f"{fails[0].check}: {fails[0].detail}; {fails[0].fix}{more}")
    for row in rows:
        # No GPU for a config that needs none: the placement line says "CPU mode" already.
        if row.status == "warn" and not (row.check == "gpus" and not gpu_reasons(cfg)):
            console.print(f"warning: {row.check}: {row.detail}", highlight=False, soft_wrap=True)
    if is_hub_id(cfg.model.name):
        reason = offline_unless_reachable()
        if reason:
            console.print(f"{reason}: {cfg.model.name} is read from the local Hugging Face cache", highlight=False,
                          soft_wrap=True)


def _interrupted(run: RunFolder) -> bool:
    """Stopped by Ctrl-C (or SIGTERM) rather than by `kforge runs stop`."""
    return run.read_status().get("stopped_by") == "signal"


def _run(cfg, run: RunFolder, plan, resume: bool, plain: bool) -> str:
    from kforge.train.build import SetupError, build_trainer
    from kforge.ui.dashboard import Dashboard

    trainer = None
    try:
        trainer = build_trainer(cfg, run, plan, resume)
        with Dashboard(console, run.name, trainer.total_steps, plan.explain(), live=False if plain else None,
                       start_step=trainer.step) as dash:
            trainer.dashboard = dash
            status = trainer.run_blocking()
    except SetupError as exc:
        run.set_status("failed", error=str(exc))
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        status = "stopped"
        if run.read_status().get("status") != "stopped":  # interrupted before the loop could say so
            run.set_status("stopped", stopped_by="signal")
    except Exception as exc:
        why = write_failure(exc)
        if why:  # a full disk or a folder made read-only during the run: one line, not a traceback
            why = f"{why}; free space or fix its rights there, then kforge train --resume {run.path}"
            log.error("%s", why)
        else:
            log.exception("run failed")
        try:
            if why or run.read_status().get("status") != "failed":
                run.set_status("failed", error=why or f"{type(exc).__name__}: {exc}"[:500])
        except OSError as status_exc:
            log.error("%s", write_failure(status_exc) or status_exc)
        status = "failed"
    finally:
        if trainer is not None:
            trainer.parts.close()
    try:
        from kforge.train.plots import write_plots

        write_plots(run)
    except ImportError:
        log.info("matplotlib not installed: no PNG plots (pip install 'kforge[plots]')")
    except OSError as exc:
        log.warning("no PNG plots: %s", write_failure(exc) or exc)
    return status

"""`kforge train`: start or resume a run. The command parses, calls the run's lifecycle (train/lifecycle.py)
in order, prints and maps the outcome to an exit code; it writes nothing in the run folder itself."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, load_config
from kforge.modelio import fit_context
from kforge.ui.console import console, fail, setup_logging


def _say(line: str) -> None:
    console.print(line, highlight=False, soft_wrap=True)


def train(
    overrides: Optional[list[str]] = OverridesArg,
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    resume: Optional[str] = typer.Option(None, "--resume", help="run folder (or name) to continue from its last checkpoint"),
    name: Optional[str] = typer.Option(None, "--name", help="run folder name (default: PRESET-YYYYmmdd-HHMMSS). "
                                       "The folder of a start that failed, was stopped or killed before its first "
                                       "step, holding only kforge's files, is reused (those files replaced); any "
                                       "other existing folder is refused with what to do (runs stop, --resume, "
                                       "runs rm)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="stop after N steps"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="placement, e.g. 'rollout=0 learner=1 eval=2,3'"),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", help="where run folders live (log.runs_dir)"),
    plain: bool = typer.Option(False, "--plain", help="plain status lines even on a terminal"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="run the pre-flight, print the GPU plan and why, then exit (nothing is started)"),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="start a config that wants a GPU on a machine without "
                                   "one (placement.allow_cpu=true): nothing is timed, a 7B model takes days"),
) -> None:
    """GRPO/LoRA training: rollouts, sandboxed evaluation, learner updates, live dashboard, run folder."""
    from kforge.train.lifecycle import drive, named, open_run, resume_target, starting
    from kforge.train.placement import memory_for, parse_gpus_option, plan_placement

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

    placement = parse_gpus_option(gpus) if gpus else {}  # before any folder is made: a typo leaves nothing behind
    if resume and (preset or config):
        flag = "--preset" if preset else "--config"
        raise fail(f"--resume continues {resume} with its own config.yaml; drop {flag} (change single settings "
                   "with key=value, recorded in the run's config_history.jsonl), or start a new run with --name")
    if resume and name is not None:  # the run keeps its folder and name: a new one would be silently ignored
        raise fail(f"--resume continues {resume} in its own folder under its own name; drop --name {name}, or "
                   f"start a new run with --name {name}")
    target = resume_target(resume, runs_dir, extra) if resume else None
    if target is not None and target.nothing_to_do:  # whatever the overrides; nothing in the run is written
        _say(f"run {target.run.name} is finished at step {target.done}; nothing to resume. To train it further: "
             f"kforge train --resume {target.run.name} --max-steps {target.done + max(1, target.done)}")
        return
    resolved = target.resolved if target is not None else load_config(preset or "default", config, extra)
    cfg = resolved.config
    with starting(None if dry_run else target):  # a dry run starts nothing
        plan = plan_placement(None, {**cfg.placement.chosen(), **placement}, memory_for(cfg),
                              pipelined=cfg.rollout.pipelined)
        # The pre-flight asks the hub once and reads a cached model offline when it cannot be reached, so it goes
        # before anything else reads the model's config (fitting the context would retry the hub first). A dry
        # run asks it too: a plan that the real start would refuse a second later is no plan.
        _preflight(cfg, target.run.path.parent if target is not None else cfg.log.runs_dir)
        if dry_run:
            console.print(plan.explain(), highlight=False, markup=False, soft_wrap=True)
            return
        resolved = fit_context(resolved, _say)
        if target is None:
            resolved = named(resolved)

        setup_logging()
        opened = open_run(resolved, target, _say)
    console.print(plan.explain(), highlight=False, markup=False, soft_wrap=True)
    outcome = drive(opened, plan, lambda trainer: _dashboard(trainer, plan, plain))
    _say(f"run {opened.run.name}: {outcome.status} at step {outcome.steps} -> {opened.run.path}")
    if outcome.status == "failed":
        if outcome.error:
            _say(f"reason: {outcome.error}")
        raise typer.Exit(1)
    if outcome.interrupted:
        from kforge.train.stopflag import exit_code

        raise typer.Exit(exit_code())  # 130 for Ctrl-C, 143 for SIGTERM


def _dashboard(trainer, plan, plain: bool):
    from kforge.ui.dashboard import Dashboard

    return Dashboard(console, trainer.run.name, trainer.total_steps, plan.explain(), live=False if plain else None,
                     start_step=trainer.step)


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

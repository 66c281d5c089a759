"""A run's life around the trainer: the run to continue and what a resume changes in it, the folder opened
(made, or repaired and re-configured), the trainer built and driven to its end, and what that end leaves.

`kforge train` parses its options, calls these in order and prints; the status in status.json is written
here and by the trainer, never by the command:

    resume_target (on --resume) -> starting( [plan, pre-flight, fit_context] -> named -> open_run ) -> drive
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kforge.config.loader import ResolvedConfig, config_changes, to_yaml
from kforge.config.schema import KforgeConfig
from kforge.errors import UserError
from kforge.runs.folder import CHECKPOINTS_FILE, LIVE, METRICS_FILE, RunFolder, RunNotFound, drop_torn_line, find_run
from kforge.runs.locate import no_run_config, resolve_run_config
from kforge.space import check_writable, run_write_failure, write_failure
from kforge.train.placement import Plan

if TYPE_CHECKING:
    from kforge.train.trainer import Trainer

log = logging.getLogger("kforge.train")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass
class Resume:
    """A run to continue: its config with this command's settings on top, and what they change in it."""

    run: RunFolder
    resolved: ResolvedConfig
    changes: dict[str, dict[str, Any]]  # key -> from, to, by
    done: int  # steps the run has done
    nothing_to_do: bool  # finished, and the config plans no step past `done`
    start: int = 0  # the step it continues from: its newest checkpoint that can be used (0 without one)
    before: dict[str, Any] = field(default_factory=dict)  # status.json as the run left it, before this start


def resume_target(spec: str, runs_dir: str | None, overrides: list[str]) -> Resume:
    """The run `spec` names, checked before any work: not running, its folder writable. Nothing is written."""
    try:
        run = find_run(spec, runs_dir or "runs")
    except RunNotFound:
        if not Path(spec).is_dir():
            raise
        run = RunFolder(Path(spec))  # a folder but not a run: said below as what it lacks
    missing = no_run_config(run)
    if missing:
        raise UserError(f"{missing}; there is no config to resume with: put the run's config.yaml back, or start "
                        "a new run with --name")
    written = resolve_run_config(run, environ={}).config
    resolved = resolve_run_config(run, overrides)
    status = run.effective_status()
    if status in LIVE:  # a live process (a dead one's status reads "crashed")
        raise UserError(f"run {run.name} is still {status} (pid {run.read_status().get('pid')}); stop it first "
                        f"with `kforge runs stop {run.name}`")
    done = run.read_status().get("step") or run.summary()["steps"]
    nothing_to_do = status == "finished" and _nothing_to_do(resolved.config, done)
    if not nothing_to_do:
        check_writable(run.path, "run folder")
    last = run.last_checkpoint()  # a damaged newer one is passed over: the resume starts here, not at `done`
    return Resume(run, resolved, config_changes(written, resolved), done, nothing_to_do, last["step"] if last else 0,
                  before=run.read_status())


@contextmanager
def starting(resume: Resume | None) -> Iterator[None]:
    """Around a resume's start-up, up to and including `open_run`: the run is "starting", with this process's
    pid, from the first check on. The pre-flight asks the hub and fitting the context reads the model's config,
    seconds in which `runs logs -f` and `watch` saw the status the run ended with last time and exited at once,
    and a second --resume was let through. A start that ends before the folder is open (a pre-flight refusal,
    Ctrl-C) puts back the status it found: the run is as it was, not crashed."""
    if resume is None:
        yield
        return
    resume.run.set_status("starting")
    try:
        yield
    except BaseException:
        # A full disk must not put its own error in place of the refusal the user needs to read; the status
        # left then ("starting", this pid) reads "crashed" once this process is gone, and resumes the same.
        with suppress(OSError):
            resume.run.write_status(resume.before)
        raise


def _nothing_to_do(cfg: KforgeConfig, done: int) -> bool:
    """Does the config plan no step past `done`? (When the problems cannot be read, only max_steps can say.)"""
    from kforge.train.build import planned_steps

    try:
        return planned_steps(cfg) <= done
    except UserError:
        return cfg.max_steps is not None and cfg.max_steps <= done


def named(resolved: ResolvedConfig) -> ResolvedConfig:
    """The config with a run name: the one given, else PRESET-YYYYmmdd-HHMMSS, a layer of its own. A preset
    given as a file path names the run by its file name alone: a run name is one folder name."""
    if resolved.config.log.run_name:
        return resolved
    stem = Path(resolved.config.preset).stem if resolved.config.preset else "run"
    return resolved.derive("generated run name", {"log": {"run_name": f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"}})


@dataclass
class OpenRun:
    """A run folder ready for the trainer, and what it held before this start (to undo a failed extension)."""

    run: RunFolder
    cfg: KforgeConfig
    resumed: bool
    before: dict[str, Any] = field(default_factory=dict)  # status.json before this start
    changes: dict[str, dict[str, Any]] = field(default_factory=dict)  # what this resume changes, recorded once restored
    config_before: str | None = None  # config.yaml before this resume changed it (None: nothing recorded yet)
    log_file: logging.Handler | None = None


def open_run(resolved: ResolvedConfig, resume: Resume | None, say: Callable[[str], None]) -> OpenRun:
    """A new run's folder made, or the resumed one repaired (torn last lines of its JSONL files cut off and
    kept aside, damaged checkpoints named); the run's log file attached. A resume's changed settings are
    recorded by `drive` once the trainer is restored: only then is the step they start after known."""
    cfg = resolved.config
    if resume is None:
        opened = OpenRun(RunFolder.create(cfg.log.runs_dir, cfg.log.run_name, to_yaml(cfg)), cfg, resumed=False)
    else:
        run = resume.run
        for line in run.damaged_checkpoints():
            say(f"warning: {line}; resuming from step {resume.start}, its newest checkpoint that can be used")
        for name in (METRICS_FILE, CHECKPOINTS_FILE):
            kept = drop_torn_line(run.path / name)
            if kept:
                say(f"{name} ended in a torn line (a crash mid-write); dropped it, a copy is in {kept}")
        opened = OpenRun(run, cfg, resumed=True, before=resume.before, changes=resume.changes)
        # Alive from here on (from `starting` on, when the command wraps its start-up in it), as a new run is
        # from its folder's making: `runs logs -f`, `ls` and `watch` see this process while the model loads.
        run.set_status("starting")
    opened.log_file = logging.FileHandler(opened.run.log_path)
    opened.log_file.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger("kforge").addHandler(opened.log_file)
    return opened


def _record_changes(opened: OpenRun, step: int) -> None:
    """Settings a resume changes are the run's from then on: recorded with the step they start after (the
    checkpoint the trainer was restored from; the steps after it are redone with them), then config.yaml
    rewritten, and each one logged."""
    run, changes = opened.run, opened.changes
    opened.config_before = run.config_path.read_text()
    run.record_config(to_yaml(opened.cfg), {"event": "resume", "after_step": step, "changes": changes})
    for key, change in changes.items():
        log.info("resume after step %d changes %s: %r -> %r (from %s)", step, key, change["from"], change["to"],
                 change["by"])


@dataclass
class Outcome:
    status: str  # finished | stopped | failed
    steps: int
    error: str | None = None  # the first line of why it failed (not for a failed extension, which was undone)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM rather than by `kforge runs stop`


def drive(opened: OpenRun, plan: Plan, watch: Callable[[Trainer], AbstractContextManager[object]]) -> Outcome:
    """Build the trainer, run it under `watch(trainer)` (the dashboard) to its end and say how it ended.

    The trainer writes the status of a run that reached its loop; this writes it only for an end the trainer
    never saw: a set-up that failed (its UserError is raised on, for the command's one line), Ctrl-C before
    the loop, or an error raised around it. A failed attempt to extend a finished run is undone: the run
    stays finished with the settings it finished with."""
    run = opened.run
    try:
        status = _run_trainer(opened, plan, watch)
    finally:
        if opened.before.get("status") == "finished" and run.read_status().get("status") == "failed":
            run.write_status(opened.before)
            if opened.config_before is not None:
                run.record_config(opened.config_before, {"event": "undone", "why": "extending the finished run failed"})
        if opened.log_file is not None:
            logging.getLogger("kforge").removeHandler(opened.log_file)
            opened.log_file.close()
    st = run.read_status()
    error = st.get("error") if status == "failed" and opened.before.get("status") != "finished" else None
    return Outcome(status, run.summary()["steps"], error.splitlines()[0] if error else None,
                   status == "stopped" and st.get("stopped_by") == "signal")


def _run_trainer(opened: OpenRun, plan: Plan, watch: Callable[[Trainer], AbstractContextManager[object]]) -> str:
    from kforge.train.build import build_trainer

    run, trainer = opened.run, None
    try:
        trainer = build_trainer(opened.cfg, run, plan, opened.resumed)  # says what it builds in the log
        if opened.changes:  # a newer checkpoint that did not load was passed over: the step restored is known now
            _record_changes(opened, trainer.step)
        with watch(trainer) as dashboard:
            trainer.dashboard = dashboard
            status = trainer.run_blocking()
    except UserError as exc:  # the set-up refused the config: the user's one line, and the run failed
        run.set_status("failed", error=str(exc))
        raise
    except KeyboardInterrupt:
        status = "stopped"
        if run.read_status().get("status") != "stopped":  # interrupted before the loop could say so
            run.set_status("stopped", stopped_by="signal")
    except Exception as exc:
        st = run.read_status()
        # The trainer records the failure of its loop in one line (a checkpoint whose save failed, with where
        # --resume continues): said as recorded, once; a failure it never saw, from the exception.
        recorded = st.get("error") if st.get("status") == "failed" else None
        why = run_write_failure(exc, run.path)
        if why:
            log.error("%s", recorded or why)
        else:
            log.exception("run failed" + (f": {recorded}" if recorded else ""))
        try:
            if st.get("status") != "failed":  # the trainer did not get to say so
                run.set_status("failed", error=why or f"{type(exc).__name__}: {exc}"[:500])
        except OSError as status_exc:
            log.error("%s", write_failure(status_exc) or status_exc)
        status = "failed"
    finally:
        if trainer is not None:
            trainer.parts.close()
    _plots(run)
    return status


def _plots(run: RunFolder) -> None:
    try:
        from kforge.train.plots import write_plots

        write_plots(run)
    except ImportError:
        log.info("matplotlib not installed: no PNG plots (pip install 'kforge[plots]')")
    except OSError as exc:
        log.warning("no PNG plots: %s", write_failure(exc) or exc)

"""`kforge runs`: the run folders on disk."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from kforge.runs.folder import LIVE, find_run, list_runs
from kforge.ui.console import break_at_separators, columns_that_fit, console, fail, rule

app = typer.Typer(no_args_is_help=True)

RunsDirOpt = typer.Option("runs", "--runs-dir", help="folder holding the run folders")
STATUS_STYLE = {"running": "green", "finished": "blue", "failed": "red", "crashed": "red", "stopped": "yellow",
                "killed": "red"}
LS_BY_VALUE = ("name", "status", "steps", "best reward", "fast_1", "started", "last checkpoint")  # kept first


def _fmt_time(ts: float | None, seconds: bool = False) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M" + (":%S" if seconds else "")) if ts else "-"


def _config_origin(run) -> dict:
    """Where the run's config came from: its preset, and each key that a --config file, the environment or
    an override set to something else (read back from the run's config.yaml)."""
    from kforge.config.loader import ConfigError, changes_from_preset
    from kforge.runs.locate import load_run_config

    out: dict = {"path": str(run.config_path), "preset": None, "changed": None}
    try:
        cfg = load_run_config(run)
    except ConfigError as exc:  # names the file and why it cannot be read
        out["error"] = str(exc)
        return out
    out["preset"] = cfg.preset
    changed = changes_from_preset(cfg)
    if changed is not None:
        changed.pop("log.run_name", None)  # the run's own name, shown above
    out["changed"] = changed
    return out


def _origin_text(origin: dict) -> str:
    if origin.get("error"):
        return origin["error"]
    preset = origin["preset"] or "none"
    if origin["changed"] is None:
        return f"{origin['path']} (preset {preset}, not found here: changes unknown)"
    changed = ", ".join(f"{k}={v}" for k, v in origin["changed"].items())
    return f"{origin['path']} (preset {preset}" + (f"; changed: {changed})" if changed else ", unchanged)")


def _fmt_num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@app.command("ls")
def ls(runs_dir: str = RunsDirOpt,
       as_json: bool = typer.Option(False, "--json", help="a JSON list of the runs' summaries, for scripts")) -> None:
    """Name, status, start time, steps, best reward, fast_1 and last checkpoint of every run."""
    rows = [run.summary() for run in list_runs(runs_dir)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"no runs under {runs_dir}/ (start one with `kforge train --preset tiny`)")
        return
    cells = {"name": [r["name"] for r in rows], "status": [r["status"] for r in rows],
             "started": [_fmt_time(r["started"]) for r in rows], "steps": [str(r["steps"]) for r in rows],
             "best reward": [_fmt_num(r["best_reward"]) for r in rows], "fast_1": [_fmt_num(r["fast_1"]) for r in rows],
             "last checkpoint": [r["last_checkpoint"] or "-" for r in rows]}
    # Every cell whole (a run name is what the user types next): a narrow terminal drops columns instead, and a
    # name too long to stand whole beside its status is laid out in its own parts, never cut inside one.
    shown = columns_that_fit(cells, console.width, LS_BY_VALUE)
    left_out = [name for name in cells if name not in shown]
    table = Table(title=f"runs in {runs_dir}/",
                  caption=f"left out at {console.width} columns: {', '.join(left_out)} (see --json)" if left_out else None)
    for col, width in shown.items():
        table.add_column(col, no_wrap=True, width=width)
    cells["name"] = [break_at_separators(name, shown["name"]) for name in cells["name"]]
    for i, r in enumerate(rows):
        table.add_row(*(Text(r["status"], style=STATUS_STYLE.get(r["status"], "")) if col == "status" else cells[col][i]
                        for col in shown))
    console.print(table)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    plot: bool = typer.Option(False, "--plot", help="write PNG plots of reward, correctness and speedup"),
    as_json: bool = typer.Option(False, "--json", help="summary, config origin, last metrics and checkpoints as "
                                 "one JSON object (with --step: the transcript's records)"),
    step: Optional[int] = typer.Option(None, "--step", help="print that step's trajectories (its transcript)"),
    problem: Optional[str] = typer.Option(None, "--problem", help="with --step: only this problem (e.g. 1/3)"),
) -> None:
    """One run in detail: status, config origin, latest metrics, checkpoints; with --step, a transcript."""
    run = find_run(name, runs_dir)
    if step is not None:
        _show_transcript(run, step, problem, as_json)
        return
    if problem is not None:
        raise fail("--problem needs --step N (the transcript of one step)")
    if plot:
        _plots_can_be_written(run)
    summary = run.summary()
    metrics = run.metrics()
    last = metrics[-1] if metrics else {}
    origin = _config_origin(run)
    if as_json:
        print(json.dumps({"summary": summary, "config": origin, "last_metrics": last, "checkpoints": run.checkpoints()},
                         indent=2))
    else:
        table = Table(title=f"run {run.name}", show_header=False)
        table.add_column("key", style="cyan")
        table.add_column("value", overflow="fold")
        for key, value in summary.items():
            table.add_row(key, _fmt_time(value, seconds=True) if key == "started" else str(value))
        table.add_row("config", _origin_text(origin))
        for key in sorted(last):
            if key == "time" and isinstance(last[key], (int, float)):
                table.add_row("last step ended", _fmt_time(last[key], seconds=True))
            elif isinstance(last[key], (int, float)):
                table.add_row(f"last {key}", f"{last[key]:.4g}")
        console.print(table)
    if plot:
        from kforge.space import write_failure
        from kforge.train.plots import write_plots

        try:
            paths = write_plots(run)
        except OSError as exc:  # the disk filled up, or the folder changed since the probe
            why = write_failure(exc)
            if why is None:
                raise
            raise fail(f"--plot: {why}", code=1) from None
        for p in paths:
            console.print(f"wrote {p}", highlight=False, soft_wrap=True)


def _plots_can_be_written(run) -> None:
    """--plot writes PNGs into the run folder: asked before anything is printed, as `train` asks."""
    from kforge.space import check_writable

    check_writable(run.path, "--plot writes its PNGs into the run folder")


def _show_transcript(run, step: int, problem: Optional[str], as_json: bool) -> None:
    """Prompts are shown by reference (hash, length); responses, verdicts, scores and advantages in full."""
    from kforge.runs.transcripts import read_transcript

    path = run.samples_path(step)
    if not path.exists():
        have = sorted(int(p.stem.split("_")[1]) for p in path.parent.glob("step_*.jsonl")) if path.parent.is_dir() else []
        raise fail(f"no transcript for step {step} in {run.name}" + (f"; steps with one: {have[0]}..{have[-1]}"
                                                                     if have else " (log.samples_max_mb=0?)"))
    records = read_transcript(path, problem)
    if problem is not None and not any("problem" in r for r in records):
        raise fail(f"step {step} of {run.name} has no trajectory of problem {problem!r}")
    if as_json:
        print(json.dumps(records, indent=1))
        return
    for rec in records:
        if "truncated" in rec:
            console.print(f"... {rec['truncated']} more trajectories not written: {rec['reason']}", style="yellow")
            continue
        rule(f"step {step} · problem {rec['problem']} · sample {rec['group']} · stopped: {rec['stop_reason']}")
        for t in rec["turns"]:
            verdict = t["status"] + (f" x{t['speedup']:.2f}" if t.get("speedup") else "") + (
                f" flags {','.join(t['flags'])}" if t.get("flags") else "")
            console.print(Text.assemble((f"turn {t['turn']}", "cyan"), f" (policy v{t['policy_version']}, prompt "
                                        f"{t['prompt_tokens']} tokens #{t['prompt_sha']}) verdict ", (verdict, "bold"),
                                        f" score {t['score']:.3f} return {t['return']:.3f} advantage "
                                        f"{t['advantage']:+.3f}"))
            console.print(t["response"], highlight=False)
            if t.get("feedback"):
                console.print(f"feedback: {t['feedback'].strip()}", style="dim", highlight=False)


@app.command("stop")
def stop(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    now: bool = typer.Option(False, "--now", help="SIGTERM the run's process now, SIGKILL after --grace seconds"),
    grace: float = typer.Option(10.0, "--grace", min=0.0, help="seconds between SIGTERM and SIGKILL with --now"),
    wait: bool = typer.Option(False, "--wait", help="return only when the run has ended"),
    timeout: float = typer.Option(600.0, "--timeout", min=0.0, help="longest --wait, in seconds"),
) -> None:
    """Ask a run to stop: it saves a checkpoint after the current step and exits with status "stopped"."""
    from kforge.ops.run_control import RunControlError, clear_stop, request_stop, terminate, wait_until_ended

    run = find_run(name, runs_dir)
    try:
        if now:
            status = terminate(run, grace)
            console.print(f"run {run.name}: {status}", highlight=False, soft_wrap=True)
            return
        request_stop(run)
    except RunControlError as exc:
        raise fail(str(exc), code=1) from None
    console.print(f"asked run {run.name} to stop: it saves a checkpoint after the current step and exits "
                  f"(follow it with `kforge runs logs {run.name} -f`)", highlight=False, soft_wrap=True)
    if wait:
        status = wait_until_ended(run, timeout)
        if status is None:
            raise fail(f"run {run.name} is still running after {timeout:g} s; `kforge runs stop {run.name} --now` "
                       "stops it at once", code=1)
        clear_stop(run)
        console.print(f"run {run.name}: {status}", highlight=False, soft_wrap=True)


@app.command("logs")
def logs(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    follow_: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines until the run ends"),
    lines: Optional[int] = typer.Option(None, "--lines", "-n", min=0, help="only the last N lines"),
) -> None:
    """Print the run's logs.log (with -f: and follow it while the run is alive)."""
    import sys

    from kforge.ops.run_control import follow, is_active, last_lines, log_size

    run = find_run(name, runs_dir)
    if not run.log_path.exists() and not (follow_ and is_active(run)):
        raise fail(f"run {run.name} has no {run.log_path.name} yet", code=1)
    start = log_size(run.log_path)
    sys.stdout.write(last_lines(run.log_path, lines))
    sys.stdout.flush()
    if not follow_:
        return
    try:
        for chunk in follow(run.log_path, lambda: is_active(run), start=start):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(130) from None  # Ctrl-C: exit 130, as every command


@app.command("watch")
def watch(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="seconds between refreshes"),
    once: bool = typer.Option(False, "--once", help="print one frame and exit"),
    plain: bool = typer.Option(False, "--plain", help="plain lines even on a terminal"),
) -> None:
    """A live view of a run's metrics and status, read from its folder (works from any terminal or SSH)."""
    import time

    from rich.live import Live

    from kforge.ops.watch import fields, plain_line, render, snapshot

    run = find_run(name, runs_dir)
    if once:
        if console.is_terminal and not plain:
            console.print(render(snapshot(run)))
        else:  # a pipe: `key: value` lines, as `check` prints them
            for key, value in fields(snapshot(run)):
                console.print(f"{key}: {value}", highlight=False, soft_wrap=True)
        return
    try:
        if console.is_terminal and not plain:
            with Live(render(snapshot(run)), console=console, refresh_per_second=4, transient=False) as live:
                while True:
                    snap = snapshot(run)
                    live.update(render(snap))
                    if not snap.active:
                        break
                    time.sleep(interval)
            return
        last_key = None
        while True:
            snap = snapshot(run)
            key = (snap.status, snap.step, snap.checkpoint, snap.stop_requested)
            if key != last_key:  # a line per change, not per poll: logs stay readable
                print(plain_line(snap), flush=True)
                last_key = key
            if not snap.active:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None  # Ctrl-C: exit 130, as every command


@app.command("tb")
def tb(
    names: Optional[list[str]] = typer.Argument(None, help="runs to show (default: every run with TensorBoard logs)"),
    runs_dir: str = RunsDirOpt,
    host: str = typer.Option("localhost", "--host", help="interface to listen on (0.0.0.0 for other machines)"),
    port: int = typer.Option(6006, "--port", help="port (the next free one when taken)"),
) -> None:
    """Start TensorBoard on the runs' tensorboard/ folders and print its URL; Ctrl-C stops it."""
    import subprocess

    from kforge.ops.run_control import (
        TENSORBOARD_MISSING,
        RunControlError,
        free_port,
        tensorboard_command,
        tensorboard_installed,
        tensorboard_logdirs,
    )

    if not tensorboard_installed():
        raise fail(TENSORBOARD_MISSING, code=1)
    runs = [find_run(n, runs_dir) for n in names] if names else list(list_runs(runs_dir))
    try:
        logdirs = tensorboard_logdirs(runs)
        if not logdirs:
            which = ", ".join(r.name for r in runs) or f"any run under {runs_dir}/"
            raise RunControlError(f"no tensorboard/ folder in {which}; runs write one with log.tensorboard=true")
        chosen = free_port(host, port)
    except RunControlError as exc:
        raise fail(str(exc), code=1) from None
    cmd = tensorboard_command(logdirs, host, chosen)
    shown = "localhost" if host in ("0.0.0.0", "::") else host
    console.print(f"TensorBoard for {', '.join(label for label, _ in logdirs)} at http://{shown}:{chosen}/",
                  highlight=False, soft_wrap=True)
    console.print(f"(over SSH: ssh -L {chosen}:localhost:{chosen} THIS_HOST, then open the URL; Ctrl-C stops it)",
                  highlight=False, soft_wrap=True)
    import signal

    got = [signal.SIGINT]

    def _as_interrupt(signum, frame):  # SIGTERM/SIGHUP (closed SSH session) must not orphan TensorBoard
        got[0] = signum
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _as_interrupt)
    proc = subprocess.Popen(cmd)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise typer.Exit(128 + got[0]) from None  # 130 for Ctrl-C, as every command; 143 for SIGTERM
    if code != 0:
        raise fail(f"TensorBoard exited with code {code}", code=1)


def _confirm(question: str, no_input: str) -> bool:
    """y/N on a terminal; off one, a line of stdin (`yes | kforge runs rm ...`), and with nothing to read
    one line asking for --yes (exit 2) instead of an "interrupted" exit 130."""
    if sys.stdin.isatty():
        return typer.confirm(question, default=False)
    console.print(f"{question} [y/N]: ", end="", highlight=False, markup=False)
    answer = sys.stdin.readline()
    if not answer:
        console.print()
        raise fail(no_input)
    return answer.strip().lower() in ("y", "yes")


@app.command("rm")
def rm(
    name: str = typer.Argument(..., help="run name or folder"),
    runs_dir: str = RunsDirOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask"),
) -> None:
    """Delete a run folder (asks first). A running run is never removed."""
    from kforge.ops.run_control import RunControlError, remove_run
    from kforge.space import check_deletable

    run = find_run(name, runs_dir)
    status = run.effective_status()
    if status in LIVE:  # refuse before asking: the answer could not change anything
        try:
            remove_run(run)
        except RunControlError as exc:
            raise fail(str(exc), code=1) from None
    check_deletable(run.path, "run folder")  # a read-only folder: one line before the question
    if not yes and not _confirm(f"delete run {run.name} ({status}) at {run.path} and all its checkpoints?",
                                f"runs rm {run.name}: nothing to confirm it on (no terminal, no input); "
                                f"add --yes to delete {run.path}"):
        console.print("nothing removed", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    try:
        remove_run(run)
    except RunControlError as exc:
        raise fail(str(exc), code=1) from None
    console.print(f"removed {run.path}", highlight=False, soft_wrap=True)

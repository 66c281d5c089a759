"""`kforge`: the command-line entry point. Each command group lives in its own module."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from kforge.cli import check, config_cmd, doctor, eval_cmd, export, problems, rag, runs, sft, train
from kforge.cli.common import Command, Commands

app = typer.Typer(
    name="kforge",
    help=(
        "Teach an LLM to write fast GPU kernels with multi-turn RL on one workstation.\n\n"
        "Start with `kforge train --preset tiny` (CPU, minutes) or `kforge train --preset kevin` (GPUs)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=Commands,  # a UserError from any command: one line, exit 2
)


def _version(value: bool) -> None:
    if value:
        from kforge import __version__

        print(f"kforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="print the version and exit"),
) -> None:
    """Teach an LLM to write fast GPU kernels with multi-turn RL on one workstation."""

app.command("train", help="GRPO/LoRA training with a live dashboard; writes runs/NAME.")(train.train)
app.command("sft", help="Supervised LoRA warm start on (problem, solution) pairs; writes an adapter folder.")(sft.sft)
app.command("eval", help="Generate and evaluate on KernelBench problems: fast_p, correctness, speedups.")(
    eval_cmd.evaluate
)
app.command("check", help="Evaluate one kernel file against one problem and print the verdict. Exit code 0 "
            "when it is accepted (correct), 1 for any other verdict, 2 for bad input.")(check.check)
app.command("doctor", help="Check what a run needs on this machine and how to fix what is missing.")(doctor.doctor)
app.command("export", help="Write a run's adapter as a clean PEFT folder, or a merged Hugging Face model.")(
    export.export
)
# `kforge eval TARGET` takes a positional target, so `compare` cannot be its subcommand: `main` sends
# `kforge eval compare ...` here, where it has its own options and help.
compare_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                          context_settings={"help_option_names": ["-h", "--help"]})
compare_app.command(help="Compare two eval results files on the problems both hold.", cls=Command)(eval_cmd.compare)
app.add_typer(rag.app, name="rag", cls=Commands)
app.add_typer(runs.app, name="runs", help="The runs on disk: ls, show, stop, logs, watch, tb, rm.",
              cls=Commands)
app.add_typer(problems.app, name="problems", help="List and show the problems a source provides; generate a curriculum.",
              cls=Commands)
app.add_typer(config_cmd.app, name="config", help="Show the resolved config and where each value came from.",
              cls=Commands)


def _click_errors() -> tuple[type, type, tuple[type, ...]]:
    """(UsageError, ClickException, Abort types) of the click that this typer runs on: recent typer
    carries its own copy of click, older typer uses click itself."""
    try:
        from typer._click import exceptions as errors
    except ImportError:  # typer that runs on click itself
        from click import exceptions as errors
    return errors.UsageError, errors.ClickException, (getattr(errors, "Abort", typer.Abort), typer.Abort, KeyboardInterrupt)


def plain_help() -> None:
    """Off a terminal, --help as click's plain text: Rich's help boxes are drawn at 80 columns there and cut
    long option names and help text with "…" instead of wrapping them. (Typer reads this switch, set from
    TYPER_USE_RICH at its import, each time it formats help.)"""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return
    import typer.core

    typer.core.HAS_RICH = False


def main(args: Optional[list[str]] = None) -> None:
    """Run a command; a usage error is one line on stderr and exit 2 (a UserError too: `Commands`), Ctrl-C
    exit 130."""
    from kforge.ui.console import quiet_libraries

    quiet_libraries()
    plain_help()
    for stream in (sys.stdout, sys.stderr):
        # A terminal that is not UTF-8 (LANG=C) gets \u escapes for what it cannot show, e.g. a run's name,
        # instead of a UnicodeEncodeError.
        if (getattr(stream, "encoding", None) or "").lower().replace("-", "") != "utf8":
            try:
                stream.reconfigure(errors="backslashreplace")
            except (AttributeError, ValueError):
                pass
    usage_error, click_error, aborts = _click_errors()
    args = sys.argv[1:] if args is None else args
    command, prog = app, "kforge"
    if args[:2] == ["eval", "compare"]:
        command, args, prog = compare_app, args[2:], "kforge eval compare"
    try:
        code = command(args=args, prog_name=prog, standalone_mode=False)
    except usage_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `kforge` or `kforge runs`: its help
            print(exc.format_message())
            code = 0
        else:
            where = exc.ctx.command_path if exc.ctx is not None else "kforge"
            print(f"error: {exc.format_message()} (see `{where} --help`)", file=sys.stderr)
            code = 2
    except click_error as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        code = exc.exit_code
    except typer.Exit as exc:
        code = exc.exit_code
    except aborts:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

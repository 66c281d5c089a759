"""`kforge`: the command-line entry point. Each command group lives in its own module."""

from __future__ import annotations

import typer

from kforge.cli import check, config_cmd, eval_cmd, problems, rag, runs, train
from kforge.cli import doctor, export

app = typer.Typer(
    name="kforge",
    help=(
        "Teach an LLM to write fast GPU kernels with multi-turn RL on one workstation.\n\n"
        "Start with `kforge train --preset tiny` (CPU, minutes) or `kforge train --preset kevin` (GPUs)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("train", help="GRPO/LoRA training with a live dashboard; writes runs/NAME.")(train.train)
app.command("eval", help="Generate and evaluate on KernelBench problems: fast_p, correctness, speedups.")(
    eval_cmd.evaluate
)
app.command("check", help="Evaluate one kernel file against one problem and print the verdict.")(check.check)
app.command("doctor", help="Check what a run needs on this machine and how to fix what is missing.")(doctor.doctor)
app.command("export", help="Write a run's adapter as a clean PEFT folder, or a merged Hugging Face model.")(
    export.export
)
app.add_typer(rag.app, name="rag")
app.add_typer(runs.app, name="runs", help="The runs on disk: ls, show, stop, logs, watch, tb, rm.")
app.add_typer(problems.app, name="problems", help="List and show the problems a source provides.")
app.add_typer(config_cmd.app, name="config", help="Show the resolved config and where each value came from.")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

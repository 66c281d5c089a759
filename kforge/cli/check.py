"""`kforge check CANDIDATE.py --problem SPEC`: evaluate one kernel file and print its verdict.

Exit code 0 when the kernel is accepted (verdict `correct`), 1 for any other verdict (so a script can gate on
it: the verdict is still printed), 2 for bad arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from kforge.errors import UserError
from kforge.jsonl import CANDIDATE_MAX_BYTES, read_text
from kforge.kernel_backends import KERNEL_BACKENDS, names
from kforge.ui.console import console, fail, print_fields

if TYPE_CHECKING:
    from kforge.evaluator.verdict import Verdict
    from kforge.problems.record import Problem


def _explain_table() -> Table:
    from kforge.evaluator import layers

    table = Table(title="Between a candidate and its reward, on this machine", show_lines=False)
    table.add_column("layer")
    table.add_column("protection")
    table.add_column("active")
    table.add_column("detail")
    for name, active, detail in layers.explain():
        layer, _, rest = name.partition("] ") if name.startswith("[") else ("[kernel", "", name)
        table.add_row(layer.lstrip("["), rest, Text("yes", style="green") if active else Text("no", style="red"), detail)
    return table


def _explain_rows() -> list[dict[str, Any]]:
    from kforge.evaluator import layers

    return [{"protection": n, "active": a, "detail": d} for n, a, d in layers.explain()]


def _load_problem(spec: str, source: str) -> Problem:
    from kforge.problems import find_problem, load_problems
    from kforge.problems.record import Problem

    path = Path(spec).expanduser()
    if spec.endswith(".py") and path.is_file():  # a KernelBench-format problem file
        code = read_text(path, UserError, "problem file", "give a KernelBench-format .py file")
        return Problem(level=0, problem_id=0, name=path.stem, code=code, source=f"file:{path}")
    return find_problem(load_problems(source), spec)


def _devices(cpu: bool) -> list[int]:
    from kforge.gpus import default_devices  # through the driver: this process never initialises CUDA

    return [] if cpu else default_devices()


def _fields(verdict: Verdict, problem: Problem) -> tuple[list[tuple[str, str | Text]], str]:
    """The verdict as (label, value) rows, and its colour."""
    style = "green" if verdict.correct else ("yellow" if verdict.status.value in ("correct", "incorrect") else "red")
    rows = [("problem", f"{problem.key} {problem.name}"),
            ("status", Text(verdict.status.value, style=style) + ("" if verdict.correct else "  (not accepted)"
                                                                  if verdict.status.value == "correct" else "")),
            ("trials", f"{verdict.trials_passed}/{verdict.trials}")]
    if verdict.max_abs_error is not None:
        rows.append(("max abs error", f"{verdict.max_abs_error:.3g}"))
    if verdict.flags:
        rows.append(("flags", ", ".join(verdict.flags)))
    if verdict.timings is not None:
        t = verdict.timings
        rows.append(("time", f"mean {t.mean_ms:.4g} ms reported (median {t.median_ms:.4g}, min {t.min_ms:.4g}, "
                     f"max {t.max_ms:.4g}, {t.trials} calls)"))
    if verdict.kernel_ms is not None:
        rows.append(("kernel time", f"{verdict.kernel_ms:.4g} ms (the report as far as the evaluator's clock allows)"))
    if verdict.baseline is not None:
        rows.append(("baseline", f"mean {verdict.baseline.mean_ms:.4g} ms"))
    rows.append(("speedup", f"{verdict.speedup:.2f}x" if verdict.speedup is not None
                 else "not measured" + ("" if verdict.timing_meaningful else " (no GPU: Triton interpreter)")))
    rows.append(("compile / run", f"{verdict.compile_s:.2f} s / {verdict.run_s:.2f} s"))
    rows.append(("feedback", verdict.feedback))
    return rows, style


def check(
    candidate: Optional[Path] = typer.Argument(None, help="the kernel file (defines class ModelNew)"),
    problem: Optional[str] = typer.Option(None, "--problem", "-p", help="LEVEL/ID, a problem name, or a problem .py file"),
    source: str = typer.Option("builtin", "--source", "-s", help="where problems come from (see `kforge problems ls`)"),
    backend: str = typer.Option("triton", "--backend", "-b", help=" | ".join(KERNEL_BACKENDS)),
    as_json: bool = typer.Option(False, "--json", help="print exactly one JSON object on stdout"),
    explain_sandbox: bool = typer.Option(False, "--explain-sandbox", help="show which protections are active here "
                                         "(with --json and a candidate: under the verdict's \"sandbox\" key)"),
    trials: Optional[int] = typer.Option(None, "--trials", help="correctness trials (default from the config)"),
    no_time: bool = typer.Option(False, "--no-time", help="skip timing even on a GPU"),
    cpu: bool = typer.Option(False, "--cpu", help="evaluate on the CPU (Triton interpreter) even with a GPU"),
) -> None:
    """Evaluate one kernel file against one problem and print the verdict.

    Exit code 0 when the kernel is accepted (verdict correct), 1 for any other verdict, 2 for bad input.
    """
    if explain_sandbox:
        if as_json:
            # --json promises one document: with a candidate the protections go inside its verdict object.
            sandbox = _explain_rows()
            if candidate is None:
                print(json.dumps(sandbox))
                return
        else:
            console.print(_explain_table())
            if candidate is None:
                return
    if candidate is None:
        raise fail("missing CANDIDATE: give the kernel file to check, e.g. `kforge check solution.py --problem 1/3`")
    if not candidate.is_file():
        raise fail(f"candidate file not found: {candidate}")
    if problem is None:
        raise fail("missing --problem: name the problem, e.g. --problem 1/3 (see `kforge problems ls`)")
    if backend not in KERNEL_BACKENDS:
        raise fail(f"unknown backend {backend!r}: use one of {names()}")
    code = read_text(candidate, UserError, "candidate", "give the kernel's .py source", CANDIDATE_MAX_BYTES)
    prob = _load_problem(problem, source)

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool

    cfg = EvaluatorConfig() if trials is None else EvaluatorConfig(num_correct_trials=trials)
    with EvalPool(cfg, devices=_devices(cpu)) as pool:
        verdict = pool.submit(prob, code, backend, measure=False if no_time else None).result()
    if as_json:
        out = verdict.to_dict()
        out["problem"] = prob.key
        out["problem_name"] = prob.name
        out["backend"] = backend
        if explain_sandbox:
            out["sandbox"] = sandbox
        print(json.dumps(out, default=str))
    else:
        rows, style = _fields(verdict, prob)
        print_fields(f"kforge check ({backend})", rows, style)
    if not verdict.correct:  # a rejected kernel is a result, but one a script must be able to gate on
        raise typer.Exit(1)

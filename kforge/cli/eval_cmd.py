"""`kforge eval TARGET ...` and `kforge eval compare A.json B.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kforge.cli.common import ConfigOpt, PresetOpt
from kforge.config.loader import ConfigError, resolve
from kforge.ui.console import console, fail, setup_logging

SUMMARY_KEYS = ("n_problems", "n_samples", "correctness", "fast_0", "fast_1", "fast_2", "pass@1", "pass@5",
                "first_turn_correctness", "compiled", "flagged", "mean_speedup", "geomean_speedup")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def print_summary(summary: dict, title: str) -> None:
    table = Table(title=title)
    table.add_column("metric", style="cyan")
    groups = sorted(summary, key=lambda g: (g != "overall", g))
    for g in groups:
        table.add_column(g)
    for key in SUMMARY_KEYS:
        if any(key in summary[g] for g in groups):
            table.add_row(key, *[_fmt(summary[g].get(key)) for g in groups])
    console.print(table)


def evaluate(
    target: Optional[str] = typer.Argument(None, help="run folder, checkpoint/adapter folder, or base model id/path "
                                           "(not needed with --candidates); or `compare` followed by two results files"),
    extra: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides (or, after `compare`, A.json B.json)"),
    level: Optional[list[int]] = typer.Option(None, "--level", "-l", help="KernelBench level (repeatable)"),
    problems: Optional[str] = typer.Option(None, "--problems", help="problem id range, e.g. 1-20"),
    source: Optional[str] = typer.Option(None, "--source", help="builtin | kernelbench | hf | path to .jsonl or checkout"),
    samples: int = typer.Option(1, "--samples", "-k", min=1, help="samples per problem"),
    turns: int = typer.Option(1, "--turns", "-t", min=1, help="refinement turns with evaluator feedback"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="sampling temperature"),
    backend: Optional[str] = typer.Option(None, "--backend", help="triton | cuda"),
    out: Path = typer.Option(Path("eval_results.json"), "--out", "-o", help="results JSON file"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="KernelBench baseline JSON instead of timing here"),
    candidates: Optional[Path] = typer.Option(None, "--candidates", "--from-file",
                                              help="evaluate given kernels (JSONL of {problem, code} or a folder of .py)"),
    step: Optional[int] = typer.Option(None, "--step", help="checkpoint step of a run folder (default: latest)"),
    resume: bool = typer.Option(False, "--resume", help="continue from --out without redoing finished samples"),
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    runs_dir: str = typer.Option("runs", "--runs-dir"),
) -> None:
    """Generate + evaluate (or evaluate given kernels); prints fast_0/1/2, correctness, speedups; writes JSON."""
    if target == "compare":
        _compare(extra or [])
        return
    from kforge.eval.runner import EvalRun, EvalTargetError, load_candidates, parse_id_range, resolve_target
    from kforge.problems import problems_from_config
    from kforge.problems.sources import ProblemSourceError
    from kforge.train.placement import plan_placement, visible_gpus

    setup_logging("WARNING")
    overrides = list(extra or [])
    try:
        lo, hi = parse_id_range(problems)
        tgt = None
        run_config = None
        if candidates is None:
            if not target:
                raise EvalTargetError("give a TARGET (run folder, adapter folder or model) or --candidates FILE")
            tgt, run_config = resolve_target(target, runs_dir, step)
        cfg = resolve(preset if not run_config else None, config or run_config, overrides).config
    except (EvalTargetError, ConfigError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    if out.exists() and not resume:
        raise fail(f"{out} exists; pass --resume to continue it or --out to write elsewhere")
    ds = cfg.dataset
    if source:
        ds.source = source
    if level:
        ds.level = list(level)
    if lo is not None or hi is not None:
        ds.start_problem, ds.end_problem = lo, hi
    if backend:
        if backend not in ("triton", "cuda"):
            raise fail(f"--backend {backend!r}: expected triton or cuda")
        ds.backend = backend
    if temperature is not None:
        cfg.rollout.temperature = temperature
    cfg.episode.mode = "multi_turn" if turns > 1 else "single_turn"
    cfg.episode.max_turns = turns
    if baseline is not None:
        if not baseline.exists():
            raise fail(f"--baseline {baseline}: no such file")
        cfg.evaluator.baseline_file = str(baseline)
    try:
        selected = problems_from_config(ds)
        given = load_candidates(candidates, selected) if candidates is not None else None
    except (ProblemSourceError, EvalTargetError, ValueError) as exc:
        raise fail(str(exc)) from None
    if not selected:
        raise fail("no problems selected: check --level, --problems and --source")

    plan = plan_placement(visible_gpus())
    devices = list(range(len(plan.gpus))) or None  # logical indices, as CUDA_VISIBLE_DEVICES lists them
    run = EvalRun(cfg, selected, out, samples=samples, target=tgt, candidates=given, devices=devices)
    if resume:
        try:
            kept = run.load_previous()
        except EvalTargetError as exc:
            raise fail(str(exc)) from None
        console.print(f"resuming: {kept} finished samples kept from {out}")
    what = f"{len(given)} given kernels" if given is not None else f"{len(selected)} problems x {samples} samples x {turns} turns"
    console.print(f"kforge eval: {tgt.description if tgt else 'given candidates'} on {what} ({ds.backend})")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("evaluate", total=None)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)
            if not console.is_terminal and (done == total or done % 10 == 0):
                print(f"{stage}: {done}/{total}", flush=True)

        run.on_progress = on_progress
        try:
            summary = run.run()
        except KeyboardInterrupt:
            run.write()
            raise fail(f"interrupted; finished samples are in {out} (continue with --resume)", code=130) from None
    print_summary(summary, f"kforge eval · {out}")
    console.print(f"wrote {out}")


def _compare(files: list[str]) -> None:
    from kforge.eval.runner import compare

    if len(files) != 2:
        raise fail("usage: kforge eval compare A.json B.json")
    docs = []
    for f in files:
        try:
            doc = json.loads(Path(f).read_text())
            doc["summary"]
        except FileNotFoundError:
            raise fail(f"{f}: no such file") from None
        except (json.JSONDecodeError, KeyError, TypeError):
            raise fail(f"{f}: not a kforge eval results file (no top-level summary)") from None
        docs.append(doc)
    table = Table(title=f"{files[0]} (A) vs {files[1]} (B)")
    for col in ("group", "metric", "A", "B", "B - A"):
        table.add_column(col)
    for group, key, va, vb, delta in compare(*docs):
        style = "" if delta is None or delta == 0 else ("green" if delta > 0 else "red")
        d = "-" if delta is None else (f"[{style}]{delta:+.3f}[/]" if style else f"{delta:+.3f}")
        table.add_row(group, key, _fmt(va), _fmt(vb), d)
    console.print(table)

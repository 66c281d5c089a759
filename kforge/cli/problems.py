"""`kforge problems ls|show|fetch|baseline|generate`: the problems a source provides, getting KernelBench once,
timing every reference on this GPU into a KernelBench-format baseline file, and writing a generated curriculum."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.syntax import Syntax
from rich.table import Table

from kforge.cli.common import OverridesArg, load_config
from kforge.problems import ProblemSourceError, find_problem, load_problems
from kforge.problems.record import Problem
from kforge.ui.console import console, fail, progress_bar

app = typer.Typer(no_args_is_help=True)

SourceOpt = typer.Option(
    "builtin",
    "--source",
    "-s",
    help="builtin | kernelbench (KERNELBENCH_ROOT, an installed kernelbench package, or the fetched cache) | hf | "
    "a .jsonl file | a KernelBench folder",
)


def _where(source: str) -> str:
    """"kernelbench: cache /root/.cache/kforge/kernelbench @ 423217d..." for the header of a listing."""
    from kforge.problems.kernelbench import describe_source

    try:
        return describe_source(source).describe()
    except ProblemSourceError:
        return "location unknown"


def _hub_notes(problems: list[Problem]) -> dict[str, str]:
    """problem key -> what it needs from the hub, and whether that blocks it on this machine."""
    from kforge.problems.hub import hub_blocker

    notes = {}
    for p in problems:
        if p.hub_models:
            blocked = hub_blocker(p)
            notes[p.key] = f"needs hub: {', '.join(p.hub_models)}" + (" (cannot run here: offline)" if blocked else "")
    return notes


@app.command("ls")
def ls(
    level: Optional[list[int]] = typer.Option(None, "--level", "-l", help="only this level (repeat for several)"),
    source: str = SourceOpt,
    as_json: bool = typer.Option(False, "--json", help="one JSON list on stdout instead of a table"),
) -> None:
    """List the problems of a source (key, name, level, lines, solution, hub needs) and where they came from."""
    problems = load_problems(source, level)
    if level and not problems:  # a level the source does not have is a typo, not an empty listing
        have = sorted({p.level for p in load_problems(source)})
        levels = ", ".join(map(str, level))
        raise fail(f"--level {levels}: source {source} has no problems at that level; "
                   + (f"its levels: {', '.join(map(str, have))}" if have else "it holds no problems"))
    where = _where(source)
    hub = _hub_notes(problems)
    if as_json:
        rows = [
            {
                "key": p.key,
                "level": p.level,
                "problem_id": p.problem_id,
                "name": p.name,
                "lines": _lines(p.code),
                "has_solution": p.solution is not None,
                "source": p.source,
                "location": where,
                "needs_hub": list(p.hub_models),
                "note": hub.get(p.key, ""),
            }
            for p in problems
        ]
        # Plain print: meant for pipes and files, so no Rich markup or wrapping.
        print(json.dumps(rows, indent=2))
        return
    console.print(f"source {source}: {where}", highlight=False, soft_wrap=True)
    if not problems:
        console.print(f"no problems in source {source!r}")
        return
    table = Table(title=f"problems from {source} ({len(problems)})")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("name")
    table.add_column("level", justify="right")
    table.add_column("lines", justify="right")
    table.add_column("solution", justify="center")
    if hub:
        table.add_column("note", style="yellow")
    for p in problems:
        cells = [p.key, p.name, str(p.level), str(_lines(p.code)), "yes" if p.solution else "-"]
        table.add_row(*cells, *([hub.get(p.key, "")] if hub else []))
    console.print(table)
    if hub:
        console.print(
            f"{len(hub)} problems download models from the Hugging Face hub when they run (KernelBench level 4); "
            "offline they get a `needs the hub` verdict instead of running",
            highlight=False,
        )


@app.command("show")
def show(
    spec: str = typer.Argument(..., help='"LEVEL/ID" (e.g. 1/3) or a name (e.g. 3_ReLU or relu)'),
    source: str = SourceOpt,
    solution: bool = typer.Option(False, "--solution", help="show the reference Triton solution instead"),
) -> None:
    """Print one problem's code (or its reference solution), syntax-highlighted on a terminal."""
    problems = load_problems(source, None)
    problem = find_problem(problems, spec)
    code = problem.code
    if solution:
        if problem.solution is None:
            raise fail(
                f"problem {problem.key} ({problem.name}) from {source} has no reference solution; "
                "only the builtin suite carries them (--source builtin)"
            )
        code = problem.solution
    if console.is_terminal:
        title = f"{problem.key} {problem.name}" + (" (reference solution)" if solution else "")
        console.rule(title)
        console.print(Syntax(code, "python", line_numbers=True, word_wrap=False))
    else:
        # Piped: the bare source, so `kforge problems show 1/3 > problem.py` gives a runnable file.
        console.out(code.rstrip("\n"), highlight=False)


@app.command("fetch")
def fetch(
    what: str = typer.Argument(..., help="what to fetch: kernelbench"),
    via: str = typer.Option("auto", "--via", help="hf (the dataset; needs `datasets`) | git | auto (hf if installed)"),
    origin: Optional[str] = typer.Option(
        None, "--from", help="dataset name for hf, or a git URL or local repository for git (default: upstream)"
    ),
    revision: Optional[str] = typer.Option(None, "--revision", help="a commit, tag or branch (default: the newest)"),
) -> None:
    """Download KernelBench once into kforge's cache, recording the revision; `source=kernelbench` uses it."""
    from kforge.problems.kernelbench import cache_dir
    from kforge.problems.kernelbench import fetch as fetch_kernelbench

    if what.strip().lower() != "kernelbench":
        raise fail(f"cannot fetch {what!r}: the only fetchable problem set is kernelbench")
    record = fetch_kernelbench(via, origin, revision, say=lambda msg: console.print(msg, highlight=False))
    counts = ", ".join(f"{name} {n}" for name, n in record.counts.items())
    console.print(
        f"fetched KernelBench via {record.via} from {record.origin} @ {record.revision or 'unknown revision'}: "
        f"{counts} -> {cache_dir()}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("baseline")
def baseline(
    level: list[int] = typer.Option(..., "--level", "-l", help="level to time (repeat for several)"),
    compile_: bool = typer.Option(False, "--compile", help="time torch.compile (inductor, default mode) instead of eager"),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="baseline JSON to write or extend (default: baselines/<GPU>/<KernelBench file name>)"
    ),
    source: str = typer.Option("kernelbench", "--source", "-s", help="problem source (as for `problems ls`)"),
    gpu: int = typer.Option(0, "--gpu", min=0, help="logical index of the GPU to time on"),
    overrides: Optional[list[str]] = OverridesArg,
) -> None:
    """Time every problem's reference on this GPU and write a KernelBench-format baseline JSON."""
    from kforge.evaluator import EvalPool
    from kforge.gpus import check_indices, visible_ids
    from kforge.ops.baseline import default_path, time_references
    from kforge.problems import baseline as baseline_file
    from kforge.problems.hub import split_runnable

    mode = "compile" if compile_ else "eager"
    problems = load_problems(source, level)
    gpus = visible_ids()
    if not gpus:
        raise fail(
            "timing needs a GPU: this machine shows no NVIDIA GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
            "run `kforge problems baseline` on the GPU the evaluations will use"
        )
    check_indices([gpu], len(gpus), "--gpu")
    if not problems:
        raise fail(f"no problems in source {source!r} at level {', '.join(map(str, level))}")
    cfg = load_config(None, None, overrides).config
    runnable, blocked = split_runnable(problems)
    for _, why in blocked:
        console.print(f"skipped: {why}", highlight=False, soft_wrap=True)

    with EvalPool(cfg.evaluator, devices=[gpu]) as pool, progress_bar() as progress:
        path = out or default_path(pool.gpu_names[0], mode)
        doc = baseline_file.load(path)  # a file that is not a baseline is refused before any timing
        progress.console.print(f"timing {len(runnable)} references ({mode}) on {pool.gpu_names[0]} -> {path}",
                               highlight=False)
        task = progress.add_task("timing", total=len(runnable))
        done = [0]

        def each(problem: Problem, mean_ms: float | None, why: str | None) -> None:
            done[0] += 1
            progress.advance(task)
            if why is not None:
                progress.console.print(f"{problem.key} {problem.name}: {why}", highlight=False)
            elif not console.is_terminal:
                print(f"{done[0]}/{len(runnable)} {problem.key} {problem.name}: {mean_ms:.3g} ms", flush=True)

        failed = time_references(pool, runnable, mode, doc, path, gpu, each)
    timed = len(runnable) - len(failed)
    console.print(f"wrote {path}: {timed} problems timed, {len(failed)} failed, {len(blocked)} skipped",
                  highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command("generate")
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="folder to write (new, empty, or one this command wrote)"),
    family: str = typer.Option("elementwise", "--family", help="the family of problems: elementwise"),
    train: int = typer.Option(256, "--train", help="training problems (distinct structures)"),
    heldout: int = typer.Option(64, "--heldout", help="held-out problems: structures never seen in training"),
    depth: int = typer.Option(3, "--depth", help="most primitives on one path of an expression"),
    inputs: int = typer.Option(3, "--inputs", help="most inputs (x, y, z) of one problem"),
    reduce_share: float = typer.Option(0.25, "--reduce-share", help="share of problems reducing each row (sum, amax)"),
    seed: int = typer.Option(0, "--seed", help="the same seed and knobs give byte-identical files"),
    rows: int = typer.Option(16, "--rows", help="rows of every input"),
    cols: int = typer.Option(4096, "--cols", help="columns of every input"),
    level: int = typer.Option(1, "--level", help="the level of the problems' LEVEL/ID keys"),
    verify: bool = typer.Option(False, "--verify", help="judge every solution with kforge's evaluator first and "
                                "write nothing unless all are correct"),
    cpu: bool = typer.Option(False, "--cpu", help="with --verify: judge on the CPU (Triton interpreter) even with a GPU"),
) -> None:
    """Write a seeded curriculum: problems.jsonl (a source: dataset.source=DIR/problems.jsonl, each row's split
    on it), sft_pairs.jsonl (the train split's solutions, for `kforge sft --data`) and curriculum.json."""
    from kforge.problems import generate as gen

    knobs = gen.Knobs(family=family, train=train, heldout=heldout, depth=depth, inputs=inputs,
                      reduce_share=reduce_share, seed=seed, rows=rows, cols=cols, level=level)
    curriculum = gen.build(knobs)
    if verify:
        _verify(curriculum, cpu)
    gen.write(out, curriculum.texts())
    counts = curriculum.manifest["counts"]
    console.print(f"wrote {out}: {counts['train']} train and {counts['test']} held-out {family} problems "
                  f"(seed {seed}); train with dataset.source={out / 'problems.jsonl'}, warm-start with "
                  f"kforge sft --data {out / 'sft_pairs.jsonl'}", highlight=False, soft_wrap=True)


def _verify(curriculum, cpu: bool) -> None:
    """Every solution through the evaluator pool; exit 1 naming the first refused, before anything is written."""
    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool
    from kforge.gpus import default_devices
    from kforge.ops.curriculum import judge_solutions, problems_of

    problems = problems_of(curriculum.rows, "generate")
    with EvalPool(EvaluatorConfig(measure_performance=False), devices=[] if cpu else default_devices()) as pool, \
            progress_bar() as progress:
        task = progress.add_task("judging solutions", total=len(problems))
        refused = judge_solutions(pool, problems, lambda p, v: progress.advance(task))
    if refused:
        problem, verdict = refused[0]
        raise fail(f"{len(refused)} of {len(problems)} generated solutions were not judged correct, e.g. "
                   f"{problem.key}: {verdict.status.value} ({verdict.feedback.splitlines()[0] if verdict.feedback else ''}); "
                   "nothing written", code=1)
    console.print(f"all {len(problems)} solutions judged correct", highlight=False)


def _lines(code: str) -> int:
    return len(code.splitlines())

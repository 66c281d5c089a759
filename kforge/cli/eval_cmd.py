"""`kforge eval TARGET ...` and `kforge eval compare A.json B.json`: parse, build (kforge.eval.build), print.

A run TARGET is evaluated on the problems it did not train on (its held-out split) unless `--split` says
otherwise, and the results file says which problems were training problems, which baseline the speedups
are against and on which GPU they were measured.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from kforge.cli.common import ConfigOpt, PresetOpt, ask_the_hub_once
from kforge.eval.report import is_speed_key, speed_measured, summary_keys
from kforge.ui.console import console, fail, progress_bar, setup_logging


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _group_order(group: str) -> tuple[int, str]:
    return (group != "overall", group)


def print_summary(summary: dict, title: str) -> None:
    table = Table(title=title)
    table.add_column("metric", style="cyan")
    groups = sorted(summary, key=_group_order)
    for g in groups:
        table.add_column(g)
    max_k = max((int(k[5:]) for g in groups for k in summary[g] if k.startswith("pass@")), default=1)
    for key in summary_keys(max_k):
        if any(key in summary[g] for g in groups):
            table.add_row(key, *[_fmt(summary[g].get(key)) if speed_measured(summary[g]) or not is_speed_key(key)
                                 else "not measured" for g in groups])
    console.print(table)


def _say(text: str) -> None:
    console.print(text, highlight=False, soft_wrap=True)


def evaluate(
    target: Optional[str] = typer.Argument(None, help="run folder, checkpoint/adapter folder, or base model id/path "
                                           "(not needed with --candidates); or `compare` followed by two results files"),
    extra: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. rollout.max_tokens=2048"),
    level: Optional[list[int]] = typer.Option(None, "--level", "-l", help="KernelBench level (repeatable); = dataset.level"),
    problems: Optional[str] = typer.Option(None, "--problems",
                                           help="problem id range, e.g. 1-20; = dataset.start_problem/end_problem"),
    source: Optional[str] = typer.Option(None, "--source",
                                         help="builtin | kernelbench | hf | path to .jsonl or checkout; = dataset.source"),
    split: Optional[str] = typer.Option(
        None, "--split", help="test (problems the run did not train on; default for a run) | train | all "
        "(default for a model); the split is the run's, or the preset's for a model"),
    samples: int = typer.Option(1, "--samples", "-k", min=1, help="samples per problem (pass@k up to k)"),
    turns: Optional[int] = typer.Option(None, "--turns", "-t", min=1, help="refinement turns with evaluator feedback "
                                        "(default 1); = episode.max_turns"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="sampling temperature; = rollout.temperature"),
    backend: Optional[str] = typer.Option(None, "--backend", help="triton | cuda; = dataset.backend"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="results JSON file (default: in the run folder, "
                                       "or eval_results-TARGET-SPLIT.json here)"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="KernelBench baseline JSON instead of timing here; "
                                            "= evaluator.baseline_file"),
    candidates: Optional[Path] = typer.Option(None, "--candidates", "--from-file",
                                              help="evaluate given kernels (JSONL of {problem, code} or a folder of .py)"),
    step: Optional[int] = typer.Option(None, "--step", help="checkpoint step of a run folder (default: latest)"),
    resume: bool = typer.Option(False, "--resume", help="continue the results file (same target, split and problems) "
                                "without redoing finished samples"),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", help="GPU indices this eval uses, e.g. 0 or 2,3 (the model is split across all of them "
        "with tensor parallelism). Default: GPU 0 when generating, every GPU for --candidates"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the problems and the plan, evaluate nothing"),
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    runs_dir: str = typer.Option("runs", "--runs-dir", help="where run folders live, for a run given by name"),
) -> None:
    """Generate + evaluate (or evaluate given kernels): correctness, fast_p, speedups, pass@k; writes JSON."""
    from kforge.eval.build import EvalRequest, build_eval, flag_overrides

    if target == "compare":  # `kforge eval compare` reaches `compare` through the app; this is the fallback
        compare(files=extra or [], all_problems=False)
        return
    setup_logging("WARNING")
    if candidates is None:  # a model is loaded (and its config read first): from the hub only when it answers
        ask_the_hub_once()
    user = list(extra or [])
    flags = flag_overrides(level, problems, source, backend, temperature, turns, baseline, user)
    plan = build_eval(EvalRequest(target, user + flags, preset, config, split, samples, out, candidates, step,
                                  resume, gpus, runs_dir, dry_run))
    if plan.target is not None:
        _check_model(plan.target.model)
    for line in plan.skipped:
        _say(f"warning: {line}")
    for _, why in plan.blocked:
        _say(f"skipped: {why}")
    what = (f"{len(plan.given)} given kernels" if plan.given is not None
            else f"{len(plan.selected)} problems x {samples} samples x {plan.cfg.turns} turns")
    _say(f"kforge eval: {plan.target.description if plan.target else 'given candidates'} on {what} "
         f"({plan.cfg.dataset.backend}); {plan.meta['split']['label']}")
    _say(f"problems: {plan.meta['source']}; baseline: {plan.meta['baseline']['label']}")
    if dry_run:
        for p in plan.selected:
            _say(f"{p.key} {p.name}" + (" (training problem)" if p.key in plan.trained else ""))
        return
    _run(plan)


def _run(plan) -> None:
    from kforge.eval.meta import split_summaries
    from kforge.space import write_failure

    run = plan.make_run()
    if plan.previous is not None:  # --resume into an existing file
        kept = run.keep_previous(plan.previous)
        console.print(f"resuming: {kept} finished samples kept from {plan.out}")
    _say(f"results: {plan.out}")
    todo, unit = run.work()  # known before anything loads: every stage shows how much is ahead
    with progress_bar(unit=unit) as progress:
        task = progress.add_task("starting", total=todo or None)
        beat = _Heartbeat(enabled=not console.is_terminal, total=todo, unit=unit)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total or None)
            beat.update(stage, done, total, say=done == total or done % 10 == 0)

        run.on_progress = on_progress
        try:
            with beat:
                parts = plan.parts(run, lambda stage: on_progress(stage, 0, todo))
                try:
                    summary = run.run(parts)
                finally:
                    parts.close()
        except KeyboardInterrupt:
            run.write()
            raise fail(f"interrupted; finished samples are in {plan.out} (continue with --resume)", code=130) from None
        except OSError as exc:
            why = write_failure(exc)
            if why is None:
                raise
            raise fail(f"{why}; the samples written before are in {plan.out}: free space there, then continue "
                       "with --resume", code=1) from None
    by_split = split_summaries(plan.meta, run)
    print_summary(summary, f"kforge eval · {plan.out} · {plan.meta['split']['label']}")
    for name, part in by_split.items():
        print_summary(part, f"{name} only")
    _say(f"wrote {plan.out}")


class _Heartbeat:
    """Piped progress lines: on every 10th sample, and at least every `every_s` seconds while a slow
    generation or evaluation finishes nothing (a log that says nothing for a minute looks hung)."""

    def __init__(self, enabled: bool, every_s: float = 10.0, total: int = 0, unit: str = ""):
        self.enabled, self.every_s, self.unit = enabled, every_s, unit
        self.stage, self.done, self.total = "starting", 0, total
        self.started = self.said = time.time()
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def update(self, stage: str, done: int, total: int, say: bool) -> None:
        with self._lock:
            self.stage, self.done, self.total = stage, done, total
        if say:
            self._say()

    def _say(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.said = time.time()
            counts = f": {self.done}/{self.total} {self.unit}".rstrip() if self.total else ""  # none: nothing to do
            line = f"{self.stage}{counts} ({self.said - self.started:.0f} s)"
        print(line, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if time.time() - self.said >= self.every_s:
                self._say()

    def __enter__(self) -> "_Heartbeat":
        if self.enabled:
            threading.Thread(target=self._loop, name="kforge-eval-progress", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()


def _check_model(model: str) -> None:
    """A model that cannot be loaded is one line and exit 2 here, not a traceback from deep in the engine."""
    from kforge.modelio import ModelLoadError, resolve_model
    from kforge.problems.hub import hub_unreachable, model_cached

    if model.startswith("pkg:"):
        try:
            resolve_model(model, dense=False)
        except ModelLoadError as exc:
            raise fail(str(exc)) from None
        return
    path = Path(model).expanduser()
    if path.is_dir():
        if not any((path / f).exists() for f in ("config.json", "adapter_config.json")) and not list(path.glob("*.gguf")):
            raise fail(f"{model} is a folder but holds no model (no config.json, adapter_config.json or .gguf)")
        return
    looks_like_path = model.startswith((".", "/", "~")) or model.endswith("/") or model.count("/") > 1
    if looks_like_path:
        raise fail(f"no run, checkpoint or model at {model}: give a run folder or name (kforge runs ls), "
                   "a checkpoint or adapter folder, or a Hugging Face model id")
    if model_cached(model):
        return
    offline = hub_unreachable()
    if offline:
        raise fail(f"model {model} is not a local folder nor in the Hugging Face cache, and {offline}: "
                   "download it once online or give a local folder")
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import RepositoryNotFoundError

        HfApi().model_info(model)
    except ImportError:
        return
    except RepositoryNotFoundError:
        raise fail(f"model {model} does not exist on the Hugging Face hub (or needs a token): check the name") from None
    except Exception:  # the hub answered oddly: let the loader try and report
        return


def compare(
    files: list[str] = typer.Argument(..., help="two results files: A.json B.json", show_default=False),
    all_problems: bool = typer.Option(False, "--all-problems", help="compare the files' own summaries even when "
                                      "they hold different problems (default: only the problems both hold)"),
) -> None:
    """Compare two results files: every summary metric of A and B and B - A, on the problems both hold."""
    from kforge.eval.compare import compare_files

    if len(files) != 2:
        raise fail("usage: kforge eval compare A.json B.json")
    cmp = compare_files(files[0], files[1], all_problems)
    for name, doc in zip("AB", (cmp.a, cmp.b)):
        labels = [_label(doc, "split"), _label(doc, "baseline")]
        _say(f"{name}: {doc.get('target', '?')}; " + "; ".join(x for x in labels if x))
    for note in cmp.notes:
        console.print(f"note: {note}", style="yellow", highlight=False, soft_wrap=True)
    table = Table(title=f"{files[0]} (A) vs {files[1]} (B)")
    for col in ("group", "metric", "A", "B", "B - A"):
        table.add_column(col)
    order = {key: i for i, key in enumerate(summary_keys(64))}
    for group, key, va, vb, delta in sorted(cmp.rows, key=lambda r: (_group_order(r[0]), order.get(r[1], len(order)), r[1])):
        style = "" if delta is None or delta == 0 else ("green" if delta > 0 else "red")
        d = "-" if delta is None else Text(f"{delta:+.3f}", style=style)
        table.add_row(group, key, _fmt(va), _fmt(vb), d)
    console.print(table)


def _label(doc: dict, key: str) -> str | None:
    part = doc.get(key)
    return part.get("label") if isinstance(part, dict) else None

"""`kforge eval TARGET ...` and `kforge eval compare A.json B.json`.

A run TARGET is evaluated on the problems it did not train on (its held-out split) unless `--split` says
otherwise, and the results file says which problems were training problems, which baseline the speedups
are against and on which GPU they were measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kforge.cli.common import ConfigOpt, PresetOpt
from kforge.config.loader import ConfigError, resolve
from kforge.eval.report import summary_keys
from kforge.ui.console import console, fail, setup_logging

SPLITS = ("test", "train", "all")


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
            table.add_row(key, *[_fmt(summary[g].get(key)) for g in groups])
    console.print(table)


def evaluate(
    target: Optional[str] = typer.Argument(None, help="run folder, checkpoint/adapter folder, or base model id/path "
                                           "(not needed with --candidates); or `compare` followed by two results files"),
    extra: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides (or, after `compare`, A.json B.json)"),
    level: Optional[list[int]] = typer.Option(None, "--level", "-l", help="KernelBench level (repeatable)"),
    problems: Optional[str] = typer.Option(None, "--problems", help="problem id range, e.g. 1-20"),
    source: Optional[str] = typer.Option(None, "--source", help="builtin | kernelbench | hf | path to .jsonl or checkout"),
    split: Optional[str] = typer.Option(
        None, "--split", help="test (problems the run did not train on; default for a run) | train | all "
        "(default for a model); the split is the run's, or the preset's for a model"),
    samples: int = typer.Option(1, "--samples", "-k", min=1, help="samples per problem (pass@k up to k)"),
    turns: int = typer.Option(1, "--turns", "-t", min=1, help="refinement turns with evaluator feedback"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="sampling temperature"),
    backend: Optional[str] = typer.Option(None, "--backend", help="triton | cuda"),
    out: Path = typer.Option(Path("eval_results.json"), "--out", "-o", help="results JSON file"),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="KernelBench baseline JSON instead of timing here"),
    candidates: Optional[Path] = typer.Option(None, "--candidates", "--from-file",
                                              help="evaluate given kernels (JSONL of {problem, code} or a folder of .py)"),
    step: Optional[int] = typer.Option(None, "--step", help="checkpoint step of a run folder (default: latest)"),
    resume: bool = typer.Option(False, "--resume", help="continue from --out without redoing finished samples"),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", help="GPU indices this eval uses, e.g. 0 or 2,3 (the model is split across all of them "
        "with tensor parallelism). Default: GPU 0 when generating, every GPU for --candidates"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the problems and the plan, evaluate nothing"),
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    runs_dir: str = typer.Option("runs", "--runs-dir"),
) -> None:
    """Generate + evaluate (or evaluate given kernels): correctness, fast_p, speedups, pass@k; writes JSON."""
    if target == "compare":
        _compare(extra or [])
        return
    from kforge.eval.runner import EvalRun, EvalTargetError, load_candidates, parse_id_range, resolve_target
    from kforge.problems import problems_from_config, split_runnable
    from kforge.problems.sources import ProblemSourceError

    setup_logging("WARNING")
    if split is not None and split not in SPLITS:
        raise fail(f"--split {split!r}: expected one of {', '.join(SPLITS)}")
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
    if tgt is not None:
        _check_model(tgt.model)
    if out.exists() and not resume and not dry_run:
        raise fail(f"{out} exists; pass --resume to continue it or --out to write elsewhere")
    # The split is the one the run (or preset) drew from its own selection, before this command's options.
    split_dataset = cfg.dataset.model_copy(deep=True)
    split = split or ("test" if run_config is not None else "all")
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
        selected, trained = _apply_split(selected, split, split_dataset, run_config is not None)
        selected, blocked = split_runnable(selected)
        given = load_candidates(candidates, selected) if candidates is not None else None
    except (ProblemSourceError, EvalTargetError, ValueError) as exc:
        raise fail(str(exc)) from None
    for _, why in blocked:
        console.print(escape(f"skipped: {why}"), highlight=False, soft_wrap=True)
    if not selected:
        raise fail("no problems selected: check --level, --problems, --source and --split")

    devices = _devices(gpus, generating=candidates is None)
    meta = _meta(cfg, split, selected, trained, devices, blocked)
    what = f"{len(given)} given kernels" if given is not None else f"{len(selected)} problems x {samples} samples x {turns} turns"
    console.print(escape(f"kforge eval: {tgt.description if tgt else 'given candidates'} on {what} ({ds.backend}); "
                         f"{meta['split']['label']}"), highlight=False, soft_wrap=True)
    console.print(escape(f"problems: {meta['source']}; baseline: {meta['baseline']['label']}"),
                  highlight=False, soft_wrap=True)
    if dry_run:
        for p in selected:
            console.print(escape(f"{p.key} {p.name}" + (" (training problem)" if p.key in trained else "")),
                          highlight=False)
        return

    run = EvalRun(cfg, selected, out, samples=samples, target=tgt, candidates=given, devices=devices)
    if resume:
        try:
            kept = run.load_previous()
        except EvalTargetError as exc:
            raise fail(str(exc)) from None
        console.print(f"resuming: {kept} finished samples kept from {out}")

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
            _annotate(out, meta, run)
            raise fail(f"interrupted; finished samples are in {out} (continue with --resume)", code=130) from None
    by_split = _annotate(out, meta, run)
    print_summary(summary, f"kforge eval · {out} · {meta['split']['label']}")
    for name, part in by_split.items():
        print_summary(part, f"{name} only")
    console.print(f"wrote {out}")


def _apply_split(selected: list, split: str, split_dataset: Any, is_run: bool) -> tuple[list, set[str]]:
    """(problems of `split`, the keys the run trains on). Held out = every problem the run does not train on."""
    from kforge.problems import ProblemSourceError, training_keys

    if split == "all" and not is_run:
        return selected, set()  # a model with no run behind it has trained on none of them
    try:
        trained = training_keys(split_dataset)
    except ProblemSourceError as exc:
        raise ProblemSourceError(f"cannot rebuild the run's train/test split ({exc}); use --split all") from None
    if split == "test":
        kept = [p for p in selected if p.key not in trained]
        if not kept:
            raise ProblemSourceError(
                "none of the selected problems is held out from the run (its test split is empty or not selected): "
                "use --split train or --split all, or select other problems"
            )
        return kept, trained
    if split == "train":
        return [p for p in selected if p.key in trained], trained
    return selected, trained


def _devices(text: Optional[str], generating: bool) -> list[int] | None:
    """Logical GPU indices for this eval. vLLM splits the model over every GPU it gets (tensor parallel), and
    7B/8B attention head counts do not divide by 3 or 6: generation takes one GPU unless told otherwise."""
    from kforge.gpus import GpuIndexError, check_indices, visible_ids

    visible = visible_ids()
    if text is None:
        if not visible:
            return None
        return [0] if generating else list(range(len(visible)))
    try:
        ids = [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise fail(f"--gpus {text!r}: expected GPU indices like 0 or 2,3") from None
    if not ids:
        raise fail(f"--gpus {text!r}: expected GPU indices like 0 or 2,3")
    try:
        check_indices(ids, len(visible), f"--gpus {text!r}: GPU")
    except GpuIndexError as exc:
        raise fail(str(exc)) from None
    return ids


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


def _meta(cfg: Any, split: str, selected: list, trained: set[str], devices: list[int] | None,
          blocked: list) -> dict[str, Any]:
    """What the numbers mean: split, problem source and revision, baseline and GPU."""
    from kforge.problems.kernelbench import describe_source
    from kforge.problems.sources import ProblemSourceError

    on_training = [p.key for p in selected if p.key in trained]
    if split == "test":
        label = f"held-out problems ({len(selected)})"
    elif split == "train":
        label = f"TRAINING problems ({len(selected)}): the run trained on these"
    elif trained:
        label = f"all problems: {len(on_training)} training + {len(selected) - len(on_training)} held-out"
    else:
        label = f"all {len(selected)} selected problems"
    try:
        where = describe_source(cfg.dataset.source).describe()
    except ProblemSourceError:
        where = "location unknown"
    return {
        "split": {"split": split, "label": label, "training_problems": on_training},
        "source": f"{cfg.dataset.source} ({where})",
        "baseline": _baseline_meta(cfg, devices),
        "skipped": [{"problem_key": p.key, "reason": why} for p, why in blocked],
    }


def _baseline_meta(cfg: Any, devices: list[int] | None) -> dict[str, Any]:
    from importlib.metadata import version

    from kforge.gpus import gpu_name

    gpu = gpu_name(devices[0]) if devices else None
    if cfg.evaluator.baseline_file:
        path = Path(cfg.evaluator.baseline_file)
        hardware = _file_hardware(path)
        note = f" (this eval runs on {gpu})" if gpu and hardware and hardware != gpu else ""
        return {"kind": "file", "file": str(path), "hardware": hardware, "gpu": gpu,
                "label": f"KernelBench baseline file {path.name}, timed on {hardware or 'unknown hardware'}{note}"}
    if not devices or not cfg.evaluator.measure_performance:
        return {"kind": "none", "gpu": gpu, "label": "none: no GPU timing here, so speedups and fast_p>0 are not measured"}
    mode = cfg.evaluator.baseline
    torch_version = version("torch")
    what = "PyTorch eager" if mode == "eager" else "torch.compile"
    return {"kind": mode, "gpu": gpu, "torch": torch_version,
            "label": f"{what} measured on {gpu} (torch {torch_version})"}


def _file_hardware(path: Path) -> str | None:
    try:
        doc = json.loads(path.read_text())
        entry = next(iter(next(iter(doc.values())).values()))
        return str(entry.get("hardware")) or None
    except (ValueError, StopIteration, AttributeError, OSError):
        return None


def _annotate(out: Path, meta: dict[str, Any], run: Any) -> dict[str, dict]:
    """Add what the numbers mean to the results file; with --split all, summaries of each part too."""
    from kforge.eval.report import summarize
    from kforge.runs.folder import atomic_write_text

    doc = json.loads(out.read_text())
    by_split: dict[str, dict] = {}
    trained = set(meta["split"]["training_problems"])
    if meta["split"]["split"] == "all" and trained:
        outcomes = run.outcomes()
        ks = range(1, run.samples + 1)
        by_split = {
            "held-out problems": summarize([o for o in outcomes if o.problem_key not in trained], ks),
            "training problems": summarize([o for o in outcomes if o.problem_key in trained], ks),
        }
    doc.update(meta)
    if by_split:
        doc["summary_by_split"] = by_split
    atomic_write_text(out, json.dumps(doc, indent=1, default=str))
    return by_split


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
    for name, doc in zip("AB", docs):
        labels = [doc.get("split", {}).get("label"), doc.get("baseline", {}).get("label")]
        console.print(escape(f"{name}: {doc.get('target', '?')}; " + "; ".join(x for x in labels if x)),
                      highlight=False, soft_wrap=True)
    if docs[0].get("baseline", {}).get("label") != docs[1].get("baseline", {}).get("label"):
        console.print("note: A and B use different baselines or GPUs, so their speedups are not comparable",
                      style="yellow", highlight=False)
    table = Table(title=f"{files[0]} (A) vs {files[1]} (B)")
    for col in ("group", "metric", "A", "B", "B - A"):
        table.add_column(col)
    order = {key: i for i, key in enumerate(summary_keys(64))}
    rows = sorted(compare(*docs), key=lambda r: (_group_order(r[0]), order.get(r[1], len(order)), r[1]))
    for group, key, va, vb, delta in rows:
        style = "" if delta is None or delta == 0 else ("green" if delta > 0 else "red")
        d = "-" if delta is None else (f"[{style}]{delta:+.3f}[/]" if style else f"{delta:+.3f}")
        table.add_row(group, key, _fmt(va), _fmt(vb), d)
    console.print(table)

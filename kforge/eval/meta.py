"""What the numbers of an eval mean, written next to them: split, problem source and revision, baseline
and GPU; and, with `--split all` on a run, the summary of each part."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig
    from kforge.eval.runner import EvalRun
    from kforge.problems.record import Problem


def describe(cfg: KforgeConfig, split: str, selected: list[Problem], trained: set[str], devices: list[int] | None,
             blocked: list[tuple[Problem, str]]) -> dict[str, Any]:
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
        "baseline": _baseline(cfg, devices),
        "skipped": [{"problem_key": p.key, "reason": why} for p, why in blocked],
    }


def _baseline(cfg: KforgeConfig, devices: list[int] | None) -> dict[str, Any]:
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
    from kforge.problems import baseline

    try:
        return baseline.hardware(baseline.load(path))
    except (ValueError, OSError):
        return None


def split_summaries(meta: dict[str, Any], run: EvalRun) -> dict[str, dict]:
    """With --split all on a run: the summary of the held-out and of the training problems, added to the file."""
    from kforge.eval.report import summarize

    trained = set(meta["split"]["training_problems"])
    if meta["split"]["split"] != "all" or not trained:
        return {}
    outcomes = run.outcomes()
    by_split = {
        "held-out problems": summarize([o for o in outcomes if o.problem_key not in trained]),
        "training problems": summarize([o for o in outcomes if o.problem_key in trained]),
    }
    run.meta["summary_by_split"] = by_split
    run.write()
    return by_split

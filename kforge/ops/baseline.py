"""`kforge problems baseline`: every problem's reference timed on one GPU into a KernelBench-format baseline
file (`kforge.problems.baseline` reads and writes it). The file is written after each problem, so an
interruption keeps what finished, and one reference that fails costs the others nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kforge.problems import baseline as baseline_file
from kforge.problems.record import Problem

if TYPE_CHECKING:
    from kforge.evaluator import EvalPool


def default_path(hardware: str, mode: str) -> Path:
    """baselines/<GPU name as a folder name>/<KernelBench's file name for `mode`>."""
    return Path("baselines") / _safe(hardware) / baseline_file.default_filename(mode)


def time_references(pool: EvalPool, problems: Sequence[Problem], mode: str, doc: dict[str, Any], path: Path,
                    device: int, each: Callable[[Problem, float | None, str | None], None]) -> list[str]:
    """Time each reference (`mode`: eager or compile) on the pool's GPU `device` into `doc`, the file at `path`
    as `baseline_file.load` read it (an existing file is extended); `each(problem, mean_ms, why)` is told of
    every problem as it ends (`why` when it failed). Returns the keys of the problems that failed."""
    hardware = pool.gpu_names[0]
    failed: list[str] = []
    for problem in problems:
        try:
            timings = pool.time_reference(problem, (mode,)).get(mode)
            if timings is None:
                raise RuntimeError(f"no {mode} timings came back")
        except RuntimeError as exc:  # out of memory, a crash: this problem fails, the others go on
            failed.append(problem.key)
            each(problem, None, _last_words(exc))
            continue
        baseline_file.add(doc, problem, timings, hardware, f"cuda:{device}")
        baseline_file.write(path, doc)
        each(problem, timings.mean_ms, None)
    return failed


def _last_words(exc: BaseException) -> str:
    """The pool's message may carry the child's traceback: its first and last lines say what went wrong."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


def _safe(name: str) -> str:
    """A GPU name as a folder name: "NVIDIA H100 80GB HBM3" -> "NVIDIA_H100_80GB_HBM3"."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") or "gpu"

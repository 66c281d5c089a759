"""KernelBench-format baseline timing files: what `kforge problems baseline` writes and `--baseline` reads.

The layout is KernelBench's `results/timing/<hardware>/baseline_time_torch*.json`::

    {"level1": {"19_ReLU.py": {"mean": 1.23, "std": 0.01, "min": 1.22, "max": 1.3,
                               "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0"}}}

Times are milliseconds per forward call, rounded to three significant figures as KernelBench writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from kforge.errors import UserError
from kforge.problems.record import Problem
from kforge.space import atomic_write_text

MODES = ("eager", "compile")


class TimingsLike(Protocol):
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    trials: int


def default_filename(mode: str) -> str:
    """KernelBench's file name for a mode: eager -> baseline_time_torch.json."""
    return "baseline_time_torch.json" if mode == "eager" else "baseline_time_torch_compile_inductor_default.json"


def entry(timings: TimingsLike, hardware: str, device: str) -> dict[str, Any]:
    return {
        "mean": _sig3(timings.mean_ms),
        "std": _sig3(timings.std_ms),
        "min": _sig3(timings.min_ms),
        "max": _sig3(timings.max_ms),
        "num_trials": int(timings.trials),
        "hardware": hardware,
        "device": device,
    }


def add(doc: dict[str, Any], problem: Problem, timings: TimingsLike, hardware: str, device: str) -> None:
    """Put one problem's timings into a baseline document (levels and files kept in KernelBench's order)."""
    level = doc.setdefault(f"level{problem.level}", {})
    level[f"{problem.name}.py"] = entry(timings, hardware, device)


def load(path: Path, fix: str = "move it away or choose another --out") -> dict[str, Any]:
    """An existing baseline file (to extend it), or an empty document when there is none."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # not UTF-8 text (UnicodeDecodeError), or not JSON
        raise UserError(f"{path} is not a baseline JSON file (not JSON text): {fix}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is not a baseline JSON file (expected an object of levelN sections)")
    return doc


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically, levels sorted and problems by id, indented as KernelBench's files are."""
    ordered = {
        level: dict(sorted(doc[level].items(), key=lambda kv: _file_id(kv[0])))
        for level in sorted(doc, key=lambda name: int(name[5:]) if name[5:].isdigit() else 0)
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(ordered, indent=4) + "\n")


def read(path: Path) -> dict[str, Any]:
    """A baseline file `--baseline` names: it must exist and hold levelN sections."""
    if not path.is_file():
        raise UserError(f"baseline file {path} does not exist: pass a KernelBench baseline JSON "
                         "(`kforge problems baseline` writes one)")
    return load(path, "pass a KernelBench baseline JSON (`kforge problems baseline` writes one)")


def lookup(doc: dict[str, Any], problem: Problem) -> dict[str, float] | None:
    """One problem's timings in ms (mean, std, min, max, num_trials), or None when the file lacks it."""
    found = doc.get(f"level{problem.level}", {}).get(f"{problem.name}.py")
    if not isinstance(found, dict) or "mean" not in found:
        return None
    mean = float(found["mean"])
    return {"mean": mean, "std": float(found.get("std", 0.0)), "min": float(found.get("min", mean)),
            "max": float(found.get("max", mean)), "num_trials": int(found.get("num_trials", 0))}


def hardware(doc: dict[str, Any]) -> str | None:
    """The GPU the file's first entry was timed on."""
    first = next((e for level in doc.values() if isinstance(level, dict) for e in level.values()), None)
    return str(first.get("hardware") or "") or None if isinstance(first, dict) else None


def _file_id(name: str) -> int:
    head = name.split("_", 1)[0]
    return int(head) if head.isdigit() else 0


def _sig3(value: float) -> float:
    return float(f"{float(value):.3g}")

"""The eval results file (`eval_results-*.json`): its one writer and its one reader.

Rewritten whole and atomically after every finished sample, so an interrupted eval loses at most the
samples in flight. Top-level keys: `summary` (metric groups), the target, model, adapter, backend, turns,
samples per problem, machine, time, the resolved config, what the numbers mean (`split`, `source`,
`baseline`, `skipped`, `selection`, optionally `summary_by_split`) and `samples` (one record per sample).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kforge.errors import UserError
from kforge.space import atomic_write_text


class ResultsFileError(UserError):
    """A path that holds no results file; the message is one line naming it."""


def write_results(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1, default=str))


def read_results(path: Path | str) -> dict[str, Any]:
    """A results file, checked for the shape every reader relies on: a summary of metric groups and a list
    of samples."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultsFileError(f"{path} is a folder; give a results JSON file") from None
    except (ValueError, OSError):
        raise ResultsFileError(f"{path}: not a kforge eval results file (not JSON)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict) or not all(
            isinstance(g, dict) for g in doc["summary"].values()):
        raise ResultsFileError(f"{path}: not a kforge eval results file (no summary of metric groups)")
    if not isinstance(doc.get("samples", []), list):
        raise ResultsFileError(f"{path}: not a kforge eval results file (samples is not a list)")
    return doc

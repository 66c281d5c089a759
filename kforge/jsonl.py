"""Reading user-supplied JSONL files (problem sets, kernel corpora) with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def iter_objects(path: Path, error: type[Exception], what: str = "one JSON object") -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(`path:line`, line number, object) for every non-blank line; a line that is not a JSON object raises
    `error` naming the file and line."""
    with Path(path).open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: not valid JSON ({exc.msg}); each line must be {what}") from None
            if not isinstance(row, dict):
                raise error(f"{where}: expected {what}, got {type(row).__name__}")
            yield where, lineno, row

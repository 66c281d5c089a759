"""Reading user-supplied files (problem sets, kernel corpora, pairs, candidates, baselines) with one-line
errors: a file that is not UTF-8 text is said in one line naming it, never a UnicodeDecodeError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

# A kernel's source is kilobytes; a candidate of megabytes is a wrong file (a log, a dump), refused in one line
# before the evaluator compiles and the results file keeps it.
CANDIDATE_MAX_BYTES = 4 << 20


def too_big(size: int, limit: int) -> str | None:
    """What to say of `size` bytes over `limit`, or None."""
    return f"{size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB a kernel source may be" if size > limit else None


def read_text(path: Path | str, error: type[Exception], what: str, want: str, limit: int | None = None) -> str:
    """The text of a file the user named; one that is not text, or over `limit` bytes, raises `error`:
    "`what` `path` is not a text file; `want`"."""
    over = too_big(Path(path).stat().st_size, limit) if limit is not None else None
    if over:
        raise error(f"{what} {path} is {over}; {want}")
    try:
        return Path(path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, ValueError):  # ValueError: a NUL byte in a name or a codec's refusal
        raise error(f"{what} {path} is not a text file; {want}") from None


def iter_objects(path: Path, error: type[Exception], what: str = "one JSON object") -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(`path:line`, line number, object) for every non-blank line; a line that is not a JSON object raises
    `error` naming the file and line."""
    try:
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
    except UnicodeDecodeError:  # read in chunks (a corpus can be large), so no line number
        raise error(f"{path} is not a text file (not UTF-8); each line must be {what}") from None

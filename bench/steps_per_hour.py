"""Steps per hour of `kforge train` runs side by side: the table the scaling rows (1, 2 and 4 GPUs; default and
continuous rollout) are read from.

    python -m bench.steps_per_hour RUN_FOLDER[=LABEL] ... [--skip 1] [--base LABEL]

A step lasts from the record of the step before it to its own (metrics.jsonl's `time`); the first `--skip`
steps (compilation, warm-up) are left out, and so is the first record, which has no step before it. Each row
says the plan the run was placed with (the `placement [...]` line of its logs.log, when it is there), the mean
and spread of its step seconds, steps per hour, the staleness of the samples it trained on (continuous mode
logs it) and its steps per hour over the base row's (the first row unless `--base` names another).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from kforge.runs.folder import RunFolder
from kforge.runs.layout import LOG_FILE, METRICS_FILE


@dataclass
class Row:
    label: str
    plan: str
    steps: list[float]  # seconds of each step counted
    staleness_mean: float | None
    staleness_max: float | None

    @property
    def per_hour(self) -> float:
        return 3600.0 / statistics.fmean(self.steps) if self.steps else float("nan")


def _refuse(line: str) -> None:
    print(f"steps_per_hour: {line}", file=sys.stderr)
    raise SystemExit(2)


def read_run(folder: Path, label: str, skip: int) -> Row:
    """One run folder's row (a folder without metrics: one line on stderr, exit 2)."""
    if not (folder / METRICS_FILE).is_file():
        _refuse(f"{folder} has no {METRICS_FILE}: give the folder of a `kforge train` run")
    # kforge's own reader: a torn last line skipped, a step a resumed run did again counted once
    records = [r for r in RunFolder(folder).metrics() if "step" in r and "time" in r]
    records.sort(key=lambda r: r["step"])
    steps = [b["time"] - a["time"] for a, b in zip(records, records[1:]) if b["step"] > skip]
    counted = [r for r in records[1:] if r["step"] > skip]
    means = [float(r["staleness/mean"]) for r in counted if "staleness/mean" in r]
    maxes = [float(r["staleness/max"]) for r in counted if "staleness/max" in r]
    log = folder / LOG_FILE
    plan = next((line.split("placement ", 1)[1].strip() for line in
                 (log.read_text(errors="replace").splitlines() if log.is_file() else []) if "placement [" in line), "-")
    return Row(label, plan, steps, statistics.fmean(means) if means else None, max(maxes) if maxes else None)


def table(rows: list[Row], base: str | None = None) -> str:
    ref = next((r for r in rows if r.label == base), rows[0])
    lines = ["| run | plan | steps counted | step s (mean, min-max) | steps/hour | staleness mean / max | vs "
             f"{ref.label} |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        spread = f"{statistics.fmean(r.steps):.1f} ({min(r.steps):.1f}-{max(r.steps):.1f})" if r.steps else "-"
        stale = f"{r.staleness_mean:.2f} / {r.staleness_max:.0f}" if r.staleness_mean is not None else "-"
        ratio = f"{r.per_hour / ref.per_hour:.2f}x" if r.steps and ref.steps else "-"
        per_hour = f"{r.per_hour:.1f}" if r.steps else "-"
        lines.append(f"| {r.label} | {r.plan} | {len(r.steps)} | {spread} | {per_hour} | {stale} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders, each optionally =LABEL (default: the folder's name)")
    ap.add_argument("--skip", type=int, default=1, help="leave out the first N steps (warm-up); default 1")
    ap.add_argument("--base", default=None, help="the label the ratio column divides by (default: the first)")
    args = ap.parse_args(argv)
    rows = []
    for spec in args.runs:
        path, _, label = spec.partition("=")
        rows.append(read_run(Path(path), label or Path(path).name, args.skip))
    if args.base is not None and args.base not in {r.label for r in rows}:
        _refuse(f"--base {args.base} is none of the labels ({', '.join(r.label for r in rows)})")
    print(table(rows, args.base))


if __name__ == "__main__":
    main()

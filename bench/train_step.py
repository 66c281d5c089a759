"""Stage breakdown of `kforge train` steps, synchronous vs pipelined (rollout.max_staleness=1).

    python -m bench.train_step --steps 4 [--preset tiny] [key=value ...]

Runs `kforge train` twice in subprocesses with the same config (max_staleness 0, then 1), reads each run's
metrics.jsonl and prints per-stage mean times, the pipelined step time over the slowest stage of the
synchronous run (target <= 1.2) and over the synchronous step time. Step time = wall time between two
consecutive step records (the first step, which includes warm-up, is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(mode: str, staleness: int, args: argparse.Namespace, root: Path) -> list[dict]:
    name = f"bench-{mode}"
    cmd = [sys.executable, "-m", "kforge", "train", "--preset", args.preset, "--plain", "--runs-dir", str(root),
           "--name", name, "--max-steps", str(args.steps), f"rollout.max_staleness={staleness}",
           "log.save_every=0", "log.eval_every=0", *args.overrides]
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    print(f"[{mode}] exit {proc.returncode} in {time.time() - t:.0f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        raise SystemExit(1)
    return [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines() if line.strip()]


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.train_step", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kforge-bench-"))
    rows = {}
    for mode, staleness in (("sync", 0), ("pipelined", 1)):
        m = run(mode, staleness, args, root)
        ends = [r["time"] for r in m]
        steps = [b - a for a, b in zip(ends, ends[1:])]
        rows[mode] = {
            "rollout+eval s": mean([r["time/rollout_eval_s"] for r in m[1:]]),
            "learn s": mean([r["time/learn_s"] for r in m[1:]]),
            "adapter sync s": mean([r["time/sync_s"] for r in m[1:]]),
            "step s": mean(steps),
            "gen tok/s": mean([r["throughput/generate_tok_s"] for r in m[1:]]),
            "staleness max": max((r.get("staleness/max", 0.0) for r in m), default=0.0),
        }
    sync = rows["sync"]
    slowest = max(sync["rollout+eval s"], sync["learn s"])
    print()
    cols = list(sync)
    print("mode       | " + " | ".join(f"{c:>14}" for c in cols))
    for mode, r in rows.items():
        print(f"{mode:<10} | " + " | ".join(f"{r[c]:>14.2f}" for c in cols))
    print()
    print(f"slowest stage (sync run): {slowest:.2f} s")
    print(f"pipelined step / slowest stage = {rows['pipelined']['step s'] / slowest:.2f}  (target <= 1.2)")
    print(f"pipelined step / synchronous step = {rows['pipelined']['step s'] / sync['step s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

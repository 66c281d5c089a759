"""Evaluator throughput of two checkouts on this machine, interleaved: bench/eval_throughput.py of each,
run alternately (A B, then B A, ...) so that load from elsewhere falls on both alike.

    python bench/eval_ab.py --base f4782c0 --rounds 3            # a commit of this repository vs this tree
    python bench/eval_ab.py --base-dir /path/to/other/checkout   # any other checkout

Each run gets a fresh cache folder (cold: references computed) and is then repeated on it (warm: the
references cached, as in training). Every run is its checkout's own eval_throughput.py with its own
kforge (`--cpu --shrink` by default: tiny shapes, Triton interpreter). Prints one row per run and, per
checkout, the mean candidates/minute cold and warm and the ratio to the base.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_RATE = re.compile(r"(\d+) candidates in ([\d.]+) s = ([\d.]+) candidates/min")


def export(rev: str, where: Path) -> Path:
    """A plain copy of `rev` of this repository (no worktree, nothing written to .git)."""
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def run(checkout: Path, cache: Path, args: argparse.Namespace) -> tuple[float, float, int]:
    """(candidates/min, wall s, candidates) of one eval_throughput run of `checkout`."""
    env = dict(os.environ, PYTHONPATH=str(checkout), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(checkout / "bench" / "eval_throughput.py"), "--problems", args.problems,
           "--cache-dir", str(cache), *args.extra]
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=args.timeout)
    found = _RATE.search(out.stdout)
    if out.returncode != 0 or not found:
        sys.exit(f"error: {checkout.name} run failed (rc {out.returncode}):\n{(out.stdout + out.stderr)[-2000:]}")
    return float(found.group(3)), float(found.group(2)), int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a commit of this repository to compare against")
    ap.add_argument("--base-dir", help="or a checkout folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--problems", default=str(ROOT.parent / "shared/data/kernelbench/problems.jsonl"))
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("extra", nargs="*", default=["--cpu", "--shrink"], help="arguments for eval_throughput.py")
    args = ap.parse_args()
    if bool(args.base) == bool(args.base_dir):
        sys.exit("error: give exactly one of --base REV or --base-dir PATH")
    if not Path(args.problems).is_file():
        sys.exit(f"error: no problem file {args.problems}: give --problems PATH (KernelBench's problems.jsonl)")
    work = Path(tempfile.mkdtemp(prefix="kforge-ab-"))
    try:
        base = export(args.base, work / "base") if args.base else Path(args.base_dir).resolve()
        checkouts = {"base": base, "this": ROOT}
        rows: list[tuple[int, str, float, float, float, float]] = []
        print(f"{'round':>5} | {'checkout':8} | {'cold cand/min':>13} | {'cold s':>7} | {'warm cand/min':>13} | {'warm s':>7}",
              flush=True)
        for r in range(args.rounds):
            order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
            for name in order:
                cache = work / f"cache-{name}-{r}"
                cold, cold_s, _ = run(checkouts[name], cache, args)
                warm, warm_s, _ = run(checkouts[name], cache, args)
                rows.append((r, name, cold, cold_s, warm, warm_s))
                print(f"{r:>5} | {name:8} | {cold:13.1f} | {cold_s:7.1f} | {warm:13.1f} | {warm_s:7.1f}", flush=True)
        print()
        means = {name: (statistics.fmean(x[2] for x in rows if x[1] == name),
                        statistics.fmean(x[4] for x in rows if x[1] == name)) for name in checkouts}
        for name, (cold, warm) in means.items():
            print(f"{name:8} mean cold {cold:.1f} cand/min, warm {warm:.1f} cand/min")
        print(f"this / base: cold {means['this'][0] / means['base'][0]:.3f}, warm {means['this'][1] / means['base'][1]:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

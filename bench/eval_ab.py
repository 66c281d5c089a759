"""Evaluator throughput of two checkouts on this machine, interleaved: bench.eval_throughput against each,
run alternately (A B, then B A, ...) so that load from elsewhere falls on both alike.

    python -m bench.eval_ab --base f4782c0 --rounds 3            # a commit of this repository vs this tree
    python -m bench.eval_ab --base-dir /path/to/other/checkout   # any other checkout

Each run gets a fresh cache folder (cold: references computed) and is then repeated on it (warm: the
references cached, as in training). Every run is this checkout's bench.eval_throughput (the same
candidates) with the other checkout's kforge, named by KFORGE_BENCH_ROOT (`--cpu --shrink` by default: tiny
shapes, Triton interpreter). Prints one row per run (candidates/minute by wall time, and CPU seconds per candidate over
the whole process tree: on a shared machine the wall time swings with others' load, the CPU time much
less) and, per checkout, the means and the ratios to the base.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, kernelbench_jsonl

_RATE = re.compile(r"(\d+) candidates in ([\d.]+) s = ([\d.]+) candidates/min")


def export(rev: str, where: Path) -> Path:
    """A plain copy of `rev` of this repository (no worktree, nothing written to .git)."""
    where.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def _cpu_s() -> float:
    """CPU seconds of every finished descendant (the pool's zygote reaps its children, and so on up)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run(checkout: Path, cache: Path, args: argparse.Namespace) -> tuple[float, float, float]:
    """(candidates/min, wall s, CPU s per candidate) of one eval_throughput run against `checkout`."""
    env = dict(os.environ, PYTHONPATH=str(checkout), KFORGE_BENCH_ROOT=str(checkout), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "bench.eval_throughput", "--problems", str(Path(args.problems).resolve()),
           "--cache-dir", str(cache), *args.extra]
    cpu0 = _cpu_s()
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout)
    found = _RATE.search(out.stdout)
    if out.returncode != 0 or not found:
        sys.exit(f"error: {checkout.name} run failed (rc {out.returncode}):\n{(out.stdout + out.stderr)[-2000:]}")
    return float(found.group(3)), float(found.group(2)), (_cpu_s() - cpu0) / int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_ab", description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="a commit of this repository to compare against")
    ap.add_argument("--base-dir", help="or a checkout folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--problems", default=str(kernelbench_jsonl()), help="KernelBench's problems.jsonl "
                    "(default: $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl)")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("extra", nargs="*", default=["--cpu", "--shrink"], help="arguments for bench.eval_throughput")
    args = ap.parse_args()
    if bool(args.base) == bool(args.base_dir):
        sys.exit("error: give exactly one of --base REV or --base-dir PATH")
    if not Path(args.problems).is_file():
        sys.exit(f"error: no problem file {args.problems}: give --problems PATH (KernelBench's problems.jsonl)")
    work = Path(tempfile.mkdtemp(prefix="kforge-ab-"))
    try:
        base = export(args.base, work / "base") if args.base else Path(args.base_dir).resolve()
        checkouts = {"base": base, "this": REPO}
        heads = ("round", "checkout", "cold cand/min", "cold s", "cold cpu s/cand", "warm cand/min", "warm s",
                 "warm cpu s/cand")
        print(" | ".join(heads), flush=True)
        rows: list[tuple[int, str, tuple[float, float, float], tuple[float, float, float]]] = []
        for r in range(args.rounds):
            order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
            for name in order:
                cache = work / f"cache-{name}-{r}"
                cold = run(checkouts[name], cache, args)
                warm = run(checkouts[name], cache, args)
                rows.append((r, name, cold, warm))
                print(f"{r:>5} | {name:8} | {cold[0]:13.1f} | {cold[1]:6.1f} | {cold[2]:15.2f} | {warm[0]:13.1f} | "
                      f"{warm[1]:6.1f} | {warm[2]:15.2f}", flush=True)
        print()
        mean = {(name, k, i): statistics.fmean(x[2 + k][i] for x in rows if x[1] == name)
                for name in checkouts for k in (0, 1) for i in (0, 2)}
        for name in checkouts:
            print(f"{name:8} mean cold {mean[name, 0, 0]:.1f} cand/min ({mean[name, 0, 2]:.2f} cpu s/cand), "
                  f"warm {mean[name, 1, 0]:.1f} cand/min ({mean[name, 1, 2]:.2f} cpu s/cand)")
        print(f"this / base candidates/min: cold {mean['this', 0, 0] / mean['base', 0, 0]:.3f}, "
              f"warm {mean['this', 1, 0] / mean['base', 1, 0]:.3f}; CPU s per candidate: "
              f"cold {mean['this', 0, 2] / mean['base', 0, 2]:.3f}, warm {mean['this', 1, 2] / mean['base', 1, 2]:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

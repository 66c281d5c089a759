"""Evaluator throughput on KernelBench level-1 problems: candidates/minute and where the time goes.

    python -m bench.eval_throughput --problems .evalcarry/problems.jsonl \
        --baselines .evalcarry/H100_Modal__baseline_time_torch.json
    python -m bench.eval_throughput --problems ... --shrink --cpu    # tiny shapes, Triton interpreter

Candidates (bench/kb_candidates.py): correct Triton kernels for 18 level-1 problems plus 6 broken or hacking ones.
Prints one row per candidate (status, speedup, fork / CUDA init / import / first launch (Triton
compile) / correctness / timing seconds), the throughput per GPU, and kforge's eager baseline next
to the published KernelBench H100 baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from bench.common import kernelbench_baselines, kernelbench_jsonl, print_table, use_kforge_from
from bench.kb_candidates import BIG, big_candidates, broken_candidates, correct_candidates, shrink


def _kernel_ms(v) -> float | None:
    """The time a speedup is computed from (a checkout before Verdict.kernel_ms: the median report)."""
    if getattr(v, "kernel_ms", None) is not None:
        return v.kernel_ms
    return v.timings.median_ms if v.timings else None


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_throughput", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(kernelbench_jsonl()), help="KernelBench's problems.jsonl "
                    "(default: $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl)")
    ap.add_argument("--baselines", default=str(kernelbench_baselines()))
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument("--timing-trials", type=int, default=100)
    ap.add_argument("--workers-per-gpu", type=int, default=2)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--big", action="store_true", help="add the 6.4 GB-input problems (19, 20, 21, 23)")
    ap.add_argument("--only", default="", help="comma-separated problem ids: only their candidates")
    ap.add_argument("--repeat", type=int, default=1, help="judge the candidates this many times in one pool "
                    "(after the first round every reference is cached: the steady state of a training run)")
    ap.add_argument("--inputs-reuse", type=int, default=None, help="evaluator.inputs_reuse (default: the config's)")
    args = ap.parse_args()
    # The kforge to measure: this checkout's, or another one's (bench/eval_ab.py runs the same candidates
    # against two checkouts).
    use_kforge_from(os.environ.get("KFORGE_BENCH_ROOT"))

    import torch

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool
    from kforge.problems.record import Problem

    rows = [json.loads(line) for line in Path(args.problems).read_text().splitlines() if line.strip()]
    by_id = {r["problem_id"]: r for r in rows if r["level"] == 1}

    def problem(pid: int) -> Problem:
        r = by_id[pid]
        code = shrink(r["code"]) if args.shrink else r["code"]
        return Problem(1, pid, r["name"], code, source="kernelbench")

    items: list[tuple[str, Problem, str]] = [("correct", problem(pid), code) for pid, code in correct_candidates().items()]
    items += [(label, problem(pid), code) for pid, label, code in broken_candidates()]
    if args.big:
        items += [("correct", problem(pid), code) for pid, code in big_candidates().items()]
        items += [("copy as ReLU", problem(19), BIG[19].replace("tl.maximum(x, 0.0)", "x"))]
    if args.only:
        keep = {int(x) for x in args.only.split(",") if x.strip()}
        items = [it for it in items if it[1].problem_id in keep]
    gpu = torch.cuda.is_available() and not args.cpu
    cfg = EvaluatorConfig(timing_trials=args.timing_trials, workers_per_gpu=args.workers_per_gpu,
                          run_timeout_s=300.0, compile_timeout_s=300.0,
                          **({"inputs_reuse": args.inputs_reuse} if args.inputs_reuse else {}))
    t0 = time.monotonic()
    with EvalPool(cfg, devices=[0] if gpu else None, cache_dir=args.cache_dir) as pool:
        t_ready = time.monotonic()
        device = pool.gpu_names[0]
        rounds = []
        for _ in range(args.repeat):
            t_round = time.monotonic()
            verdicts = pool.evaluate_many([(p, code, "triton") for _label, p, code in items])
            rounds.append(time.monotonic() - t_round)
    wall = rounds[-1]
    print(f"device: {device}  torch {torch.__version__}  pool start {t_ready - t0:.1f} s  "
          f"workers/GPU {cfg.workers_per_gpu}  timing trials {cfg.timing_trials}")
    keys = ("fork_s", "cuda_init_s", "import_s", "first_trial_s", "correctness_s", "timing_s")
    heads = ("problem", "candidate", "status", "flags", "trials", "speedup", "kernel ms", "kforge eager ms",
             "published ms", "fork", "cuda init", "import", "1st launch", "correctness", "timing", "total s")
    published = {}
    if Path(args.baselines).exists():
        published = json.loads(Path(args.baselines).read_text()).get("level1", {})
    table = []
    for (label, p, _code), v in zip(items, verdicts):
        d = v.details.get("durations", {})
        pub = published.get(f"{p.name}.py", {}).get("mean")
        table.append((p.name[:34], label, v.status.value, ",".join(v.flags) or "-", f"{v.trials_passed}/{v.trials}",
                      f"{v.speedup:.2f}" if v.speedup is not None else "-",
                      f"{_kernel_ms(v):.3f}" if _kernel_ms(v) is not None else "-",
                      f"{v.baseline.mean_ms:.3f}" if v.baseline else "-", f"{pub}" if pub is not None else "-",
                      *[f"{d[k]:.2f}" if k in d else "-" for k in keys], f"{v.run_s:.1f}"))
    print_table(heads, table)
    n = len(items)
    good = sum(1 for (label, _p, _c), v in zip(items, verdicts) if (label == "correct") == v.correct)
    print(f"\n{n} candidates in {wall:.1f} s = {60 * n / wall:.1f} candidates/min on 1 "
          f"{'GPU' if gpu else 'CPU pool'}; {good}/{n} verdicts as intended; inputs_reuse {cfg.inputs_reuse}"
          + (f"; rounds {', '.join(f'{r:.1f}' for r in rounds)} s (the table and rate: the last)" if len(rounds) > 1 else ""))
    for k in keys:
        vals = [v.details.get("durations", {}).get(k) for v in verdicts]
        vals = [x for x in vals if x is not None]
        if vals:
            print(f"  {k:14s} median {statistics.median(vals):.3f} s  max {max(vals):.3f} s  (n={len(vals)})")
    ratios = []
    for (label, p, _c), v in zip(items, verdicts):
        pub = published.get(f"{p.name}.py", {}).get("mean")
        if label == "correct" and v.baseline and pub:
            ratios.append(v.baseline.mean_ms / pub)
    if ratios:
        print(f"  kforge eager baseline / published H100 baseline: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} problems")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

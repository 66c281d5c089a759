"""The judge's latency and throughput on small kernels, and its honesty under load.

    python -m bench.judge_latency                          # one worker, checks one at a time: the breakdown
    python -m bench.judge_latency --workers 16 --rounds 3  # a full pool: checks/minute per GPU
    python -m bench.judge_latency --busy 2 --rounds 3      # the same beside 2 busy processes (a second pool
                                                           # judging in a loop, a CPU spinner): flags counted
    python -m bench.judge_latency --cpu --count 3          # plumbing on the CPU (Triton interpreter)

Candidates: honest elementwise Triton kernels of the shape the curriculum family has (one torch expression
over 1-3 inputs of 16 x 4096 fp32, some with a row reduction; ~0.01-0.2 ms a call on an H100), plus with
`--set kb` the correct KernelBench level-1 candidates of bench/kb_candidates.py and with `--set builtin`
kforge's built-in solutions. Every one is honest: any flag or verdict other than `correct` is a false
positive, counted in the last line. Prints per check the stages of `details.durations` (fork, import,
first trial, correctness, warm-up, timing and its parts: up to the window's end, the copy-out and answer,
the parent's frozen read; profile), their medians, and checks/minute. KFORGE_BENCH_ROOT measures another
checkout with the same candidates (before/after in one run: run it twice, one root each); KFORGE_KERNELBENCH
names KernelBench's problems.jsonl for `--set kb` (default: ../shared/data/kernelbench/problems.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, kernelbench_jsonl, kforge_root, print_table, use_kforge_from

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {expr}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''

SOLUTION = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_kernel({ptrs}, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
{loads}
    tl.store(out_ptr + offs, {expr}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        out = torch.empty_like({first})
        n = out.numel()
        fused_kernel[(triton.cdiv(n, 1024),)]({call}, out, n, BLOCK=1024)
        return out
'''

ROW_SOLUTION = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_kernel({ptrs}, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
{loads}
    v = tl.where(mask, {expr}, {neutral})
    tl.store(out_ptr + row, tl.{reduce}(v, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        rows, cols = {first}.shape
        out = torch.empty(rows, device={first}.device, dtype={first}.dtype)
        row_kernel[(rows,)]({call}, out, cols, BLOCK=triton.next_power_of_2(cols))
        return out
'''

# (torch expression, Triton expression, inputs, row reduction or None)
FAMILY = [
    ("torch.maximum(torch.cos(y + 1.5), x)", "tl.maximum(tl.cos(y + 1.5), x)", "xy", None),
    ("torch.sigmoid(x) * 2.0 - y", "tl.sigmoid(x) * 2.0 - y", "xy", None),
    ("torch.relu(x - 0.5) + torch.abs(y)", "tl.maximum(x - 0.5, 0.0) + tl.abs(y)", "xy", None),
    ("torch.exp(torch.sin(x)) * 0.5", "tl.exp(tl.sin(x)) * 0.5", "x", None),
    ("torch.clamp(x * 3.0, -1.0, 1.0) + z", "tl.minimum(tl.maximum(x * 3.0, -1.0), 1.0) + z", "xz", None),
    ("torch.where(x > 0, x, 0.1 * x) * y + z", "tl.where(x > 0, x, 0.1 * x) * y + z", "xyz", None),
    ("torch.minimum(torch.sigmoid(x), torch.cos(y))", "tl.minimum(tl.sigmoid(x), tl.cos(y))", "xy", None),
    ("(torch.sin(x) * y).sum(dim=-1)", "tl.sin(x) * y", "xy", "sum"),
    ("torch.abs(x - y).amax(dim=-1)", "tl.abs(x - y)", "xy", "max"),
]


def family(rows: int, cols: int) -> list[tuple[str, str, str]]:
    """(name, problem code, solution code) for each expression of FAMILY."""
    out = []
    for i, (expr, texpr, names, reduce) in enumerate(FAMILY):
        args = ", ".join(names)
        inputs = ", ".join(f"torch.randn({rows}, {cols})" for _ in names)
        ptrs = ", ".join(f"{n}_ptr" for n in names)
        base = "row * cols + offs" if reduce else "offs"
        loads = "\n".join(f"    {n} = tl.load({n}_ptr + {base}, mask=mask, other=0.0)" for n in names)
        fill = dict(args=args, ptrs=ptrs, loads=loads, expr=texpr, first=names[0], call=args)
        if reduce:
            code = ROW_SOLUTION.format(**fill, reduce=reduce, neutral="0.0" if reduce == "sum" else "-float('inf')")
        else:
            code = SOLUTION.format(**fill)
        out.append((f"gen{i}", PROBLEM.format(args=args, expr=expr, inputs=inputs), code))
    return out


def candidates(sets: list[str], rows: int, cols: int, cpu: bool) -> list[tuple[str, object, str]]:
    """(label, Problem, code) of every honest candidate in the chosen sets."""
    from kforge.problems.record import Problem

    items: list[tuple[str, object, str]] = [(name, Problem(1, 900 + i, name, prob, source="bench"), sol)
                                            for i, (name, prob, sol) in enumerate(family(rows, cols))]
    items = items if "gen" in sets else []
    if "builtin" in sets:
        from kforge.problems.sources import builtin_problems

        items += [(f"builtin {p.key}", p, p.solution) for p in builtin_problems() if p.solution]
    if "kb" in sets:
        from bench.kb_candidates import correct_candidates, shrink

        kb = kernelbench_jsonl()
        by_id = {r["problem_id"]: r for r in map(json.loads, kb.read_text().splitlines()) if r["level"] == 1}
        for pid, code in correct_candidates().items():
            prob = shrink(by_id[pid]["code"]) if cpu else by_id[pid]["code"]
            items.append((f"kb {pid}", Problem(1, pid, by_id[pid]["name"], prob, source="kernelbench"), code))
    return items


STAGES = ("fork_s", "cuda_init_s", "import_s", "first_call_s", "first_trial_s", "correctness_s", "warmup_s", "timing_s",
          "timing_window_s", "timing_answer_s", "timing_read_s", "profile_s", "recheck_s")


def busy(args: argparse.Namespace) -> list[subprocess.Popen]:
    """Load beside the measured pool: one CPU spinner and `--busy - 1` pools judging the same candidates in
    a loop (on the same GPU), each its own process group."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)]
    for i in range(args.busy - 1):
        cache = Path(args.cache_dir or "/tmp/kforge-judge-latency").resolve()
        argv = [sys.executable, "-m", "bench.judge_latency", "--loop", "--workers", str(args.workers), "--set", args.set,
                "--cache-dir", f"{cache}-busy{i}"] + (["--cpu"] if args.cpu else [])
        procs.append(subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    return procs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.judge_latency", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="workers per GPU (1: each check alone)")
    ap.add_argument("--rounds", type=int, default=2, help="the candidates this many times in one pool (the first "
                    "computes the references; the table shows the last)")
    ap.add_argument("--set", default="gen", help="comma-separated: gen, kb, builtin")
    ap.add_argument("--count", type=int, default=0, help="only the first N candidates")
    ap.add_argument("--copies", type=int, default=1, help="each candidate this many times per round")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--timing-trials", type=int, default=None)
    ap.add_argument("--startups", type=int, default=0, help="evaluator.startups_per_gpu (0: no limit)")
    ap.add_argument("--busy", type=int, default=0, help="processes loading the machine while it is measured")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)  # a busy pool: judge until killed
    args = ap.parse_args(argv)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before torch and triton are imported
    use_kforge_from(os.environ.get("KFORGE_BENCH_ROOT"))
    import torch

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool

    gpu = torch.cuda.is_available() and not args.cpu
    rows, cols = (args.rows, args.cols) if not args.cpu else (4, 64)
    items = candidates(args.set.split(","), rows, cols, not gpu)
    items = (items[:args.count] if args.count else items) * args.copies
    extra = {"timing_trials": args.timing_trials} if args.timing_trials else {}
    cfg = EvaluatorConfig(workers_per_gpu=args.workers, cpu_workers=args.workers, startups_per_gpu=args.startups,
                          **extra)
    helpers = busy(args) if args.busy and not args.loop else []
    try:
        with EvalPool(cfg, devices=[0] if gpu else None, cache_dir=args.cache_dir) as pool:
            jobs = [(p, code, "triton") for _label, p, code in items]
            if args.loop:
                while True:
                    pool.evaluate_many(jobs)
            rounds, verdicts = [], []
            for r in range(args.rounds):
                t0 = time.monotonic()
                verdicts.append(pool.evaluate_many(jobs))
                rounds.append(time.monotonic() - t0)
                bad = [f"{label}: {v.status.value} {v.flags} {str(v.details.get('reason'))[:160]}"
               + (f" | error: {v.error[:200]!r}" if v.error else "")
               + (f" | recheck: {v.details['recheck']}" if "recheck" in v.details else "")
                       for (label, _p, _c), v in zip(items, verdicts[-1]) if not v.correct or v.flags]
                print(f"round {r + 1}: {len(jobs)} checks in {rounds[-1]:.1f} s, {len(bad)} not `correct` or flagged",
                      *bad, sep="\n    ", flush=True)
            device = pool.gpu_names[0] if gpu else "CPU (Triton interpreter)"
    finally:
        for proc in helpers:
            proc.kill()
    print(f"device: {device}; torch {torch.__version__}; kforge from {kforge_root()}; workers/GPU {args.workers}; "
          f"busy processes beside: {args.busy}; timing trials {cfg.timing_trials}; start-ups at once "
          f"{cfg.startups_per_gpu or 'unlimited'}")
    heads = ("candidate", "verdict", "calls") + tuple(s.removesuffix("_s") for s in STAGES) + ("total s",)
    table = []
    last = verdicts[-1]
    for (label, _p, _c), v in zip(items, last):
        d = v.details.get("durations", {})
        verdict = v.status.value + ("+" + "+".join(v.flags) if v.flags else "")
        table.append((label, verdict, str(d.get("timed_calls", "-")),
                      *[f"{d[s]:.3f}" if s in d else "-" for s in STAGES], f"{v.run_s:.2f}"))
    print_table(heads, table)
    med = {s: statistics.median(vals) for s in STAGES
           if (vals := [v.details["durations"][s] for v in last if s in v.details.get("durations", {})])}
    print("medians: " + ", ".join(f"{s.removesuffix('_s')} {x:.3f} s" for s, x in med.items())
          + f", check {statistics.median(v.run_s for v in last):.3f} s")
    n = len(items)
    print(f"rounds: {', '.join(f'{r:.1f} s' for r in rounds)}; the last: {n} checks = {60 * n / rounds[-1]:.1f} "
          f"checks/min on one {'GPU' if gpu else 'CPU pool'}")
    wrong = [(label, v.status.value, v.flags, v.details.get("reason"), (v.error or "")[:200]) for vs in verdicts
             for (label, _p, _c), v in zip(items, vs) if not v.correct or v.flags]
    rechecked = [v.details["recheck"].get("rounds", 1) for vs in verdicts for v in vs if "recheck" in v.details]
    print(f"re-measured before a timing flag: {len(rechecked)} of {n * len(verdicts)} checks "
          f"({sum(rechecked)} paired re-measures)")
    print(f"honest checks not `correct` or flagged: {len(wrong)} of {n * len(verdicts)}")
    for w in wrong:
        print("  ", *w)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

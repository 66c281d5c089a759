#!/usr/bin/env python3
"""Timing fidelity: kforge's speedup against the same kernel timed the KernelBench way, in one run.

    python -m bench.timing_fidelity --problems .evalcarry/problems.jsonl [--cache-dir DIR]

For 10 level-1 problems with a correct Triton kernel (bench/kb_candidates.py), the kernel is judged by
kforge's pool (sandboxed child, kforge's own eager baseline), then timed in this process as KernelBench's
evaluator times it: CUDA events on the current stream, 3 warm-up calls, 100 trials, a 256 MB L2 flush
before each trial, the mean. The reference Model is timed the same way, and the two speedups compared.
The last line says whether every kforge speedup is within 5% of the KernelBench-way one; exit 0 only then.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import types
from pathlib import Path

from bench.common import kernelbench_jsonl
from bench.kb_candidates import correct_candidates

PROBLEMS = (1, 2, 13, 16, 4, 12, 88, 94, 47, 48)


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def kernelbench_ms(model, inputs, trials: int = 100, warmup: int = 3) -> float:
    """KernelBench's timing: events around each call on the current stream, L2 flushed before each."""
    import torch

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.fmean(times)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.timing_fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(kernelbench_jsonl()), help="KernelBench's problems.jsonl "
                    "(default: $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl)")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args()

    import torch

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool
    from kforge.problems.record import Problem

    rows = {r["problem_id"]: r for r in map(json.loads, Path(args.problems).read_text().splitlines())
            if r["level"] == 1}
    kernels = correct_candidates()
    items = [(Problem(1, pid, rows[pid]["name"], rows[pid]["code"], source="kernelbench"), kernels[pid])
             for pid in PROBLEMS]
    with EvalPool(EvaluatorConfig(), devices=[0], cache_dir=args.cache_dir) as pool:
        verdicts = pool.evaluate_many([(p, code, "triton") for p, code in items])
    work = Path(tempfile.mkdtemp(prefix="kforge-fidelity-"))
    table, ok = [], True
    for (problem, code), v in zip(items, verdicts):
        ref_path, new_path = work / f"ref_{problem.problem_id}.py", work / f"new_{problem.problem_id}.py"
        ref_path.write_text(problem.code)
        new_path.write_text(problem.code + "\n\n" + code)  # KernelBench runs the candidate beside the reference
        ref_mod, new_mod = load(ref_path, f"ref_{problem.problem_id}"), load(new_path, f"new_{problem.problem_id}")
        torch.manual_seed(0)
        init = ref_mod.get_init_inputs()
        with torch.device("cuda"):
            torch.manual_seed(0)
            ref = ref_mod.Model(*init).cuda()
            torch.manual_seed(0)
            new = new_mod.ModelNew(*init).cuda()
            torch.manual_seed(1)
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref_mod.get_inputs()]
        ref_ms, new_ms = kernelbench_ms(ref, inputs), kernelbench_ms(new, inputs)
        kb = ref_ms / new_ms
        ratio = (v.speedup / kb) if v.speedup else float("nan")
        good = v.correct and v.speedup is not None and abs(ratio - 1) <= 0.05
        ok &= good
        table.append((problem.name[:36], v.status.value, f"{v.timings.median_ms:.3f}" if v.timings else "-",
                      f"{v.baseline.median_ms:.3f}" if v.baseline else "-", f"{v.speedup:.3f}" if v.speedup else "-",
                      f"{new_ms:.3f}", f"{ref_ms:.3f}", f"{kb:.3f}", f"{ratio:.3f}", "ok" if good else "OFF"))
        del inputs, ref, new
        torch.cuda.empty_cache()
    heads = ("problem", "verdict", "kforge kernel ms", "kforge eager ms", "kforge speedup", "KB kernel ms",
             "KB eager ms", "KB speedup", "kforge/KB", "")
    widths = [max(len(str(r[i])) for r in table + [heads]) for i in range(len(heads))]
    print(f"device: {torch.cuda.get_device_name(0)}  torch {torch.__version__}")
    print(" | ".join(h.ljust(w) for h, w in zip(heads, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    print(f"\n{'WITHIN 5%' if ok else 'NOT WITHIN 5%'}: kforge speedup / KernelBench-way speedup for {len(table)} kernels")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

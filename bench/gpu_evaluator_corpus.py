"""Run the candidate corpus (tests/candidates) through the evaluator on a GPU and print a table.

    python bench/gpu_evaluator_corpus.py            # GPU 0 (falls back to CPU without one)
    python bench/gpu_evaluator_corpus.py --cpu      # the same corpus on the Triton interpreter

Every row says what the evaluator was expected to say and what it said; the exit code is 1 when
any row disagrees. After every candidate a correct kernel is evaluated again, to show the pool
survived (crashes, illegal addresses, hangs, escapes).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _manifest():
    path = ROOT / "tests" / "candidates" / "manifest.py"
    spec = importlib.util.spec_from_file_location("kforge_candidate_manifest", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--timing-trials", type=int, default=20)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--memory-limit-gb", type=float, default=32.0)
    args = ap.parse_args()

    import torch

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool, sandbox
    from kforge.problems.record import Problem

    m = _manifest()
    gpu = torch.cuda.is_available() and not args.cpu
    os.environ.setdefault("HF_TOKEN", "hf_corpus_secret_value")
    cfg = EvaluatorConfig(num_correct_trials=3, run_timeout_s=10.0, compile_timeout_s=240.0, memory_limit_gb=args.memory_limit_gb,
                          timing_trials=args.timing_trials, warmup_trials=3)
    print("sandbox on this machine:")
    for name, active, detail in sandbox.explain():
        print(f"  [{'x' if active else ' '}] {name}: {detail}")
    cases = [c for c in m.CASES if (c.gpu_only <= gpu) and not (c.cpu_only and gpu)]
    good = (ROOT / "tests" / "candidates" / "relu_correct.py").read_text()
    rows = []
    t_all = time.monotonic()
    with EvalPool(cfg, devices=[0] if gpu else None, cache_dir=args.cache_dir) as pool:
        print(f"device: {pool.gpu_names[0]}  torch {torch.__version__}")
        for c in cases:
            code = c.code().replace("__PORT__", "9").replace("__SLEEP__", "4321.5").replace(
                "__TARGET__", "/tmp/kforge-escape-check.txt").replace("__POOL_PID__", str(os.getpid()))
            t0 = time.monotonic()
            v = pool.submit(Problem(*m.PROBLEMS[c.problem]), code, c.backend).result()
            wall = time.monotonic() - t0
            after = pool.submit(Problem(*m.PROBLEMS["relu"]), good, "triton", measure=False).result()
            ok = (v.status.value in c.status.split("|") and all(any(f.startswith(x) for f in v.flags) for x in c.flags)
                  and v.correct == c.correct and after.correct)
            if not ok:
                print(f"--- {c.file}: {v.status.value} {v.flags}\n{v.feedback}\n{v.details.get('reason', '')}", flush=True)
            rows.append((c.file, c.backend, c.status, v.status.value, ",".join(v.flags) or "-",
                         f"{v.speedup:.2f}" if v.speedup is not None else "-",
                         f"{v.timings.median_ms:.4f}" if v.timings else "-", f"{wall:.1f}", "ok" if ok else "MISMATCH",
                         "yes" if after.correct else "NO", v.feedback.splitlines()[0][:90]))
    heads = ("candidate", "backend", "expected", "got", "flags", "speedup", "median ms", "wall s", "check",
             "pool ok after", "feedback (first line)")
    widths = [max(len(str(r[i])) for r in rows + [heads]) for i in range(len(heads))]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(heads, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    bad = [r for r in rows if r[8] != "ok"]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} as expected; total {time.monotonic() - t_all:.1f} s;"
          f" escape file exists: {os.path.exists('/tmp/kforge-escape-check.txt')}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

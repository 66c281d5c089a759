#!/usr/bin/env python3
"""Verdict repeatability at full KernelBench size: the same honest kernel, judged again and again.

    python -m bench.repeatability --problems .evalcarry/problems.jsonl [--checks 3] [--cache-dir DIR]

Honest Triton and CUDA kernels for level-1 problems whose inputs are 6-9 GB are each checked `--checks`
times through `kforge check --json` (a fresh process every time, one cache folder shared by all), then
once more all together through `kforge eval --candidates` (one pool run per backend). One row per kernel: the verdicts,
the speedups, their spread (max/min - 1) and the wall time of each check. The last line says whether every
verdict was the same and every speedup within 5% of the kernel's others; exit 0 only then.
Needs a GPU (the inputs do not fit a CPU run's time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, kernelbench_jsonl, print_table
from bench.kb_candidates import BIG, LOSS, MATVEC, REDUCE

CUDA_ELEMENTWISE = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>

__global__ void ew_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = __EXPR__; }
}

torch::Tensor ew_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    ew_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
cpp_src = "torch::Tensor ew_cuda(torch::Tensor x);"
ext = load_inline(name="kforge___NAME__", cpp_sources=cpp_src, cuda_sources=cuda_src, functions=["ew_cuda"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.ew_cuda(x.contiguous())
'''


def kernels() -> list[tuple[int, str, str]]:
    """(problem id, backend, source): honest kernels for problems with inputs of 6.4 GB or more."""
    return [
        (47, "triton", REDUCE.replace("__OP__", "0").replace("__RET__", "out.unsqueeze(1)")),  # sum, 8.6 GB
        (49, "triton", REDUCE.replace("__OP__", "2").replace("__RET__", "out")),  # max over a dim, 8.6 GB
        (4, "triton", MATVEC),  # matrix-vector, 8.6 GB
        (94, "triton", LOSS.replace("__OP__", "0")),  # MSE loss, 8.6 GB
        (19, "triton", BIG[19]),  # ReLU, 6.4 GB
        (23, "triton", BIG[23]),  # softmax, 6.4 GB
        (19, "cuda", CUDA_ELEMENTWISE.replace("__EXPR__", "v > 0.f ? v : 0.f").replace("__NAME__", "relu")),
        (21, "cuda", CUDA_ELEMENTWISE.replace("__EXPR__", "1.f / (1.f + __expf(-v))").replace("__NAME__", "sigmoid")),
    ]


def check(path: Path, pid: int, backend: str, problems: str, env: dict[str, str]) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "kforge", "check", str(path), "--problem", f"1/{pid}", "--source", problems,
           "--backend", backend, "--json"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.monotonic() - t0
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), wall
    except (json.JSONDecodeError, IndexError):
        return {"status": f"no verdict (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"}, wall


def label(v: dict) -> str:
    flags = ",".join(v.get("flags") or [])
    return v.get("status", "?") + (f"[{flags}]" if flags else "")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.repeatability", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=str(kernelbench_jsonl()), help="KernelBench's problems.jsonl "
                    "(default: $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl)")
    ap.add_argument("--checks", type=int, default=3)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--pool-timeout", type=float, default=900.0)
    args = ap.parse_args()
    problems = str(Path(args.problems).resolve())
    work = Path(tempfile.mkdtemp(prefix="kforge-repeat-"))
    env = {**os.environ, "KFORGE_CACHE_DIR": args.cache_dir or str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    rows = []
    for pid, backend, code in kernels():
        path = work / f"p{pid}_{backend}.py"
        path.write_text(code)
        runs = [check(path, pid, backend, problems, env) for _ in range(args.checks)]
        rows.append({"pid": pid, "backend": backend, "path": path, "checks": runs})
        print(f"1/{pid} {backend}: " + "; ".join(f"{label(v)} {v.get('speedup') or '-'} {w:.1f}s" for v, w in runs),
              flush=True)
    # The same kernels once more, together, through one pool run per backend.
    pool: dict[tuple[int, str], dict] = {}
    t0 = time.monotonic()
    for backend in sorted({r["backend"] for r in rows}):
        cands, out = work / f"candidates-{backend}.jsonl", work / f"pool-{backend}.json"
        with cands.open("w") as fh:
            for r in rows:
                if r["backend"] == backend:
                    fh.write(json.dumps({"problem": f"1/{r['pid']}", "code": r["path"].read_text()}) + "\n")
        proc = subprocess.run([sys.executable, "-m", "kforge", "eval", "--candidates", str(cands), "--source", problems,
                               "--level", "1", "--backend", backend, "--out", str(out)], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=args.pool_timeout)
        if not out.exists():
            print(f"pool run ({backend}) failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
            continue
        for rec in json.loads(out.read_text()).get("samples", []):
            pid = int(str(rec["problem_key"]).split("/")[-1])
            pool[(pid, backend)] = rec.get("verdict") or {}
    pool_wall = time.monotonic() - t0
    print(f"\npool run: {len(rows)} candidates in {pool_wall:.0f} s\n")
    heads = ("problem", "backend", "verdicts (checks, then pool)", "speedups", "spread", "wall s per check")
    table, stable = [], True
    for r in rows:
        verdicts = [v for v, _ in r["checks"]]
        pv = pool.get((r["pid"], r["backend"]))
        allv = verdicts + ([pv] if pv else [])
        speeds = [float(v["speedup"]) for v in allv if v.get("speedup")]
        spread = max(speeds) / min(speeds) - 1 if speeds else float("nan")
        same = len({label(v) for v in allv}) == 1 and pv is not None
        ok = same and (not speeds or spread <= 0.05)
        stable &= ok
        table.append((f"1/{r['pid']}", r["backend"], " ".join(label(v) for v in allv),
                      " ".join(f"{s:.2f}" for s in speeds) or "-", f"{spread:.1%}" if speeds else "-",
                      " ".join(f"{w:.1f}" for _, w in r["checks"])))
    print_table(heads, table)
    print(f"\n{'REPEATABLE' if stable else 'NOT REPEATABLE'}: {len(rows)} kernels x {args.checks} checks + 1 pool run; "
          "same verdict every time and speedups within 5%" + ("" if stable else ": see the rows above"))
    return 0 if stable else 1


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""How busy each GPU and each role kept the GPUs through a run's steps: NVML sampled during the steps,
not read at their end.

    python -m bench.gpu_busy record --out busy.jsonl [--every 0.5]      # until killed (SIGTERM/SIGINT)
    python -m bench.gpu_busy summary busy.jsonl RUN_FOLDER [--skip 1]   # over the run's steps

`record` writes one line per sample: each GPU's utilisation (the share of the last sample period in which a
kernel ran) and, per role, the SM utilisation NVML attributes to that role's processes and the GPU memory
they hold. A process's role is
the KFORGE_ROLE of the process or of its nearest ancestor (vLLM's engine core and the eval pool's children
inherit their parent's), "other" when none has one.
`summary` keeps the samples inside the run's steps (from metrics.jsonl: a step ends at its record's `time`
and lasted `time/step_s`; `--skip` leaves out the first steps, which pay compilation and warm-up) and prints
the busy fraction per GPU and per role, each role's peak memory per GPU (over the whole recording), and the
steps' time per stage, rollout tokens/s, learner and sync seconds.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path


def role_of(psutil, pid: int, cache: dict[int, str]) -> str:
    """The KFORGE_ROLE of `pid` or of its nearest ancestor that has one ("other" when none), cached by pid."""
    if pid not in cache:
        role = "other"
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.parents()]:
                if p.environ().get("KFORGE_ROLE"):
                    role = p.environ()["KFORGE_ROLE"]
                    break
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        cache[pid] = role
    return cache[pid]


def record(out: Path, every: float) -> int:
    import psutil
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    seen = [0] * len(handles)  # NVML returns per-process samples newer than this timestamp (microseconds)
    roles: dict[int, str] = {}
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    with out.open("a") as f:
        while not stop:
            line: dict = {"t": time.time(), "gpus": []}
            for i, h in enumerate(handles):
                per_role: dict[str, float] = defaultdict(float)
                try:
                    for s in pynvml.nvmlDeviceGetProcessUtilization(h, seen[i]):
                        seen[i] = max(seen[i], s.timeStamp)
                        per_role[role_of(psutil, s.pid, roles)] += s.smUtil
                except pynvml.NVMLError:
                    pass  # no process sample in this period
                mem: dict[str, float] = defaultdict(float)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    mem[role_of(psutil, proc.pid, roles)] += (proc.usedGpuMemory or 0) / 2**30
                line["gpus"].append({"util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu, "roles": dict(per_role),
                                     "gib": dict(mem)})
            f.write(json.dumps(line) + "\n")
            f.flush()
            time.sleep(every)
    return 0


def summary(samples_path: Path, run: Path, skip: int) -> int:
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [s for s in steps if "time/step_s" in s][skip:]
    if not steps:
        print(f"{run}: no step after the first {skip}")
        return 1
    windows = [(s["time"] - s["time/step_s"], s["time"]) for s in steps]
    samples = [json.loads(x) for x in samples_path.read_text().splitlines() if x.strip()]
    inside = [s for s in samples if any(a <= s["t"] <= b for a, b in windows)]
    if not inside:
        print(f"{samples_path}: no sample inside the steps")
        return 1
    n_gpu = len(inside[0]["gpus"])
    print(f"run {run.name}: steps {steps[0]['step']}-{steps[-1]['step']}, {len(inside)} samples inside them")
    for key, label in (("time/step_s", "step s"), ("time/rollout_wall_s", "rollout wall s"),
                       ("time/generate_s", "generate s"), ("time/eval_sum_s", "eval s (summed)"),
                       ("throughput/generate_tok_s", "rollout tokens/s"), ("time/learn_s", "learner s"),
                       ("time/sync_s", "sync s"), ("time/checkpoint_s", "checkpoint s")):
        values = [s[key] for s in steps if key in s]
        if values:
            print(f"  {label:<17} median {statistics.median(values):9.2f}   ({', '.join(f'{v:.1f}' for v in values)})")
    roles = sorted({r for s in inside for g in s["gpus"] for r in g["roles"]})
    print(f"\n{'GPU':<5} | {'busy %':>7} | " + " | ".join(f"{r + ' SM %':>14}" for r in roles))
    for i in range(n_gpu):
        busy = statistics.mean(s["gpus"][i]["util"] for s in inside)
        per = [statistics.mean(s["gpus"][i]["roles"].get(r, 0.0) for s in inside) for r in roles]
        print(f"{i:<5} | {busy:>7.1f} | " + " | ".join(f"{v:>14.1f}" for v in per))
    held = sorted({r for s in samples for g in s["gpus"] for r in g.get("gib", {})})
    print(f"\n{'GPU':<5} | " + " | ".join(f"{r + ' peak GiB':>16}" for r in held) + f" | {'all peak GiB':>12}")
    for i in range(n_gpu):
        peaks = [max(s["gpus"][i].get("gib", {}).get(r, 0.0) for s in samples) for r in held]
        total = max(sum(s["gpus"][i].get("gib", {}).values()) for s in samples)
        print(f"{i:<5} | " + " | ".join(f"{v:>16.1f}" for v in peaks) + f" | {total:>12.1f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_busy", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--every", type=float, default=0.5)
    s = sub.add_parser("summary")
    s.add_argument("samples")
    s.add_argument("run")
    s.add_argument("--skip", type=int, default=1)
    args = ap.parse_args()
    if args.cmd == "record":
        return record(Path(args.out), args.every)
    return summary(Path(args.samples), Path(args.run), args.skip)


if __name__ == "__main__":
    sys.exit(main())

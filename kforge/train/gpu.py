"""GPU memory and utilisation per role, read through NVML (nvidia-ml-py) or nvidia-smi; never initialises CUDA."""

from __future__ import annotations

import shutil
import subprocess

from kforge.train.placement import ROLES, Plan


def _query_smi() -> dict[str, tuple[float, float, float]]:
    """{physical id: (used GiB, total GiB, utilisation %)}."""
    try:
        import pynvml

        pynvml.nvmlInit()
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            out[str(i)] = (mem.used / 2**30, mem.total / 2**30, float(util.gpu))
        return out
    except Exception:  # no NVML bindings, or no driver: fall back to the CLI
        pass
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            out[parts[0]] = (float(parts[1]) / 1024, float(parts[2]) / 1024, float(parts[3]))
    return out


def role_gpu_stats(plan: Plan) -> dict[str, float]:
    if plan.mode == "cpu":
        return {}
    stats = _query_smi()
    out: dict[str, float] = {}
    for role in ROLES:
        ids = [plan.gpus[i] for i in getattr(plan, role)]
        rows = [stats[i] for i in ids if i in stats]
        if rows:
            out[f"gpu/{role}/mem_used_gb"] = sum(r[0] for r in rows)
            out[f"gpu/{role}/util_pct"] = sum(r[2] for r in rows) / len(rows)
    return out

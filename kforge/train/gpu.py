"""GPU memory and utilisation per role for the step metrics, read through `kforge.gpus` (nvidia-smi or
NVML), never by initialising CUDA in the trainer's process."""

from __future__ import annotations

from kforge.gpus import matches, query_gpus
from kforge.train.placement import ROLES, Plan


def role_gpu_stats(plan: Plan) -> dict[str, float]:
    if plan.mode == "cpu":
        return {}
    gpus, _ = query_gpus()
    out: dict[str, float] = {}
    for role in ROLES:
        rows = [g for i in getattr(plan, role) for g in gpus or [] if matches(plan.gpus[i], g)]
        if rows:
            out[f"gpu/{role}/mem_used_gb"] = sum(g.used_mib for g in rows) / 1024
            utils = [g.util_pct for g in rows if g.util_pct is not None]
            if utils:
                out[f"gpu/{role}/util_pct"] = sum(utils) / len(utils)
    return out

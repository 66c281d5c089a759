"""The machine's NVIDIA GPUs as nvidia-smi or NVML report them, read without initialising CUDA in this
process (a forked eval zygote must never inherit a CUDA context). Used by `kforge doctor` and by the
trainer's per-role memory/utilisation metrics."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class Gpu:
    index: str
    uuid: str
    name: str
    total_mib: float
    used_mib: float
    driver: str
    util_pct: float | None = None  # compute utilisation over the driver's last sample period


def query_gpus() -> tuple[list[Gpu] | None, str]:
    """(all GPUs, how they were read); None when neither nvidia-smi nor NVML answers."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run(
                [smi, "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version,utilization.gpu",
                 "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"nvidia-smi did not answer: {exc}"
        if res.returncode != 0:
            return None, f"nvidia-smi failed: {(res.stderr or res.stdout).strip().splitlines()[-1:] or ['?']}"
        gpus = []
        for line in res.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 7 and parts[0].isdigit():
                gpus.append(Gpu(parts[0], parts[1], parts[2], _num(parts[3]), _num(parts[4]), parts[5], _num(parts[6])))
        return gpus, "nvidia-smi"
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        gpus = []
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            gpus.append(Gpu(str(i), _text(uuid), _text(name), mem.total / 2**20, mem.used / 2**20, _text(driver), util))
        return gpus, "NVML"
    except Exception:  # no bindings or no driver: there is no GPU this process could use
        return None, "no nvidia-smi and no NVML"


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)



"""The machine's NVIDIA GPUs: one query and one logical -> physical mapping for every user.

Logical indices are what a process with our CUDA_VISIBLE_DEVICES sees (0..n-1); physical ids are what a
child process needs in its own CUDA_VISIBLE_DEVICES (an index, a `GPU-` UUID or a `MIG-` instance id,
exactly as the parent's variable spells it). Nothing here initialises CUDA (a forked eval zygote must
never inherit a CUDA context): GPUs are read through nvidia-smi or NVML. Placement, the rollout and
learner workers, the eval pool and `kforge doctor` all go through this module.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from kforge.errors import UserError


class GpuIndexError(UserError):
    """A logical GPU index that this process cannot see; the message is one line for the user."""


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
    """(all GPUs of the machine, how they were read); None when neither nvidia-smi nor NVML answers."""
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
            util = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            gpus.append(Gpu(str(i), _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h)),
                            mem.total / 2**20, mem.used / 2**20, _text(driver), util))
        return gpus, "NVML"
    except Exception:  # no bindings or no driver: there is no GPU this process could use
        return None, "no nvidia-smi and no NVML"


@lru_cache(maxsize=4)
def _machine_gpus() -> tuple[Gpu, ...]:
    """The GPU listing, read once per process (names and UUIDs do not change while we run)."""
    gpus, _ = query_gpus()
    return tuple(gpus or ())


def matches(entry: str, gpu: Gpu) -> bool:
    return entry == gpu.index or (entry.startswith("GPU-") and gpu.uuid.startswith(entry))


def visible_entries(env: str | None, gpus: list[Gpu]) -> list[str]:
    """The physical ids a process with CUDA_VISIBLE_DEVICES=`env` sees, in logical order. Pure: CUDA's rules
    are that the list ends at the first entry that names no device (`-1` is the usual way to hide all),
    an entry may be an index, a UUID prefix or a MIG instance, and no variable means every GPU."""
    if env is None:
        return [g.index for g in gpus]
    out: list[str] = []
    for entry in (x.strip() for x in env.split(",")):
        if not entry or entry == "-1":
            break
        if entry.startswith("MIG-"):
            out.append(entry)  # MIG instances are not listed per GPU by the query; trust the variable
            continue
        if gpus and not any(matches(entry, g) for g in gpus):
            break
        if not gpus and not (entry.isdigit() or entry.startswith("GPU-")):
            break
        if entry not in out:
            out.append(entry)
    return out


def visible_records(gpus: list[Gpu]) -> list[Gpu]:
    """The query's records of the GPUs this process sees (a MIG instance shows as the whole GPU list: the
    query does not list instances)."""
    entries = visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    if any(e.startswith("MIG-") for e in entries):
        return gpus
    return [g for e in entries for g in gpus if matches(e, g)]


def visible_ids() -> list[str]:
    """Physical ids of the GPUs this process may use, in logical order; [] without a GPU."""
    gpus = list(_machine_gpus())
    if not gpus:
        return []  # no driver answers: whatever the variable says, CUDA will find no device
    return visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)


def check_indices(logicals: list[int], visible: int, what: str = "GPU") -> None:
    """The one check of logical GPU indices against the `visible` count (`len(visible_ids())`): every
    index a user or a config names (placement, `kforge eval --gpus`, `problems baseline --gpu`) goes here."""
    bad = [i for i in logicals if not 0 <= i < visible]
    if bad:
        seen = f"{visible} GPU(s) visible (0..{visible - 1})" if visible else "no GPU is visible"
        raise GpuIndexError(f"{what} {bad[0]} does not exist: {seen}")


def physical_id(logical: int) -> str:
    """The id that names logical GPU `logical` in a child's CUDA_VISIBLE_DEVICES."""
    ids = visible_ids()
    check_indices([logical], len(ids))
    return ids[logical]


def default_devices() -> list[int]:
    """GPU 0 when this process sees a GPU, else none (the CPU): read through the driver, never CUDA."""
    return [0] if visible_ids() else []


def child_visible_devices(logicals: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a child that should see these logical GPUs (in this order)."""
    return ",".join(physical_id(i) for i in logicals)


def gpu_name(logical: int) -> str:
    """The product name of logical GPU `logical` (e.g. 'NVIDIA H100 80GB HBM3'); MIG instances carry their
    parent's name. Falls back to `cuda<physical id>` when the driver does not say."""
    phys = physical_id(logical)
    for g in _machine_gpus():
        if matches(phys, g):
            return g.name
    if phys.startswith("MIG-"):
        parent = _mig_parent_name(phys)
        if parent:
            return f"{parent} MIG"
    return f"cuda{phys}"


def _mig_parent_name(mig_uuid: str) -> str | None:
    """`nvidia-smi -L` lists each GPU followed by its MIG instances with their UUIDs."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    parent = None
    for line in out.splitlines():
        m = re.match(r"GPU \d+: (.+?) \(UUID", line.strip())
        if m:
            parent = m.group(1)
        elif mig_uuid in line:
            return parent
    return None


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

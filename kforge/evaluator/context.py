"""What every parent-side stage needs to start a child: config, cgroups, folders and the sandbox request."""

from __future__ import annotations

import hashlib
import os
import secrets as _secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator.arena import Arena
from kforge.evaluator.children import CgroupFactory, Child
from kforge.evaluator.contention import GpuActivity
from kforge.evaluator.slot import Slot

_SALT_LOCK = threading.Lock()


def sha(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


@dataclass
class PoolContext:
    cfg: EvaluatorConfig
    cgroups: CgroupFactory
    work_dir: Path  # scratch folders of children (removed with the pool)
    cache_dir: Path  # kforge's cache: children never read or write it, except a CUDA build folder
    secrets: list[str]  # values redacted from anything shown
    activity: GpuActivity | None = None  # who else used each device, for timed runs (training only)

    def salt(self) -> str:
        """A per-cache secret: trial and timing seeds derive from it, so no candidate can know them in
        advance, while the reference outputs stay cacheable across runs."""
        path = self.cache_dir / "seed-salt"
        with _SALT_LOCK:
            if not path.exists():
                # Written beside its final name, then linked: the first writer wins, across threads and pools.
                tmp = path.with_suffix(f".{os.getpid()}.{_secrets.token_hex(4)}.tmp")
                tmp.write_text(_secrets.token_hex(16))
                os.chmod(tmp, 0o600)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink()
            return path.read_text().strip()

    def warm_triton(self, slot: Slot) -> Path:
        """Triton's compiled driver helpers for this GPU, written only by the trusted reference child;
        each candidate gets a copy in its scratch folder, so none can poison another's cache."""
        path = self.cache_dir / "triton-warm" / sha(slot.gpu_name)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def child(self, slot: Slot, kind: str, job: dict[str, Any], writable: list[str] | None = None,
              triton_cache: str | None = None, arena: Arena | None = None,
              readable: list[str] | None = None) -> Child:
        """Fork a sandboxed child of `kind` from the slot's zygote and hand it `job` (and `arena`, the
        shared memory its outputs go to); `readable`: folders it may read beside the system's, never write."""
        writable = list(writable or [])
        env = dict(slot.zygote.env)
        copy: dict[str, str] = {}
        if slot.on_gpu:
            writable += [str(p) for p in Path("/dev").glob("nvidia*")]
            # CUDA init fails (cudaGetDeviceCount error 304) unless it may write its threads' names to
            # /proc/<pid>/task/<tid>/comm; Landlock cannot name those per thread. The child's /proc is
            # its own (PID namespace), /proc/sys and /sys are mounted read-only (zygote._view), and an
            # unprivileged uid cannot write what root owns there.
            writable += ["/proc"]
            env["CUDA_CACHE_PATH"] = "/nonexistent"
            env["CUDA_CACHE_DISABLE"] = "1"
            if kind == "reference":
                env["TRITON_CACHE_DIR"] = triton_cache or str(self.warm_triton(slot))
                writable.append(env["TRITON_CACHE_DIR"])
            else:
                copy["triton-cache"] = str(self.warm_triton(slot))
        writable += [p for p in ("/dev/null", "/dev/zero", "/dev/urandom") if os.path.exists(p)]
        request = {"env": env, "writable": writable, "readable": list(readable or []),
                   "memory_bytes": int(self.cfg.memory_limit_gb * (1 << 30)),
                   "restrict_reads": self.cfg.sandbox_restrict_reads, "copy_into_scratch": copy,
                   "triton_cache_in_scratch": bool(copy)}
        return Child(slot.zygote, self.cgroups, kind, request, job, str(self.work_dir), pids_max=self.cfg.pids_max,
                     arena=arena)

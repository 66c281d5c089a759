"""Which LoRA adapters an engine must keep: the current one, and every older one a request still names.

With pipelining, the next step's rollouts start under one adapter and a sync replaces it while they are in
flight; removing the replaced adapter at once would pull it from under those requests. Each request leases
its adapter id for its lifetime; a replaced (retired) adapter is removed only when its last lease ends.
Thread-safe: requests finish on the engine's event loop while syncs come from the trainer's thread.

The copies an engine loads are written where that is fastest (``EngineCopies``: /dev/shm when it has
room, else the run folder).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("kforge.rollout")


class AdapterLeases:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[int, int] = {}
        self._retired: set[int] = set()

    def acquire(self, adapter_id: int) -> None:
        with self._lock:
            self._inflight[adapter_id] = self._inflight.get(adapter_id, 0) + 1

    def release(self, adapter_id: int) -> bool:
        """One request of `adapter_id` finished; True when that was the last one of a retired adapter (the
        caller removes it from the engine now)."""
        with self._lock:
            left = self._inflight.get(adapter_id, 0) - 1
            if left < 0:
                raise RuntimeError(f"adapter {adapter_id} released more often than acquired")
            if left:
                self._inflight[adapter_id] = left
                return False
            self._inflight.pop(adapter_id, None)
            if adapter_id in self._retired:
                self._retired.discard(adapter_id)
                return True
            return False

    def retire(self, adapter_id: int) -> bool:
        """`adapter_id` was replaced; True when no request holds it (remove it now), else it goes with the
        last release."""
        with self._lock:
            if self._inflight.get(adapter_id):
                self._retired.add(adapter_id)
                return False
            return True

    def in_flight(self, adapter_id: int) -> int:
        with self._lock:
            return self._inflight.get(adapter_id, 0)


SHM = Path("/dev/shm")
# Room asked of /dev/shm before the first copy, whose size is not known yet; after it, twice the last copy.
FIRST_COPY_ROOM = 256 * 2**20


class EngineCopies:
    """Where the adapter versions handed to the rollout engine are written: ``/dev/shm/kforge-<run>-<hash of
    its path>`` (memory:
    no disk write, no fsync wait, read back at memory speed) when /dev/shm is a writable folder with room,
    else ``fallback`` (the run folder's adapters/). A copy that fails in /dev/shm (full) moves this and
    every later copy to ``fallback``. Each copy is written whole under a temporary name and renamed (by the
    learner's save), so the engine never reads a half-written folder. ``close`` removes the /dev/shm
    folder; a folder of the same tag left by a process that died is removed when the next one starts."""

    def __init__(self, fallback: Path, shm: Path | bool = True, dtype: str | None = None) -> None:
        """``shm``: True = /dev/shm (``SHM``), False = never, or another folder standing in for it."""
        self.fallback = Path(fallback)
        shm = (SHM if shm else None) if isinstance(shm, bool) else Path(shm)
        self.dtype = dtype if dtype in ("bfloat16", "float16") else None  # the engine's; None: as the learner has it
        where = str(self.fallback.resolve())
        tag = f"kforge-{self.fallback.parent.name}-{hashlib.sha1(where.encode()).hexdigest()[:10]}"
        self.shm_root = shm / tag if shm is not None and _usable(shm) else None
        if self.shm_root is not None:
            shutil.rmtree(self.shm_root, ignore_errors=True)  # an earlier process of this run that died
        self._last_bytes = 0

    @property
    def root(self) -> Path:
        return self.shm_root if self.shm_root is not None else self.fallback

    def path(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def write(self, version: int, save: Callable[[Path, str | None], None]) -> Path:
        """``save(folder, dtype)`` the given version's copy where it is fastest, in the engine's dtype
        (``dtype``: bfloat16 or float16; None keeps the learner's fp32); returns the folder."""
        if self.shm_root is not None:
            free = shutil.disk_usage(self.shm_root.parent).free
            if free >= max(2 * self._last_bytes, FIRST_COPY_ROOM):
                try:
                    save(self.path(version), self.dtype)
                    self._last_bytes = _bytes(self.path(version))
                    return self.path(version)
                except Exception as exc:
                    log.warning("adapter copy in %s failed (%s); writing them to %s from now on",
                                self.shm_root, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                self.fallback)
            else:
                log.warning("%s has %d MiB free, under the %d MiB an adapter copy needs; writing them to %s "
                            "from now on", self.shm_root.parent, free // 2**20,
                            max(2 * self._last_bytes, FIRST_COPY_ROOM) // 2**20, self.fallback)
            self.close()
        save(self.path(version), self.dtype)
        return self.path(version)

    def prune(self, keep: int = 3) -> None:
        """Keep the newest ``keep`` versions (older ones may still serve requests in flight)."""
        for path in (sorted(self.root.glob("v*")) if self.root.is_dir() else [])[:-keep]:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """Remove what was written in /dev/shm (the fallback folder is the run's and stays)."""
        if self.shm_root is not None:
            shutil.rmtree(self.shm_root, ignore_errors=True)
            self.shm_root = None


def _usable(shm: Path) -> bool:
    return shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())

"""Which LoRA adapters an engine must keep: the current one, and every older one a request still names.

With pipelining, the next step's rollouts start under one adapter and a sync replaces it while they are in
flight; removing the replaced adapter at once would pull it from under those requests. Each request leases
its adapter id for its lifetime; a replaced (retired) adapter is removed only when its last lease ends.
Thread-safe: requests finish on the engine's event loop while syncs come from the trainer's thread.
"""

from __future__ import annotations

import threading


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

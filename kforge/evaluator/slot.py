"""One eval device as the pool holds it: its zygote, its gate and its start-up slots.

What a child holds on its device while it works (gate.py): timed calls hold the gate alone (`timing`), any
other GPU work holds it shared (`gpu_work`), and a start-up (a fork up to the child's READY) first takes one
of at most `evaluator.startups_per_gpu` start-up slots, then the shared hold (`start_up`), in that order.
children.py is one child's process; a Slot is the device it runs on.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from kforge.evaluator.children import Zygote
from kforge.evaluator.gate import DeviceGate

T = TypeVar("T")


@dataclass
class Slot:
    """One eval device: its zygote, its gate (gate.py: timing alone, other GPU work shared) and its name."""

    index: int | None  # CUDA index (after CUDA_VISIBLE_DEVICES) or None for CPU
    zygote: Zygote
    gpu_name: str = "cpu"
    gate: DeviceGate | None = None  # a GPU's own; the CPU has none (its timing means nothing to protect)
    # At most this many children starting at once (evaluator.startups_per_gpu; None: no limit). The driver makes
    # CUDA contexts one at a time: 16 children starting together held the gate ~2.8 s each on an H100 (0.24 s
    # alone) and every timer waited for them all; waiting here holds nothing.
    startups: threading.BoundedSemaphore | None = None

    def __post_init__(self) -> None:
        if self.gate is None and self.on_gpu:
            self.gate = DeviceGate()

    @property
    def device(self) -> str:
        return "cpu" if self.index is None else "cuda"

    @property
    def on_gpu(self) -> bool:
        return self.index is not None

    @property
    def tag(self) -> str:
        import torch

        return f"{self.gpu_name}|torch{torch.__version__}"

    def timing(self) -> contextlib.AbstractContextManager[object]:
        """Held while a child is timed: no other GPU work of the pool runs on this device meanwhile."""
        return self.gate.exclusive() if self.gate is not None else contextlib.nullcontext()

    def starting(self) -> contextlib.AbstractContextManager[object]:
        """Held from before a child's fork (before the gate's shared hold) to its READY; never asked for while
        holding the gate: a start-up waiting behind a timer must not be what a shared holder waits for."""
        if self.startups is None:
            return contextlib.nullcontext()
        if self.gate is not None and self.gate.holding() is not None:
            raise RuntimeError("a start-up slot asked for while this thread holds the gate")
        return self.startups

    def start_up(self, spawn: Callable[[], T]) -> tuple[T, contextlib.ExitStack, contextlib.ExitStack]:
        """`spawn()` (a fork) under a start-up slot, then the gate's shared hold (that order: no deadlock).
        Returns its result, the slot's stack (close it at READY) and the shared hold's (closing it gives the
        slot back too); a fork that fails gives both back."""
        starting = contextlib.ExitStack()
        starting.enter_context(self.starting())
        with contextlib.ExitStack() as setting_up:
            setting_up.push(starting)
            setting_up.enter_context(self.gpu_work())
            spawned = spawn()
            return spawned, starting, setting_up.pop_all()

    def gpu_work(self) -> contextlib.AbstractContextManager[object]:
        """Held while a child does any other GPU work (start-up, trials, a reference run): several at once."""
        return self.gate.shared() if self.gate is not None else contextlib.nullcontext()

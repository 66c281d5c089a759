"""Ctrl-C and SIGTERM during `kforge train`: the first asks the loop to stop after the step, the second now."""

from __future__ import annotations

import logging
import signal
import types
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kforge.train")


# The first stopping signal this process received (SIGINT or SIGTERM), for its exit code: 128 + the signal's
# number, as a shell reports a process that a signal ended (130 for Ctrl-C, 143 for SIGTERM).
received: list[int] = []


def exit_code() -> int:
    return 128 + (received[0] if received else signal.SIGINT)


@dataclass
class StopFlag:
    """Ctrl-C once: finish the step, checkpoint, exit. Twice: stop now."""

    requested: bool = False
    _old: Any = None

    def install(self) -> None:
        def handler(signum: int, frame: types.FrameType | None) -> None:
            if not received:
                received.append(int(signum))
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
            log.warning("stop requested: finishing this step, saving a checkpoint (Ctrl-C again to stop now)")

        try:
            self._old = (signal.signal(signal.SIGINT, handler), signal.signal(signal.SIGTERM, handler))
        except ValueError:  # not in the main thread (tests): no handler
            self._old = None

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old[0])
            signal.signal(signal.SIGTERM, self._old[1])

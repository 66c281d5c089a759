"""Ctrl-C and SIGTERM during `kforge train`: the first asks the loop to stop after the step, the second now.
And the STOP file `kforge runs stop` drops: which one is for this start."""

from __future__ import annotations

import logging
import signal
import types
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kforge.runs.layout import STOP_FILE

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


def drop_stale_stop(run_dir: Path) -> None:
    """A STOP file older than this process asked an earlier start to stop (served, or left by a crash): it must
    not stop this one. One written since (`kforge runs stop` during a resume's pre-flight, while the run shows
    "starting") is for this start, and the loop serves it before its first step."""
    path = run_dir / STOP_FILE
    with suppress(FileNotFoundError):
        if path.stat().st_mtime < psutil.Process().create_time():
            path.unlink()

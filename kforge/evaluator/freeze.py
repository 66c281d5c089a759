"""Stop every process of a child while the parent reads its outputs, verify it stopped, then resume it.

With a cgroup of its own the child is frozen through the cgroup-v2 freezer (`cgroup.freeze`): every
task in the group stops, forks included, and `cgroup.events` says when they all have. Without one, the
child's process group (the outer process did setsid) gets SIGSTOP, and the parent waits until every
thread of the outer and inner processes (and their children) shows the stopped state in /proc; a
process that left the process group (setsid) is not stopped then. Either way nothing the child runs can
observe or change the arena while the parent reads it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Callable, Iterator


class FreezeError(Exception):
    """The child could not be stopped in time."""


def _events_frozen(cgroup: Path) -> bool:
    for line in (cgroup / "cgroup.events").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "frozen":
            return value.strip() == "1"
    return False


def _descendants(pid: int) -> list[int]:
    """pid and everything below it, through /proc/<pid>/task/<tid>/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                pass
    return out


def _all_stopped(pid: int) -> bool:
    for p in _descendants(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # gone: nothing left to stop
        for tid in tids:
            try:
                stat = Path(f"/proc/{p}/task/{tid}/stat").read_text()
            except OSError:
                continue
            state = stat.rpartition(")")[2].split()[0]  # the name in parentheses may hold spaces
            if state not in ("T", "t", "Z", "X"):
                return False
    return True


def _wait(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pause = 0.0002
    while not done():
        if time.monotonic() > deadline:
            raise FreezeError(f"the child did not stop within {timeout_s:g} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


@contextlib.contextmanager
def frozen(pid: int, cgroup: Path | None, timeout_s: float = 5.0) -> Iterator[None]:
    """Inside the block every process of the child (outer pid `pid`, its process group, its cgroup) is stopped."""
    if cgroup is not None and (cgroup / "cgroup.freeze").exists():
        (cgroup / "cgroup.freeze").write_text("1")
        try:
            _wait(lambda: _events_frozen(cgroup), timeout_s)
            yield
        finally:
            try:
                (cgroup / "cgroup.freeze").write_text("0")
            except OSError:
                pass
        return
    try:
        os.killpg(pid, signal.SIGSTOP)
    except OSError:
        pass  # already gone: there is nothing to stop
    try:
        _wait(lambda: _all_stopped(pid), timeout_s)
        yield
    finally:
        try:
            os.killpg(pid, signal.SIGCONT)
        except OSError:
            pass

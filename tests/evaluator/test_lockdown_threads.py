"""The lock-down holds for every thread (threat model items 2 and 5): a thread started before it, by the
candidate or a library it loaded, neither forks, execs nor uses System V IPC afterwards (the seccomp filter
is loaded for every thread, TSYNC), and a thread kforge did not start before the candidate ran ends the
child at the lock-down (Landlock restricts only the thread that asks). Each case runs in a forked process:
the rules are for good."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import threading
import time
from typing import Any, Callable

import pytest

from kforge.evaluator import confine


def _in_fork(body: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run `body(out)` in a forked process and return what it put in `out`."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child reports through the pipe
        out: dict[str, Any] = {}
        try:
            body(out)
        except BaseException as exc:  # noqa: BLE001
            out["raised"] = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(wfd, json.dumps(out).encode())
            os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    with os.fdopen(rfd) as fh:
        return json.loads(fh.read())


def _gone(known: dict[int, int]) -> None:
    """Wait until every thread not in `known` has left /proc (a joined Python thread is still ending there)."""
    deadline = time.monotonic() + 5.0
    while set(confine.threads()) - set(known) and time.monotonic() < deadline:
        time.sleep(0.01)


def _attempts(out: dict[str, Any]) -> None:
    """fork, exec (in a forked child, whose exit code says whether the shell ran) and shmget, from this thread."""
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            try:
                os.execv("/bin/sh", ["sh", "-c", "exit 7"])
            finally:
                os._exit(1)
        out["fork"] = "allowed"
        out["exec"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    except OSError as exc:
        out["fork"] = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    out["shmget"] = [libc.shmget(0, 4096, 0o1600), ctypes.get_errno()]


@pytest.mark.skipif(not confine.seccomp_available(), reason="needs libseccomp")
def test_a_thread_started_before_the_lock_down_filter_is_refused_too() -> None:
    """The thread starts first, waits, and tries after the main thread loaded the filter. Loaded for the
    calling thread only, the filter let it fork, exec and make shared memory."""
    def body(out: dict[str, Any]) -> None:
        go, seen = threading.Event(), {}
        thread = threading.Thread(target=lambda: (go.wait(), _attempts(seen)))
        thread.start()
        out["applied"] = confine.apply_no_spawn()
        go.set()
        thread.join()
        out.update(seen)

    out = _in_fork(body)
    assert out["applied"][0] and "every thread" in out["applied"][1], out
    assert out["fork"] == errno.EPERM, out
    assert out["shmget"] == [-1, errno.EPERM], out


def test_the_lock_down_refuses_a_thread_started_after_the_set_up() -> None:
    """`known` is taken before the candidate runs; a thread started later and still running at the lock-down
    ends the child (StrayThreads), before any rule is applied; one that ended before is no reason to."""
    def body(out: dict[str, Any]) -> None:
        known = confine.threads()
        assert os.getpid() in known
        gone = threading.Thread(target=lambda: None)
        gone.start()
        gone.join()
        _gone(known)
        out["ended_only"] = confine.lock_down({}, known)
        stop = threading.Event()
        stray = threading.Thread(target=stop.wait, name="torch-worker")  # a name is no credential
        stray.start()
        try:
            confine.lock_down({}, known)
            out["stray"] = "allowed"
        except confine.StrayThreads as exc:
            out["stray"] = str(exc)
        stop.set()
        stray.join()
        _gone(known)
        out["after"] = confine.lock_down({}, known)

    out = _in_fork(body)
    assert "raised" not in out, out
    assert out["ended_only"]["threads"] == 1, out
    assert out["stray"].startswith("1 thread(s) started after the set-up"), out
    assert out["after"]["threads"] == 1, out


def test_a_thread_is_named_by_its_start_time_not_its_id_alone() -> None:
    """A thread id seen again with another start time (an id reused by a later thread) is not the known one."""
    def body(out: dict[str, Any]) -> None:
        known = confine.threads()
        known[os.getpid()] -= 1  # as if the id had been another thread's before
        try:
            confine.lock_down({}, known)
            out["reused"] = "allowed"
        except confine.StrayThreads:
            out["reused"] = "refused"

    assert _in_fork(body)["reused"] == "refused"

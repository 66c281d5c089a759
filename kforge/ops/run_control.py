"""Controlling a run from outside its process: stop it, read its log, remove it, start TensorBoard on it.

Everything goes through the run folder (status.json, the STOP file, logs.log), so these work from another
terminal or over SSH. Signals are sent only to the pid the run recorded, and only after checking that this
pid is still the process that wrote the status (pids get recycled).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

import psutil

from kforge.runs.folder import LIVE, STOP_FILE, RunFolder, pid_alive
from kforge.space import atomic_write_text, check_deletable

TENSORBOARD_MISSING = "tensorboard is not installed: pip install tensorboard (or pip install 'kforge[plots]')"


class RunControlError(RuntimeError):
    """The action cannot be done to this run; one line for the user. Exit code 1 (not bad arguments)."""


def is_active(run: RunFolder) -> bool:
    return run.effective_status() in LIVE


def _owner(run: RunFolder) -> str:
    st = run.read_status()
    host = st.get("host")
    return f"pid {st.get('pid')}" + (f" on {host}" if host and host != socket.gethostname() else "")


# ---------------------------------------------------------------------------------------------- stop


def request_stop(run: RunFolder) -> Path:
    """Drop the STOP file: the training loop sees it before its next step, saves a checkpoint and exits."""
    status = run.effective_status()
    if status not in LIVE:
        raise RunControlError(f"run {run.name} is not running (status {status}); nothing to stop")
    path = run.path / STOP_FILE
    atomic_write_text(path, json.dumps({"requested": time.time(), "by_pid": os.getpid(),
                                        "host": socket.gethostname()}) + "\n")
    return path


def clear_stop(run: RunFolder) -> None:
    """Remove a served stop request, so that `kforge train --resume` does not stop again at once."""
    if not is_active(run):
        (run.path / STOP_FILE).unlink(missing_ok=True)


def wait_until_ended(run: RunFolder, timeout_s: float, poll_s: float = 0.5) -> str | None:
    """The run's status once its process has ended, or None if it is still running after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_active(run):
            return run.effective_status()
        time.sleep(poll_s)
    return None


def terminate(run: RunFolder, grace_s: float = 10.0) -> str:
    """SIGTERM to the run's process, SIGKILL to it and its children if it is still there after grace_s.

    The loop treats SIGTERM like Ctrl-C (finish the step, checkpoint, exit "stopped"); a run that does not
    make it within the grace period is killed and marked "killed": it resumes from its last checkpoint.
    Returns the final status.
    """
    st = run.read_status()
    host = st.get("host")
    if host and host != socket.gethostname():
        raise RunControlError(f"run {run.name} runs on {host}; signals only reach processes of this host: run "
                              f"`kforge runs stop {run.name} --now` there, or drop the STOP file with `kforge runs stop`")
    pid, started = st.get("pid"), st.get("pid_started")
    if st.get("status") in LIVE and pid and started is None:
        raise RunControlError(f"run {run.name}: its status records pid {pid} but not when that process started, "
                              f"so it cannot be told from another process with that pid; drop the STOP file "
                              f"with `kforge runs stop {run.name}` instead")
    if st.get("status") not in LIVE or not pid_alive(pid, started):
        raise RunControlError(f"run {run.name} is not running (status {run.effective_status()}); nothing to stop")
    proc = psutil.Process(pid)
    try:
        family = [proc, *proc.children(recursive=True)]
        proc.terminate()
    except psutil.NoSuchProcess:
        return run.effective_status()
    _, alive = psutil.wait_procs([proc], timeout=grace_s)
    killed = bool(alive)
    for p in alive:
        _kill_tree(p, family)
    # Helpers the run started (eval zygote, learner process, rollout engine) must not outlive it; killing
    # them does not change the run's own outcome.
    leftovers = [p for p in family[1:] if _running(p)]
    _, still = psutil.wait_procs(leftovers, timeout=5.0)
    for p in still:
        _kill(p)
    if killed:
        psutil.wait_procs([proc], timeout=5.0)
    if killed or run.read_status().get("status") in LIVE:
        run.set_status("killed", note=f"killed by `kforge runs stop --now` after {grace_s:g} s; "
                                      "resume continues from the last checkpoint")
    return run.effective_status()


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(p: psutil.Process) -> None:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass


def _kill_tree(p: psutil.Process, known: list[psutil.Process]) -> None:
    try:
        extra = p.children(recursive=True)
    except psutil.NoSuchProcess:
        extra = []
    for q in [p, *extra]:
        _kill(q)
    known.extend(q for q in extra if q not in known)


# ---------------------------------------------------------------------------------------------- rm


def remove_run(run: RunFolder) -> None:
    """Delete the run folder; never a run whose process is alive. Every folder in it is asked first (an
    UnwritableFolder, nothing deleted, when one cannot be changed), so a removal does not stop halfway; one
    that fails anyway goes on past what it cannot delete and says what is left."""
    status = run.effective_status()
    if status in LIVE:
        raise RunControlError(f"run {run.name} is {status} ({_owner(run)}); stop it first with "
                              f"`kforge runs stop {run.name}`, then remove it")
    check_deletable(run.path, "run folder")
    failed: list[tuple[str, str]] = []

    def passed_over(path: str, exc: BaseException) -> None:
        failed.append((path, getattr(exc, "strerror", None) or str(exc)))

    if sys.version_info >= (3, 12):  # onerror is deprecated there
        shutil.rmtree(run.path, onexc=lambda _func, path, exc: passed_over(path, exc))
    else:
        shutil.rmtree(run.path, onerror=lambda _func, path, info: passed_over(path, info[1]))
    if failed:
        left = sum(len(files) for _, _, files in os.walk(run.path)) if run.path.exists() else 0
        path, why = failed[0]
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        raise RunControlError(f"run {run.name} was removed only in part: could not delete {path} ({why}){more}; "
                              f"left in {run.path}: {left} file(s)")


# ---------------------------------------------------------------------------------------------- logs


def last_lines(path: Path, n: int | None) -> str:
    """The whole file, or its last n lines."""
    try:
        with open(path, errors="replace") as fh:
            if n is None:
                return fh.read()
            return "".join(deque(fh, maxlen=n)) if n > 0 else ""
    except FileNotFoundError:
        return ""


def follow(path: Path, still_running: Callable[[], bool], start: int = 0, poll_s: float = 0.5,
           max_wait_s: float | None = None) -> Iterator[str]:
    """New text of a growing file from byte `start`, until the writer has ended and everything is read.

    A file that does not exist yet is waited for while the run is alive; a truncated file is read again
    from its start.
    """
    pos = start
    deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
    lingered = False
    while True:
        alive = still_running()  # read before the file, so the last lines written before the end are read
        if not alive and not lingered:
            # The process writes a few last lines after its final status; give them a moment.
            lingered = True
            time.sleep(poll_s)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if 0 <= size < pos:
            pos = 0
        if size > pos:
            with open(path, "rb") as fh:
                fh.seek(pos)
                data = fh.read(size - pos)
            pos += len(data)
            yield data.decode(errors="replace")
            continue
        if not alive or (deadline is not None and time.monotonic() > deadline):
            return
        time.sleep(poll_s)


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# ------------------------------------------------------------------------------------------- TensorBoard


def tensorboard_installed() -> bool:
    try:
        return importlib.util.find_spec("tensorboard.main") is not None
    except ImportError:  # a broken or partial install
        return False


def tensorboard_logdirs(runs: list[RunFolder]) -> list[tuple[str, Path]]:
    """(label, tensorboard folder) of each run that has one. TensorBoard's --logdir_spec separates entries
    with ',' and label from path with ':', so labels lose those characters."""
    out = []
    for run in runs:
        tb = run.path / "tensorboard"
        if tb.is_dir():
            if "," in str(tb.resolve()):
                raise RunControlError(f"{tb}: TensorBoard cannot take a folder whose path holds ','; rename it")
            out.append((run.name.replace(",", "_").replace(":", "_"), tb.resolve()))
    return out


def free_port(host: str, preferred: int) -> int:
    """`preferred` when it is free on host, else a free port the OS picks."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host if host not in ("localhost", "") else "127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RunControlError(f"no free port on {host}")


def tensorboard_command(logdirs: list[tuple[str, Path]], host: str, port: int) -> list[str]:
    spec = ",".join(f"{label}:{path}" for label, path in logdirs)
    return [sys.executable, "-m", "tensorboard.main", "--logdir_spec", spec, "--host", host, "--port", str(port)]

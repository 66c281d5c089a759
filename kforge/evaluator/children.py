"""The parent's side of one sandboxed child: zygote handles, cgroups, pipes, deadlines, killing."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kforge.evaluator import sandbox
from kforge.evaluator.wire import FrameReader, decode_safe, send_pickle

_LEN = struct.Struct("<I")
_KFORGE_ROOT = str(Path(__file__).resolve().parents[2])


class Zygote:
    """One forkserver process (see zygote.py). Restarted transparently if it dies."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path, start_timeout_s: float = 300.0) -> None:
        self.name = name
        self.env = env
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.start_s = 0.0

    def _start(self) -> None:
        t0 = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_KFORGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kforge.evaluator.zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                cwd="/", start_new_session=True,
            )
        theirs.close()
        ours.settimeout(self.start_timeout_s)
        try:
            ready = ours.recv(16)
        except OSError as exc:
            raise RuntimeError(f"evaluator zygote {self.name} did not start: {exc}; see {self.log_path}") from exc
        if ready != b"R":
            raise RuntimeError(f"evaluator zygote {self.name} failed to start; see {self.log_path}")
        ours.settimeout(60.0)
        self.sock = ours
        self.start_s = time.monotonic() - t0

    def ensure(self) -> None:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._close_locked()
                self._start()

    def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._close_locked()
                self._start()
            assert self.sock is not None
            payload = _LEN.pack(0) + pickle.dumps(request)
            socket.send_fds(self.sock, [payload], fds)
            data = self.sock.recv(16)
            if len(data) != _LEN.size:
                raise RuntimeError(f"evaluator zygote {self.name} stopped answering")
            return _LEN.unpack(data)[0]

    def _close_locked(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        with self.lock:
            self._close_locked()


class CgroupFactory:
    """Per-child cgroup-v2 folders under one folder of this pool; `cgroup.kill` ends everything in one."""

    def __init__(self) -> None:
        self.root: Path | None = None
        base = sandbox.cgroup2_root()
        if base is not None:
            path = base / f"kforge-pool-{os.getpid()}-{id(self):x}"
            try:
                path.mkdir()
                self.root = path
            except OSError:
                self.root = None
        self.n = 0
        self.lock = threading.Lock()

    def new(self) -> Path | None:
        if self.root is None:
            return None
        with self.lock:
            self.n += 1
            path = self.root / f"c{self.n}"
        try:
            path.mkdir()
            return path
        except OSError:
            return None

    @staticmethod
    def kill_and_remove(path: Path | None) -> None:
        if path is None:
            return
        for _ in range(50):
            try:
                (path / "cgroup.kill").write_text("1")
            except OSError:
                pass
            try:
                path.rmdir()
                return
            except OSError:
                time.sleep(0.02)

    def close(self) -> None:
        if self.root is not None:
            for child in self.root.iterdir():
                if child.is_dir():
                    self.kill_and_remove(child)
            try:
                self.root.rmdir()
            except OSError:
                pass


class Child:
    """One running child: send a job, read messages with deadlines, always cleaned up by close()."""

    def __init__(self, zygote: Zygote, cgroups: CgroupFactory, kind: str, request: dict[str, Any],
                 job: dict[str, Any], scratch_parent: str | None = None) -> None:
        self.scratch = tempfile.mkdtemp(prefix="kforge-", dir=scratch_parent)
        os.chmod(self.scratch, 0o700)
        self.cgroup = cgroups.new()
        self.exit: dict[str, Any] | None = None
        self.closed = False
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        req = dict(request, kind=kind, scratch=self.scratch, cgroup=str(self.cgroup) if self.cgroup else None,
                   uid=os.getuid(), gid=os.getgid())
        t0 = time.monotonic()
        try:
            self.pid = zygote.fork(req, [to_r, from_w])
        finally:
            os.close(to_r)
            os.close(from_w)
        self.fork_s = time.monotonic() - t0
        self.wfd = to_w
        self.reader = FrameReader(from_r)
        try:
            send_pickle(self.wfd, job)
        except OSError:
            pass  # the child died at once; recv() reports it

    def send(self, obj: Any) -> None:
        try:
            send_pickle(self.wfd, obj)
        except OSError:
            pass

    def recv(self, deadline: float) -> dict[str, Any]:
        """The next message; raises TimeoutError past the deadline, EOFError when the child is gone."""
        msg = decode_safe(self.reader.read(deadline))
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise EOFError("malformed message from the child")
        if msg["type"] == "exit":
            self.exit = msg
        return msg

    def wait_exit(self, timeout: float = 5.0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while self.exit is None:
            try:
                self.recv(deadline)
            except (TimeoutError, EOFError, Exception):  # noqa: BLE001 - best effort
                break
        return self.exit

    def kill(self) -> None:
        CgroupFactory.kill_and_remove(self.cgroup)
        self.cgroup = None
        for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            with open(os.path.join(self.scratch, "stderr.txt"), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.kill()
        for fd in (self.wfd, self.reader.fd):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)

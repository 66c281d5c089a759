"""The parent's side of one sandboxed child: zygote handles, cgroups, pipes, deadlines, killing."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kforge.evaluator import sandbox
from kforge.evaluator.arena import Arena
from kforge.evaluator.freeze import frozen
from kforge.evaluator.wire import SMALL_MESSAGE, FrameReader, WireError, decode, send_pickle

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

_LEN = struct.Struct("<I")
_KFORGE_ROOT = str(Path(__file__).resolve().parents[2])
# A zygote's first lines: drop the script's folder from sys.path, import kforge from `paths`, run
# zygote.main.
_BOOT = ("import sys\n"
         "del sys.path[0]\n"
         "sys.path[:0] = {paths!r}\n"
         "from kforge.evaluator.child.zygote import main\n"
         "main()\n")


class ProtocolViolation(Exception):
    """The child sent something the protocol does not allow at this point."""


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
        # The zygote starts from a script of a few lines in the pool's own folder (no child can read it),
        # which says where kforge is imported from: not the environment (a child reads back the block
        # its zygote started with through /proc/self/environ), not the command line, and no `<string>`
        # frame (code made at run time counts as the candidate's) under every child's stack.
        paths = [_KFORGE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        boot = self.log_path.with_name(f"{self.name}-boot.py")
        fd = os.open(boot, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(_BOOT.format(paths=list(dict.fromkeys(paths))))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(boot), str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=dict(self.env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, cwd="/", start_new_session=True,
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
            # Hand the pids and memory controllers down to the per-child groups, where the kernel lets us
            # (a cgroup-v2 root or a delegated subtree; a hybrid v1 machine keeps them elsewhere).
            for where in (base, path):
                for controller in ("+pids", "+memory"):
                    try:
                        (where / "cgroup.subtree_control").write_text(controller)
                    except OSError:
                        pass
        self.n = 0
        self.lock = threading.Lock()

    def new(self, pids_max: int | None = None, memory_max: int | None = None) -> Path | None:
        if self.root is None:
            return None
        with self.lock:
            self.n += 1
            path = self.root / f"c{self.n}"
        try:
            path.mkdir()
        except OSError:
            return None
        # Root ignores RLIMIT_NPROC, and RLIMIT_DATA misses page-cache and shared memory: the cgroup's
        # own limits hold whoever the child is (when this cgroup's controllers are delegated to us).
        for name, value in (("pids.max", pids_max), ("memory.max", memory_max)):
            if value is not None:
                try:
                    (path / name).write_text(str(value))
                except OSError:
                    pass
        return path

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
                 job: dict[str, Any], scratch_parent: str | None = None, pids_max: int | None = None,
                 arena: Arena | None = None) -> None:
        self.scratch = tempfile.mkdtemp(prefix="kforge-", dir=scratch_parent)
        os.chmod(self.scratch, 0o700)
        for name, src in (request.get("copy_into_scratch") or {}).items():
            shutil.copytree(src, os.path.join(self.scratch, name), symlinks=False, dirs_exist_ok=True)
        run_as = sandbox.child_ids()
        if os.geteuid() == 0 and run_as[0] != 0:
            _give(self.scratch, run_as, recursive=True)  # made by this process just now: nothing to follow
            for path in request.get("writable", []):
                if path.startswith("/dev/") or path == "/proc":
                    continue
                _give(path, run_as, recursive=False)  # a cache folder: the child writes inside it
        self.arena = arena
        self.cgroup = cgroups.new(pids_max, request.get("memory_bytes"))
        self.exit: dict[str, Any] | None = None
        self.closed = False
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        req = dict(request, kind=kind, scratch=self.scratch, cgroup=str(self.cgroup) if self.cgroup else None,
                   uid=os.getuid(), gid=os.getgid(), run_as=run_as)
        t0 = time.monotonic()
        try:
            self.pid = zygote.fork(req, [to_r, from_w] + ([arena.fd] if arena is not None else []))
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

    def read(self, meta: list[Any], slots: list[Any], where: str | list[Tensor | None],
             plain: list[Any] | None = None) -> list[Any]:
        """The outputs the child copied into its arena, read by this process while every process of the
        child is stopped (freeze.py): nothing it runs can see or change what is read."""
        assert self.arena is not None
        with frozen(self.pid, self.cgroup):
            return self.arena.read(meta, slots, where, plain)

    def send(self, obj: object) -> None:
        try:
            send_pickle(self.wfd, obj)
        except OSError:
            pass

    def recv(self, deadline: float, max_bytes: int = SMALL_MESSAGE) -> dict[str, Any]:
        """The next message; TimeoutError past the deadline, EOFError when the child is gone,
        ProtocolViolation for a frame that is too big or malformed."""
        try:
            msg = decode(self.reader.read(deadline, max_bytes))
        except WireError as exc:
            raise ProtocolViolation(str(exc)) from None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise ProtocolViolation("a message without a type")
        if msg["type"] == "exit":
            self.exit = msg
        return msg

    def ask(self, request: dict[str, Any] | None, expect: str, deadline: float,
            max_bytes: int = SMALL_MESSAGE) -> dict[str, Any]:
        """Send one request (None: just wait) and accept exactly one answer of type `expect`.

        The deadline is the parent's, fixed per stage: nothing the child sends extends it. An error
        report comes back as such; an exit means the child is gone (EOFError); any other message is a
        protocol violation."""
        if request is not None:
            self.send(request)
        msg = self.recv(deadline, max_bytes)
        if msg["type"] == "exit":
            raise EOFError("the child exited")
        if msg["type"] not in (expect, "error"):
            raise ProtocolViolation(f"expected {expect!r}, got {msg['type'][:40]!r}")
        if msg["type"] == expect and isinstance(request, dict) and "id" in request and msg.get("id") != request["id"]:
            raise ProtocolViolation("an answer to a request that was not asked")
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
        """The end of the child's stderr. The scratch folder is the child's: never follow a link there,
        and read only a plain file with one name (a hard link could point at a host file)."""
        try:
            fd = os.open(os.path.join(self.scratch, "stderr.txt"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return ""
            os.lseek(fd, max(0, st.st_size - limit), os.SEEK_SET)
            return os.read(fd, limit).decode(errors="replace")
        except OSError:
            return ""
        finally:
            os.close(fd)

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
        if self.arena is not None:
            self.arena.close()


def _give(path: str, ids: tuple[int, int], recursive: bool) -> None:
    """chown to the child's unprivileged ids without following links (the parent runs as root)."""
    try:
        os.chown(path, *ids, follow_symlinks=False)
        if recursive:
            for root, dirs, files in os.walk(path, followlinks=False):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), *ids, follow_symlinks=False)
    except OSError:
        pass

"""The forkserver: one per eval device, started with a clean environment.

It imports torch and Triton once (never touching CUDA, so forking stays legal) and then forks one
short-lived child per request. Each request arrives over a Unix socket with two pipe ends attached
(SCM_RIGHTS): the child reads its job from one and writes results to the other, so the results go
straight to the pool, not through the zygote.

Child layout:  zygote -> outer (setsid, cgroup, unshare) -> inner (PID 1 of the new PID namespace:
sandboxes itself, runs the job). The outer waits for the inner and reports how it ended. A third
descriptor, when sent, is the child's output arena (arena.py): the inner passes it to the job.

Started by children.Zygote as `python BOOT FD`: BOOT, a script of a few lines in the pool's folder, says
where kforge is imported from (never the environment, which every child could read back through
/proc/self/environ); FD is the inherited control socket.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import select
import signal
import socket
import struct
import sys
import tempfile
from typing import Any

_LEN = struct.Struct("<I")


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _close_fds(keep: set[int]) -> None:
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _redirect_output(scratch: str) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        out = os.open(os.path.join(scratch, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)


def _view(req: dict[str, Any], ns_flags: int, applied: dict[str, Any]) -> None:
    """The child's file system (mounts.py): private /proc and /dev/shm, read-only /proc/sys and /sys, and
    for an unprivileged child under a root trainer, the paths it needs bound back under folders it could
    not search."""
    from kforge.evaluator import mounts, sandbox

    if not ns_flags & sandbox.CLONE_NEWNS or not mounts.make_private():
        return  # mounts made now would reach the host's namespace
    if req.get("private_proc", True) and ns_flags & sandbox.CLONE_NEWPID:
        applied["private_proc"] = mounts.private_proc()
    applied["private_shm"] = mounts.private_shm()
    # Host-global settings (kernel.core_pattern runs a helper as host root; vm.drop_caches; the hostname
    # without a UTS namespace) stay unwritable whatever Landlock leaves writable on a GPU.
    applied["read_only"] = [p for p, bind in (("/proc/sys", True), ("/sys", False)) if mounts.read_only(p, bind)]
    uid, gid = req["run_as"]
    if os.geteuid() == 0 and uid != 0 and applied["private_shm"]:
        need = sandbox.readable_roots(req.get("readable", [])) + [req["scratch"], *req.get("writable", [])]
        try:
            applied["exposed"] = mounts.expose(need, uid, gid)
        except OSError as exc:  # the job then fails where it cannot reach a path, and says which
            applied["exposed"] = f"failed: {exc}"
    # Folders a child is given to read only (a CUDA build folder once built): read-only at the mount
    # level too, whoever owns the files and whatever Landlock does here.
    applied["read_only"] += [p for p in req.get("readable", []) if mounts.read_only(p, bind_first=True)]


def _inner(req: dict[str, Any], rfd: int, wfd: int, afd: int | None, ns_flags: int) -> None:
    from kforge.evaluator import confine, sandbox
    from kforge.evaluator.child import harness
    from kforge.evaluator.wire import read_pickle_blocking, send_message

    applied: dict[str, Any] = {}
    sandbox.set_pdeathsig()
    if os.geteuid() == 0:  # as root the PID namespace came first; the rest is made here, before the drop
        ns_flags |= sandbox.enter_private_namespaces()
    applied["namespaces"] = ns_flags
    _view(req, ns_flags, applied)
    scratch = req["scratch"]
    uid, gid = req["run_as"]
    applied["uid"] = uid if sandbox.drop_privileges(uid, gid) else os.geteuid()
    sandbox.set_pdeathsig()  # a change of user clears it (the kernel's commit_creds): asked again, as that user
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ["HOME"] = scratch
    os.environ["TMPDIR"] = scratch
    # Each child compiles into its own Triton cache (a copy of the warm one, made by the parent).
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(scratch, "triton-cache"))
    # The lock-down takes the user list away, and torch's profiler asks for inductor's default cache folder,
    # which is named after getpass.getuser() (a KeyError without /etc/passwd: every profiled call on a GPU
    # failed as failed_when_timed). A folder of its own, and a user name that needs no lookup.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor-cache")
    os.environ["LOGNAME"] = "candidate"
    tempfile.tempdir = scratch
    os.chdir(scratch)
    writable = [scratch, *req.get("writable", [])] + (["/dev/shm"] if applied.get("private_shm") else [])
    if req.get("landlock", True):
        readable = sandbox.readable_roots(req.get("readable", [])) if req.get("restrict_reads", True) else None
        applied["landlock"] = confine.apply_landlock(writable, readable, net=req.get("landlock_net", True),
                                                     scope=req.get("landlock_scope", True))
    if req.get("seccomp", True):
        applied["seccomp"] = confine.apply_seccomp()
    # The harness applies these when the parent said (confine.lock_down): no process, exec or file the
    # set-up needed stays open to the candidate's library calls.
    lockdown = {"landlock": req.get("landlock", True) and req.get("restrict_reads", True), "writable": writable,
                "readable": sandbox.readable_roots(req.get("readable", []), sandbox.ETC_AFTER_SETUP),
                "net": req.get("landlock_net", True), "scope": req.get("landlock_scope", True),
                "seccomp": req.get("seccomp", True)}
    sandbox.apply_rlimits(int(req["memory_bytes"]))
    faulthandler.enable(file=sys.stderr)
    try:
        job = read_pickle_blocking(rfd)
        job["scratch"] = scratch
        job["arena_fd"] = afd
        job["lockdown"] = lockdown
        send_message(wfd, {"type": "sandbox", "applied": applied})
        harness.JOBS[req["kind"]](job, wfd, rfd)
    except BaseException as exc:  # noqa: BLE001 - last resort: tell the parent, then die quietly
        import traceback

        try:
            send_message(wfd, {"type": "error", "stage": "harness", "category": "runtime_error",
                            "message": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]})
        except BaseException:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _outer(req: dict[str, Any], rfd: int, wfd: int, afd: int | None, zygote: int) -> None:
    from kforge.evaluator import sandbox
    from kforge.evaluator.wire import send_message

    # Dies with the zygote (which dies with the pool), so a trainer killed outright leaves no candidate
    # running: a hang would otherwise spin on a core for good under init.
    sandbox.set_pdeathsig()
    if os.getppid() != zygote:  # the zygote went before the signal was asked for
        os._exit(1)
    os.setsid()
    if req.get("cgroup"):
        try:
            with open(os.path.join(req["cgroup"], "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        except OSError:
            pass
    _close_fds({rfd, wfd} | ({afd} if afd is not None else set()))
    _redirect_output(req["scratch"])
    ns_flags = 0
    if req.get("namespaces", True):
        ns_flags, _notes = sandbox.enter_namespaces(req["uid"], req["gid"])
    pid = os.fork()
    if pid == 0:
        try:
            _inner(req, rfd, wfd, afd, ns_flags)
        finally:
            os._exit(0)
    os.close(rfd)
    if afd is not None:
        os.close(afd)
    _, status = os.waitpid(pid, 0)
    info = {"type": "exit", "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
    try:
        send_message(wfd, info)
    finally:
        os._exit(0)


def serve(ctrl: socket.socket) -> None:
    from kforge.evaluator import sandbox

    sandbox.set_subreaper()  # orphans come back here and are reaped, never left as zombies
    while True:
        ready, _, _ = select.select([ctrl], [], [], 0.5)
        _reap()
        if not ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctrl, 1 << 20, 4)
        except OSError:
            return
        if not msg:
            return  # the pool went away
        req = pickle.loads(msg[_LEN.size:])
        rfd, wfd = fds[0], fds[1]
        afd = fds[2] if len(fds) > 2 else None  # the output arena (arena.py), when the child has one
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            ctrl.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                _outer(req, rfd, wfd, afd, zygote)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        ctrl.sendall(_LEN.pack(pid))


def _preload() -> None:
    """Everything a child would import anyway, so each fork starts warm."""
    import numpy  # noqa: F401 (preloaded for the children)
    import torch  # noqa: F401 (preloaded for the children)
    import torch.nn.functional  # noqa: F401 (preloaded for the children)

    try:
        import triton  # noqa: F401 (preloaded for the children)
        import triton.language  # noqa: F401 (preloaded for the children)
    except ImportError:
        pass
    # Children cannot read kforge's own folder (it holds the built-in solutions): everything they run
    # of kforge is imported here, before the fork.
    import kforge.evaluator.child.arena_writer  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.child.coverage  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.child.guard  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.child.harness  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.child.loop  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.confine  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.mounts  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.protocol  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.sandbox  # noqa: F401 (preloaded for the children)
    import kforge.evaluator.wire  # noqa: F401 (preloaded for the children)


def main() -> None:
    ctrl = socket.socket(fileno=int(sys.argv[1]))
    # Children must not read the working folder.
    sys.path[:] = [p for p in sys.path if p not in ("", "/", os.getcwd())]
    _preload()
    ctrl.sendall(b"R")  # ready
    serve(ctrl)


if __name__ == "__main__":
    main()

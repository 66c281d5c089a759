"""What this machine lets the sandbox do, measured once, and every layer between a candidate and its
reward as rows for `kforge check --explain-sandbox` (the parent's side; children never import this)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from kforge.evaluator.confine import landlock_abi, seccomp_available
from kforge.evaluator.mounts import make_private, private_proc
from kforge.evaluator.sandbox import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    cgroup2_root,
    child_ids,
    enter_namespaces,
    enter_private_namespaces,
)


@dataclass
class Capabilities:
    """What the kernel lets a child do here, measured by `probe()` in a throwaway fork."""

    userns: bool = False
    unprivileged: bool = False  # the child runs without uid 0 (root trainers: as nobody; others: as themselves)
    netns: bool = False
    utsns: bool = False
    ipcns: bool = False
    pidns: bool = False
    mountns_proc: bool = False
    landlock_abi: int = 0
    seccomp: bool = False
    cgroup: bool = False
    notes: list[str] = field(default_factory=list)



def probe() -> Capabilities:
    """Fork a throwaway child that tries each layer and reports back (the parent stays untouched)."""
    caps = Capabilities(landlock_abi=landlock_abi(), seccomp=seccomp_available())
    caps.cgroup = cgroup2_root() is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked probe
        os.close(r)
        try:
            flags, notes = enter_namespaces(os.getuid(), os.getgid())
            res = [str(flags)]
            if flags & CLONE_NEWPID:
                inner = os.fork()
                if inner == 0:  # the same steps the zygote's inner child takes
                    got = flags | (enter_private_namespaces() if os.geteuid() == 0 else 0)
                    ok = bool(got & CLONE_NEWNS) and make_private() and private_proc()
                    ok = ok and len([p for p in os.listdir("/proc") if p.isdigit()]) <= 2
                    os.write(w, f"{got}".encode())
                    os._exit(0 if ok else 1)
                _, status = os.waitpid(inner, 0)
                res.append("proc" if os.waitstatus_to_exitcode(status) == 0 else "noproc")
            os.write(w, (" " + " ".join(res) + "|" + "; ".join(notes)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    head, _, notes = data.decode().partition("|")
    parts = head.split()
    # The inner's flags come first when it ran (they include the outer's), else the outer's alone.
    flags = int(parts[0]) if parts else 0
    caps.userns = bool(flags & CLONE_NEWUSER)
    caps.netns = bool(flags & CLONE_NEWNET)
    caps.utsns = bool(flags & CLONE_NEWUTS)
    caps.ipcns = bool(flags & CLONE_NEWIPC)
    caps.pidns = bool(flags & CLONE_NEWPID)
    caps.mountns_proc = "proc" in parts[1:]
    caps.unprivileged = child_ids()[0] != 0
    caps.notes = [n for n in notes.split("; ") if n]
    return caps


@lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    return probe()


def cgroup_limits() -> bool:
    """Whether a child cgroup here accepts pids.max and memory.max (controllers delegated to us)."""
    base = cgroup2_root()
    if base is None:
        return False
    probe = base / f"kforge-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        for controller in ("+pids", "+memory"):
            try:
                (base / "cgroup.subtree_control").write_text(controller)
            except OSError:
                pass
        leaf = probe / "c"
        try:
            (probe / "cgroup.subtree_control").write_text("+pids +memory")
            leaf.mkdir()
            (leaf / "pids.max").write_text("64")
            (leaf / "memory.max").write_text(str(1 << 30))
            return True
        except OSError:
            return False
        finally:
            if leaf.exists():
                leaf.rmdir()
    finally:
        probe.rmdir()


def explain() -> list[tuple[str, bool, str]]:
    """(protection, active, detail) for each layer between a candidate and a reward on this machine.

    Rows name their layer: [parent] checks hold whatever the candidate's process does; [kernel]
    confinement is enforced by Linux; [in-process] layers run inside the candidate's interpreter and
    are evidence only (a candidate with native code can defeat them)."""
    c = capabilities()
    ll = c.landlock_abi
    limits = cgroup_limits()
    rows = [
        ("[parent] trials chosen and compared by the parent", True,
         "secret seeds, parent's order, one answer per request; reference outputs never in the child"),
        ("[parent] outputs read by the parent from shared memory, child frozen", True,
         "whole outputs copied to a sealed memfd before each answer; positions never sent; cgroup freezer or SIGSTOP"),
        ("[parent] bounded frames, no pickle, fixed deadlines", True,
         "answers carry no outputs; JSON + raw tensors; one budget per stage"),
        ("[parent] clock and samples of every timed call", True,
         "one request per call on fresh inputs; mean report checked and raised to the parent's clock"),
        ("[parent] decoy trial without the candidate's kernels", True,
         "right outputs with its Triton launches skipped: kernel_not_needed"),
        ("[parent] failure category from the stage the parent saw", True,
         "before a call answered with its kernel on the call's data: compile_error"),
        ("[parent] never follows a child-writable path", True, "stderr read with O_NOFOLLOW; build state kept outside"),
        ("own session / process group", True, "setsid; the parent kills the group on timeout"),
        ("cgroup (kills detached processes)", c.cgroup, "cgroup v2 child group + cgroup.kill + cgroup.freeze" if c.cgroup
         else "no writable cgroup v2 here; falls back to the PID namespace / process-group kill and SIGSTOP"),
        ("[kernel] cgroup pids.max and memory.max", limits, "per-child limits" if limits
         else "controllers not delegated here; RLIMIT_DATA and the PID namespace remain"),
        ("[kernel] never root", c.unprivileged, "root trainer: the child runs as nobody, no capabilities"
         if c.unprivileged else "the child would run as uid 0"),
        ("user namespace", c.userns, "unshare(CLONE_NEWUSER), own ids mapped" if c.userns
         else "not used (root trainer: plain uid drop) or not permitted"),
        ("network namespace (no network)", c.netns, "unshare(CLONE_NEWNET): only a down loopback"
         if c.netns else "not permitted; seccomp/Landlock still deny internet sockets"),
        ("[kernel] UTS namespace (hostname is its own)", c.utsns, "unshare(CLONE_NEWUTS)" if c.utsns else "not permitted"),
        ("[kernel] IPC namespace (System V and POSIX IPC die with the child)", c.ipcns,
         "unshare(CLONE_NEWIPC): nothing one child leaves there reaches another" if c.ipcns else "not permitted"),
        ("PID namespace (detached children die with the candidate)", c.pidns,
         "candidate is PID 1 of its own namespace" if c.pidns else "not permitted"),
        ("private /proc (other processes' memory/env invisible)", c.mountns_proc,
         "fresh procfs in a mount namespace" if c.mountns_proc else "host /proc visible; ptrace is still denied by seccomp"),
        ("[kernel] /proc/sys and /sys read-only", c.mountns_proc, "read-only mounts in the child's namespace"
         if c.mountns_proc else "needs a mount namespace; Landlock and the uid remain"),
        ("[kernel] private /dev/shm and Triton cache", c.mountns_proc,
         "tmpfs per child; each child compiles into its own copy of a warm cache" if c.mountns_proc
         else "own Triton cache copy; /dev/shm not writable"),
        ("Landlock filesystem (writes only to scratch)", ll >= 1, f"ABI {ll}" if ll else
         "kernel lacks Landlock: writes are not confined"),
        ("[kernel] Landlock reads (not /, kforge's checkout or caches)", ll >= 1,
         "system folders, the Python installation, a few files of /etc" if ll else "needs Landlock"),
        ("Landlock TCP bind/connect denied", ll >= 4, f"ABI {ll}" if ll >= 4 else "needs Landlock ABI 4"),
        ("Landlock signal scope (cannot signal the trainer)", ll >= 6, f"ABI {ll}" if ll >= 6 else "needs Landlock ABI 6"),
        ("seccomp (no AF_INET/AF_INET6 sockets, no ptrace)", c.seccomp, "libseccomp via ctypes"
         if c.seccomp else "libseccomp.so.2 not found"),
        ("[kernel] after set-up: no exec, new process or System V IPC; fewer reads", c.seccomp and ll >= 1,
         "a second seccomp filter and Landlock layer at READY (Triton on a GPU: after the first trial)"
         if c.seccomp and ll >= 1 else "needs libseccomp and Landlock"),
        ("rlimits DATA/FSIZE/CORE/NPROC (not AS)", True, "RLIMIT_DATA = evaluator.memory_limit_gb"),
        ("scrubbed environment", True, "locale and CUDA/compiler variables; a PATH of its own (the Python "
         "installation's, the build tools', the system's); nothing of the trainer's PATH or PYTHONPATH"),
        ("[parent] child text in feedback built from the candidate's own", True, "its frames with the parent's "
         "copy of each line, the exception type, a message of its own words (300 characters); 1200 in all"),
        ("[in-process] static checks", True, "no sys/os/gc/inspect/ctypes/exec/open/dunders/patching/loaders in the source"),
        ("[in-process] audit hook", True, "frames, gc, ctypes, files, processes, sockets refused; no new code or "
         "unpickling with a candidate frame on the stack"),
        ("[in-process] launch evidence", True, "real triton.jit kernels of the candidate's file, on the call's tensors, "
         "writing its outputs, in every trial and timed call; in the trials, outputs unchanged after its last launch"),
    ]
    return rows

"""What this machine lets the sandbox do, measured once, and every layer between a candidate and its
reward as rows for `kforge check --explain-sandbox` (the parent's side; children never import this)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from kforge.evaluator.sandbox import (CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, cgroup2_root,
                                      enter_namespaces, landlock_abi, mount_private_proc, seccomp_available)


@dataclass
class Capabilities:
    """What the kernel lets a child do here, measured by `probe()` in a throwaway fork."""

    userns: bool = False
    netns: bool = False
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
                if inner == 0:
                    ok = bool(flags & CLONE_NEWNS) and mount_private_proc()
                    ok = ok and len([p for p in os.listdir("/proc") if p.isdigit()]) <= 2
                    os._exit(0 if ok else 1)
                _, status = os.waitpid(inner, 0)
                res.append("proc" if os.waitstatus_to_exitcode(status) == 0 else "noproc")
            os.write(w, (" ".join(res) + "|" + "; ".join(notes)).encode())
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
    flags = int(parts[0]) if parts else 0
    caps.userns = bool(flags & CLONE_NEWUSER)
    caps.netns = bool(flags & CLONE_NEWNET)
    caps.pidns = bool(flags & CLONE_NEWPID)
    caps.mountns_proc = "proc" in parts[1:]
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
        ("[parent] bounded frames, no pickle, fixed deadlines", True,
         "frames capped at the expected output size; JSON + raw tensors; one budget per stage"),
        ("[parent] clock and samples of every timed call", True,
         "parent's wall clock around each timed batch on fresh inputs; sampled outputs of every call checked"),
        ("[parent] never follows a child-writable path", True, "stderr read with O_NOFOLLOW; build state kept outside"),
        ("own session / process group", True, "setsid; the parent kills the group on timeout"),
        ("cgroup (kills detached processes)", c.cgroup, "cgroup v2 child group + cgroup.kill" if c.cgroup
         else "no writable cgroup v2 here; falls back to the PID namespace / session kill"),
        ("[kernel] cgroup pids.max and memory.max", limits, "per-child limits" if limits
         else "controllers not delegated here; RLIMIT_DATA and the PID namespace remain"),
        ("user namespace", c.userns, "unshare(CLONE_NEWUSER)" if c.userns else "not permitted"),
        ("network namespace (no network)", c.netns, "unshare(CLONE_NEWNET): only a down loopback"
         if c.netns else "not permitted; seccomp/Landlock still deny internet sockets"),
        ("PID namespace (detached children die with the candidate)", c.pidns,
         "candidate is PID 1 of its own namespace" if c.pidns else "not permitted"),
        ("private /proc (other processes' memory/env invisible)", c.mountns_proc,
         "fresh procfs in a mount namespace" if c.mountns_proc else "host /proc visible; ptrace is still denied by seccomp"),
        ("[kernel] private /dev/shm and Triton cache", c.mountns_proc,
         "tmpfs per child; each child compiles into its own copy of a warm cache" if c.mountns_proc
         else "own Triton cache copy; /dev/shm not writable"),
        ("Landlock filesystem (writes only to scratch)", ll >= 1, f"ABI {ll}" if ll else
         "kernel lacks Landlock: writes are not confined"),
        ("[kernel] Landlock reads (not /, kforge's checkout or caches)", ll >= 1,
         "system folders and the Python installation only" if ll else "needs Landlock"),
        ("Landlock TCP bind/connect denied", ll >= 4, f"ABI {ll}" if ll >= 4 else "needs Landlock ABI 4"),
        ("Landlock signal scope (cannot signal the trainer)", ll >= 6, f"ABI {ll}" if ll >= 6 else "needs Landlock ABI 6"),
        ("seccomp (no AF_INET/AF_INET6 sockets, no ptrace)", c.seccomp, "libseccomp via ctypes"
         if c.seccomp else "libseccomp.so.2 not found"),
        ("rlimits DATA/FSIZE/CORE/NPROC (not AS)", True, "RLIMIT_DATA = evaluator.memory_limit_gb (root ignores NPROC)"),
        ("scrubbed environment", True, "only PATH, locale and CUDA/compiler variables survive"),
        ("[in-process] static checks", True, "no sys/os/gc/inspect/ctypes/exec/open/dunders/patching in the source"),
        ("[in-process] audit hook", True, "frames, gc, ctypes, exec/compile, files, processes, sockets refused"),
        ("[in-process] launch evidence", True, "real triton.jit kernels of the candidate's file, on the trial's tensors"),
    ]
    return rows

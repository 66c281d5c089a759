"""Kernel rules a child applies to itself last, just before running the job: Landlock and seccomp.

Landlock limits which files the child may write (its scratch folder, device nodes it needs) and, with
reads restricted, which it may read; on ABI 4 it denies TCP bind/connect and on ABI 6 signals and
abstract sockets outside the sandbox. seccomp denies internet sockets, ptrace and cross-process memory
access. Once the set-up is over (`lock_down`, when the parent says), a second filter denies exec, new
processes and System V IPC, and a second Landlock layer drops what only the set-up read: the in-process
layers are early refusals, these hold whatever library frame asks. Both only through ctypes and raw
syscalls, and both degrade alone when the kernel refuses them.

Every seccomp filter is loaded for every thread of the process at once (TSYNC). Landlock restricts only
the thread that asks (and threads it starts later): no kernel kforge runs on offers Landlock's TSYNC
(ABI 8), so a thread that outlives the set-up must be one kforge knows (`threads`, taken before any
candidate code ran), or the lock-down refuses the child (`StrayThreads`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from functools import lru_cache

_libc = ctypes.CDLL(None, use_errno=True)

# x86_64 / aarch64 share these numbers for Landlock (generic syscall table entries).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


# Landlock filesystem rights (ABI 1..5).
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2  # ABI 6

_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]




def landlock_abi() -> int:
    """The Landlock ABI version (0 when the kernel lacks it or disabled it)."""
    res = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(res), 0)


@lru_cache(maxsize=1)
def _libseccomp() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def seccomp_available() -> bool:
    return _libseccomp() is not None



# ---------------------------------------------------------------------------------------------
# Landlock
# ---------------------------------------------------------------------------------------------


def _handled_fs(abi: int, restrict_reads: bool) -> int:
    rights = (_FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_CHAR | _FS_MAKE_DIR | _FS_MAKE_REG
              | _FS_MAKE_SOCK | _FS_MAKE_FIFO | _FS_MAKE_BLOCK | _FS_MAKE_SYM)
    if restrict_reads:
        rights |= _FS_READ_FILE | _FS_READ_DIR
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    # IOCTL_DEV (ABI 5) is left unhandled: with it, CUDA init fails under the sandbox on an H100
    # host (cudaGetDeviceCount error 304) even with every /dev/nvidia* node allowed.
    return rights


def apply_landlock(writable: list[str], readable: list[str] | None, net: bool = True,
                   scope: bool = True) -> tuple[bool, str]:
    """Restrict this process (and its descendants) to writing only under `writable`.

    With `readable` given, reads are limited to those trees too (home folders with token files
    stay out of reach). ABI >= 4 also denies TCP bind/connect; ABI >= 6 denies signals to
    processes outside the sandbox (the trainer, the zygote).
    """
    abi = landlock_abi()
    if abi <= 0:
        return False, "Landlock unavailable"
    handled = _handled_fs(abi, readable is not None)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4 and net:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= 6 and scope:
        attr.scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX
        size = 24
    fd = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return False, f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        rules: dict[str, int] = {}
        for path in readable or []:
            rules[path] = rules.get(path, 0) | _FS_READ_FILE | _FS_READ_DIR
        for path in writable:
            rules[path] = rules.get(path, 0) | handled | _FS_READ_FILE | _FS_READ_DIR
        for path, access in rules.items():
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    access &= _FILE_RIGHTS
                rule = _PathBeneathAttr(access & handled, pfd)
                if rule.allowed_access and _libc.syscall(_SYS_LANDLOCK_ADD_RULE, fd, 1, ctypes.byref(rule), 0) != 0:
                    return False, f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(pfd)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False, "prctl(NO_NEW_PRIVS) failed"
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            return False, f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(fd)
    return True, f"Landlock ABI {abi}"


# ---------------------------------------------------------------------------------------------
# seccomp
# ---------------------------------------------------------------------------------------------


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_EQ = 4
_AF_INET, _AF_INET6, _AF_PACKET = 2, 10, 17


_SCMP_CMP_MASKED_EQ = 7
_CLONE_THREAD = 0x00010000
_SCMP_FLTATR_CTL_TSYNC = 4  # enum scmp_filter_attr: load the filter for every thread of the process
UNSYNCED = "seccomp_load: a thread could not be synchronised (TSYNC)"


def _load_filter(lib: ctypes.CDLL, rules: list[tuple[int, str, tuple[tuple[int, int, int, int], ...]]]) -> tuple[bool, str]:
    """Add one seccomp filter: each rule is (action, syscall name, argument comparisons (arg, op, a, b))."""
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        return False, "seccomp_init failed"
    try:
        # Without it the filter holds only for the calling thread: a thread started earlier (by a library
        # the candidate loaded at import) would fork and exec after the lock-down.
        tsync = lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_TSYNC, 1) == 0
        for action, name, cmps in rules:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr if cmps else None) != 0:
                return False, f"seccomp rule for {name}"
        res = lib.seccomp_load(ctx)
        if res == -errno.ESRCH:  # a thread whose filters diverged from this one's (it loaded its own)
            return False, UNSYNCED
        if res != 0:
            return False, "seccomp_load failed"
    finally:
        lib.seccomp_release(ctx)
    return True, "" if tsync else "(this thread only: libseccomp without TSYNC) "


def _errno(code: int) -> int:
    return 0x00050000 | code  # SCMP_ACT_ERRNO(code)


def apply_seccomp() -> tuple[bool, str]:
    """Deny internet sockets, ptrace, cross-process memory access and clearing the death signal."""
    lib = _libseccomp()
    if lib is None:
        return False, "libseccomp not found"
    eperm = _errno(errno.EPERM)
    rules = [(eperm, "socket", ((0, _SCMP_CMP_EQ, family, 0),)) for family in (_AF_INET, _AF_INET6, _AF_PACKET)]
    rules += [(eperm, name, ()) for name in ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
                                             "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key")]
    rules.append((eperm, "prctl", ((0, _SCMP_CMP_EQ, PR_SET_PDEATHSIG, 0),)))
    ok, why = _load_filter(lib, rules)
    return ok, why + "seccomp: no AF_INET/AF_INET6/AF_PACKET sockets, no ptrace/process_vm_*" if ok else why


def apply_no_spawn() -> tuple[bool, str]:
    """A second filter, for the candidate once nothing it legitimately runs needs a process: no exec, no
    new process (clone without CLONE_THREAD, fork, vfork; clone3, whose flags a filter cannot read, says
    ENOSYS, so the C library falls back to clone for threads) and no System V IPC. Whatever library frame
    asks (a shell through torch's Popen, libc's system() through ctypes), the kernel refuses it."""
    lib = _libseccomp()
    if lib is None:
        return False, "libseccomp not found"
    eperm = _errno(errno.EPERM)
    rules = [(eperm, name, ()) for name in ("execve", "execveat", "fork", "vfork", "shmget", "shmat", "msgget",
                                             "semget")]
    rules.append((eperm, "clone", ((0, _SCMP_CMP_MASKED_EQ, _CLONE_THREAD, 0),)))
    rules.append((_errno(errno.ENOSYS), "clone3", ()))
    ok, why = _load_filter(lib, rules)
    return ok, why + "seccomp: no exec, no new process, no System V IPC, in every thread" if ok else why


class StrayThreads(Exception):
    """The lock-down found a thread kforge did not start before the candidate's code ran: the second Landlock
    layer would not hold for it, so the child is refused (the harness tells the parent and exits)."""


def threads() -> dict[int, int]:
    """This process's threads as {thread id: start time} (clock ticks after boot, field 22 of
    /proc/self/task/<tid>/stat). A thread is named by how it came to be, not by anything it can set (its
    name): a thread id reused by a later thread comes with a later start time."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = int(stat.rpartition(")")[2].split()[19])  # the name in parentheses may hold spaces
    return out


def lock_down(spec: dict, known: dict[int, int] | None = None) -> dict:
    """The child's rules from the moment the parent chose (READY, or after the first call on a GPU, where
    Triton runs ptxas at a kernel's first launch): processes left from before are killed (as PID 1 of its
    own PID namespace, kill(-1) reaches only those), no new process or exec in any thread, and a second
    Landlock layer whose reads leave out what only the set-up needed. Returns what was applied.

    Raises StrayThreads when a thread not in `known` (the harness's and torch's, taken before the
    candidate's import) is running before or after both are applied, or when the filter could not be loaded
    for every thread: Landlock's layer holds only for this thread and those it starts from now on. Before:
    a stray thread that waits for the filter to appear would read what only the second layer closes in the
    moments before this one is applied, and be gone by the time anyone looked."""
    applied: dict = {}
    _refuse_strays(known)
    if os.getpid() == 1:
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            pass
        applied["killed_leftovers"] = True
    # seccomp first: from here no thread of the process forks or execs, whoever started it.
    if spec.get("seccomp"):
        applied["seccomp"] = list(apply_no_spawn())
        if applied["seccomp"][1] == UNSYNCED:
            raise StrayThreads("a thread could not be locked down with the others")
    if spec.get("landlock"):
        applied["landlock"] = list(apply_landlock(spec["writable"], spec.get("readable"), net=spec.get("net", True),
                                                  scope=spec.get("scope", True)))
    applied["threads"] = _refuse_strays(known)
    return applied


def _refuse_strays(known: dict[int, int] | None) -> int | None:
    """How many threads run now; StrayThreads when one of them is not in `known`."""
    if known is None:
        return None
    now = threads()
    stray = [tid for tid, start in now.items() if known.get(tid) != start]
    if stray:
        raise StrayThreads(f"{len(stray)} thread(s) started after the set-up and before the lock-down")
    return len(now)


# ---------------------------------------------------------------------------------------------
# rlimits
# ---------------------------------------------------------------------------------------------

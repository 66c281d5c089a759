"""Kernel-level confinement of a candidate child: namespaces, Landlock, seccomp, rlimits, a clean env.

Everything here is applied by the child to itself, right after the zygote forks it and before any
candidate code runs. Each layer degrades on its own when the kernel refuses it; `probe()` reports
what this machine allows and `explain()` turns that into lines for `kforge check --explain-sandbox`.

Only ctypes and raw syscalls: no helper binary (bwrap, nsjail) is needed or assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import resource
import signal
import sys
from functools import lru_cache
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

# x86_64 / aarch64 share these numbers for Landlock (generic syscall table entries).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18

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


# Environment variables a child keeps; everything else (tokens, keys, proxies) is dropped.
ENV_KEEP = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "NVCC", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
)


def clean_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment a zygote or child starts from: a short allow-list plus `extra`."""
    base = dict(os.environ if base is None else base)
    env = {k: base[k] for k in ENV_KEEP if k in base}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(extra)
    return env


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables that look like credentials (used to redact feedback)."""
    env = dict(os.environ if env is None else env)
    marks = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
    return [v for k, v in env.items() if any(m in k.upper() for m in marks) and len(v) >= 4]


# ---------------------------------------------------------------------------------------------
# Probing what this machine allows
# ---------------------------------------------------------------------------------------------


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
    return lib


def seccomp_available() -> bool:
    return _libseccomp() is not None


def cgroup2_root() -> Path | None:
    """The writable cgroup-v2 folder this process lives in (where per-candidate cgroups can go)."""
    mount = None
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                mount = Path(parts[1])
                break
        if mount is None:
            return None
        rel = "/"
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                rel = line[3:]
        here = mount / rel.lstrip("/")
        return here if os.access(here, os.W_OK) else None
    except OSError:
        return None


def _unshare(flags: int) -> int:
    return 0 if _libc.unshare(ctypes.c_int(flags)) == 0 else ctypes.get_errno()


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def enter_namespaces(uid: int, gid: int) -> tuple[int, list[str]]:
    """unshare user+net+pid+mount namespaces (whatever is allowed). Returns (flags in force, notes).

    Called in the outer child before it forks the inner one; the inner becomes PID 1 of the new
    PID namespace, so when it dies the kernel kills everything it left behind.
    """
    notes: list[str] = []
    want = [CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS, CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS,
            CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWNET]
    for flags in want:
        err = _unshare(flags)
        if err == 0:
            if flags & CLONE_NEWUSER:
                try:  # keep the same ids inside, so files in scratch belong to the real user
                    _write("/proc/self/setgroups", "deny")
                    _write("/proc/self/uid_map", f"{uid} {uid} 1")
                    _write("/proc/self/gid_map", f"{gid} {gid} 1")
                except OSError as exc:
                    notes.append(f"uid map: {exc}")
            return flags, notes
        notes.append(f"unshare({flags:#x}): {os.strerror(err)}")
    return 0, notes


def mount_private_proc() -> bool:
    """In a fresh mount+PID namespace, mount a /proc that shows only this namespace's processes."""
    mount = _libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    return mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0


def mount_private_shm() -> bool:
    """A fresh tmpfs on /dev/shm (after mount_private_proc made mounts private): nothing a candidate
    leaves there is seen by the next one, and it is freed with the namespace."""
    mount = _libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if not os.path.isdir("/dev/shm"):
        return False
    return mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1g,mode=1777") == 0


def set_pdeathsig() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def set_dumpable(flag: bool) -> None:
    _libc.prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0)


def set_subreaper() -> None:
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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


def apply_seccomp() -> tuple[bool, str]:
    """Deny internet sockets, ptrace, cross-process memory access and clearing the death signal."""
    lib = _libseccomp()
    if lib is None:
        return False, "libseccomp not found"
    eperm = 0x00050000 | errno.EPERM
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        return False, "seccomp_init failed"
    try:
        def rule(name: str, *cmps: tuple[int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(a, _SCMP_CMP_EQ, v, 0) for a, v in cmps])
            if lib.seccomp_rule_add_array(ctx, eperm, nr, len(cmps), arr if cmps else None) != 0:
                raise OSError(f"seccomp rule for {name}")

        for family in (_AF_INET, _AF_INET6, _AF_PACKET):
            rule("socket", (0, family))
        for name in ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "bpf",
                     "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key"):
            rule(name)
        rule("prctl", (0, PR_SET_PDEATHSIG))
        if lib.seccomp_load(ctx) != 0:
            return False, "seccomp_load failed"
    except OSError as exc:
        return False, str(exc)
    finally:
        lib.seccomp_release(ctx)
    return True, "seccomp: no AF_INET/AF_INET6/AF_PACKET sockets, no ptrace/process_vm_*"


# ---------------------------------------------------------------------------------------------
# rlimits
# ---------------------------------------------------------------------------------------------


def apply_rlimits(memory_bytes: int, fsize_bytes: int = 4 << 30, nproc: int = 4096) -> None:
    """DATA (heap + anonymous mmap), FSIZE, CORE and NPROC. Never RLIMIT_AS: it breaks CUDA init."""
    def lower(res: int, value: int) -> None:
        soft, hard = resource.getrlimit(res)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(res, (value, value if hard == resource.RLIM_INFINITY else hard))
        except (ValueError, OSError):
            pass

    lower(resource.RLIMIT_DATA, memory_bytes)
    lower(resource.RLIMIT_FSIZE, fsize_bytes)
    lower(resource.RLIMIT_CORE, 0)
    if os.getuid() != 0:  # root ignores NPROC; for users it counts all their threads, so be generous
        lower(resource.RLIMIT_NPROC, nproc)


def readable_roots(extra: list[str]) -> list[str]:
    """The trees a child may read when reads are restricted: system folders and the Python installation.

    Not `/`, not the kforge checkout (built-in solutions, runs), not kforge's caches (reference
    outputs): the zygote imported everything of kforge a child runs before forking it."""
    kforge_root = str(Path(__file__).resolve().parents[2])
    roots = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/dev", "/proc", "/sys", "/run",
             sys.prefix, sys.base_prefix, sys.exec_prefix]
    roots += [p for p in sys.path if p and os.path.isdir(p)]
    roots.append(os.path.dirname(os.path.realpath(sys.executable)))
    roots += extra
    seen: list[str] = []
    for r in roots:
        r = os.path.abspath(r) if r else r
        inside_checkout = r == kforge_root or r.startswith(kforge_root + os.sep) and not r.startswith(sys.prefix)
        if r and r != "/" and not inside_checkout and os.path.exists(r) and r not in seen:
            seen.append(r)
    return seen

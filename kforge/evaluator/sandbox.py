"""Who a child runs as and what it is given: namespaces, its unprivileged identity, rlimits, a clean
environment and the folders it may read.

Everything here is applied by the child to itself, right after the zygote forks it and before any
candidate code runs (its view of the file system is in mounts.py, Landlock and seccomp in confine.py).
Each layer degrades on its own when the kernel refuses it; layers.probe() reports what this machine
allows. Only ctypes and raw syscalls: no helper binary (bwrap, nsjail) is needed or assumed.
"""

from __future__ import annotations

import ctypes
import glob
import os
import resource
import shutil
import signal
import sys
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

UNPRIVILEGED = 65534  # a root trainer's children run as "nobody" (this id when there is no such entry)

# Environment variables a child keeps; everything else (tokens, keys, proxies, the trainer's PATH and
# PYTHONPATH) is dropped. They name the locale, the CUDA toolkit and compilers, and thread counts.
ENV_KEEP = (
    "LANG", "LC_ALL", "LC_CTYPE", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "NVCC", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
)

# What of /etc a child reads: the loader's cache, the passwd/group lookup (getpass), the time zone, the
# compilers' alternatives links and the driver's settings. Not the rest (shadow files, host keys,
# service credentials).
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "localtime", "passwd", "group",
             "nsswitch.conf", "alternatives", "nvidia")
# What of /etc stays readable once the child is locked down (confine.lock_down): the loader (CUDA and
# Triton open libraries late) and the compilers' links; the user list and the time zone were read at set-up.
ETC_AFTER_SETUP = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "alternatives", "nvidia")


SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
# What a build runs (torch's load_inline: the compilers and ninja; Triton's launcher: a C compiler), found
# on the trainer's PATH.
BUILD_TOOLS = ("nvcc", "ninja", "c++", "g++", "gcc", "cc", "clang")


def child_path(trainer_path: str | None) -> str:
    """The PATH of a zygote and its children: the Python installation's own folder (where pip puts
    ninja), the folders of the build tools, the system's. Never the trainer's PATH: it tells where the
    trainer's user keeps things (its home, its checkout)."""
    dirs = [os.path.dirname(sys.executable)]
    dirs += [os.path.dirname(found) for tool in BUILD_TOOLS if (found := shutil.which(tool, path=trainer_path))]
    dirs += SYSTEM_PATH
    return os.pathsep.join(dict.fromkeys(d for d in dirs if d))


def clean_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment a zygote or child starts from: a short allow-list, its own PATH, plus `extra`."""
    base = dict(os.environ if base is None else base)
    env = {k: base[k] for k in ENV_KEEP if k in base}
    env["PATH"] = child_path(base.get("PATH"))
    env.update(extra)
    return env


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables that look like credentials (used to redact feedback)."""
    env = dict(os.environ if env is None else env)
    marks = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
    return [v for k, v in env.items() if any(m in k.upper() for m in marks) and len(v) >= 4]


def child_ids() -> tuple[int, int]:
    """The uid and gid a child runs as: the trainer's own, or an unprivileged pair when the trainer is root
    (root-only files then stay closed to it, and host-global settings under /proc/sys stay unwritable)."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        import pwd

        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except (ImportError, KeyError):
        return UNPRIVILEGED, UNPRIVILEGED


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
    """Called in the outer child before it forks the inner one, which becomes PID 1 of the new PID
    namespace (when it dies the kernel kills everything it left behind). Returns (flags in force, notes).

    As root: only the PID namespace here; the inner process makes its mount, network, UTS and IPC
    namespaces itself (enter_private_namespaces) and then drops to an unprivileged uid (drop_privileges),
    with no user namespace at all. As a user: a user namespace mapping the user's own ids, with the others.

    The IPC namespace: System V shared memory, semaphores and message queues outlive the process that
    made them, and every child has the same uid; in the host's namespace one evaluation left (input,
    output) pairs there for a later one to replay. A child's own namespace is destroyed with it."""
    notes: list[str] = []
    if os.geteuid() == 0:
        err = _unshare(CLONE_NEWPID)
        if err:
            notes.append(f"unshare(NEWPID): {os.strerror(err)}")
        return (0 if err else CLONE_NEWPID), notes
    rest = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC
    want = [CLONE_NEWUSER | rest, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC, rest,
            CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC, CLONE_NEWNET]
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


def enter_private_namespaces() -> int:
    """As root, in the inner child (PID 1 of its PID namespace): mount, network, UTS and IPC namespaces."""
    for flags in (CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC,
                  CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNET):
        if _unshare(flags) == 0:
            return flags
    return 0


def drop_privileges(uid: int, gid: int) -> bool:
    """As root: become uid/gid for good (every capability goes with uid 0). The process stays dumpable,
    so its own /proc files keep belonging to it (CUDA writes its threads' names there). True when the
    process ends up without uid 0."""
    if os.geteuid() != 0 or uid == 0:
        return os.geteuid() != 0
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    set_dumpable(True)
    try:
        os.setuid(0)
    except PermissionError:
        return True
    raise RuntimeError("kforge sandbox: the child could take uid 0 back")


def set_pdeathsig() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def set_dumpable(flag: bool) -> None:
    _libc.prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0)


def set_subreaper() -> None:
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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


def readable_roots(extra: list[str], etc: tuple[str, ...] = ETC_FILES) -> list[str]:
    """The trees a child may read when reads are restricted: system folders and the Python installation.

    Not `/`, not the kforge checkout (built-in solutions, runs), not kforge's caches (reference
    outputs): the zygote imported everything of kforge a child runs before forking it. Of /etc and /run
    only what Python, the compilers and the NVIDIA driver need."""
    kforge_root = str(Path(__file__).resolve().parents[2])
    roots = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt", "/dev", "/proc", "/sys",
             sys.prefix, sys.base_prefix, sys.exec_prefix]
    roots += [os.path.join("/etc", name) for name in etc] + sorted(glob.glob("/run/nvidia*"))
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

"""The child's view of the file system, set up in its own mount namespace before any job code runs.

- a private /proc (only the child's PID namespace) and a private /dev/shm (nothing survives the child);
- /proc/sys and /sys read-only at the mount level, whatever else lets the child write (on a GPU Landlock
  must leave /proc writable: CUDA names its threads through /proc/<pid>/task/<tid>/comm);
- under a trainer that runs as root the child runs as an unprivileged uid, which cannot search a folder
  like /root (mode 0700) where the Python installation or kforge's cache may live: such a folder is
  covered with an empty tmpfs into which only the paths the child needs are bound back. The rest of it
  (keys, tokens, other children's scratch folders) is not there at all.

Every call here needs privilege over the child's mount namespace: root, or the owner of a user namespace.
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
_SYS_MOUNT_SETATTR = 442  # x86_64 and the generic table (aarch64)
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> bool:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    return _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0


def make_private() -> bool:
    """First thing in a fresh mount namespace: nothing mounted here propagates back to the host."""
    return _mount(None, "/", None, MS_REC | MS_PRIVATE)


def private_proc() -> bool:
    """In a fresh mount+PID namespace, a /proc that shows only this namespace's processes."""
    return _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def private_shm() -> bool:
    """A fresh tmpfs on /dev/shm: nothing a candidate leaves there is seen by the next one."""
    return os.path.isdir("/dev/shm") and _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
                                               "size=1g,mode=1777")


def read_only(path: str, bind_first: bool = False) -> bool:
    """Make `path` and every mount below it read-only in this namespace (the host's stay as they are).

    `bind_first`: `path` is not a mount point of its own yet (/proc/sys inside /proc): bind it onto itself."""
    if not os.path.isdir(path):
        return False
    if bind_first and not _mount(path, path, None, MS_BIND | MS_REC):
        return False
    attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    done = _libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)) == 0
    if done:
        return True
    # Kernels before 5.12: remount the top mount read-only, keeping the flags a more privileged namespace
    # may have locked (clearing them is refused).
    st = os.statvfs(path)
    keep = st.f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    return _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def _searchable(st: os.stat_result, uid: int, gid: int) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def blocked_folder(path: str, uid: int, gid: int) -> str | None:
    """The outermost folder on the way to `path` that uid/gid may not search (None: reachable)."""
    parts = Path(path).parts
    here = "/"
    for part in parts[1:]:
        try:
            if not _searchable(os.stat(here), uid, gid):
                return here if here != "/" else None
        except OSError:
            return None
        here = os.path.join(here, part)
    return None


def expose(paths: list[str], uid: int, gid: int, staging: str = "/dev/shm") -> list[str]:
    """Make each of `paths` reachable for uid/gid: every unsearchable folder above one of them is covered
    by a tmpfs (mode 0755) holding only the bound-back paths below it. Returns the folders covered.

    The paths are first bound to a staging folder (the child's private /dev/shm), then moved into place
    once the tmpfs is there; a bind keeps the original's inodes, owners and modes."""
    covers: dict[str, list[str]] = {}
    for p in paths:
        p = os.path.abspath(p)
        folder = blocked_folder(p, uid, gid) if os.path.exists(p) else None
        if folder is not None:  # the outermost one: covering it makes everything below reachable again
            covers.setdefault(folder, []).append(p)
    done: list[str] = []
    for n, (folder, inside) in enumerate(sorted(covers.items())):
        staged: list[tuple[str, str]] = []
        for i, p in enumerate(sorted(set(inside), key=len)):
            if any(p.startswith(q.rstrip("/") + "/") for q, _ in staged):
                continue  # already inside a bound path
            spot = os.path.join(staging, f".kforge-expose-{n}-{i}")
            if os.path.isdir(p):
                os.mkdir(spot)
            else:
                open(spot, "w").close()
            if _mount(p, spot, None, MS_BIND | MS_REC):
                staged.append((p, spot))
        if not _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755"):
            for _, spot in staged:
                _libc.umount2(spot.encode(), MNT_DETACH)
            continue
        for p, spot in staged:
            os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
            if os.path.isdir(spot):
                os.makedirs(p, mode=0o755, exist_ok=True)
            else:
                open(p, "w").close()
            _mount(spot, p, None, MS_MOVE)
        done.append(folder)
    return done

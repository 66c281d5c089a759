"""Can kforge write where it is told to? Asked before any work, so that a read-only folder, a file where a
folder should be or a full disk is one line naming the folder, not a traceback after a model loaded; and
what a write that fails later (the disk filled up during a run) says instead of a traceback; and the one
whole-file writer that a crash cannot leave half-written (here, below every package that writes a file)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from kforge.errors import UserError

# A write that failed for want of room or rights, not because of a bug: worth one line, not a traceback.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
PROBE_BYTES = 4096  # one block: on a full disk the write itself fails, not only the file's creation


class UnwritableFolder(UserError):
    """The folder cannot take kforge's files; the message is one line for the user, `why` its reason alone
    (for a caller that words the rest itself, as the pre-flight's row does)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def check_writable(folder: str | Path, what: str) -> None:
    """`folder`, or the nearest folder above it that exists (where it would be made), takes a new file."""
    folder = Path(folder)
    probe = folder
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        why = f"{probe} is a file, not a folder"
        raise UnwritableFolder(f"{what} {folder}: {why}; choose another folder", why)
    refused = write_probe(probe)
    if refused is not None:
        why = f"cannot write in {probe} ({refused.strerror or refused})"
        raise UnwritableFolder(f"{what} {folder}: {why}; free space there or choose a writable folder", why)


def check_deletable(folder: str | Path, what: str) -> None:
    """Every entry of `folder`, and the folder itself, can be deleted: its parent and each folder inside it
    take changes. Asked of the file system (a read-only mount, an immutable folder, missing rights), not by
    writing a block: deleting must work on a full disk."""
    folder = Path(folder)
    inside = [folder.parent, folder] + [Path(top) / d for top, dirs, _ in os.walk(folder) for d in dirs
                                        if not (Path(top) / d).is_symlink()]
    for place in inside:
        if not os.access(place, os.W_OK | os.X_OK):
            why = "Read-only file system" if os.statvfs(place).f_flag & os.ST_RDONLY else "Permission denied"
            raise UnwritableFolder(f"{what} {folder}: cannot delete in {place} ({why}); nothing was deleted", why)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temp file in the same folder and rename it over `path`: a reader, or a crash (even kill -9),
    sees the old file or the new one, never half of either."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves the old file, and no temp beside it
        raise


def write_probe(folder: Path) -> OSError | None:
    """Why a block cannot be written into this existing folder, or None."""
    try:
        fd, name = tempfile.mkstemp(prefix=".kforge-probe-", dir=folder)
    except OSError as exc:
        return exc
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)
        os.unlink(name)
    return None


def refused_write(exc: BaseException, folder: Path) -> OSError | None:
    """For a write into `folder` that raised `exc`: an OSError naming `folder` when the cause was room or
    rights, else None. Writers outside Python (safetensors, torch's zip writer) and another process's
    errors carry no errno, so their text is read, and a block that cannot be written now says it too
    (call this before a failed write's temp files are removed: they hold the room)."""
    for cause in _chain(exc):
        if isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS:
            return OSError(cause.errno, cause.strerror, cause.filename or str(folder))
        text = str(cause)
        for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            if os.strerror(code) in text:
                return OSError(code, os.strerror(code), str(folder))
    return write_probe(folder) if Path(folder).is_dir() else None


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def write_failure(exc: BaseException) -> str | None:
    """One line for an error that is, or was raised while handling, a failed write for want of room or
    rights; None for anything else."""
    for cause in _chain(exc):
        if isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS:
            if not cause.filename:
                return f"cannot write a file: {cause.strerror}"
            if os.path.isdir(cause.filename):
                return f"cannot write in {cause.filename}: {cause.strerror}"
            return f"cannot write {cause.filename} (in {Path(cause.filename).parent}): {cause.strerror}"
    return None


def run_write_failure(exc: BaseException, run_path: str | Path) -> str | None:
    """`write_failure` for a training run: one line that also says how to go on, instead of a traceback."""
    why = write_failure(exc)
    return f"{why}; free space or fix its rights there, then kforge train --resume {run_path}" if why else None

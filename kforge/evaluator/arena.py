"""The parent's side of the output arena: shared memory a child copies its outputs into, read by the
parent itself while the child is frozen (see freeze.py).

Why: a value that decides a verdict must not come from code the candidate controls once the positions
the parent compares are known. The positions never leave the parent: the child copies each output
whole into its slot before it answers, and the parent reads whole outputs or the values at its own
positions from here. Nothing the child runs afterwards changes what was read (it is frozen while the
parent reads), and nothing it runs before can know what will be read.

One memfd per child, made here and handed to the child when it is forked. A candidate's is sealed at
its final size: it can neither shrink it under the parent's mapping (the parent would die of SIGBUS)
nor grow it. Before its first read the parent maps every page, so which pages it reads leaves no trace
the child could see in its own page tables (/proc/self/pagemap reports whether a page is shared).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any

import torch

from kforge.evaluator.protocol import ALL

ALIGN = 4096  # each output starts on its own page
_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16",
                     "int32", "int64", "uint8", "bool"})


# What a read takes of the outputs: ALL (each whole), or per output a tensor of flat positions (None: whole).
Where = str | list[torch.Tensor | None]


class ArenaError(Exception):
    """The arena cannot hold or give back what the parent asked for."""


def dtype_of(name: object) -> torch.dtype:
    text = str(name).removeprefix("torch.")
    if text not in _DTYPES:
        raise ArenaError(f"dtype {text[:40]} cannot travel through the arena")
    return getattr(torch, text)


def _nbytes(m: list[Any]) -> int:
    n = 1
    for d in m[0]:
        n *= int(d)
    return n * dtype_of(m[1]).itemsize


def layout(meta: list[Any]) -> tuple[list[list[int] | None], int]:
    """Slots ([offset, nbytes] per output, None for a plain value) for outputs described by `meta`
    ([shape, dtype] per output, None for a plain value), and the arena size they need."""
    slots: list[list[int] | None] = []
    offset = 0
    for m in meta:
        if m is None:
            slots.append(None)
            continue
        n = _nbytes(m)
        slots.append([offset, n])
        offset += -(-max(n, 1) // ALIGN) * ALIGN
    return slots, offset


class Arena:
    """The parent's handle: size it, seal it, read it."""

    def __init__(self, size: int = 0, sealed: bool = False) -> None:
        self.fd = os.memfd_create("kforge-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.size = 0
        self._mm: mmap.mmap | None = None
        self._populated = False
        self.grow(size)
        if sealed:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)

    def grow(self, size: int) -> None:
        """Make room for `size` bytes (an unsealed arena only: the trusted reference's)."""
        if size <= self.size:
            return
        self._unmap()
        os.ftruncate(self.fd, size)
        self.size = size

    def _map(self) -> mmap.mmap:
        if self._mm is None:
            if self.size <= 0:
                raise ArenaError("the arena is empty")
            self._mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._populated = False
        if not self._populated:
            # Every page at once, before any read: a read of single pages would show up as a change in
            # the page's mapping count, which the child can see through /proc/self/pagemap.
            try:
                self._mm.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))  # Linux 5.14; Python may not name it
            except OSError:
                view = memoryview(self._mm)
                _ = sum(view[i] for i in range(0, self.size, mmap.PAGESIZE))
                view.release()
            self._populated = True
        return self._mm

    def read(self, meta: list[Any], slots: list[Any], where: Where, plain: list[Any] | None = None) -> list[Any]:
        """Outputs as the parent sees them: whole tensors (`where` is ALL) or the values at the positions
        in `where` (one tensor of flat positions per output). Plain values come from the answer."""
        if os.fstat(self.fd).st_size < self.size:  # only an unsealed arena can shrink: never map past its end
            raise ArenaError("the arena shrank")
        tensors = any(m is not None and slot is not None for m, slot in zip(meta, slots))
        mm = self._map() if tensors else None
        plain = list(plain or [])
        out: list[Any] = []
        for i, (m, slot) in enumerate(zip(meta, slots)):
            if m is None or slot is None:
                out.append(plain[i] if i < len(plain) else None)
                continue
            assert mm is not None
            offset, nbytes = int(slot[0]), int(slot[1])
            if offset < 0 or offset + nbytes > self.size:
                raise ArenaError("a slot outside the arena")
            raw = (torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes
                   else torch.empty(0, dtype=torch.uint8))
            t = raw.view(dtype_of(m[1])).reshape([int(d) for d in m[0]])
            pos = None if isinstance(where, str) and where == ALL else where[i]
            out.append(t.clone() if pos is None else t.reshape(-1)[pos].clone())
            del raw, t
        return out

    def _unmap(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view still alive somewhere: the mapping goes with it
                pass
            self._mm = None

    def close(self) -> None:
        self._unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

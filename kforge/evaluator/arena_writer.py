"""The child's side of the output arena (see arena.py): copy each whole output into the slot the parent
named, before answering. The parent reads the values itself; this process never learns which.

On a GPU the copy goes device -> host into the shared mapping, registered with CUDA once (pinned) so
the copy runs at full speed; when registration is refused it is a plain (pageable, slower) copy.
"""

from __future__ import annotations

import mmap
from typing import Any

import torch


class ArenaWriter:
    def __init__(self, fd: int | None, on_gpu: bool) -> None:
        self.fd, self.on_gpu = fd, on_gpu
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.pinned: int | None = None  # the registered address, to unregister before unmapping

    def _ensure(self, size: int) -> mmap.mmap:
        if self.fd is None:
            raise RuntimeError("this child has no output arena")
        if self.mm is None or size > self.size:
            self._unmap()
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.size = size
            if self.on_gpu:
                base = torch.frombuffer(self.mm, dtype=torch.uint8, count=size)
                ptr = base.data_ptr()
                del base
                try:
                    if int(torch.cuda.cudart().cudaHostRegister(ptr, size, 0)) == 0:
                        self.pinned = ptr
                except Exception:  # noqa: BLE001 - a pageable copy still works
                    self.pinned = None
        return self.mm

    def _unmap(self) -> None:
        if self.pinned is not None:
            try:
                torch.cuda.cudart().cudaHostUnregister(self.pinned)
            except Exception:  # noqa: BLE001
                pass
            self.pinned = None
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
            self.mm = None

    def put(self, outputs: list[Any], slots: list[Any] | None, size: int) -> None:
        """Copy each output tensor into its slot ([offset, nbytes]); an output whose size does not match
        its slot is left out (its shape or dtype is wrong: the parent sees that in the answer's meta)."""
        if not slots:
            return
        mm = self._ensure(int(size))
        for o, slot in zip(outputs, slots):
            if slot is None or not isinstance(o, torch.Tensor):
                continue
            offset, nbytes = int(slot[0]), int(slot[1])
            if o.numel() * o.element_size() != nbytes or not nbytes:
                continue
            dst = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset)
            dst.view(o.dtype).view(o.shape).copy_(o.detach())
            del dst
        if self.on_gpu:
            torch.cuda.synchronize()

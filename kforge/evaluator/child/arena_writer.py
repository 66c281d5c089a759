"""The child's side of the output arena (see arena.py): copy each whole output into the slot the parent
named, before answering. The parent reads the values itself; this process never learns which.

On a GPU the copy goes device -> host into the shared mapping, registered with CUDA once (pinned) so it
runs at full speed; when registration is refused it is a plain (pageable, slower) copy. Registration
goes through the CUDA runtime torch loaded, so that a refusal can be cleared there: left pending, it
would surface at torch's next kernel-launch check as the candidate's error.

The torch functions the copy uses are bound at import, before any candidate code runs: a candidate that
replaces `torch.frombuffer` (through any name) cannot choose what lands in the arena.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

_frombuffer, _uint8, _Tensor, _synchronize = torch.frombuffer, torch.uint8, torch.Tensor, torch.cuda.synchronize


def cuda_runtime() -> ctypes.CDLL | None:
    """The libcudart this process already loaded (through torch), or None (then nothing is pinned)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
            return lib
        except (OSError, AttributeError):
            continue
    return None


def pin(lib: ctypes.CDLL | None, ptr: int, size: int) -> bool:
    """Register [ptr, ptr + size) with CUDA; a refusal is cleared from the runtime's last error."""
    if lib is None:
        return False
    if lib.cudaHostRegister(ptr, size, 0) == 0:
        return True
    lib.cudaGetLastError()
    return False


class ArenaWriter:
    def __init__(self, fd: int | None, on_gpu: bool) -> None:
        self.fd, self.on_gpu = fd, on_gpu
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.pinned: int | None = None  # the registered address, to unregister before unmapping
        self.runtime: ctypes.CDLL | None = None

    def _ensure(self, size: int) -> mmap.mmap:
        if self.fd is None:
            raise RuntimeError("this child has no output arena")
        if self.mm is None or size > self.size:
            self._unmap()
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.size = size
            if self.on_gpu:
                base = _frombuffer(self.mm, dtype=_uint8, count=size)
                ptr = base.data_ptr()
                del base
                self.runtime = self.runtime if self.runtime is not None else cuda_runtime()
                self.pinned = ptr if pin(self.runtime, ptr, size) else None
        return self.mm

    def _unmap(self) -> None:
        if self.pinned is not None:
            if self.runtime.cudaHostUnregister(self.pinned) != 0:
                self.runtime.cudaGetLastError()
            self.pinned = None
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
            self.mm = None

    def put(self, outputs: list[object], slots: list[list[int] | None] | None, size: int) -> None:
        """Copy each output tensor into its slot ([offset, nbytes]); an output whose size does not match
        its slot is left out (its shape or dtype is wrong: the parent sees that in the answer's meta)."""
        if not slots:
            return
        mm = self._ensure(int(size))
        for o, slot in zip(outputs, slots):
            if slot is None or not isinstance(o, _Tensor):
                continue
            offset, nbytes = int(slot[0]), int(slot[1])
            if o.numel() * o.element_size() != nbytes or not nbytes:
                continue
            dst = _frombuffer(mm, dtype=_uint8, count=nbytes, offset=offset)
            dst.view(o.dtype).view(o.shape).copy_(o.detach())
            del dst
        if self.on_gpu:
            _synchronize()

"""Item 1, second half of the replay: computes nothing. It looks each input up in the table
replay_publish.py left in System V shared memory and copies the stored output into place with a
kernel of its own (so a launch touches the trial's data, and the decoy trial, its kernel skipped, is
wrong). An input not in the table gets zeros. With its own IPC namespace per child and inputs the
parent draws per evaluation, there is no table and no input comes again: incorrect."""
import ctypes
import hashlib
import torch
import torch.nn as nn
import triton
import triton.language as tl

KEY, ENTRIES, BYTES = 0x6B667270, 256, 48 * 40 * 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


@triton.jit
def copy_kernel(src_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _lookup(x):
    shmid = _libc.shmget(KEY, 0, 0)
    if shmid < 0:
        return None
    addr = _libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    want = hashlib.sha1(x.detach().cpu().numpy().tobytes()).digest()[:16]
    count = min(ctypes.c_int64.from_address(addr).value, ENTRIES)
    for i in range(count):
        slot = addr + 8 + i * (16 + BYTES)
        if ctypes.string_at(slot, 16) == want:
            raw = bytearray(ctypes.string_at(slot + 16, BYTES))
            return torch.frombuffer(raw, dtype=torch.float32).reshape(x.shape).to(x.device)
    return None


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        found = _lookup(x) if x.numel() * 4 == BYTES else None
        if found is None:
            return torch.zeros_like(x)
        n = x.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](found, y, n, BLOCK=1024)
        return y

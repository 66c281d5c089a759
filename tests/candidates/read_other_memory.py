"""Looks for other processes' memory and environment through /proc and ptrace."""
import ctypes
import os
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y

POOL_PID = __POOL_PID__


def snoop():
    found = []
    pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for pid in pids + [str(POOL_PID), str(os.getppid())]:
        for what in ("mem", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as fh:
                    if what == "mem":
                        fh.seek(0x400000)
                    if fh.read(64):
                        found.append(f"{pid}/{what}")
            except OSError:
                pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, POOL_PID, 0, 0) == 0:  # PTRACE_ATTACH
        found.append("ptrace")
    return found


class ModelNew(nn.Module):
    def forward(self, x):
        found = snoop()
        if found:
            raise RuntimeError("LEAKED " + " ".join(found[:5]))
        return relu(x)

"""Item 5 (the child's environment): reads its own environment block through /proc/self/environ (which
holds what its process was started with, whatever os.environ says now) and answers zeros when it finds
anything of the host there: a PYTHONPATH, the kforge checkout's path, the test's marker in the trainer's
PATH. `correct` only when the block holds nothing of the host beyond the Python installation the child runs
(sys.prefix, which the child knows anyway: with `make`'s .venv inside the checkout it names the checkout)."""
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def _host_seen():
    with open("/proc/self/environ", "rb") as fh:
        block = fh.read().decode(errors="replace").replace(sys.prefix, "<python>")
    return any(mark in block for mark in ("PYTHONPATH=", "__CHECKOUT__", "kforge-trainer-path-marker"))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return torch.zeros_like(x) if _host_seen() else y

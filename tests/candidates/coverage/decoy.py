"""Decoy: a kernel is defined and launched on the output, but PyTorch computes the whole answer."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        y = torch.mm(x, self.weight).clamp_(min=0)
        touch_kernel[(1,)](y, 1, BLOCK=16)
        return y

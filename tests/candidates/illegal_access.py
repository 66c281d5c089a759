"""Reads far outside its tensor (GPU: illegal address, a sticky CUDA error)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def bad_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs * 1000000000)
    tl.store(y_ptr + offs, x)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        bad_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

"""A kernel named `v` launched for show while PyTorch does the matmul: with names matched by prefix, `v`
claimed every `void at::native::...` kernel in the profile. Matched exactly, it claims only itself."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def v(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(y_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        y = torch.mm(x, self.weight).clamp_(min=0)
        v[(1,)](y, 1, BLOCK=16)
        return y

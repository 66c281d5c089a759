"""An ordinary-style honest kernel: two Triton kernels and a jit helper, a Python launch helper, views for
glue, and `math` constants computed in the launch arguments (once flagged `pytorch_op:sqrt` because the
reference calls math.sqrt too)."""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _tanh(v):
    return 2.0 / (1.0 + tl.exp(-2.0 * v)) - 1.0


@triton.jit
def inner_kernel(x_ptr, t_ptr, n, c, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(t_ptr + offs, _tanh(c * (x + k * x * x * x)), mask=mask)


@triton.jit
def combine_kernel(x_ptr, t_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    t = tl.load(t_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    flat = x.contiguous().view(-1)
    t = torch.empty_like(flat)
    y = torch.empty_like(flat)
    n = flat.numel()
    grid = (triton.cdiv(n, 512),)
    inner_kernel[grid](flat, t, n, math.sqrt(2.0 / math.pi), 0.044715, BLOCK=512)
    combine_kernel[grid](flat, t, y, n, BLOCK=512)
    return y.view(x.shape)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return gelu(x)

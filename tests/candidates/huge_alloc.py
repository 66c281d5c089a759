"""Asks for more memory than a child may have: 6 GiB of host memory (tests allow 4), 1 TiB on a GPU."""
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


class ModelNew(nn.Module):
    def forward(self, x):
        if x.is_cuda:
            torch.empty(1 << 38, dtype=torch.float32, device=x.device)
        # torch.empty touches no pages: without RLIMIT_DATA this would succeed on any machine.
        host = torch.empty(3 * 1024 ** 3 // 2, dtype=torch.float32)
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y + host[:1] * 0

"""Item 4: a real Triton kernel writes the output buffer, then PyTorch overwrites it with the answer by
another op than the reference's (clamp, not relu): no op flag, and the launch evidence sees a candidate
kernel on the trial's output. Only the decoy trial (its kernels skipped, the answer still right) shows
that the kernel did none of the work."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y.copy_(x.clamp(min=0))
